// The step-time simulator (FlexFlow's execution simulator, Jia et al. SysML 2019, for this
// engine): given a model, the profiles of plan/profile.h and a strategy, it builds the task
// graph of one pipeline step — every pass of every stage's list (schedule.h) as a compute
// task on that stage's workers, every boundary tensor as a transfer on the link between two
// stages' meshes, with their dependencies — and replays it.
//
// The replay shares the machine's cores among the worker threads that can run (processor
// sharing: k runnable threads on C cores each progress at min(1, C/k)), which is what the
// operating system does when a peer has more workers than cores, so the prediction is for
// this machine; with --cores W (a core per worker) it is for a machine that has them. On
// request (SimulationOptions::contention, plan's default) every pass of more workers than
// cores does a measured amount of CPU work more (the hand-off to its thread), and a mesh
// with more ranks than cores waits a measured time at each ring step or all-reduce inside
// it: threads that outnumber the cores wait for one at every hand-off. A transfer delays
// its receiver by the boundary's resharding time: on emulated links the planner's
// modelled time (reshard.h), on free links its memory copies and messages.
// Beyond the passes a step pays its fixed overhead (threads, groups; measured per worker
// count), the stages' gradient all-reduce and the gradient's assembly.
//
// Memory per worker: its parameters (a tensor rank's shard of each block) times the
// copies training keeps — weights, gradient and Adam's two moments, 4 — plus the largest
// sum, over its list, of the activations (and B's stash) of the micro-batches in flight.
#pragma once

#include <string>
#include <vector>

#include "peertrain/model/transformer.h"
#include "peertrain/parallel/pipeline.h"
#include "peertrain/plan/profile.h"

namespace peertrain::plan {

struct Strategy {
  // sp, tp, pp or stage_meshes, microbatches, schedule, chunks, stage_first_units (empty:
  // balanced from the profile, as the engine does), reshard, links, split.
  parallel::EngineConfig engine;
  int batch = 8;                 // sequences per step
  std::string describe() const;  // "sp2 tp1 pp2 m4 1f1b"
  // The flags that run it: --sp 2 --tp 1 --pp 2 --microbatches 4 --schedule 1f1b --stages …
  std::vector<std::string> flags() const;
};

struct SimulationOptions {
  int cores = 0;                // 0: this machine's
  double memory_cap_bytes = 0;  // per worker; 0: none
  int parameter_copies = 4;     // weights, gradient, Adam's two moments
  // On this machine with more workers than cores, add the measured hand-off costs to the
  // passes (contention_costs). `plan` turns it on (--no-contention turns it off): the
  // validation grid's worst row was 15–20 % in three runs with it, 15–31 % in five with a
  // factor on the passes instead, 25–28 % with neither (docs/plan.md). Off here, so that a
  // simulation replays the profiles it is given.
  bool contention = false;
  // With contention: these costs instead of the calibrated ones (the calibration's own use).
  const Contention* contention_costs = nullptr;
};

struct Prediction {
  bool feasible = true;
  std::string why_not;  // when not: cannot be built, or does not fit
  double step_s = 0;
  double passes_s = 0;               // the replayed passes, first start to last end
  double compute_s = 0;              // the busiest stage's passes, one worker's CPU time
  double bubble = 0;                 // stages' mean idle share of passes_s
  double overhead_s = 0;             // threads, groups, the gradient's assembly
  double reduce_s = 0;               // the stages' gradient all-reduce
  double transfer_s = 0;             // one boundary tensor's resharding (the slowest boundary)
  std::vector<double> worker_bytes;  // per stage: one worker's peak memory
  std::vector<int> first_units;      // the stage boundaries used
  double peak_bytes() const;
};

Prediction simulate(const model::TransformerConfig& model, const Strategy& strategy, Profiler& profiler,
                    const SimulationOptions& options = {});

// What W oversubscribed workers lose to the scheduler beyond the profiles (nothing when W
// fits the cores), calibrated on real engine steps of the planned model (batch rounded to
// 2W micro-batches), measured once per model and cached. A cost per pass, so that a
// pipeline of W stages (2W micro-batches of 1F1B) replays in its measured time; then a cost
// per ring hop, so that one mesh of W sequence ranks does. A model whose tokens W does not
// divide, or whose W stages or W sequence ranks the engine refuses, is calibrated on a
// small stand-in instead (d 64, 32·W tokens). At the planned
// model's shape because the wait for a core at a hand-off grows with the passes the other
// threads are in: costs fitted on the stand-in under-charged the validation grid's
// 4-worker pipelines by 18–27 % (docs/plan.md).
Contention contention_costs(Profiler& profiler, int workers, const model::TransformerConfig& planned, int batch);

// The cache's key of a calibration: the worker count, the model and the batch.
std::string contention_key(const model::TransformerConfig& calibration, int workers, int batch);

}  // namespace peertrain::plan
