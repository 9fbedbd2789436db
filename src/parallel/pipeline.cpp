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

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <exception>
#include <string>
#include <thread>

#include "peertrain/core/error.h"
#include "peertrain/parallel/partitioner.h"
#include "pipeline_worker.h"

namespace peertrain::parallel {

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
  check_vocab_parallel(config_.vocab_parallel, model_.config(), config_.pp);
  shape_ = ScheduleShape{.schedule = config_.schedule,
                         .stages = config_.pp,
                         .microbatches = config_.microbatches,
                         .interleave = config_.chunks,
                         .output_barriers = output_barriers(config_.vocab_parallel)};
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
  // Under vocabulary parallelism the embedding and head units leave the vocabulary out: the
  // stages share it evenly, so only the rest is balanced.
  model::UnitContext context;
  context.vocabulary_outside = config_.vocab_parallel != VocabParallel::kNone;
  unit_costs_ = profile_units(model_, params, sample[0], config_.profile_repetitions, context);
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
  // PipeDream reads the last step's micro-batches in this one: the engine keeps its own copy
  // of the last two batches.
  const bool pipedream = config_.schedule == Schedule::kPipeDream;
  GlobalBatch kept = batch;
  if (pipedream) {
    OwnedBatch& own = owned_[steps_ % 2];
    own.batch = batch.batch;
    own.bytes.assign(batch.bytes.begin(), batch.bytes.end());
    own.targets.assign(batch.targets.begin(), batch.targets.end());
    own.labels.assign(batch.labels.begin(), batch.labels.end());
    own.pixels.assign(batch.pixels.begin(), batch.pixels.end());
    kept = GlobalBatch{own.batch, own.bytes, own.targets, own.pixels, own.labels};
  }
  StepShared shared(params, kept, config_, shape_, schedule_, first_units_, units);
  shared.version = steps_;
  shared.carrying = carrying_;
  carrying_ = false;  // until this step has succeeded
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
  carrying_ = pipedream && P > 1;
  ++steps_;

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
  for (int p = 0; p < P; ++p) {
    const auto& mine = workers_[static_cast<std::size_t>(p) * S]->stashed;
    stats_.stashed.insert(stats_.stashed.end(), mine.begin(), mine.end());
  }
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
      st.units += end - first;
    }
    for (const auto& r : workers_[static_cast<std::size_t>(p) * S]->ranges)
      st.parameter_bytes += sizeof(float) * r.size;
    for (int s = 0; s < S; ++s) {
      const Worker& w = *workers_[static_cast<std::size_t>(p) * S + s];
      st.busy_s += w.busy_s / S;
      st.busy_cpu_s += w.busy_cpu_s / S;
      st.wait_s += w.wait_s / S;
      st.reduce_s += w.reduce_s / S;
      st.peak_activation_bytes = std::max(st.peak_activation_bytes, w.peak_bytes);
      st.peak_in_flight = std::max(st.peak_in_flight, w.peak_in_flight);
      st.peak_output_states = std::max(st.peak_output_states, w.peak_outputs_held);
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
