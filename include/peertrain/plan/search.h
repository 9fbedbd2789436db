// The strategy search: every way to lay out one peer's workers that the engine can build —
// sp × tp × pp = W, the micro-batch count, the schedule, vocabulary parallelism (a GPT's
// pipeline of tensor rank 1 whose output layer outweighs a block: none, vocab-1, vocab-2),
// and stages of different meshes with each resharding strategy — simulated (simulator.h) and
// ranked by predicted step time, the ones that do not fit the memory cap or cannot be built
// kept apart with the reason. Exhaustive: at W ≤ 64 workers and a batch of up to a few
// hundred sequences the space is a few thousand strategies, and a simulation takes well
// under a millisecond once the profiles are cached; the profiles, one per (unit, micro-batch
// size, sp, tp), are what costs, and they are measured once per machine and build.
#pragma once

#include <string>
#include <vector>

#include "peertrain/plan/simulator.h"

namespace peertrain::plan {

struct SearchSpace {
  int workers = 1;
  int batch = 8;
  std::vector<int> microbatches;              // empty: every divisor of the batch up to 4·pp
  std::vector<parallel::Schedule> schedules;  // empty: every synchronous one (not pipedream)
  parallel::SequenceSplit split = parallel::SequenceSplit::kZigzag;
  bool vocab_parallel = true;  // also try vocab-1 and vocab-2 where the engine has them
  bool stage_meshes = true;    // also try stages of different (sp, tp) meshes, each resharding
};

struct Candidate {
  Strategy strategy;
  Prediction prediction;
  std::string loses_because;  // against the first: the part of the step where it loses most
};

// Feasible candidates first, fastest first; then the others with their reasons.
std::vector<Candidate> search(const model::TransformerConfig& model, const SearchSpace& space, Profiler& profiler,
                              const SimulationOptions& options = {});

}  // namespace peertrain::plan
