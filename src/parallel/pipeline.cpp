// Pipeline stages × sequence ranks as threads of one process: GPipe (Huang et al. 2019)
// and 1F1B / PipeDream-Flush (Narayanan et al. 2019, 2021) over micro-batches, ring
// attention across the sequence ranks of each stage. See pipeline.h.
//
// Sends between stages are asynchronous and receives block. ThreadGroup's sends are
// rendezvous, so blocking sends would deadlock 1F1B (stage s sending forward i + 1 while
// stage s + 1 sends it backward i); with each send posted and its buffer parked in an
// outbox until the partner took it, a worker only ever waits for a pass that the
// neighbour's schedule runs earlier, which is what replay_schedule's sweep relies on too.
//
// The sequence ranks of a stage run the same schedule in lockstep, so their collectives
// (ring attention, vit's pooling, the gradient all-reduce) come in the same order.
#include "peertrain/parallel/pipeline.h"

#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <chrono>
#include <exception>
#include <latch>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>

#include "peertrain/comm/failure_latch.h"
#include "peertrain/comm/thread_group.h"
#include "peertrain/core/error.h"
#include "peertrain/model/batch_slice.h"
#include "peertrain/parallel/partitioner.h"

namespace peertrain::parallel {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// CPU time of the calling thread: unlike wall time it does not grow while the thread
// waits for a core that other workers hold, which is what oversubscription distorts.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Messages into virtual stage k for micro-batch i: its input forward, its output gradient
// backward.
int forward_tag(int k, int microbatch, int microbatches) { return 2 * (k * microbatches + microbatch); }
int backward_tag(int k, int microbatch, int microbatches) { return 2 * (k * microbatches + microbatch) + 1; }
std::size_t pass_index(const PipelineOp& op, int chunks, int microbatches) {
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

// What the workers of one step share.
struct StepShared {
  StepShared(std::span<const float> params, const GlobalBatch& batch, const EngineConfig& config,
             const ScheduleShape& shape, const std::vector<std::vector<PipelineOp>>& schedule,
             const std::vector<int>& first_units, int units)
      : params(params),
        batch(batch),
        config(config),
        shape(shape),
        schedule(schedule),
        split_backward(shape.split_backward()),
        first_units(first_units),
        units(units),
        start(static_cast<std::ptrdiff_t>(config.pp) * config.sp) {}

  std::span<const float> params;
  const GlobalBatch& batch;
  const EngineConfig& config;
  const ScheduleShape& shape;
  const std::vector<std::vector<PipelineOp>>& schedule;
  bool split_backward;  // B and W are separate passes
  const std::vector<int>& first_units;
  int units;
  // Fresh groups every step: an aborted group stays aborted, and making one costs nothing
  // next to a step.
  std::vector<std::unique_ptr<comm::ThreadGroup>> stage_groups;     // [pp], sp ranks each
  std::vector<std::unique_ptr<comm::ThreadGroup>> pipeline_groups;  // [sp], pp ranks each
  comm::FailureLatch failure;
  std::latch start;  // so that every worker's clock starts together
};

std::vector<int> rank_positions(int tokens, int sp, int rank, SequenceSplit split) {
  if (sp == 1) {
    std::vector<int> all(tokens);
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
  return sequence_positions(tokens, sp, rank, split);
}

void build_microbatches(const model::Transformer& model, const GlobalBatch& global, int microbatches,
                        RankBatches& rank) {
  const auto& c = model.config();
  const bool gpt = c.kind == model::TransformerKind::kGpt;
  std::vector<int> every(static_cast<std::size_t>(c.tokens()));
  std::iota(every.begin(), every.end(), 0);
  const model::TokenBatch whole{.batch = global.batch,
                                .tokens = c.tokens(),
                                .positions = every,
                                .bytes = global.bytes,
                                .pixels = global.pixels,
                                .targets = gpt ? global.targets : global.labels,
                                .loss_divisor = gpt ? static_cast<double>(global.batch) * c.seq : global.batch};
  const bool all_tokens = rank.positions.size() == every.size();
  const int per = global.batch / microbatches;
  rank.slices.resize(static_cast<std::size_t>(microbatches));
  for (int i = 0; i < microbatches; ++i)
    model::slice_batch(c, whole, i * per, per,
                       all_tokens ? std::span<const int>() : std::span<const int>(rank.positions),
                       rank.slices[static_cast<std::size_t>(i)]);
}

// The parameter ranges a stage's backward adds into: its chunks' units', and the
// embedding's when it holds a tied head. Overlapping and adjacent ranges are merged, so
// each parameter appears once and the all-reduce makes few calls.
std::vector<model::ParameterRange> touched_ranges(const model::Transformer& model,
                                                  const std::vector<std::pair<int, int>>& unit_runs) {
  std::vector<model::ParameterRange> ranges;
  for (auto [first_unit, end_unit] : unit_runs) {
    for (int u = first_unit; u < end_unit; ++u) ranges.push_back(model.unit_parameters(u));
    if (model.config().tied_head && end_unit == model.num_units()) ranges.push_back(model.unit_parameters(0));
  }
  std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  std::vector<model::ParameterRange> merged;
  for (const auto& r : ranges) {
    if (r.size == 0) continue;
    if (!merged.empty() && merged.back().offset + merged.back().size >= r.offset)
      merged.back().size = std::max(merged.back().size, r.offset + r.size - merged.back().offset);
    else
      merged.push_back(r);
  }
  return merged;
}

}  // namespace

// Worker (stage, rank): its share of every micro-batch and the buffers it keeps between
// steps.
struct PipelineEngine::Worker {
  int stage = 0, rank = 0;
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
    int units() const { return end_unit - first_unit; }
  };
  std::vector<Chunk> chunks;
  // Messages between two chunks of this same worker (the V's turn, or p = 1), by tag.
  std::map<int, AlignedVector<float>> local;

  // The flat layout, so units write where they always do; only `ranges` are used, which
  // keeps the tied embedding's two writers (stage 0 and the head's stage) apart.
  AlignedVector<float> grads;
  std::vector<model::ParameterRange> ranges;
  AlignedVector<float> received, scratch[2];

  // Buffers handed to isend, kept until the partner has taken them.
  struct Parcel {
    AlignedVector<float> data;
    Work request;
  };
  std::vector<Parcel> outbox;

  // This step's connections.
  std::vector<PipelineOp> ops;
  comm::Group* stage_group = nullptr;  // the stage's sequence ranks; null when sp == 1
  comm::Group* pipe = nullptr;         // this rank's stages; null when pp == 1
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
    return str("pipeline stage ", stage, " (units ", units, "), sequence rank ", rank);
  }

  // Everything before the clock starts; false when it failed (recorded).
  bool prepare(StepShared& step, model::Transformer& engine_model);
  // The schedule, then the sends' completion and the gradient all-reduce.
  void run(StepShared& step);
  void forward(StepShared& step, const PipelineOp& op);
  void backward(StepShared& step, const PipelineOp& op);  // the whole backward, or B when split
  void weight(StepShared& step, const PipelineOp& op);    // W: the parameter gradients, after B
  void release(Chunk& chunk, int microbatch);             // its activations are no longer needed
  // Receives into `into` the message `tag` from the worker of virtual stage k (this one's
  // local box when it is this stage), and sends `parcel` there.
  void receive(StepShared& step, int k, int tag, AlignedVector<float>& into);
  void send(StepShared& step, int k, int tag, Parcel& parcel);
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

bool PipelineEngine::Worker::prepare(StepShared& step, model::Transformer& engine_model) {
  const EngineConfig& config = step.config;
  const int P = config.pp, M = config.microbatches, V = step.shape.virtual_stages();
  const int v = step.shape.chunks();
  try {
    model = &engine_model;
    if (static_cast<int>(chunks.size()) != v) chunks.assign(static_cast<std::size_t>(v), {});
    std::vector<std::pair<int, int>> runs;
    for (int c = 0; c < v; ++c) {
      Chunk& chunk = chunks[static_cast<std::size_t>(c)];
      const int k = step.shape.virtual_stage(stage, c);
      const int first = step.first_units[static_cast<std::size_t>(k)];
      const int end = k + 1 < V ? step.first_units[static_cast<std::size_t>(k) + 1] : step.units;
      if (chunk.first_unit != first || chunk.end_unit != end) chunk.slots.clear();  // a new split
      chunk.virtual_stage = k;
      chunk.first_unit = first;
      chunk.end_unit = end;
      chunk.free_slots.clear();
      for (int slot = 0; slot < static_cast<int>(chunk.slots.size()); ++slot) chunk.free_slots.push_back(slot);
      chunk.slot_of.assign(static_cast<std::size_t>(M), -1);
      runs.emplace_back(first, end);
    }
    build_microbatches(*model, step.batch, M, data);
    ops = step.schedule[static_cast<std::size_t>(stage)];
    ranges = touched_ranges(*model, runs);
    grads.resize(model->num_parameters());
    for (const auto& r : ranges) std::fill_n(grads.begin() + r.offset, r.size, 0.0f);
    const std::size_t floats =
        static_cast<std::size_t>(model->config().d_model) * data[0].batch * data.positions.size();
    received.resize(floats);
    scratch[0].resize(floats);
    scratch[1].resize(floats);
    local.clear();
    pass_cpu_s.assign(3 * static_cast<std::size_t>(v) * M, 0.0);
    loss = 0;
    busy_s = busy_cpu_s = wait_s = reduce_s = 0;
    peak_bytes = 0;
    in_flight = peak_in_flight = 0;
    stage_group = config.sp > 1 ? &step.stage_groups[stage]->member(rank) : nullptr;
    pipe = P > 1 ? &step.pipeline_groups[rank]->member(stage) : nullptr;
    if (stage_group) ring.emplace(*stage_group, config.ring, config.timeout_s);
    context = {};
    context.attention = ring ? &*ring : nullptr;
    context.sequence_group = stage_group;
    context.timeout_s = config.timeout_s;
    return true;
  } catch (...) {
    step.failure.record(std::current_exception(), where());
    return false;
  }
}

void PipelineEngine::Worker::receive(StepShared& step, int k, int tag, AlignedVector<float>& into) {
  const int from = step.shape.stage_of(k);
  if (from == stage) {
    auto it = local.find(tag);
    PEERTRAIN_CHECK(it != local.end(), where(), ": message ", tag, " from its own chunk has not been sent");
    into.swap(it->second);
    local.erase(it);
    return;
  }
  waiting([&] { pipe->recv(from, tag, into, step.config.timeout_s); });
}

void PipelineEngine::Worker::send(StepShared& step, int k, int tag, Parcel& parcel) {
  const int to = step.shape.stage_of(k);
  if (to == stage) {
    local[tag] = parcel.data;  // a copy: the parcel goes back to the outbox
    return;
  }
  parcel.request = pipe->isend(to, tag, parcel.data);
}

std::size_t PipelineEngine::Worker::held_bytes() const {
  std::size_t bytes = 0;
  for (const Chunk& chunk : chunks)
    for (int held : chunk.slot_of)
      if (held >= 0)
        for (const auto& saved : chunk.slots[static_cast<std::size_t>(held)]) bytes += saved.activation_bytes();
  return bytes;
}

void PipelineEngine::Worker::forward(StepShared& step, const PipelineOp& op) {
  const int V = step.shape.virtual_stages(), M = step.config.microbatches, i = op.microbatch;
  Chunk& chunk = chunks[static_cast<std::size_t>(op.chunk)];
  const int k = chunk.virtual_stage;
  if (k > 0) receive(step, k - 1, forward_tag(k, i, M), received);
  if (chunk.free_slots.empty()) {
    chunk.slots.emplace_back(chunk.units());
    chunk.free_slots.push_back(static_cast<int>(chunk.slots.size()) - 1);
  }
  const int slot = chunk.free_slots.back();
  chunk.free_slots.pop_back();
  chunk.slot_of[static_cast<std::size_t>(i)] = slot;
  Parcel* parcel = k + 1 < V ? &free_parcel(received.size()) : nullptr;
  busy(op, M, [&] {
    // Units chain through two scratch buffers; the first reads what arrived, the last
    // writes straight into the outgoing parcel.
    for (int j = 0; j < chunk.units(); ++j) {
      const int unit = chunk.first_unit + j;
      const bool head = unit + 1 == step.units;
      const float* in = unit == 0 ? nullptr : j == 0 ? received.data() : scratch[(j - 1) % 2].data();
      float* out = head ? nullptr : j + 1 == chunk.units() ? parcel->data.data() : scratch[j % 2].data();
      const float unit_loss =
          model->forward(unit, step.params, data[i], in, out, chunk.slots[static_cast<std::size_t>(slot)][j], context);
      if (head) loss += unit_loss;
    }
  });
  if (parcel) send(step, k + 1, forward_tag(k + 1, i, M), *parcel);
  // What the stage now holds for the backward passes still to come.
  ++in_flight;
  peak_bytes = std::max(peak_bytes, held_bytes());
  peak_in_flight = std::max(peak_in_flight, in_flight);
}

void PipelineEngine::Worker::backward(StepShared& step, const PipelineOp& op) {
  const int V = step.shape.virtual_stages(), M = step.config.microbatches, i = op.microbatch;
  Chunk& chunk = chunks[static_cast<std::size_t>(op.chunk)];
  const int k = chunk.virtual_stage;
  if (k + 1 < V) receive(step, k + 1, backward_tag(k, i, M), received);
  const int slot = chunk.slot_of[static_cast<std::size_t>(i)];
  PEERTRAIN_CHECK(slot >= 0, "backward of micro-batch ", i, " before its forward on stage ", stage);
  Parcel* parcel = k > 0 ? &free_parcel(received.size()) : nullptr;
  busy(op, M, [&] {
    for (int j = chunk.units() - 1; j >= 0; --j) {
      const int unit = chunk.first_unit + j;
      const float* dout = unit + 1 == step.units   ? nullptr
                          : j + 1 == chunk.units() ? received.data()
                                                   : scratch[(j + 1) % 2].data();
      float* din = unit == 0 ? nullptr : j == 0 ? parcel->data.data() : scratch[j % 2].data();
      auto& saved = chunk.slots[static_cast<std::size_t>(slot)][j];
      if (step.split_backward)
        model->backward_input(unit, step.params, data[i], dout, din, saved, context);
      else
        model->backward(unit, step.params, data[i], dout, din, saved, grads, context);
    }
  });
  if (parcel) send(step, k - 1, backward_tag(k - 1, i, M), *parcel);
  if (step.split_backward)
    peak_bytes = std::max(peak_bytes, held_bytes());  // B added what W needs
  else
    release(chunk, i);
}

void PipelineEngine::Worker::weight(StepShared& step, const PipelineOp& op) {
  Chunk& chunk = chunks[static_cast<std::size_t>(op.chunk)];
  const int i = op.microbatch;
  const int slot = chunk.slot_of[static_cast<std::size_t>(i)];
  PEERTRAIN_CHECK(slot >= 0, "W pass of micro-batch ", i, " before its forward on stage ", stage);
  busy(op, step.config.microbatches, [&] {
    for (int j = chunk.units() - 1; j >= 0; --j)
      model->backward_weight(chunk.first_unit + j, step.params, data[i], chunk.slots[static_cast<std::size_t>(slot)][j],
                             grads, context);
  });
  release(chunk, i);
}

void PipelineEngine::Worker::release(Chunk& chunk, int i) {
  chunk.free_slots.push_back(chunk.slot_of[static_cast<std::size_t>(i)]);
  chunk.slot_of[static_cast<std::size_t>(i)] = -1;
  --in_flight;
}

void PipelineEngine::Worker::run(StepShared& step) {
  const double timeout_s = step.config.timeout_s;
  try {
    for (const PipelineOp& op : ops) {
      if (op.kind == PassKind::kForward)
        forward(step, op);
      else if (op.kind == PassKind::kBackward)
        backward(step, op);
      else
        weight(step, op);
    }
    waiting([&] {
      for (auto& parcel : outbox) {
        parcel.request.wait(timeout_s);
        parcel.request = Work();
      }
    });
    end = Clock::now();
    if (stage_group) {
      for (const auto& r : ranges)
        stage_group->all_reduce(std::span<float>(grads).subspan(r.offset, r.size), timeout_s);
      reduce_s = seconds_between(end, Clock::now());
    }
  } catch (...) {
    step.failure.record(std::current_exception(), where());
    // The groups are aborted now, so these return at once, and no send is left pointing
    // into a buffer or at a group that is about to go.
    for (auto& parcel : outbox) parcel.request = Work();
    end = Clock::now();
  }
  ring.reset();
  stage_group = pipe = nullptr;
  context = {};
}

PipelineEngine::PipelineEngine(model::Transformer& model, EngineConfig config)
    : model_(model), config_(std::move(config)) {
  const int units = model_.num_units();
  const int tokens = model_.config().tokens();
  if (config_.pp < 1 || config_.pp > units)
    throw Error(ErrorKind::kInvalidArgument,
                str("--pp ", config_.pp, ": expected 1 to ", units, " stages (the model has ", units,
                    " units: embedding, ", model_.config().layers, " blocks, head)"));
  if (config_.sp < 1 || config_.sp > tokens)
    throw Error(ErrorKind::kInvalidArgument, str("--sp ", config_.sp, ": expected 1 to ", tokens,
                                                 " sequence ranks (", tokens, " tokens per sequence)"));
  if (config_.microbatches < 1)
    throw Error(ErrorKind::kInvalidArgument, str("--microbatches ", config_.microbatches, ": expected at least 1"));
  shape_ = ScheduleShape{.schedule = config_.schedule,
                         .stages = config_.pp,
                         .microbatches = config_.microbatches,
                         .interleave = config_.chunks};
  schedule_ = build_schedule(shape_);  // validates: names --chunks, --microbatches
  const int virtual_stages = shape_.virtual_stages();
  if (virtual_stages > units)
    throw Error(ErrorKind::kInvalidArgument,
                str("--pp ", config_.pp, " with --schedule ", to_string(config_.schedule), " (", shape_.chunks(),
                    " chunks per stage) cuts the model into ", virtual_stages, " virtual stages, but it has only ",
                    units, " units (embedding, ", model_.config().layers, " blocks, head)"));
  if (!(config_.timeout_s > 0))
    throw Error(ErrorKind::kInvalidArgument, str("pipeline timeout ", config_.timeout_s, " s: expected > 0"));
  if (config_.threads_per_worker < 1)
    throw Error(ErrorKind::kInvalidArgument,
                str("pipeline threads per worker ", config_.threads_per_worker, ": expected at least 1"));
  if (config_.profile_repetitions < 1)
    throw Error(ErrorKind::kInvalidArgument,
                str("pipeline profile repetitions ", config_.profile_repetitions, ": expected at least 1"));
  if (!config_.stage_first_units.empty()) {
    validate_first_units(config_.stage_first_units, units, virtual_stages, "--stages");
    first_units_ = config_.stage_first_units;
  } else if (virtual_stages == 1) {
    first_units_ = {0};
  }
  workers_.resize(static_cast<std::size_t>(config_.pp) * config_.sp);
  for (int p = 0; p < config_.pp; ++p)
    for (int s = 0; s < config_.sp; ++s) {
      auto w = std::make_unique<Worker>();
      w->stage = p;
      w->rank = s;
      // Fails here, before any thread starts, when the split does not divide the tokens.
      try {
        w->data.positions = rank_positions(tokens, config_.sp, s, config_.split);
      } catch (const Error& e) {
        throw Error(e.kind(), str("--sp ", config_.sp, ": ", e.what()));
      }
      workers_[static_cast<std::size_t>(p) * config_.sp + s] = std::move(w);
    }
}

PipelineEngine::~PipelineEngine() = default;

void PipelineEngine::check_batch(const GlobalBatch& batch, std::span<const float> params) const {
  const auto& c = model_.config();
  const int m = config_.microbatches;
  if (batch.batch < 1 || batch.batch % m != 0)
    throw Error(ErrorKind::kInvalidArgument, str("--microbatches ", m, ": the batch of ", batch.batch,
                                                 " is not divisible into ", m, " equal micro-batches"));
  const auto b = static_cast<std::size_t>(batch.batch);
  auto expect = [](std::size_t got, std::size_t want, const char* what) {
    if (got != want)
      throw Error(ErrorKind::kInvalidArgument, str("pipeline step: ", what, " has ", got, " values, expected ", want));
  };
  if (c.kind == model::TransformerKind::kGpt) {
    expect(batch.bytes.size(), b * c.seq, "the batch's bytes [batch × seq]");
    expect(batch.targets.size(), b * c.seq, "the batch's targets [batch × seq]");
  } else {
    expect(batch.pixels.size(), b * c.image * c.image, "the batch's pixels [batch × image²]");
    expect(batch.labels.size(), b, "the batch's labels [batch]");
  }
  expect(params.size(), model_.num_parameters(), "the parameter buffer");
}

void PipelineEngine::plan(std::span<const float> params, const GlobalBatch& batch) {
  if (!config_.stage_first_units.empty()) {
    first_units_ = config_.stage_first_units;
    return;
  }
  if (shape_.virtual_stages() == 1) {
    first_units_ = {0};
    return;
  }
  check_batch(batch, params);
  // Rank 0's share of micro-batch 0 is what each worker computes per pass.
  RankBatches sample;
  sample.positions = workers_[0]->data.positions;
  build_microbatches(model_, batch, config_.microbatches, sample);
  unit_costs_ = profile_units(model_, params, sample[0], config_.profile_repetitions);
  first_units_ = partition(unit_costs_, shape_.virtual_stages());
}

float PipelineEngine::step(std::span<const float> params, const GlobalBatch& batch, std::span<float> grads) {
  const auto step_start = Clock::now();
  check_batch(batch, params);
  if (grads.size() != model_.num_parameters())
    throw Error(ErrorKind::kInvalidArgument, str("pipeline step: the gradient buffer has ", grads.size(),
                                                 " values, expected ", model_.num_parameters()));
  if (first_units_.empty()) plan(params, batch);

  const int P = config_.pp, S = config_.sp, M = config_.microbatches;
  const int units = model_.num_units();
  StepShared shared(params, batch, config_, shape_, schedule_, first_units_, units);
  if (S > 1)
    for (int p = 0; p < P; ++p) {
      shared.stage_groups.push_back(std::make_unique<comm::ThreadGroup>(S, str("stage ", p, " sequence group")));
      shared.failure.watch(shared.stage_groups.back()->member(0));
    }
  if (P > 1)
    for (int s = 0; s < S; ++s) {
      shared.pipeline_groups.push_back(
          std::make_unique<comm::ThreadGroup>(P, str("sequence rank ", s, " pipeline group")));
      shared.failure.watch(shared.pipeline_groups.back()->member(0));
    }

  auto work = [&](Worker& w) {
#ifdef _OPENMP
    // Each worker stands for one device: a GEMM that fanned out into an OpenMP team per
    // worker would oversubscribe the cores, and libgomp's spinning teams then crawl.
    if (workers_.size() > 1) omp_set_num_threads(config_.threads_per_worker);
#endif
    const bool ready = w.prepare(shared, model_);
    shared.start.arrive_and_wait();
    w.begin = w.end = Clock::now();
    if (ready) w.run(shared);
  };
  if (workers_.size() == 1) {
    work(*workers_[0]);
  } else {
    std::vector<std::thread> threads;
    threads.reserve(workers_.size());
    try {
      for (auto& w : workers_) threads.emplace_back(work, std::ref(*w));
    } catch (...) {
      // The started workers find their groups aborted; release them from the start line.
      shared.failure.record(std::current_exception(), "pipeline engine: starting the worker threads");
      shared.start.count_down(static_cast<std::ptrdiff_t>(workers_.size() - threads.size()));
    }
    for (auto& t : threads) t.join();
  }
  shared.failure.rethrow();

  // Sum the stages' ranges (after the all-reduce every rank of a stage holds the same);
  // only the tied embedding has two stages adding into it.
  std::fill(grads.begin(), grads.end(), 0.0f);
  for (int p = 0; p < P; ++p) {
    const Worker& w = *workers_[static_cast<std::size_t>(p) * S];
    for (const auto& r : w.ranges)
      for (std::size_t k = r.offset; k < r.offset + r.size; ++k) grads[k] += w.grads[k];
  }
  // Each sequence rank reports its share of the loss (vit's ranks 1/sp of the pooled one).
  double loss = 0;
  const int head_stage = shape_.stage_of(shape_.virtual_stages() - 1);  // P − 1, or 0 on a V
  for (int s = 0; s < S; ++s) loss += workers_[static_cast<std::size_t>(head_stage) * S + s]->loss;

  stats_ = StepStats{};
  stats_.loss = loss;
  stats_.theoretical_bubble = theoretical_bubble(shape_);
  auto begin = workers_[0]->begin;
  auto end = workers_[0]->end;
  for (const auto& w : workers_) {
    begin = std::min(begin, w->begin);
    end = std::max(end, w->end);
  }
  stats_.pipeline_s = seconds_between(begin, end);
  stats_.stages.resize(P);
  for (int p = 0; p < P; ++p) {
    StageStats& st = stats_.stages[p];
    const int V = shape_.virtual_stages();
    st.first_unit = first_units_[static_cast<std::size_t>(shape_.virtual_stage(p, 0))];
    st.units = 0;
    for (int c = 0; c < shape_.chunks(); ++c) {
      const int k = shape_.virtual_stage(p, c);
      const int first = first_units_[static_cast<std::size_t>(k)];
      const int end = k + 1 < V ? first_units_[static_cast<std::size_t>(k) + 1] : units;
      for (int u = first; u < end; ++u) st.parameter_bytes += sizeof(float) * model_.unit_parameters(u).size;
      st.units += end - first;
    }
    for (int s = 0; s < S; ++s) {
      const Worker& w = *workers_[static_cast<std::size_t>(p) * S + s];
      st.busy_s += w.busy_s / S;
      st.busy_cpu_s += w.busy_cpu_s / S;
      st.wait_s += w.wait_s / S;
      st.reduce_s += w.reduce_s / S;
      st.peak_activation_bytes = std::max(st.peak_activation_bytes, w.peak_bytes);
      st.peak_in_flight = std::max(st.peak_in_flight, w.peak_in_flight);
    }
    // Idle includes the fill before a stage's first input and the drain after its last
    // pass, which no receive measures but the theoretical bubble counts.
    st.idle_s = std::max(0.0, stats_.pipeline_s - st.busy_s);
    stats_.measured_bubble += st.bubble() / P;
  }
  const auto replay = replay_schedule(shape_, schedule_, [&](int stage, const PipelineOp& op) {
    double slowest = 0;  // the sequence ranks of a stage wait for each other in the ring
    for (int s = 0; s < S; ++s)
      slowest = std::max(
          slowest, workers_[static_cast<std::size_t>(stage) * S + s]->pass_cpu_s[pass_index(op, shape_.chunks(), M)]);
    return slowest;
  });
  stats_.replayed_bubble = replay.span_bubble;
  stats_.replayed_step_s = replay.makespan_s;
  stats_.step_s = seconds_between(step_start, Clock::now());
  return static_cast<float>(loss);
}

}  // namespace peertrain::parallel
