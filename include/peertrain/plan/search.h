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

#include <functional>
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
  // Set by measure_best: the median of its rounds' step times on this machine, and each round's.
  double measured_s = 0;
  std::vector<double> measured_rounds_s;
};

// Feasible candidates first, fastest first; then the others with their reasons.
std::vector<Candidate> search(const model::TransformerConfig& model, const SearchSpace& space, Profiler& profiler,
                              const SimulationOptions& options = {});

struct MeasureOptions {
  int best = 3;    // how many candidates to run: the best of each family, then of each layout
  int rounds = 3;  // each a real engine step of every one of them, in an order rotated every round
  int steps = 5;   // timed steps a run (after one warm-up step); its median is the round's figure
};
// Called before each run: the round, the candidate's index among the measured, and how
// many are measured (fewer than MeasureOptions::best when there are fewer layouts).
using MeasureProgress = std::function<void(int round, int index, int count)>;

// The search's answer checked on this machine: `best` feasible candidates, first the best
// predicted of each family (sp, tp, pp, stage meshes, resharding and vocabulary
// parallelism: the simulator's error is shared within a family and differs between them),
// then, where there are fewer families, of each further layout (a family's micro-batch
// counts; a layout's other schedules share its unit profiles, and so their error). The
// choice reads `candidates` in the search's order (fastest predicted first). They run on
// the engine (real steps of random data, one strategy at a time) in `rounds` rounds, in
// the search's order rotated every round, so that a slow spell of the machine moves one
// figure of each rather than all of one, and none always runs first after a cold start.
// They are then ranked by the median of their rounds and put first, and every other feasible
// candidate's loses_because is set against the new first. Where the simulator's figures
// lie within its error of each other (near-ties a few percent apart, docs/plan.md), this
// picks the one that is fastest here. A candidate the engine refuses or fails on becomes
// infeasible, with the reason.
void measure_best(const model::TransformerConfig& model, std::vector<Candidate>& candidates,
                  const MeasureOptions& options, const MeasureProgress& progress = {});

// Why a measured candidate ranks behind the measured winner: its median's gap, and in how
// many of the rounds, which measure the two side by side, it was the faster one.
std::string why_measured_slower(const Candidate& c, const Candidate& winner);

}  // namespace peertrain::plan
