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
#include <numeric>
#include <string>
#include <thread>

#include "peertrain/core/error.h"
#include "peertrain/model/tensor_shard.h"
#include "peertrain/parallel/partitioner.h"
#include "pipeline_worker.h"

namespace peertrain::parallel {

Layout boundary_layout(const StageMesh& m, SequenceSplit split) {
  Layout layout{{-1, m.sp > 1 ? 0 : -1, -1}, {0, 0, 0}};
  layout.zigzag[1] = m.sp > 1 && split == SequenceSplit::kZigzag;
  return layout;
}

std::vector<StageMesh> parse_stage_meshes(std::string_view text, std::string_view flag) {
  std::vector<StageMesh> meshes;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t semicolon = std::min(text.find(';', start), text.size());
    const std::string_view stage = text.substr(start, semicolon - start);
    const int p = static_cast<int>(meshes.size());
    StageMesh mesh;
    std::size_t at = 0;
    while (at <= stage.size()) {
      const std::size_t comma = std::min(stage.find(',', at), stage.size());
      const std::string_view item = stage.substr(at, comma - at);
      const std::size_t equals = item.find('=');
      const std::string_view axis = item.substr(0, std::min(equals, item.size()));
      int* into = axis == "sp" ? &mesh.sp : axis == "tp" ? &mesh.tp : nullptr;
      if (into == nullptr || equals == std::string_view::npos)
        throw Error(ErrorKind::kInvalidArgument, str(flag, " '", text, "': stage ", p, ": '", item,
                                                     "' is not sp=N or tp=N (e.g. \"sp=2,tp=1;sp=1,tp=4\")"));
      const std::string value(item.substr(equals + 1));
      std::size_t used = 0;
      int n = 0;
      try {
        n = std::stoi(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != value.size() || value.empty() || n < 1)
        throw Error(ErrorKind::kInvalidArgument,
                    str(flag, " '", text, "': stage ", p, ": ", axis, "=", value, " is not a positive whole number"));
      *into = n;
      at = comma + 1;
    }
    meshes.push_back(mesh);
    start = semicolon + 1;
  }
  return meshes;
}

std::string to_string(const std::vector<StageMesh>& meshes) {
  std::string text;
  for (const StageMesh& m : meshes) text += str(text.empty() ? "" : ";", "sp=", m.sp, ",tp=", m.tp);
  return text;
}

void PipelineEngine::check_meshes() {
  const auto& c = model_.config();
  const int tokens = c.tokens();
  const bool listed = !config_.stage_meshes.empty();
  if (listed && (config_.sp != 1 || config_.tp != 1))
    throw Error(ErrorKind::kInvalidArgument,
                str("--stage-mesh gives each stage its sp and tp: leave --sp and --tp at 1 (they are ", config_.sp,
                    " and ", config_.tp, ")"));
  if (listed && static_cast<int>(config_.stage_meshes.size()) != config_.pp)
    throw Error(ErrorKind::kInvalidArgument, str("--stage-mesh '", to_string(config_.stage_meshes), "' gives ",
                                                 config_.stage_meshes.size(), " stages, --pp is ", config_.pp));
  if (config_.sp < 1 || config_.sp > tokens)
    throw Error(ErrorKind::kInvalidArgument, str("--sp ", config_.sp, ": expected 1 to ", tokens, " sequence ranks (",
                                                 tokens, " tokens per sequence)"));
  if (!listed) model::check_tensor_parallel(c, config_.tp, "--tp");
  int total = 0;
  for (int p = 0; p < config_.pp; ++p) {
    const StageMesh m = config_.mesh(p);
    const std::string where = listed ? str("--stage-mesh stage ", p) : std::string("--sp");
    if (m.sp < 1 || m.tp < 1)
      throw Error(ErrorKind::kInvalidArgument, str(where, ": sp=", m.sp, ", tp=", m.tp, ": expected at least 1"));
    try {
      rank_positions(tokens, m.sp, 0, config_.split);
    } catch (const Error& e) {
      throw Error(e.kind(), str(where, listed ? str(" axis sp=", m.sp) : str(" ", m.sp), ": ", e.what()));
    }
    if (listed) model::check_tensor_parallel(c, m.tp, str(where, " axis"));
    total += m.workers();
    if (config_.max_workers > 0 && total > config_.max_workers)
      throw Error(ErrorKind::kInvalidArgument,
                  str(listed ? where : std::string("--sp × --tp × --pp"), " (sp=", m.sp, " × tp=", m.tp, " = ",
                      m.workers(), " workers) brings the peer to ", total, " workers, more than the ",
                      config_.max_workers, " it has (--workers)"));
    meshes_.push_back(m);
  }
  const bool uniform = std::all_of(meshes_.begin(), meshes_.end(), [&](const StageMesh& m) { return m == meshes_[0]; });
  if (config_.vocab_parallel != VocabParallel::kNone && (!uniform || meshes_[0].tp != 1))
    throw Error(ErrorKind::kInvalidArgument,
                str("--vocab-parallel ", to_string(config_.vocab_parallel),
                    " needs every stage on the same sequence ranks and no tensor parallelism (the meshes are ",
                    to_string(meshes_), ")"));
  if (config_.links) {
    const LinkModel& l = *config_.links;
    if (!(l.between_bytes_per_s > 0) || !(l.within_bytes_per_s > 0) || !(l.latency_s >= 0))
      throw Error(ErrorKind::kInvalidArgument, "emulated links: bandwidths must be positive, the latency ≥ 0");
  }
}

void PipelineEngine::plan_boundaries(int microbatch) {
  if (boundaries_->microbatch == microbatch) return;
  boundaries_->exchanges.clear();
  boundaries_->microbatch = microbatch;
  const std::vector<std::int64_t> shape{microbatch, model_.config().tokens(), model_.config().d_model};
  auto ranks_of = [&](int p) {
    std::vector<int> ranks(static_cast<std::size_t>(meshes_[static_cast<std::size_t>(p)].workers()));
    std::iota(ranks.begin(), ranks.end(), first_worker_[static_cast<std::size_t>(p)]);
    return ranks;
  };
  auto add = [&](int from, int to) {
    if (from == to || boundaries_->exchanges.count({from, to})) return;
    const StageMesh &a = meshes_[static_cast<std::size_t>(from)], &b = meshes_[static_cast<std::size_t>(to)];
    boundaries_->exchanges.emplace(
        std::pair{from, to},
        plan_exchange(Mesh{{a.sp, a.tp}}, boundary_layout(a, config_.split), ranks_of(from), Mesh{{b.sp, b.tp}},
                      boundary_layout(b, config_.split), ranks_of(to), shape, config_.reshard));
  };
  // Activations forward from virtual stage k to k + 1, their gradients back.
  for (int k = 0; k + 1 < shape_.virtual_stages(); ++k) {
    add(shape_.stage_of(k), shape_.stage_of(k + 1));
    add(shape_.stage_of(k + 1), shape_.stage_of(k));
  }
}

PipelineEngine::Worker& PipelineEngine::worker(int stage, int sequence_rank, int tensor_rank) const {
  const StageMesh& m = meshes_[static_cast<std::size_t>(stage)];
  return *workers_[static_cast<std::size_t>(first_worker_[static_cast<std::size_t>(stage)] + sequence_rank * m.tp +
                                            tensor_rank)];
}

PipelineEngine::PipelineEngine(model::Transformer& model, EngineConfig config)
    : model_(model), config_(std::move(config)) {
  const int units = model_.num_units();
  const int tokens = model_.config().tokens();
  if (config_.pp < 1 || config_.pp > units)
    throw Error(ErrorKind::kInvalidArgument,
                str("--pp ", config_.pp, ": expected 1 to ", units, " stages (the model has ", units,
                    " units: embedding, ", model_.config().layers, " blocks, head)"));
  check_meshes();
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
  for (int p = 0; p < config_.pp; ++p) {
    const StageMesh& m = meshes_[static_cast<std::size_t>(p)];
    first_worker_.push_back(static_cast<int>(workers_.size()));
    for (int s = 0; s < m.sp; ++s)
      for (int t = 0; t < m.tp; ++t) {
        auto w = std::make_unique<Worker>();
        w->stage = p;
        w->rank = s;
        w->tp_rank = t;
        w->mesh = m;
        w->mesh_index = s * m.tp + t;
        w->index = static_cast<int>(workers_.size());
        w->data.positions = rank_positions(tokens, m.sp, s, config_.split);  // checked by check_meshes
        workers_.push_back(std::move(w));
      }
  }
  boundaries_ = std::make_unique<BoundaryPlans>();
}

PipelineEngine::~PipelineEngine() = default;

std::string PipelineEngine::describe_boundaries() const {
  std::string text;
  for (const auto& [pair, x] : boundaries_->exchanges) {
    const auto& [from, to] = pair;
    text += str("stage ", from, " (sp=", meshes_[static_cast<std::size_t>(from)].sp,
                ",tp=", meshes_[static_cast<std::size_t>(from)].tp, ") -> stage ", to,
                " (sp=", meshes_[static_cast<std::size_t>(to)].sp, ",tp=", meshes_[static_cast<std::size_t>(to)].tp,
                "), ", to_string(x.strategy), ", tensor [", x.shape[0], ", ", x.shape[1], ", ", x.shape[2], "]:\n",
                describe(x.schedule));
  }
  return text;
}

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

  const int P = config_.pp, M = config_.microbatches;
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
  plan_boundaries(batch.batch / M);
  StepShared shared(params, kept, config_, shape_, schedule_, first_units_, units, *boundaries_);
  shared.version = steps_;
  shared.carrying = carrying_;
  carrying_ = false;  // until this step has succeeded
  auto group = [&](int size, std::string name) {
    auto g = std::make_unique<comm::ThreadGroup>(size, std::move(name));
    shared.failure.watch(g->member(0));
    return g;
  };
  for (int p = 0; p < P; ++p) {
    const StageMesh& m = meshes_[static_cast<std::size_t>(p)];
    shared.stage_groups.push_back(m.workers() > 1 ? group(m.workers(), str("stage ", p, " group")) : nullptr);
    shared.sequence_groups.emplace_back();
    shared.tensor_groups.emplace_back();
    for (int t = 0; t < m.tp && m.sp > 1; ++t)
      shared.sequence_groups.back().push_back(group(m.sp, str("stage ", p, " tensor rank ", t, " sequence group")));
    for (int s = 0; s < m.sp && m.tp > 1; ++s)
      shared.tensor_groups.back().push_back(group(m.tp, str("stage ", p, " sequence rank ", s, " tensor group")));
  }
  if (P > 1) shared.fabric = group(static_cast<int>(workers_.size()), "pipeline fabric");
  if (P > 1 && config_.vocab_parallel != VocabParallel::kNone)
    for (int s = 0; s < meshes_[0].sp; ++s)
      shared.pipeline_groups.push_back(group(P, str("sequence rank ", s, " pipeline group")));
  if (config_.links) {
    std::vector<int> mesh_of;
    for (const auto& w : workers_) mesh_of.push_back(w->stage);
    shared.links = std::make_unique<LinkEmulator>(*config_.links, std::move(mesh_of));
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

  // Sum the stages' ranges (after the all-reduce every worker of a stage holds the same);
  // only the tied embedding has two stages adding into it.
  std::fill(grads.begin(), grads.end(), 0.0f);
  for (int p = 0; p < P; ++p) {
    const Worker& w = worker(p, 0, 0);
    for (const auto& r : w.ranges)
      for (std::size_t k = r.offset; k < r.offset + r.size; ++k) grads[k] += w.grads[k];
  }
  // Each sequence rank reports its share of the loss (vit's ranks 1/sp of the pooled one);
  // the tensor ranks of a sequence rank all computed the same.
  double loss = 0;
  const int head_stage = shape_.stage_of(shape_.virtual_stages() - 1);  // P − 1, or 0 on a V
  for (int s = 0; s < meshes_[static_cast<std::size_t>(head_stage)].sp; ++s) loss += worker(head_stage, s, 0).loss;

  stats_ = StepStats{};
  stats_.loss = loss;
  for (int p = 0; p < P; ++p) {
    const auto& mine = worker(p, 0, 0).stashed;
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
  // The workers of stage p.
  auto stage_workers = [&](int p) {
    const auto first = workers_.begin() + first_worker_[static_cast<std::size_t>(p)];
    return std::span<const std::unique_ptr<Worker>>(&*first, static_cast<std::size_t>(meshes_[p].workers()));
  };
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
    for (const auto& r : worker(p, 0, 0).ranges) st.parameter_bytes += sizeof(float) * r.size;
    if (const int tp = meshes_[static_cast<std::size_t>(p)].tp; tp > 1)  // a tensor rank holds its shard of each block
      for (const auto& chunk : worker(p, 0, 0).chunks)
        for (int u = std::max(chunk.first_unit, 1); u < std::min(chunk.end_unit, units - 1); ++u)
          st.parameter_bytes -=
              sizeof(float) * (model_.unit_parameters(u).size - model::tensor_shard_floats(model_.config(), tp));
    const auto here = stage_workers(p);
    const double n = static_cast<double>(here.size());
    for (const auto& w : here) {
      st.busy_s += w->busy_s / n;
      st.busy_cpu_s += w->busy_cpu_s / n;
      st.wait_s += w->wait_s / n;
      st.reduce_s += w->reduce_s / n;
      st.peak_activation_bytes = std::max(st.peak_activation_bytes, w->peak_bytes);
      st.peak_in_flight = std::max(st.peak_in_flight, w->peak_in_flight);
      st.peak_output_states = std::max(st.peak_output_states, w->peak_outputs_held);
    }
    // Idle includes the fill before a stage's first input and the drain after its last
    // pass, which no receive measures but the theoretical bubble counts.
    st.idle_s = std::max(0.0, stats_.pipeline_s - st.busy_s);
    stats_.measured_bubble += st.bubble() / P;
  }
  const auto replay = replay_schedule(shape_, schedule_, [&](int stage, const PipelineOp& op) {
    double slowest = 0;  // the workers of a stage wait for each other in their collectives
    for (const auto& w : stage_workers(stage))
      slowest = std::max(slowest, w->pass_cpu_s[pass_index(op, shape_.chunks(), M)]);
    return slowest;
  });
  stats_.replayed_bubble = replay.span_bubble;
  stats_.replayed_step_s = replay.makespan_s;
  stats_.step_s = seconds_between(step_start, Clock::now());
  return static_cast<float>(loss);
}

}  // namespace peertrain::parallel
