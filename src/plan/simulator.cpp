// The step-time simulator; see simulator.h.
#include "peertrain/plan/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "peertrain/core/error.h"
#include "peertrain/model/tensor_shard.h"
#include "peertrain/model/transformer_layout.h"
#include "peertrain/parallel/partitioner.h"
#include "peertrain/parallel/reshard.h"
#include "peertrain/parallel/ring_attention.h"
#include "peertrain/parallel/schedule.h"

namespace peertrain::plan {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

UnitKind kind_of(int unit, int units) {
  return unit == 0 ? UnitKind::kEmbedding : unit + 1 == units ? UnitKind::kHead : UnitKind::kBlock;
}

// build_schedule is a pure function of the shape, and the greedy generators (ZB-H2, the V
// schedules) try dozens of orderings: a search asks for the same few shapes many times.
const std::vector<std::vector<parallel::PipelineOp>>& schedule_of(const parallel::ScheduleShape& shape) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, int, int>, std::vector<std::vector<parallel::PipelineOp>>> built;
  const auto key = std::tuple{static_cast<int>(shape.schedule), shape.stages, shape.microbatches, shape.interleave,
                              shape.output_barriers};
  std::lock_guard lock(mutex);
  auto it = built.find(key);
  if (it == built.end()) it = built.emplace(key, parallel::build_schedule(shape)).first;
  return it->second;
}

}  // namespace

std::string Strategy::describe() const {
  const auto& e = engine;
  // Stage meshes name their resharding too: strategies that differ only in it are
  // different rows of a search, and would otherwise read alike.
  std::string mesh = e.stage_meshes.empty()
                         ? str("sp", e.sp, " tp", e.tp)
                         : str("meshes ", parallel::to_string(e.stage_meshes), " ", parallel::to_string(e.reshard));
  return str(mesh, " pp", e.pp, " m", e.microbatches, " ", parallel::to_string(e.schedule),
             e.schedule == parallel::Schedule::kInterleaved ? str(" v", e.chunks) : "",
             e.vocab_parallel != parallel::VocabParallel::kNone ? str(" ", parallel::to_string(e.vocab_parallel)) : "");
}

std::vector<std::string> Strategy::flags() const {
  const auto& e = engine;
  std::vector<std::string> f;
  if (e.stage_meshes.empty()) {
    f.insert(f.end(), {"--sp", str(e.sp), "--tp", str(e.tp)});
  } else {
    f.insert(f.end(), {"--stage-mesh", parallel::to_string(e.stage_meshes), "--reshard",
                       std::string(parallel::to_string(e.reshard))});
  }
  f.insert(f.end(), {"--pp", str(e.pp), "--microbatches", str(e.microbatches), "--schedule",
                     std::string(parallel::to_string(e.schedule))});
  if (e.schedule == parallel::Schedule::kInterleaved) f.insert(f.end(), {"--chunks", str(e.chunks)});
  if (e.vocab_parallel != parallel::VocabParallel::kNone)
    f.insert(f.end(), {"--vocab-parallel", std::string(parallel::to_string(e.vocab_parallel))});
  return f;
}

double Prediction::peak_bytes() const {
  return worker_bytes.empty() ? 0 : *std::max_element(worker_bytes.begin(), worker_bytes.end());
}

Prediction simulate(const model::TransformerConfig& config, const Strategy& strategy, Profiler& profiler,
                    const SimulationOptions& options) {
  Prediction out;
  auto refuse = [&](std::string why) {
    out.feasible = false;
    out.why_not = std::move(why);
    return out;
  };
  const parallel::EngineConfig& e = strategy.engine;
  if (e.microbatches < 1 || strategy.batch % e.microbatches != 0)
    return refuse(str("--microbatches ", e.microbatches, " does not divide the batch of ", strategy.batch));
  // The model's layout, kept per configuration (building it each time would cost more than
  // the rest of a simulation).
  static std::mutex models_mutex;
  static std::map<std::string, std::unique_ptr<model::Transformer>> models;
  model::Transformer* built = nullptr;
  {
    const std::string key = str(model_key(config), " L", config.layers);
    std::lock_guard lock(models_mutex);
    auto& slot = models[key];
    if (!slot) slot = std::make_unique<model::Transformer>(config);
    built = slot.get();
  }
  model::Transformer& model = *built;
  const auto& c = model.config();
  // What the engine would refuse, with its words: the engine's constructor checks it all,
  // but also builds the schedule, so its verdict is kept per configuration.
  std::vector<parallel::StageMesh> meshes;
  {
    static std::mutex mutex;
    static std::map<std::vector<int>, std::pair<std::string, std::vector<parallel::StageMesh>>> verdicts;
    std::vector<int> key{static_cast<int>(c.kind),
                         c.d_model,
                         c.heads,
                         c.layers,
                         c.tokens(),
                         c.vocab,
                         c.classes,
                         c.tied_head,
                         c.mlp_ratio,
                         e.sp,
                         e.tp,
                         e.pp,
                         e.microbatches,
                         static_cast<int>(e.schedule),
                         e.chunks,
                         static_cast<int>(e.split),
                         e.max_workers,
                         static_cast<int>(e.vocab_parallel)};
    for (const auto& m : e.stage_meshes) key.insert(key.end(), {m.sp, m.tp});
    key.push_back(-1);
    key.insert(key.end(), e.stage_first_units.begin(), e.stage_first_units.end());
    std::unique_lock lock(mutex);
    auto it = verdicts.find(key);
    if (it == verdicts.end()) {
      lock.unlock();
      std::pair<std::string, std::vector<parallel::StageMesh>> verdict;
      try {
        parallel::PipelineEngine probe(model, e);
        verdict.second = probe.meshes();
      } catch (const Error& err) {
        verdict.first = err.what();
      }
      lock.lock();
      it = verdicts.emplace(key, std::move(verdict)).first;
    }
    if (!it->second.first.empty()) return refuse(it->second.first);
    meshes = it->second.second;
  }
  const int P = e.pp, M = e.microbatches, b = strategy.batch / M, units = model.num_units();
  const int barriers = parallel::output_barriers(e.vocab_parallel);  // 0: no vocabulary parallelism
  const parallel::ScheduleShape shape{
      .schedule = e.schedule, .stages = P, .microbatches = M, .interleave = e.chunks, .output_barriers = barriers};
  const int V = shape.virtual_stages();
  const auto& ops = schedule_of(shape);
  const bool split_backward = shape.split_backward();

  // Each stage's unit costs on its mesh (under vocabulary parallelism the embedding and the
  // head without the vocabulary, and the stage's share of the output layer).
  std::vector<std::vector<UnitCost>> cost(static_cast<std::size_t>(P));
  for (int p = 0; p < P; ++p)
    for (UnitKind kind : {UnitKind::kEmbedding, UnitKind::kBlock, UnitKind::kHead, UnitKind::kVocabOutput}) {
      if (kind == UnitKind::kVocabOutput && barriers == 0) continue;
      // A block is the same with or without the vocabulary's split; the embedding and the
      // head only leave the vocabulary out (any mode); the output shard depends on both.
      const bool output = kind == UnitKind::kVocabOutput, block = kind == UnitKind::kBlock;
      cost[static_cast<std::size_t>(p)].push_back(profiler.unit(c, {.unit = kind,
                                                                    .microbatch = b,
                                                                    .sp = meshes[p].sp,
                                                                    .tp = meshes[p].tp,
                                                                    .split = e.split,
                                                                    .solo = e.workers() == 1,
                                                                    .vocab_parallel = block    ? 0
                                                                                      : output ? barriers
                                                                                               : std::min(barriers, 1),
                                                                    .vocab_ranks = output ? P : 1}));
    }
  auto unit_cost = [&](int stage, int unit) -> const UnitCost& {
    return cost[static_cast<std::size_t>(stage)][static_cast<std::size_t>(kind_of(unit, units))];
  };
  // The stage boundaries: given, or balanced on stage 0's costs, as the engine's plan() does.
  out.first_units = e.stage_first_units;
  if (out.first_units.empty()) {
    std::vector<double> costs;
    for (int u = 0; u < units; ++u) costs.push_back(unit_cost(0, u).forward_s + unit_cost(0, u).backward_s);
    out.first_units = V == 1 ? std::vector<int>{0} : parallel::partition(costs, V);
  }
  auto units_of = [&](int k) {
    return std::pair{out.first_units[static_cast<std::size_t>(k)],
                     k + 1 < V ? out.first_units[static_cast<std::size_t>(k) + 1] : units};
  };
  // Each virtual stage's passes and what one micro-batch leaves in its memory.
  struct Chunk {
    double forward = 0, backward = 0, input = 0, weight = 0, activations = 0, stash = 0;
    double forward_cpu = 0, backward_cpu = 0, input_cpu = 0, weight_cpu = 0;
    int blocks = 0;
  };
  std::vector<Chunk> chunk(static_cast<std::size_t>(V));
  for (int k = 0; k < V; ++k) {
    const int p = shape.stage_of(k);
    auto [first, end] = units_of(k);
    Chunk& ch = chunk[static_cast<std::size_t>(k)];
    for (int u = first; u < end; ++u) {
      const UnitCost& uc = unit_cost(p, u);
      ch.blocks += kind_of(u, units) == UnitKind::kBlock;
      ch.forward += uc.forward_s;
      ch.backward += uc.backward_s;
      ch.input += uc.backward_input_s;
      ch.weight += uc.backward_weight_s;
      ch.forward_cpu += uc.forward_cpu_s;
      ch.backward_cpu += uc.backward_cpu_s;
      ch.input_cpu += uc.backward_input_cpu_s;
      ch.weight_cpu += uc.backward_weight_cpu_s;
      ch.activations += uc.activation_bytes;
      ch.stash += uc.stash_bytes;
    }
  }
  // A pass: one worker's CPU time, and its wall time with the mesh alone.
  auto output_cost = [&](int stage) -> const UnitCost& {
    return cost[static_cast<std::size_t>(stage)][static_cast<std::size_t>(UnitKind::kVocabOutput)];
  };
  auto pass_cost = [&](const parallel::PipelineOp& op, int stage) {
    if (op.kind == parallel::PassKind::kOutputS)
      return std::pair{output_cost(stage).forward_cpu_s, output_cost(stage).forward_s};
    if (op.kind == parallel::PassKind::kOutputT)
      return std::pair{output_cost(stage).backward_cpu_s, output_cost(stage).backward_s};
    const Chunk& ch = chunk[static_cast<std::size_t>(shape.virtual_stage(stage, op.chunk))];
    switch (op.kind) {
      case parallel::PassKind::kForward:
        return std::pair{ch.forward_cpu, ch.forward};
      case parallel::PassKind::kBackward:
        return split_backward ? std::pair{ch.input_cpu, ch.input} : std::pair{ch.backward_cpu, ch.backward};
      default:
        return std::pair{ch.weight_cpu, ch.weight};
    }
  };

  // The boundary tensors' time from one stage's mesh to another's.
  const MachineCosts& machine = profiler.machine();
  const int cores = options.cores > 0 ? options.cores : machine.cores;
  // More workers than cores: each pass of the pipeline's chain (a forward or a backward, the
  // passes whose input another stage hands over) pays the calibrated cost of a hand-off;
  // a W, S or T pass works on what its own stage holds and does not. (Charging only the
  // passes whose thread had slept for its input measured worse: GPipe's forwards, mostly
  // queued, came out 25 % low while 1F1B held, docs/plan.md.) That cost is CPU work, done
  // on a shared core like the pass's own: the switch to the woken thread and the caches
  // it refills. Charged instead as a wait that left the cores to others, it would
  // cost only where a core would otherwise idle, so the fit swung with the calibration's
  // noise, and it charged GPipe's queued forwards, whose cores stay busy, more than
  // 1F1B's (GPipe +12…17 % against 1F1B's −1…+6 % in five runs side by side).
  // A mesh with more ranks than cores waits again at each hand-off between its ranks inside
  // a pass, as its ranks can never all run at once: each hop of the ring attention (sp − 1
  // for every unit the ring carries in a block forward, sp backward) and each
  // all-reduce (2 a block each way); a smaller mesh's ranks can, and the scheduler keeps
  // them running through their exchanges.
  Contention contention;
  if (options.contention && options.cores <= 0 && e.workers() > cores)
    contention = options.contention_costs ? *options.contention_costs
                                          : contention_costs(profiler, e.workers(), c, strategy.batch);
  auto contention_s = [&](const parallel::PipelineOp& op, int stage) {
    // The passes through the blocks' exchanges: forward and backward (or B); not W, nor
    // the output layer's S and T.
    const bool exchanges = op.kind == parallel::PassKind::kForward || op.kind == parallel::PassKind::kBackward;
    const auto& m = meshes[static_cast<std::size_t>(stage)];
    int per_block = 0;
    if (exchanges && m.workers() > cores) {
      const bool forward = op.kind == parallel::PassKind::kForward;
      if (m.sp > 1 && e.ring == parallel::RingMode::kOnlineSoftmax) {
        // The ring's units (a block of a sequence and head's keys, or whole heads that fit
        // one: parallel/ring_attention.h): sp − 1 hops forward; backward their dK and dV
        // sums wait at every hop, and once more on their way home.
        const model::AttentionShape local{.batch = b, .heads = c.heads / m.tp, .tokens = c.tokens() / m.sp};
        per_block =
            parallel::RingAttention::ring_units(local, parallel::kDefaultRingBlockTokens) * (forward ? m.sp - 1 : m.sp);
      } else if (m.sp > 1) {
        // Ring Self-Attention: the keys' and values' passes forward; backward three, two
        // of them carrying sums home.
        per_block = forward ? 2 * (m.sp - 1) : 3 * (m.sp - 1) + 2;
      }
      per_block += m.tp > 1 ? 2 : 0;
    }
    const int blocks = per_block > 0 ? chunk[static_cast<std::size_t>(shape.virtual_stage(stage, op.chunk))].blocks : 0;
    return std::pair{exchanges ? contention.pass_s : 0.0, contention.sync_s * per_block * blocks};
  };
  const std::vector<std::int64_t> tensor{b, c.tokens(), c.d_model};
  auto plan_transfer = [&](int from, int to) {
    const auto& a = meshes[static_cast<std::size_t>(from)];
    const auto& d = meshes[static_cast<std::size_t>(to)];
    const double tile_bytes = 4.0 * b * (c.tokens() / d.sp) * c.d_model;
    const parallel::Mesh source{{a.sp, a.tp}}, destination{{d.sp, d.tp}};
    const auto tasks = parallel::plan_reshard(source, parallel::boundary_layout(a, e.split), destination,
                                              parallel::boundary_layout(d, e.split), tensor);
    const auto schedule = parallel::schedule_reshard(tasks, e.reshard, source.workers(), destination.workers());
    // The engine's copies: pack, into the outgoing parcel, across, unpack.
    double seconds = 4 * tile_bytes / machine.copy_bytes_per_s;
    if (e.links) {
      seconds += parallel::reshard_cost(tasks, schedule, *e.links).seconds;
    } else {
      int messages = 0;
      for (const auto& t : schedule.transfers) messages += static_cast<int>(t.receivers.size() + t.group.size());
      seconds += machine.message_s * std::max(1.0, static_cast<double>(messages) / destination.workers());
    }
    return seconds;
  };
  // Kept per (meshes, tensor, strategy, links): planning a reshard costs more than the rest.
  auto transfer = [&](int from, int to) {
    static std::mutex mutex;
    static std::map<std::vector<double>, double> planned;
    const auto& a = meshes[static_cast<std::size_t>(from)];
    const auto& d = meshes[static_cast<std::size_t>(to)];
    const auto& l = e.links ? *e.links : parallel::LinkModel{};
    const std::vector<double> key{double(a.sp),
                                  double(a.tp),
                                  double(d.sp),
                                  double(d.tp),
                                  double(b),
                                  double(c.tokens()),
                                  double(c.d_model),
                                  double(static_cast<int>(e.reshard)),
                                  double(static_cast<int>(e.split)),
                                  e.links ? 1.0 : 0.0,
                                  l.between_bytes_per_s,
                                  l.within_bytes_per_s,
                                  l.latency_s,
                                  machine.copy_bytes_per_s,
                                  machine.message_s};
    {
      std::lock_guard lock(mutex);
      if (auto it = planned.find(key); it != planned.end()) return it->second;
    }
    const double seconds = plan_transfer(from, to);
    std::lock_guard lock(mutex);
    return planned[key] = seconds;
  };
  std::vector<std::vector<double>> delay(static_cast<std::size_t>(P),
                                         std::vector<double>(static_cast<std::size_t>(P), 0));
  for (int k = 0; k + 1 < V; ++k) {
    const int a = shape.stage_of(k), d = shape.stage_of(k + 1);
    if (a == d) continue;
    delay[a][d] = transfer(a, d);
    delay[d][a] = transfer(d, a);
    out.transfer_s = std::max({out.transfer_s, delay[a][d], delay[d][a]});
  }

  // Vocabulary parallelism: the head stage sends each micro-batch's y to every other stage
  // for its S; every S, and vocab-2's T, ends in a barrier of all the stages (a pipeline
  // group per sequence rank): an all-gather of the statistics (vocab-1: with the
  // unnormalised input gradients, 2d + 3 floats a column from each stage), vocab-2's T an
  // all-reduce of dy.
  const int head_stage = shape.stage_of(V - 1);
  const double columns = static_cast<double>(b) * (c.tokens() / std::max(1, meshes[0].sp));
  const double y_delay = machine.message_s + 4.0 * columns * c.d_model / machine.copy_bytes_per_s;
  auto gather_s = [&](double floats_per_stage) {
    return (P - 1) * (machine.message_s + 4.0 * floats_per_stage / machine.copy_bytes_per_s);
  };
  // Beyond the bytes, a barrier of all the engine's threads costs what the machine's does
  // (measured: a scheduler's wake-up once they outnumber the cores).
  const double meet_s = barriers > 0 ? profiler.barrier_s(e.workers()) : 0.0;
  const double s_barrier_s =
      meet_s + (barriers == 1 ? gather_s(columns * (2.0 * c.d_model + 3)) : gather_s(columns * 3));
  const double t_barrier_s = meet_s + 2.0 * (P - 1) * machine.message_s +
                             2.0 * (P - 1) / P * 4.0 * columns * c.d_model / machine.copy_bytes_per_s;
  std::vector<double> s_done(static_cast<std::size_t>(M), kNever), t_done = s_done;
  std::vector<int> s_arrived(static_cast<std::size_t>(M), 0), t_arrived = s_arrived;
  auto has_barrier = [&](const parallel::PipelineOp& op) {
    return (op.kind == parallel::PassKind::kOutputS && barriers > 0) ||
           (op.kind == parallel::PassKind::kOutputT && barriers == 2);
  };

  // The replay: every stage runs its list in order; a pass starts once its inputs are there.
  // A pass is its CPU work, which the runnable stages' threads share the cores for, then
  // the rest of its wall time alone (its collectives' waits), which leaves them to others.
  std::vector<std::vector<double>> forward_done(static_cast<std::size_t>(V), std::vector<double>(M, kNever)),
      backward_done = forward_done;
  std::vector<std::size_t> next(static_cast<std::size_t>(P), 0);
  std::vector<double> cpu_left(static_cast<std::size_t>(P), 0), wait_left(static_cast<std::size_t>(P), 0),
      running_wall(static_cast<std::size_t>(P), 0), work(static_cast<std::size_t>(P), 0);
  // kBarrier: a pass's work done, waiting for every stage to reach the same barrier.
  enum Phase : char { kIdle, kComputing, kWaiting, kBarrier };
  std::vector<Phase> phase(static_cast<std::size_t>(P), kIdle);
  std::vector<char> released(static_cast<std::size_t>(P), 0);  // past its barrier, paying its messages
  auto ready_at = [&](int p, const parallel::PipelineOp& op) {
    if (op.carried) return 0.0;  // PipeDream: its input came in the step before
    const int k = shape.virtual_stage(p, op.chunk), i = op.microbatch;
    switch (op.kind) {
      case parallel::PassKind::kForward:
        return k == 0 ? 0.0 : forward_done[k - 1][i] + delay[shape.stage_of(k - 1)][p];
      case parallel::PassKind::kBackward:
        if (k + 1 < V) return backward_done[k + 1][i] + delay[shape.stage_of(k + 1)][p];
        return barriers == 0 ? forward_done[k][i] : barriers == 1 ? s_done[i] : t_done[i];  // dy
      case parallel::PassKind::kOutputS:
        return forward_done[V - 1][i] + (p == head_stage ? 0.0 : y_delay);
      case parallel::PassKind::kOutputT:
        return s_done[i];
      default:
        return backward_done[k][i];
    }
  };
  double now = 0;
  for (;;) {
    double wake = kNever;
    bool all_done = true;
    for (int p = 0; p < P; ++p) {
      const auto& list = ops[static_cast<std::size_t>(p)];
      if (next[p] >= list.size()) continue;
      all_done = false;
      if (phase[p] != kIdle) continue;
      const double ready = ready_at(p, list[next[p]]);
      if (ready <= now + 1e-15) {
        const auto [cpu, wall] = pass_cost(list[next[p]], p);
        const int w = meshes[p].workers();
        phase[p] = kComputing;
        const auto [handoff_cpu, handoff_wait] = contention_s(list[next[p]], p);
        cpu_left[p] = cpu + handoff_cpu;
        wait_left[p] = std::max(0.0, wall - cpu * w / std::min(w, cores)) + machine.pass_overhead_s + handoff_wait;
        work[p] += wall;
      } else {
        wake = std::min(wake, ready);
      }
    }
    if (all_done) break;
    int threads = 0;
    for (int p = 0; p < P; ++p)
      if (phase[p] == kComputing) threads += meshes[p].workers();
    // Each computing thread gets a share of the cores, at the speed of that many computing
    // at once.
    const double share = threads > 0 ? std::min(1.0, static_cast<double>(cores) / threads) : 1.0;
    // A stage's profile was measured with its own mesh's threads at once, so it carries
    // that many's slowdown already.
    auto speed = [&](int p) {
      return share * machine.slowdown_at(meshes[p].workers()) / machine.slowdown_at(std::max(threads, 1));
    };
    double until = wake;
    bool any = false;
    for (int p = 0; p < P; ++p) {
      if (phase[p] == kComputing) until = std::min(until, now + cpu_left[p] / speed(p));
      if (phase[p] == kWaiting) until = std::min(until, now + wait_left[p]);
      any = any || phase[p] == kComputing || phase[p] == kWaiting;
    }
    if (!any) {
      PEERTRAIN_CHECK(wake < kNever, "simulator: ", strategy.describe(), " stalls");
      now = wake;
      continue;
    }
    for (int p = 0; p < P; ++p) {
      if (phase[p] == kIdle || phase[p] == kBarrier) continue;
      running_wall[p] += until - now;
      if (phase[p] == kComputing) {
        cpu_left[p] -= (until - now) * speed(p);
        if (cpu_left[p] > 1e-12) continue;
        phase[p] = kWaiting;
      } else {
        wait_left[p] -= until - now;
      }
      if (phase[p] != kWaiting || wait_left[p] > 1e-12) continue;
      const auto& op = ops[static_cast<std::size_t>(p)][next[p]];
      if (has_barrier(op) && !released[p]) {
        phase[p] = kBarrier;
        ++(op.kind == parallel::PassKind::kOutputS ? s_arrived : t_arrived)[static_cast<std::size_t>(op.microbatch)];
        continue;
      }
      released[p] = 0;
      const int k = shape.virtual_stage(p, op.chunk);
      if (!op.carried) {
        if (op.kind == parallel::PassKind::kForward) forward_done[k][op.microbatch] = until;
        if (op.kind == parallel::PassKind::kBackward) backward_done[k][op.microbatch] = until;
      }
      if (op.kind == parallel::PassKind::kOutputS) s_done[static_cast<std::size_t>(op.microbatch)] = until;
      if (op.kind == parallel::PassKind::kOutputT) t_done[static_cast<std::size_t>(op.microbatch)] = until;
      phase[p] = kIdle;
      ++next[p];
    }
    // A barrier every stage has reached lets them all go, after its messages.
    for (int p = 0; p < P; ++p) {
      if (phase[p] != kBarrier) continue;
      const auto& op = ops[static_cast<std::size_t>(p)][next[p]];
      const bool s_pass = op.kind == parallel::PassKind::kOutputS;
      if ((s_pass ? s_arrived : t_arrived)[static_cast<std::size_t>(op.microbatch)] < P) continue;
      phase[p] = kWaiting;
      wait_left[p] = s_pass ? s_barrier_s : t_barrier_s;
      released[p] = 1;
    }
    now = until;
  }
  out.passes_s = now;
  for (int p = 0; p < P; ++p) {
    out.compute_s = std::max(out.compute_s, work[p]);
    out.bubble += (now > 0 ? 1 - running_wall[p] / now : 0) / P;
  }

  // Parameters each worker holds (a tensor rank: its shard of each block) and the stages'
  // gradient all-reduce, which covers the full ranges of its units.
  const int workers = e.workers();
  const double vocab_floats = static_cast<double>(c.vocab) * c.d_model;  // one V × d matrix
  double assembly_floats = 0;
  for (int p = 0; p < P; ++p) {
    const auto& m = meshes[static_cast<std::size_t>(p)];
    double floats = 0, reduced = 0;
    for (int ch = 0; ch < shape.chunks(); ++ch) {
      auto [first, end] = units_of(shape.virtual_stage(p, ch));
      for (int u = first; u < end; ++u) {
        const double whole = static_cast<double>(model.unit_parameters(u).size);
        reduced += whole;
        floats += u > 0 && u + 1 < units && m.tp > 1 ? static_cast<double>(model::tensor_shard_floats(c, m.tp)) : whole;
        // Under vocabulary parallelism the vocabulary's rows leave the embedding and the head
        // (shared evenly below); without it a tied head keeps a copy of the embedding.
        if (barriers > 0 && (u == 0 || (u + 1 == units && !c.tied_head))) {
          floats -= vocab_floats;
          reduced -= vocab_floats;
        }
        if (u + 1 == units && c.tied_head && first > 0 && barriers == 0) floats += model.unit_parameters(0).size;
      }
    }
    if (barriers > 0) {
      floats += (c.tied_head ? 1 : 2) * vocab_floats / P;
      reduced += (c.tied_head ? 1 : 2) * vocab_floats / P;
    }
    assembly_floats += reduced;
    const int k = m.workers();
    if (k > 1)
      out.reduce_s = std::max(
          out.reduce_s, 2.0 * (k - 1) / k * 4 * reduced / machine.copy_bytes_per_s + 2.0 * (k - 1) * machine.message_s);
    // Peak activations over its list: a forward adds its micro-batch's, B its stash, and the
    // last backward pass of a micro-batch (W when split) frees both.
    double held = 0, peak = 0;
    for (const auto& op : ops[static_cast<std::size_t>(p)])
      if (op.carried && (op.kind == parallel::PassKind::kBackward))
        held += chunk[shape.virtual_stage(p, op.chunk)].activations;
    peak = held;
    for (const auto& op : ops[static_cast<std::size_t>(p)]) {
      const Chunk& ch = chunk[static_cast<std::size_t>(shape.virtual_stage(p, op.chunk))];
      if (op.kind == parallel::PassKind::kForward) held += ch.activations;
      if (op.kind == parallel::PassKind::kBackward) held += split_backward ? ch.stash : -ch.activations;
      if (op.kind == parallel::PassKind::kWeight) held -= ch.activations + ch.stash;
      if (op.kind == parallel::PassKind::kOutputS) held += output_cost(p).activation_bytes;
      if (op.kind == parallel::PassKind::kOutputT) held -= output_cost(p).activation_bytes;
      peak = std::max(peak, held);
    }
    out.worker_bytes.push_back(options.parameter_copies * 4.0 * floats + peak);
  }
  out.reduce_s *= std::max(1.0, static_cast<double>(workers) / cores);  // the stages reduce at once
  out.overhead_s = profiler.step_overhead_s(workers) + 2 * 4 * assembly_floats / machine.copy_bytes_per_s;
  // Vocabulary parallelism's token vectors: every stage looks up its rows and sends them to
  // stage 0 before the passes, and gets the gradient back after.
  if (barriers > 0) out.overhead_s += 2.0 * M * machine.message_s;
  out.step_s = out.overhead_s + out.passes_s + out.reduce_s;
  if (options.memory_cap_bytes > 0)
    for (int p = 0; p < P; ++p)
      if (out.worker_bytes[p] > options.memory_cap_bytes)
        return refuse(str("does not fit: stage ", p, "'s workers need ",
                          static_cast<long long>(out.worker_bytes[p] / (1 << 20)), " MiB each, the cap is ",
                          static_cast<long long>(options.memory_cap_bytes / (1 << 20)), " MiB"));
  return out;
}

std::string contention_key(const model::TransformerConfig& c, int workers, int batch) {
  return str(workers, " workers: ", model_key(c), " L", c.layers, " batch ", batch);
}

Contention contention_costs(Profiler& profiler, int workers, const model::TransformerConfig& planned, int batch) {
  if (workers <= profiler.machine().cores) return {};
  // Calibrated at the planned model's own shape: the wait for a core at a hand-off grows
  // with the passes the other threads are in, so costs fitted on a smaller model's shorter
  // passes under-charge a larger one's (docs/plan.md, Contention).
  model::TransformerConfig c = planned;
  c.layers = std::max(c.layers, workers - 2);                            // a unit per stage at least
  batch = 2 * workers * std::max(1, (batch + workers) / (2 * workers));  // 2W micro-batches
  Strategy pipeline;
  pipeline.engine.pp = workers;
  pipeline.engine.microbatches = 2 * workers;
  Strategy mesh;
  mesh.engine.sp = workers;
  // Kept under the planned model's key, whichever model calibrated it: the engine's check
  // below builds the model and two engines, too much for every simulation of a search.
  const std::string planned_key = contention_key(c, workers, batch);
  if (const Contention* known = profiler.contention(planned_key)) return *known;
  // Both calibration strategies as the engine would take them (its constructor is the check).
  auto engine_runs = [&] {
    try {
      model::Transformer model(c);
      for (const Strategy* s : {&pipeline, &mesh}) parallel::PipelineEngine probe(model, s->engine);
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  if (c.tokens() % workers != 0 || !engine_runs()) {
    // No mesh of W sequence ranks, or no W stages, of this model: the small stand-in.
    c = model::TransformerConfig{};
    c.d_model = 64;
    c.heads = 2;
    c.layers = std::max(2, workers);
    c.seq = 32 * workers;
    batch = 2 * workers;
  }
  pipeline.batch = mesh.batch = batch;
  const std::string key = contention_key(c, workers, batch);
  if (const Contention* known = profiler.contention(key)) {
    profiler.set_contention(planned_key, *known);
    return *known;
  }
  // The two strategies' units and their engine steps measured in the same rounds, so that
  // the costs fitted below compare figures of the same spells of the machine's speed: a
  // step measured once, in a slow second, put its whole difference from units measured
  // in a fast one into the hand-off costs (4 workers: 0.42 and 2.2 ms against 0.09 and 0.6
  // in the run before, and the 4-rank meshes predicted 50–90 % high).
  std::vector<double> pipeline_steps, mesh_steps;
  profiler.profile_together(
      [&] {
        for (const Strategy* s : {&pipeline, &mesh}) {
          const Prediction learn = simulate(c, *s, profiler);
          PEERTRAIN_CHECK(learn.feasible, "contention calibration: ", s->describe(), " cannot run: ", learn.why_not);
        }
      },
      [&](int, int, int) {
        pipeline_steps.push_back(measure_engine_step_s(c, pipeline.engine, batch, 3));
        mesh_steps.push_back(measure_engine_step_s(c, mesh.engine, batch, 3));
      });
  // The cost that makes strategy s replay in its measured step time, the other cost fixed:
  // the replay grows with it, so bisect (a simulation takes microseconds).
  auto fit = [&](const Strategy& s, double measured, Contention costs, double Contention::*cost) {
    SimulationOptions options{.contention = true, .contention_costs = &costs};
    double lo = 0, hi = std::max(1e-3, measured);
    for (int i = 0; i < 40; ++i) {
      costs.*cost = (lo + hi) / 2;
      (simulate(c, s, profiler, options).step_s < measured ? lo : hi) = costs.*cost;
    }
    return lo;
  };
  Contention costs;
  costs.pass_s = fit(pipeline, median(pipeline_steps), costs, &Contention::pass_s);
  costs.sync_s = fit(mesh, median(mesh_steps), costs, &Contention::sync_s);
  profiler.set_contention(key, costs);
  profiler.set_contention(planned_key, costs);
  return costs;
}

}  // namespace peertrain::plan
