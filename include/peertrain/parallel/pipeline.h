// The group of workers inside one peer that computes a step's gradient: the model's chain
// of units cut into PP pipeline stages, run by any schedule of schedule.h (GPipe, 1F1B,
// interleaved, the zero-bubble and V schedules; a stage may hold several chunks of the
// model, and the backward may be split into B and W). Each stage has its own mesh of
// workers, SP sequence ranks × TP tensor ranks (--sp and --tp, or per stage --stage-mesh):
// the sequence ranks cut the tokens and run ring attention, the tensor ranks split the
// blocks' heads and MLP width (model/tensor_shard.h). Worker (p, s, t) is a thread; the
// sequence ranks of a tensor rank share a group (ring attention, vit's pooling), the tensor
// ranks of a sequence rank another (the blocks' all-reduces), the whole stage a third (the
// gradient all-reduce), and every worker of the peer a fabric for the activations forward
// and their gradients back. Where two neighbouring stages' meshes differ, the tensor at
// their boundary is resharded between them (reshard_exchange.h, --reshard).
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

#include <optional>
#include <string>
#include <string_view>

#include "peertrain/model/gradient_engine.h"
#include "peertrain/model/transformer.h"
#include "peertrain/parallel/reshard.h"
#include "peertrain/parallel/ring_attention.h"
#include "peertrain/parallel/schedule.h"
#include "peertrain/parallel/vocab_parallel.h"

namespace peertrain::parallel {
namespace pipeline_detail {
struct BoundaryPlans;  // pipeline_worker.h
}

// One pipeline stage's workers: sp sequence ranks × tp tensor ranks, worker (s, t) the
// stage's s·tp + t-th. Its activations are [micro-batch, tokens, d_model], the tokens split
// over sp (zigzag or contiguous, as --sequence-split says) and replicated over tp.
struct StageMesh {
  int sp = 1;
  int tp = 1;
  int workers() const { return sp * tp; }
  bool operator==(const StageMesh&) const = default;
};

// A stage's boundary tensor [micro-batch, tokens, d_model] on its mesh {sp, tp} (reshard.h):
// the tokens split over the sequence ranks as `split` says, the tensor ranks replicating.
Layout boundary_layout(const StageMesh& mesh, SequenceSplit split);

// "sp=2,tp=1;sp=1,tp=4": one mesh per stage, in order, separated by ';'; an axis left out
// is 1. Throws Error(kInvalidArgument) naming `flag`, the stage and the axis.
std::vector<StageMesh> parse_stage_meshes(std::string_view text, std::string_view flag = "--stage-mesh");
std::string to_string(const std::vector<StageMesh>& meshes);

struct EngineConfig {
  int sp = 1;            // sequence ranks per stage (--sp)
  int tp = 1;            // tensor ranks per stage (--tp)
  int pp = 1;            // pipeline stages (--pp)
  // Each stage's own mesh (--stage-mesh), pp of them; empty: every stage sp × tp.
  std::vector<StageMesh> stage_meshes{};
  int max_workers = 0;  // the workers this peer has (--workers): the meshes must fit; 0: no limit
  // How a boundary tensor crosses between two stages' meshes (--reshard).
  ReshardStrategy reshard = ReshardStrategy::kSendRecv;
  // Emulated links between the workers (reshard_exchange.h's LinkEmulator), for the
  // boundary tensors: fast inside a stage's mesh, slow between meshes. Off (free) by default.
  std::optional<LinkModel> links{};
  int microbatches = 1;  // M: micro-batches per step (--microbatches); must divide the batch
  Schedule schedule = Schedule::kOneFOneB;
  // gpt: the input embedding and the output layer with its loss split over the pp stages,
  // V/pp vocabulary rows each (vocab_parallel.h); none keeps them whole on the first and
  // the last stage.
  VocabParallel vocab_parallel = VocabParallel::kNone;
  int chunks = 2;  // interleaved: chunks per stage (--chunks); zb-v and v-half have 2, the others 1
  // First unit of each virtual stage, pp · chunks of them in the model's order (--stages);
  // empty: profile the units and partition them.
  std::vector<int> stage_first_units{};
  SequenceSplit split = SequenceSplit::kZigzag;
  RingMode ring = RingMode::kOnlineSoftmax;
  double timeout_s = 60;        // any one wait of a worker for another
  int profile_repetitions = 3;  // timed runs of each unit, median taken
  // OpenMP threads of each worker's GEMMs when there are several workers. A process-wide
  // Eigen::setNbThreads(n) takes precedence over it (Eigen reads its own setting first).
  int threads_per_worker = 1;

  StageMesh mesh(int stage) const {
    return stage_meshes.empty() ? StageMesh{sp, tp} : stage_meshes[static_cast<std::size_t>(stage)];
  }
  int workers() const {
    int n = 0;
    for (int p = 0; p < pp; ++p) n += mesh(p).workers();
    return n;
  }
};

// The whole step's data of this peer, whole sequences (the engine cuts them).
struct GlobalBatch {
  int batch = 0;                           // sequences (gpt) or images (vit)
  std::span<const std::int32_t> bytes;     // gpt: [batch × seq] input bytes
  std::span<const std::int32_t> targets;   // gpt: [batch × seq] the next byte of each
  std::span<const float> pixels;           // vit: [batch × image²]
  std::span<const std::int32_t> labels;    // vit: [batch]
};

// One stage over the last step, its workers averaged (times) or maxed (memory).
struct StageStats {
  int first_unit = 0;
  int units = 0;
  double busy_s = 0;      // wall time inside unit forward/backward (ring attention included)
  double busy_cpu_s = 0;  // this thread's CPU time there: busy_s less the time other threads held the core
  double wait_s = 0;      // wall time blocked on a neighbour stage: receives, and sends at the end of the step
  double idle_s = 0;      // pipeline_s − busy_s: wait_s, and the fill and drain around its passes
  double reduce_s = 0;    // the gradient all-reduce over the sequence ranks
  // The parameters one of its workers holds: its chunks' units (under tensor parallelism
  // its shard of each block), its vocabulary shard (floats × 4).
  std::size_t parameter_bytes = 0;
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
  // flag (--sp, --tp, --pp, --stage-mesh with the stage and the axis, --microbatches,
  // --stages). Keeps a reference to the model.
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
  // rethrown naming its stage, sequence rank and tensor rank.
  float step(std::span<const float> params, const GlobalBatch& batch, std::span<float> grads);

  const EngineConfig& config() const { return config_; }
  // The first unit of each virtual stage (pp · chunks, in the model's order); empty before plan().
  const std::vector<int>& stage_first_units() const { return first_units_; }
  const std::vector<double>& unit_costs() const { return unit_costs_; }       // the profile; empty if overridden
  const StepStats& last_stats() const { return stats_; }
  const ScheduleShape& schedule_shape() const { return shape_; }
  // Each stage's mesh, and the resharding plan of each boundary whose meshes differ, as
  // text ("stage 0 → 1: …"), for the last step's micro-batch size; empty before a step.
  const std::vector<StageMesh>& meshes() const { return meshes_; }
  std::string describe_boundaries() const;

 private:
  struct Worker;
  void check_batch(const GlobalBatch& batch, std::span<const float> params) const;
  void check_meshes();
  void plan_boundaries(int microbatch);  // for this micro-batch size, unless they are
  Worker& worker(int stage, int sequence_rank, int tensor_rank) const;

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
  std::vector<StageMesh> meshes_;                 // per stage
  std::vector<int> first_worker_;                 // per stage: its first worker's index in workers_
  std::vector<std::unique_ptr<Worker>> workers_;  // stage by stage, (s, t) at s·tp + t; kept between steps
  std::unique_ptr<pipeline_detail::BoundaryPlans> boundaries_;  // the resharding plans, for one micro-batch size
};

// The engine behind the common gradient interface (model/gradient_engine.h): a TokenBatch
// in, the step's gradient out; evaluation runs on the unsplit model, which the engine's
// tests hold equal to it.
std::unique_ptr<model::GradientEngine> make_pipeline_gradient_engine(model::Transformer& model, EngineConfig config);

// How a peer computes its transformer's gradient, chosen in one place for training and
// `bench step`: on a GPU when `device` is cuda; else the pipeline engine when the split
// has more than one worker; else the batch over `threads` threads; else the unsplit model.
struct GradientEngineChoice {
  model::Device device = model::Device::kCpu;
  model::DeviceOptions device_options;  // with Device::kCuda
  EngineConfig engine;
  int threads = 1;
};
struct GradientEngineMade {
  std::unique_ptr<model::GradientEngine> engine;
  model::DeviceModel* device = nullptr;  // the GPU model inside `engine`, with Device::kCuda
};
GradientEngineMade make_gradient_engine(model::Transformer& model, const GradientEngineChoice& choice);

}  // namespace peertrain::parallel
