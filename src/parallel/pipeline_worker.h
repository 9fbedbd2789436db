// The pipeline engine's workers (pipeline.h): what the workers of one step share, and the
// worker — one (stage, sequence rank) thread — with its chunks, buffers and passes.
// Internal to the parallel module: pipeline.cpp runs the step, pipeline_worker.cpp the
// passes.
#pragma once

#include <chrono>
#include <cstddef>
#include <latch>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "peertrain/comm/failure_latch.h"
#include "peertrain/comm/thread_group.h"
#include "peertrain/core/aligned.h"
#include "peertrain/core/error.h"
#include "peertrain/core/work.h"
#include "peertrain/model/batch_slice.h"
#include "peertrain/parallel/pipeline.h"
#include "peertrain/parallel/reshard_exchange.h"
#include "peertrain/parallel/ring_attention.h"

namespace peertrain::parallel {
namespace pipeline_detail {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to);
// CPU time of the calling thread: unlike wall time it does not grow while the thread
// waits for a core that other workers hold, which is what oversubscription distorts.
double thread_cpu_seconds();

// Messages into virtual stage k for micro-batch i: its input forward, its output gradient
// backward.
inline int forward_tag(int k, int microbatch, int microbatches) { return 2 * (k * microbatches + microbatch); }
inline int backward_tag(int k, int microbatch, int microbatches) { return 2 * (k * microbatches + microbatch) + 1; }
// Vocabulary parallelism's messages, numbered after those: a stage's share of micro-batch
// i's token vectors to stage 0, stage 0's gradient of them back to every stage, the head
// stage's ln_f output to every stage.
inline int token_tag(int i, int microbatches, int virtual_stages) { return 2 * virtual_stages * microbatches + i; }
inline int token_grad_tag(int i, int microbatches, int virtual_stages) {
  return (2 * virtual_stages + 1) * microbatches + i;
}
inline int output_tag(int i, int microbatches, int virtual_stages) {
  return (2 * virtual_stages + 2) * microbatches + i;
}
inline std::size_t pass_index(const PipelineOp& op, int chunks, int microbatches) {
  return (static_cast<std::size_t>(op.kind) * chunks + op.chunk) * microbatches + op.microbatch;
}

// The step's micro-batches as one sequence rank holds them.
struct RankBatches {
  std::vector<int> positions;  // the rank's tokens (all of them when sp == 1)
  std::vector<model::BatchSlice> slices;
  const model::TokenBatch& operator[](int microbatch) const {
    return slices[static_cast<std::size_t>(microbatch)].batch;
  }
};

// The resharding plan of each pair of stages that send each other a boundary tensor, for
// one micro-batch size; keyed (from stage, to stage).
struct BoundaryPlans {
  int microbatch = 0;
  std::map<std::pair<int, int>, ReshardExchange> exchanges;
  const ReshardExchange& at(int from, int to) const { return exchanges.at({from, to}); }
};

// What the workers of one step share.
struct StepShared {
  StepShared(std::span<const float> params, const GlobalBatch& batch, const EngineConfig& config,
             const ScheduleShape& shape, const std::vector<std::vector<PipelineOp>>& schedule,
             const std::vector<int>& first_units, int units, const BoundaryPlans& boundaries)
      : params(params),
        batch(batch),
        config(config),
        shape(shape),
        schedule(schedule),
        split_backward(shape.split_backward()),
        first_units(first_units),
        units(units),
        boundaries(boundaries),
        start(static_cast<std::ptrdiff_t>(config.workers())) {}

  std::span<const float> params;
  const GlobalBatch& batch;
  const EngineConfig& config;
  const ScheduleShape& shape;
  const std::vector<std::vector<PipelineOp>>& schedule;
  bool split_backward;  // B and W are separate passes
  const std::vector<int>& first_units;
  int units;
  const BoundaryPlans& boundaries;
  // Fresh groups every step: an aborted group stays aborted, and making one costs nothing
  // next to a step.
  std::vector<std::unique_ptr<comm::ThreadGroup>> stage_groups;                  // [pp], the stage's workers
  std::vector<std::vector<std::unique_ptr<comm::ThreadGroup>>> sequence_groups;  // [pp][tp], sp ranks each
  std::vector<std::vector<std::unique_ptr<comm::ThreadGroup>>> tensor_groups;    // [pp][sp], tp ranks each
  std::unique_ptr<comm::ThreadGroup> fabric;                                     // every worker: the boundary tensors
  // Vocabulary parallelism (every stage sp × 1): [sp], pp ranks each.
  std::vector<std::unique_ptr<comm::ThreadGroup>> pipeline_groups;
  std::unique_ptr<LinkEmulator> links;  // EngineConfig::links; null: free
  // PipeDream: this step's number (its weights' version), and whether the last step left
  // micro-batches in flight (else the carried backwards are skipped).
  long long version = 0;
  bool carrying = false;
  comm::FailureLatch failure;
  std::latch start;  // so that every worker's clock starts together
};

// The tokens of sequence rank `rank` of `sp` (all of them when sp == 1).
std::vector<int> rank_positions(int tokens, int sp, int rank, SequenceSplit split);
// The step's micro-batches as rank.positions holds them.
void build_microbatches(const model::Transformer& model, const GlobalBatch& global, int microbatches,
                        RankBatches& rank);
// The parameter ranges a stage's backward adds into: its chunks' units', and the
// embedding's when it holds a tied head. Under vocabulary parallelism (shard non-null) the
// embedding unit keeps only wpe and the head only ln_f, and every stage adds its shard:
// wte's columns and, untied, lm_head's rows (d strided runs). Overlapping and adjacent
// ranges are merged, so each parameter appears once and the all-reduce makes few calls.
std::vector<model::ParameterRange> touched_ranges(const model::Transformer& model,
                                                  const std::vector<std::pair<int, int>>& unit_runs,
                                                  const VocabShard* shard = nullptr);

}  // namespace pipeline_detail

using namespace pipeline_detail;  // this header is private to the two files of the engine

// Worker (stage, sequence rank, tensor rank): its share of every micro-batch and the
// buffers it keeps between steps.
struct PipelineEngine::Worker {
  int stage = 0, rank = 0, tp_rank = 0;
  int index = 0;       // in the engine's workers (the fabric's rank)
  int mesh_index = 0;  // in its stage's mesh: rank · tp + tp_rank
  StageMesh mesh;
  RankBatches data;
  model::Transformer* model = nullptr;  // shared: its temporaries are per thread

  // One of the stage's chunks: virtual stage k of the model's p·v, units [first_unit,
  // end_unit). Saved activations: a slot is one UnitActivations per unit of the chunk.
  // Slots return to the free list once the micro-batch's backward (its W when split) is
  // done, so 1F1B allocates p − s of them, GPipe m.
  struct Chunk {
    int virtual_stage = 0;
    int first_unit = 0, end_unit = 0;
    std::vector<std::vector<model::UnitActivations>> slots;
    std::vector<int> free_slots;
    std::vector<int> slot_of;  // per micro-batch; −1 when not in flight
    std::vector<int> carried_slot_of;     // PipeDream: the last step's micro-batches still in flight
    std::vector<long long> slot_version;  // PipeDream: the weights' version each slot's forward ran on
    int units() const { return end_unit - first_unit; }
  };
  std::vector<Chunk> chunks;
  // Messages between two chunks of this same worker (the V's turn, or p = 1), by tag.
  std::map<int, AlignedVector<float>> local;

  // Vocabulary parallelism: this stage's rows, and per micro-batch the token vectors
  // (stage 0: summed over the stages), the ln_f output and its gradient (the head stage),
  // the gradient of the token vectors (stage 0, for every stage).
  std::optional<VocabShard> shard;
  std::vector<AlignedVector<float>> token_vectors, outputs, output_grads, token_grads;
  // Each micro-batch's output layer between its S and T passes; how many are held.
  std::vector<VocabOutputState> output_states;
  std::vector<char> output_live;
  int outputs_held = 0, peak_outputs_held = 0;

  // PipeDream: the last step's micro-batches and weights (this stage's ranges of a
  // full-size buffer), for the carried backwards; the gradient that the stage after sent
  // at the end of the last step for the first of them; the stashes' checks.
  RankBatches data_last;
  AlignedVector<float> weights, weights_last;
  long long weights_version = -1, weights_last_version = -1;
  AlignedVector<float> carried_gradient;
  std::vector<StepStats::StashedPass> stashed;

  // The flat layout, so units write where they always do; only `ranges` are used, which
  // keeps the tied embedding's two writers (stage 0 and the head's stage) apart.
  AlignedVector<float> grads;
  std::vector<model::ParameterRange> ranges;
  // Of those, the ones every tensor rank computes alike (the embedding, the head): only
  // tensor rank 0's gradient of them counts, the others zero theirs before the all-reduce.
  std::vector<model::ParameterRange> replicated_ranges;
  AlignedVector<float> received, scratch[2];

  // Buffers handed to isend, kept until the partner has taken them.
  struct Parcel {
    AlignedVector<float> data;
    Work request;
  };
  std::vector<Parcel> outbox;

  // This step's connections.
  std::vector<PipelineOp> ops;
  comm::Group* stage_group = nullptr;     // the stage's workers; null when it has one
  comm::Group* sequence_group = nullptr;  // this tensor rank's sequence ranks; null when sp == 1
  comm::Group* tensor_group = nullptr;    // this sequence rank's tensor ranks; null when tp == 1
  comm::Group* fabric = nullptr;          // every worker; null when pp == 1
  comm::Group* pipe = nullptr;            // vocabulary parallelism: this rank's stages
  std::optional<RingAttention> ring;
  model::UnitContext context;

  // The last step.
  float loss = 0;
  double busy_s = 0, busy_cpu_s = 0, wait_s = 0, reduce_s = 0;
  Clock::time_point begin, end;
  std::size_t peak_bytes = 0;
  int in_flight = 0, peak_in_flight = 0;
  std::vector<double> pass_cpu_s;  // by pass_index

  std::string where() const {
    std::string units;
    for (const Chunk& c : chunks) units += str(units.empty() ? "" : ", ", c.first_unit, "–", c.end_unit - 1);
    return str("pipeline stage ", stage, " (units ", units, "), sequence rank ", rank,
               mesh.tp > 1 ? str(", tensor rank ", tp_rank) : "");
  }

  // Everything before the clock starts; false when it failed (recorded).
  bool prepare(StepShared& step, model::Transformer& engine_model);
  // The schedule, then the sends' completion and the gradient all-reduce.
  void run(StepShared& step);
  void forward(StepShared& step, const PipelineOp& op);
  void backward(StepShared& step, const PipelineOp& op);  // the whole backward, or B when split
  void weight(StepShared& step, const PipelineOp& op);    // W: the parameter gradients, after B
  // Vocabulary parallelism: the output layer of one micro-batch with every stage, its S
  // pass (logits, statistics, the barrier) and its T pass (the gradients); this stage's
  // share of the token lookup (before the schedule) and of the embedding's gradient (after
  // it).
  void output_s(StepShared& step, const PipelineOp& op);
  void output_t(StepShared& step, const PipelineOp& op);
  void look_up_tokens(StepShared& step);
  void add_token_gradients(StepShared& step);
  // Sends a copy of `data` to every other stage.
  void send_to_all(StepShared& step, int tag, const AlignedVector<float>& data);
  void release(Chunk& chunk, int microbatch, bool carried = false);  // its activations are no longer needed
  // Receives into `into` the message `tag` from the workers of virtual stage k (this one's
  // local box when it is this stage), and sends `parcel` there: through the resharding
  // plan between the two stages' meshes.
  void receive(StepShared& step, int k, int tag, AlignedVector<float>& into);
  void send(StepShared& step, int k, int tag, Parcel& parcel);
  struct FabricLink;
  std::size_t held_bytes() const;

  // Times fn as busy (inside the model's units) for pass `op`.
  template <typename Fn>
  void busy(const PipelineOp& op, int microbatches, Fn&& fn) {
    const auto wall = Clock::now();
    const double cpu = thread_cpu_seconds();
    fn();
    const double cpu_s = thread_cpu_seconds() - cpu;
    busy_s += seconds_between(wall, Clock::now());
    busy_cpu_s += cpu_s;
    pass_cpu_s[pass_index(op, static_cast<int>(chunks.size()), microbatches)] += cpu_s;
  }
  // Times fn as waiting for a neighbour.
  template <typename Fn>
  void waiting(Fn&& fn) {
    const auto wall = Clock::now();
    fn();
    wait_s += seconds_between(wall, Clock::now());
  }

  Parcel& free_parcel(std::size_t floats) {
    for (auto& parcel : outbox)
      if (parcel.request.done()) {
        parcel.request.wait();  // rethrows a failed send
        parcel.request = Work();
        parcel.data.resize(floats);
        return parcel;
      }
    outbox.push_back({AlignedVector<float>(floats), Work()});
    return outbox.back();
  }
};

}  // namespace peertrain::parallel
