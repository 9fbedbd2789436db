// The group of workers inside one peer that computes a step's gradient: the model's chain
// of units cut into PP pipeline stages, run by any schedule of schedule.h (GPipe, 1F1B,
// interleaved, the zero-bubble and V schedules; a stage may hold several chunks of the
// model, and the backward may be split into B and W), each stage's tokens cut over SP sequence ranks that run
// ring attention. Worker (p, s) — stage p, sequence rank s — is a thread; stage p's SP
// workers share a group (ring attention, vit's pooling, the gradient all-reduce), and
// sequence rank s's PP workers share another (activations forward, their gradients back).
//
// A step splits the peer's batch into M micro-batches, runs the schedule, and yields the
// gradient of the step's mean loss: the same numbers, up to float rounding, as the unsplit
// Transformer::forward_backward over the whole batch (tests/parallel/pipeline_test.cpp).
//
// Except under PipeDream (--schedule pipedream), which changes the numbers: the pipeline
// does not drain at the end of a step, so stage s keeps its last w = p − s − 1 micro-batches
// in flight and runs their backwards in the next step, on the weights their forward used
// (weight stashing: the engine keeps a copy of each stage's parameters from the step
// before). A step's gradient on stage s is then the gradient of its first M − w
// micro-batches at this step's weights plus that of the previous step's last w at the
// previous step's weights: those w micro-batches' gradients are one update stale when the
// optimizer applies them, stage 0's p − 1 of every M the most, the last stage's none. The
// loss is this step's, at this step's weights. The first step has nothing carried, and the
// last step's in-flight micro-batches never run their backward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "peertrain/model/gradient_engine.h"
#include "peertrain/model/transformer.h"
#include "peertrain/parallel/ring_attention.h"
#include "peertrain/parallel/schedule.h"
#include "peertrain/parallel/vocab_parallel.h"

namespace peertrain::parallel {

struct EngineConfig {
  int sp = 1;            // sequence ranks per stage (--sp)
  int pp = 1;            // pipeline stages (--pp)
  int microbatches = 1;  // M: micro-batches per step (--microbatches); must divide the batch
  Schedule schedule = Schedule::kOneFOneB;
  // gpt: the input embedding and the output layer with its loss split over the pp stages,
  // V/pp vocabulary rows each (vocab_parallel.h); none keeps them whole on the first and
  // the last stage.
  VocabParallel vocab_parallel = VocabParallel::kNone;
  int chunks = 2;  // interleaved: chunks per stage (--chunks); zb-v and v-half have 2, the others 1
  // First unit of each virtual stage, pp · chunks of them in the model's order (--stages);
  // empty: profile the units and partition them.
  std::vector<int> stage_first_units;
  SequenceSplit split = SequenceSplit::kZigzag;
  RingMode ring = RingMode::kOnlineSoftmax;
  double timeout_s = 60;        // any one wait of a worker for another
  int profile_repetitions = 3;  // timed runs of each unit, median taken
  // OpenMP threads of each worker's GEMMs when there are several workers. A process-wide
  // Eigen::setNbThreads(n) takes precedence over it (Eigen reads its own setting first).
  int threads_per_worker = 1;
};

// The whole step's data of this peer, whole sequences (the engine cuts them).
struct GlobalBatch {
  int batch = 0;                           // sequences (gpt) or images (vit)
  std::span<const std::int32_t> bytes;     // gpt: [batch × seq] input bytes
  std::span<const std::int32_t> targets;   // gpt: [batch × seq] the next byte of each
  std::span<const float> pixels;           // vit: [batch × image²]
  std::span<const std::int32_t> labels;    // vit: [batch]
};

// One stage over the last step, its sequence ranks averaged (times) or maxed (memory).
struct StageStats {
  int first_unit = 0;
  int units = 0;
  double busy_s = 0;      // wall time inside unit forward/backward (ring attention included)
  double busy_cpu_s = 0;  // this thread's CPU time there: busy_s less the time other threads held the core
  double wait_s = 0;      // wall time blocked on a neighbour stage: receives, and sends at the end of the step
  double idle_s = 0;      // pipeline_s − busy_s: wait_s, and the fill and drain around its passes
  double reduce_s = 0;    // the gradient all-reduce over the sequence ranks
  std::size_t parameter_bytes = 0;  // the parameters it holds: its chunks' units, its vocabulary shard (floats × 4)
  std::size_t peak_activation_bytes = 0;  // Σ activation_bytes() of the micro-batches in flight, at its largest
  int peak_in_flight = 0;                 // micro-batches in flight at most
  // Vocabulary parallelism: micro-batches whose output layer it held between S and T at
  // most (their state counts in peak_activation_bytes too).
  int peak_output_states = 0;
  double bubble() const { return busy_s + idle_s > 0 ? idle_s / (busy_s + idle_s) : 0.0; }
};

struct StepStats {
  std::vector<StageStats> stages;
  double loss = 0;
  double step_s = 0;      // wall time of step(), threads started and gradients summed included
  double pipeline_s = 0;  // from the workers' common start to the end of the last pass
  // Mean over stages of idle/(busy + idle), in wall time, as it happened on this machine.
  // With fewer cores than workers the stages time-share, which stretches busy_s and hides
  // part of the bubble; then replayed_bubble is the number to read.
  double measured_bubble = 0;
  // The schedule replayed with every pass lasting its measured thread CPU time and one
  // processor per stage (replay_schedule): the bubble of this partition and schedule on a
  // machine with a core per worker.
  double replayed_bubble = 0;
  double replayed_step_s = 0;     // that replay's makespan: the step's time with a core per worker
  double theoretical_bubble = 0;  // the papers' closed form for the schedule (schedule.h)
  // PipeDream: each backward of this step on stage 0's sequence rank 0 … on every stage,
  // with the version (step number) of the weights its forward ran on and of those it used.
  struct StashedPass {
    int stage = 0, microbatch = 0;
    bool carried = false;
    long long forward_version = 0, backward_version = 0;
  };
  std::vector<StashedPass> stashed;
};

class PipelineEngine {
 public:
  // Checks the configuration against the model; throws Error(kInvalidArgument) naming the
  // flag (--sp, --pp, --microbatches, --stages). Keeps a reference to the model.
  PipelineEngine(model::Transformer& model, EngineConfig config);
  ~PipelineEngine();
  PipelineEngine(const PipelineEngine&) = delete;
  PipelineEngine& operator=(const PipelineEngine&) = delete;

  // Fixes the stages: the override if one was given, else a profile of every unit on the
  // first micro-batch of `batch` and partition(). step() calls it the first time; calling
  // it again re-profiles.
  void plan(std::span<const float> params, const GlobalBatch& batch);

  // One step: writes the gradient of the step's mean loss into grads (overwritten) and
  // returns that loss. Throws Error(kInvalidArgument) for a batch that M does not divide
  // or spans of the wrong size; a failing worker aborts the others and its error is
  // rethrown naming its stage and sequence rank.
  float step(std::span<const float> params, const GlobalBatch& batch, std::span<float> grads);

  const EngineConfig& config() const { return config_; }
  // The first unit of each virtual stage (pp · chunks, in the model's order); empty before plan().
  const std::vector<int>& stage_first_units() const { return first_units_; }
  const std::vector<double>& unit_costs() const { return unit_costs_; }       // the profile; empty if overridden
  const StepStats& last_stats() const { return stats_; }
  const ScheduleShape& schedule_shape() const { return shape_; }

 private:
  struct Worker;
  void check_batch(const GlobalBatch& batch, std::span<const float> params) const;

  model::Transformer& model_;
  EngineConfig config_;
  // PipeDream: the step's batch copied (the carried micro-batches read the last one's in the
  // next step), and the steps run so far (the weights' version).
  struct OwnedBatch {
    int batch = 0;
    std::vector<std::int32_t> bytes, targets, labels;
    std::vector<float> pixels;
  };
  OwnedBatch owned_[2];
  long long steps_ = 0;
  bool carrying_ = false;  // the last step left micro-batches in flight
  ScheduleShape shape_;
  std::vector<std::vector<PipelineOp>> schedule_;  // each stage's passes, fixed at construction
  std::vector<int> first_units_;
  std::vector<double> unit_costs_;
  StepStats stats_;
  std::vector<std::unique_ptr<Worker>> workers_;  // pp · sp, index p · sp + s; kept between steps
};

// The engine behind the common gradient interface (model/gradient_engine.h): a TokenBatch
// in, the step's gradient out; evaluation runs on the unsplit model, which the engine's
// tests hold equal to it.
std::unique_ptr<model::GradientEngine> make_pipeline_gradient_engine(model::Transformer& model, EngineConfig config);

}  // namespace peertrain::parallel
