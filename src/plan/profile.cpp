// Measuring what the simulator needs; see profile.h.
#include "peertrain/plan/profile.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "peertrain/comm/thread_group.h"
#include "peertrain/config.h"
#include "peertrain/core/aligned.h"
#include "peertrain/core/cache_dir.h"
#include "peertrain/core/error.h"
#include "peertrain/core/log.h"
#include "peertrain/core/rng.h"
#include "peertrain/model/batch_slice.h"
#include "peertrain/model/transformer_layout.h"
#include "peertrain/parallel/pipeline.h"
#include "peertrain/parallel/random_batch.h"
#include "peertrain/parallel/vocab_parallel.h"

namespace peertrain::plan {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

namespace {

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double wall_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown cpu";
}

// Vocabulary parallelism's output layer on one stage: its shard's S and T passes for one
// micro-batch (b × T / sp columns: a sequence rank's share), on one thread, in a group of
// one (the barriers' messages are the simulator's to add).
UnitCost measure_vocab_output_here(const model::TransformerConfig& config, const UnitShape& shape, int repetitions) {
#ifdef _OPENMP
  omp_set_num_threads(1);  // as the engine: one thread per worker (this thread's setting only)
#endif
  model::Transformer model(config);
  const auto& c = model.config();
  std::vector<float> params(model.num_parameters());
  model.initialize(params, 1);
  const auto mode = shape.vocab_parallel == 1 ? parallel::VocabParallel::kVocab1 : parallel::VocabParallel::kVocab2;
  const parallel::VocabShard shard = parallel::vocab_shard(c.vocab, shape.vocab_ranks, 0);
  const int d = c.d_model, n = shape.microbatch * (c.tokens() / shape.sp);
  Rng rng(13);
  AlignedVector<float> y(static_cast<std::size_t>(d) * n), dy(y.size());
  for (auto& x : y) x = static_cast<float>(rng.normal());
  std::vector<std::int32_t> targets(static_cast<std::size_t>(n));
  for (auto& t : targets) t = static_cast<std::int32_t>(rng.uniform_below(c.vocab));
  std::vector<float> grads(params.size(), 0.0f);
  const std::size_t w = c.tied_head ? model.layout().wte : model.layout().head_w;
  comm::ThreadGroup alone(1, "profile vocabulary group");
  // Four micro-batches' S, then their T, as the schedules place them; the first round warms up.
  constexpr int kInFlight = 4;
  std::vector<parallel::VocabOutputState> states(kInFlight);
  std::vector<double> s_times, t_times;
  UnitCost cost;
  for (int r = 0; r <= repetitions; ++r) {
    double s_sum = 0, t_sum = 0;
    for (auto& state : states) {
      const double start = thread_cpu_s();
      parallel::vocab_output_forward(alone.member(0), mode, shard, c.vocab, d, c.tied_head, params.data() + w, y.data(),
                                     n, targets, 1.0f / static_cast<float>(n), state,
                                     mode == parallel::VocabParallel::kVocab1 ? dy.data() : nullptr);
      s_sum += thread_cpu_s() - start;
    }
    for (auto& state : states) {
      const double start = thread_cpu_s();
      parallel::vocab_output_backward(alone.member(0), mode, shard, c.vocab, d, c.tied_head, params.data() + w, targets,
                                      1.0f / static_cast<float>(n), state,
                                      mode == parallel::VocabParallel::kVocab2 ? dy.data() : nullptr, grads.data() + w);
      t_sum += thread_cpu_s() - start;
    }
    cost.activation_bytes = static_cast<double>(states[0].bytes());
    if (r == 0) continue;
    s_times.push_back(s_sum / kInFlight);
    t_times.push_back(t_sum / kInFlight);
  }
  // One thread alone: its CPU time is its wall time, and the cleaner of the two here.
  cost.forward_s = cost.forward_cpu_s = median(s_times);
  cost.backward_s = cost.backward_cpu_s = median(t_times);
  return cost;
}

// On a thread of its own, so that the caller's OpenMP setting stays as it was.
UnitCost measure_vocab_output(const model::TransformerConfig& config, const UnitShape& shape, int repetitions) {
  UnitCost cost;
  std::exception_ptr failure;
  std::thread worker([&] {
    try {
      cost = measure_vocab_output_here(config, shape, repetitions);
    } catch (...) {
      failure = std::current_exception();
    }
  });
  worker.join();
  if (failure) std::rethrow_exception(failure);
  return cost;
}

// One unit's passes on sp × tp threads with real groups; the slowest worker's medians.
UnitCost measure_unit(const model::TransformerConfig& config, const UnitShape& shape, int repetitions) {
  if (shape.unit == UnitKind::kVocabOutput) return measure_vocab_output(config, shape, repetitions);
  model::Transformer model(config);
  const auto& c = model.config();
  std::vector<float> params(model.num_parameters());
  model.initialize(params, 1);
  Rng rng(7);
  const int b = shape.microbatch, T = c.tokens(), d = c.d_model;
  const parallel::RandomBatch data = parallel::random_batch(c, b, rng);
  std::vector<int> every(static_cast<std::size_t>(T));
  std::iota(every.begin(), every.end(), 0);
  const model::TokenBatch whole{.batch = b,
                                .tokens = T,
                                .positions = every,
                                .bytes = data.bytes,
                                .pixels = data.pixels,
                                .targets = data.targets,
                                .loss_divisor = static_cast<double>(b) * T};
  const int unit = shape.unit == UnitKind::kEmbedding ? 0 : shape.unit == UnitKind::kBlock ? 1 : model.num_units() - 1;
  const int W = shape.sp * shape.tp;
  std::vector<std::unique_ptr<comm::ThreadGroup>> sequence_groups, tensor_groups;
  for (int t = 0; t < shape.tp && shape.sp > 1; ++t)
    sequence_groups.push_back(std::make_unique<comm::ThreadGroup>(shape.sp, "profile sequence group"));
  for (int s = 0; s < shape.sp && shape.tp > 1; ++s)
    tensor_groups.push_back(std::make_unique<comm::ThreadGroup>(shape.tp, "profile tensor group"));
  std::vector<UnitCost> costs(static_cast<std::size_t>(W));
  std::barrier start_line(W);
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(W));
  auto work = [&](int s, int t) {
    try {
#ifdef _OPENMP
      if (!shape.solo) omp_set_num_threads(1);  // as the engine: one thread per worker
#endif
      std::vector<int> positions;
      if (shape.sp > 1) positions = parallel::sequence_positions(T, shape.sp, s, shape.split);
      model::BatchSlice slice;
      model::slice_batch(c, whole, 0, b, positions, slice);
      const model::TokenBatch& mine = slice.batch;
      std::optional<parallel::RingAttention> ring;
      model::UnitContext context;
      context.vocabulary_outside = shape.vocab_parallel > 0;
      if (shape.sp > 1) {
        context.sequence_group = &sequence_groups[static_cast<std::size_t>(t)]->member(s);
        ring.emplace(*context.sequence_group, parallel::RingMode::kOnlineSoftmax, 60.0);
        context.attention = &*ring;
      }
      if (shape.tp > 1) context.tensor_group = &tensor_groups[static_cast<std::size_t>(s)]->member(t);
      const std::size_t n = static_cast<std::size_t>(d) * mine.batch * mine.tokens;
      AlignedVector<float> in(n), out(n), dout(n), din(n);
      Rng data(11 + static_cast<std::uint64_t>(s * shape.tp + t));
      for (auto* v : {&in, &dout})
        for (auto& x : *v) x = static_cast<float>(data.normal());
      std::vector<float> grads(model.num_parameters(), 0.0f);
      // The head writes no output but its loss, unless the vocabulary is outside: then its y.
      const bool last = unit + 1 == model.num_units() && !context.vocabulary_outside;
      float* din_or_null = unit == 0 ? nullptr : din.data();
      // [pass][0: wall, 1: CPU] per repetition: forward, B, W, fused backward.
      std::vector<double> times[4][2];
      UnitCost& cost = costs[static_cast<std::size_t>(s * shape.tp + t)];
      // As in a pipeline, several micro-batches are in flight: forwards of kInFlight of them,
      // then their backwards, so that a backward reads activations the forwards after it
      // have pushed out of the caches. Averaged over them; the first round is a warm-up.
      constexpr int kInFlight = 4;
      std::vector<model::UnitActivations> saved(kInFlight), again(kInFlight);
      for (int r = 0; r <= repetitions; ++r) {
        double sum[4][2] = {};
        auto timed = [&](int pass, auto&& fn) {
          start_line.arrive_and_wait();  // every worker of the mesh starts the pass at once
          const double wall = wall_s(), cpu = thread_cpu_s();
          fn();
          sum[pass][0] += wall_s() - wall;
          sum[pass][1] += thread_cpu_s() - cpu;
        };
        for (auto& a : saved)
          timed(0, [&] { model.forward(unit, params, mine, in.data(), last ? nullptr : out.data(), a, context); });
        for (auto& a : saved) {
          timed(1, [&] { model.backward_input(unit, params, mine, dout.data(), din_or_null, a, context); });
          cost.stash_bytes = static_cast<double>(a.stash.size() * sizeof(float));
          timed(2, [&] { model.backward_weight(unit, params, mine, a, grads, context); });
        }
        for (auto& a : again) model.forward(unit, params, mine, in.data(), last ? nullptr : out.data(), a, context);
        for (auto& a : again)
          timed(3, [&] { model.backward(unit, params, mine, dout.data(), din_or_null, a, grads, context); });
        cost.activation_bytes = static_cast<double>(saved[0].activation_bytes());
        if (r == 0) continue;
        for (int pass = 0; pass < 4; ++pass)
          for (int k = 0; k < 2; ++k) times[pass][k].push_back(sum[pass][k] / kInFlight);
      }
      cost.forward_s = median(times[0][0]);
      cost.backward_input_s = median(times[1][0]);
      cost.backward_weight_s = median(times[2][0]);
      cost.backward_s = median(times[3][0]);
      // A lone worker's GEMMs run on every core: its CPU time is the wall time's.
      cost.forward_cpu_s = shape.solo ? cost.forward_s : median(times[0][1]);
      cost.backward_input_cpu_s = shape.solo ? cost.backward_input_s : median(times[1][1]);
      cost.backward_weight_cpu_s = shape.solo ? cost.backward_weight_s : median(times[2][1]);
      cost.backward_cpu_s = shape.solo ? cost.backward_s : median(times[3][1]);
    } catch (...) {
      failures[static_cast<std::size_t>(s * shape.tp + t)] = std::current_exception();
      for (auto& g : sequence_groups) g->member(0).abort("a profiling worker failed");
      for (auto& g : tensor_groups) g->member(0).abort("a profiling worker failed");
    }
  };
  std::vector<std::thread> threads;
  for (int s = 0; s < shape.sp; ++s)
    for (int t = 0; t < shape.tp; ++t) threads.emplace_back(work, s, t);
  for (auto& th : threads) th.join();
  for (auto& f : failures)
    if (f) std::rethrow_exception(f);
  UnitCost slowest;
  for (const UnitCost& k : costs) {
    slowest.forward_s = std::max(slowest.forward_s, k.forward_s);
    slowest.backward_s = std::max(slowest.backward_s, k.backward_s);
    slowest.backward_input_s = std::max(slowest.backward_input_s, k.backward_input_s);
    slowest.backward_weight_s = std::max(slowest.backward_weight_s, k.backward_weight_s);
    slowest.forward_cpu_s = std::max(slowest.forward_cpu_s, k.forward_cpu_s);
    slowest.backward_cpu_s = std::max(slowest.backward_cpu_s, k.backward_cpu_s);
    slowest.backward_input_cpu_s = std::max(slowest.backward_input_cpu_s, k.backward_input_cpu_s);
    slowest.backward_weight_cpu_s = std::max(slowest.backward_weight_cpu_s, k.backward_weight_cpu_s);
    slowest.activation_bytes = std::max(slowest.activation_bytes, k.activation_bytes);
    slowest.stash_bytes = std::max(slowest.stash_bytes, k.stash_bytes);
  }
  return slowest;
}

// The statistics of `steps` engine steps of model `c` on this batch.
std::vector<parallel::StepStats> engine_steps(const model::TransformerConfig& c, const parallel::EngineConfig& e,
                                              const parallel::GlobalBatch& global, int steps) {
  model::Transformer model(c);
  parallel::PipelineEngine engine(model, e);
  std::vector<float> params(model.num_parameters()), grads(params.size());
  model.initialize(params, 1);
  std::vector<parallel::StepStats> stats;
  for (int r = 0; r < steps; ++r) {
    engine.step(params, global, grads);
    stats.push_back(engine.last_stats());
  }
  return stats;
}

// Of a model too small to compute anything (one byte a token): what the engine costs
// around its passes.
std::vector<parallel::StepStats> idle_steps(const model::TransformerConfig& c, const parallel::EngineConfig& e,
                                            int batch, int steps) {
  const std::vector<std::int32_t> ones(static_cast<std::size_t>(batch) * c.seq, 1);
  parallel::GlobalBatch global;
  global.batch = batch;
  global.bytes = global.targets = ones;
  return engine_steps(c, e, global, steps);
}

}  // namespace

double measure_engine_step_s(const model::TransformerConfig& c, const parallel::EngineConfig& e, int batch, int steps) {
  Rng rng(17);
  const parallel::RandomBatch data = parallel::random_batch(c, batch, rng);
  const parallel::GlobalBatch global = parallel::global_batch(data, c, batch);
  const auto stats = engine_steps(c, e, global, steps + 1);
  std::vector<double> times;
  for (std::size_t r = 1; r < stats.size(); ++r) times.push_back(stats[r].step_s);  // the first plans and warms up
  return median(times);
}

namespace {

model::TransformerConfig idle_model(int layers, int seq) {
  model::TransformerConfig c;
  c.d_model = 8;
  c.heads = 1;
  c.layers = layers;
  c.seq = seq;
  c.vocab = 16;
  return c;
}

// A pass's cost beyond its units: 4 stages, 16 micro-batches of 1F1B, whose critical path
// is 2(m + p − 1) passes one after another.
double measure_pass_overhead() {
  parallel::EngineConfig e;
  e.pp = 4;
  e.microbatches = 16;
  e.stage_first_units = {0, 1, 2, 3};
  std::vector<double> per_pass;
  for (const auto& st : idle_steps(idle_model(2, 4), e, 16, 7))
    per_pass.push_back(st.pipeline_s / (2.0 * (16 + 4 - 1)));
  return median(per_pass);
}

MachineCosts measure_machine() {
  MachineCosts m;
  m.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // memcpy on buffers well beyond the caches.
  std::vector<char> a(64 << 20, 1), b(64 << 20, 0);
  std::vector<double> rates;
  for (int r = 0; r < 4; ++r) {
    const double t0 = wall_s();
    std::memcpy(b.data(), a.data(), a.size());
    rates.push_back(static_cast<double>(a.size()) / (wall_s() - t0));
  }
  m.copy_bytes_per_s = *std::max_element(rates.begin(), rates.end());
  // An empty message between two threads: half a ping-pong's round trip.
  comm::ThreadGroup pair(2, "profile ping-pong");
  constexpr int kTrips = 200;
  float token = 0;
  const double t0 = wall_s();
  std::thread other([&] {
    float x = 0;
    for (int i = 0; i < kTrips; ++i) {
      pair.member(1).recv(0, 0, {&x, 1});
      pair.member(1).send(0, 1, {&x, 1});
    }
  });
  for (int i = 0; i < kTrips; ++i) {
    pair.member(0).send(1, 0, {&token, 1});
    pair.member(0).recv(1, 1, {&token, 1});
  }
  other.join();
  m.message_s = (wall_s() - t0) / (2.0 * kTrips);
  // n threads running a transformer block's forward and backward at once, each its own, in
  // thread CPU time, against one alone: up to twice as many threads as cores, where they
  // time-share a core and evict each other's working set from its caches.
  auto block_cpu_s = [](int threads) {
    std::vector<double> per(static_cast<std::size_t>(threads));
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&per, t] {
#ifdef _OPENMP
        omp_set_num_threads(1);
#endif
        model::TransformerConfig c;
        c.d_model = 128;
        c.heads = 4;
        c.layers = 1;
        c.seq = 128;
        model::Transformer block(c);
        std::vector<float> params(block.num_parameters()), grads(params.size());
        block.initialize(params, 1);
        std::vector<int> positions(128);
        std::iota(positions.begin(), positions.end(), 0);
        std::vector<std::int32_t> ids(128, 1);
        const model::TokenBatch batch{.batch = 1,
                                      .tokens = 128,
                                      .positions = positions,
                                      .bytes = ids,
                                      .pixels = {},
                                      .targets = ids,
                                      .loss_divisor = 128};
        AlignedVector<float> x(128 * 128, 0.5f), y(x.size()), dx(x.size());
        model::UnitActivations saved;
        const double start = thread_cpu_s();
        for (int r = 0; r < 12; ++r) {
          block.forward(1, params, batch, x.data(), y.data(), saved, {});
          block.backward(1, params, batch, y.data(), dx.data(), saved, grads, {});
        }
        per[static_cast<std::size_t>(t)] = thread_cpu_s() - start;
      });
    for (auto& th : pool) th.join();
    return median(per);
  };
  // The host's speed drifts while this runs (on a shared host, other tenants' use of its
  // caches and memory): one measurement alone, taken once, set every ratio, and a slow
  // moment there or a fast one later skewed them all, by 24 % once. So each count is
  // measured in rounds, each beside a fresh measurement alone, and the median ratio kept.
  // Company cannot make a thread faster: a figure below 1 is this machine's noise.
  // Beyond 8 threads one round: a many-core machine would otherwise spend most of its
  // calibration here, and its per-thread noise averages over the threads anyway.
  constexpr int kRounds = 5;
  m.slowdown.push_back(1.0);
  for (int n = 2; n <= 2 * m.cores; ++n) {
    std::vector<double> ratios;
    for (int r = 0; r < (n <= 8 ? kRounds : 1); ++r) {
      const double alone = block_cpu_s(1);
      ratios.push_back(block_cpu_s(n) / alone);
    }
    m.slowdown.push_back(std::max(1.0, median(ratios)));
  }
  m.pass_overhead_s = measure_pass_overhead();
  return m;
}

// One barrier of `threads` threads that each compute ~0.2 ms between barriers (an all-gather
// of 3 floats, as vocabulary parallelism's statistics): the time per round with it, less the
// same work without it.
double measure_barrier(int threads) {
  if (threads < 2) return 0;
  constexpr int kRounds = 60;
  auto spin = [] {
    const double until = thread_cpu_s() + 2e-4;
    volatile double x = 1;
    while (thread_cpu_s() < until) x = x * 1.0000001 + 1e-9;
  };
  auto run = [&](bool with_barrier) {
    comm::ThreadGroup group(threads, "profile barrier group");
    std::barrier start_line(threads);
    double elapsed = 0;
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        std::vector<float> mine(3, 1.0f), all(static_cast<std::size_t>(3 * threads));
        start_line.arrive_and_wait();
        const double start = wall_s();
        for (int r = 0; r < kRounds; ++r) {
          spin();
          if (with_barrier) group.member(t).all_gather(mine, all);
        }
        start_line.arrive_and_wait();
        if (t == 0) elapsed = wall_s() - start;
      });
    for (auto& th : pool) th.join();
    return elapsed;
  };
  std::vector<double> extra;
  for (int r = 0; r < 3; ++r) extra.push_back(std::max(0.0, (run(true) - run(false)) / kRounds));
  return median(extra);
}

// A pipeline step beyond its passes: threads, groups, the start latch, the gradient
// assembly.
double measure_overhead(int workers) {
  parallel::EngineConfig e;
  e.sp = workers;
  std::vector<double> over;
  for (const auto& st : idle_steps(idle_model(1, 4 * workers), e, 1, 7)) over.push_back(st.step_s - st.pipeline_s);
  return median(over);
}

}  // namespace

double MachineCosts::slowdown_at(int threads) const {
  if (slowdown.empty() || threads < 1) return 1.0;
  return slowdown[static_cast<std::size_t>(std::min<int>(threads, static_cast<int>(slowdown.size())) - 1)];
}

std::string model_key(const model::TransformerConfig& c) {
  return str(c.kind == model::TransformerKind::kGpt ? "gpt" : "vit", " d", c.d_model, " H", c.heads, " T", c.tokens(),
             " V", c.kind == model::TransformerKind::kGpt ? c.vocab : c.classes, c.tied_head ? " tied" : "", " mlp",
             c.mlp_ratio);
}

std::string UnitShape::key(const model::TransformerConfig& c) const {
  return str(model_key(c), " ",
             unit == UnitKind::kEmbedding ? "embedding"
             : unit == UnitKind::kBlock   ? "block"
             : unit == UnitKind::kHead    ? "head"
                                          : "vocab-output",
             " b", microbatch, " sp", sp, " tp", tp, " ", parallel::to_string(split), solo ? " solo" : "",
             vocab_parallel > 0 ? str(" vocab-", vocab_parallel, "/", vocab_ranks) : "");
}

Profiler::Profiler(std::string cache_path, int repetitions)
    : path_(std::move(cache_path)),
      repetitions_(repetitions),
      // Any positive figures: a search on stand-ins is only run to learn its shapes.
      stand_in_{.forward_s = 1e-3,
                .backward_s = 2e-3,
                .backward_input_s = 1e-3,
                .backward_weight_s = 1e-3,
                .forward_cpu_s = 1e-3,
                .backward_cpu_s = 2e-3,
                .backward_input_cpu_s = 1e-3,
                .backward_weight_cpu_s = 1e-3,
                .activation_bytes = 1,
                .stash_bytes = 1} {
  load();
}

std::string Profiler::default_cache_path() {
  const std::string cache = user_cache_dir();
  return cache.empty() ? "" : cache + "/profile.tsv";
}

// The running executable's size and modification time: another build of the code (a
// faster kernel, say) is another build, whose units must be measured again, even at the
// same version and flags. Empty where /proc is not there.
namespace {
std::string executable_identity() {
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return "";
  const auto size = std::filesystem::file_size(exe, error);
  if (error) return "";
  const auto written = std::filesystem::last_write_time(exe, error);
  if (error) return "";
  return str(" | binary ", size, " bytes, written ", written.time_since_epoch().count());
}
}  // namespace

std::string Profiler::machine_key() {
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  return str(host, " | ", cpu_model(), " | ", std::thread::hardware_concurrency(), " cores | ", PEERTRAIN_VERSION, " ",
             __VERSION__, " | ", PEERTRAIN_BUILD_FLAGS, executable_identity());
}

namespace {

// A worker or thread count from a cache line's key; nullopt unless the whole key is one.
std::optional<int> count_key(const std::string& key) {
  int n = 0;
  const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), n);
  if (error != std::errc() || end != key.data() + key.size() || n < 1) return std::nullopt;
  return n;
}

}  // namespace

// A cache is only a cache: a line it cannot read is named in a warning and left out, so
// what it held is measured again and the next save() writes it back whole.
void Profiler::load() {
  if (path_.empty()) return;
  std::ifstream in(path_);
  std::string line;
  if (!std::getline(in, line) || line != "machine\t" + machine_key()) return;  // another machine's or build's
  for (int number = 2; std::getline(in, line); ++number) {
    std::istringstream row(line);
    std::string kind, key;
    std::getline(row, kind, '\t');
    std::getline(row, key, '\t');
    bool read = false;
    if (kind == "unit") {
      UnitCost u;
      row >> u.forward_s >> u.backward_s >> u.backward_input_s >> u.backward_weight_s >> u.forward_cpu_s >>
          u.backward_cpu_s >> u.backward_input_cpu_s >> u.backward_weight_cpu_s >> u.activation_bytes >> u.stash_bytes;
      if ((read = static_cast<bool>(row))) units_[key] = u;
    } else if (kind == "machine") {
      row >> machine_.cores >> machine_.copy_bytes_per_s >> machine_.message_s >> machine_.pass_overhead_s;
      machine_known_ = static_cast<bool>(row);
      for (double x; row >> x;) machine_.slowdown.push_back(x);
      machine_known_ = machine_known_ && static_cast<int>(machine_.slowdown.size()) == 2 * machine_.cores;
      read = machine_known_;
      if (!read) machine_.slowdown.clear();
    } else if (kind == "handoff") {  // keyed by contention_key
      Contention k;
      if ((read = static_cast<bool>(row >> k.pass_s >> k.sync_s))) machine_.contention[key] = k;
    } else if (const std::optional<int> count = count_key(key); !count) {
      // not a count: left out
    } else if (kind == "overhead") {
      double s = 0;
      if ((read = static_cast<bool>(row >> s))) machine_.step_overhead_s[*count] = s;
    } else if (kind == "barrier") {
      double b = 0;
      if ((read = static_cast<bool>(row >> b))) machine_.barrier_s[*count] = b;
    }
    if (!read)
      log::warn("profile cache ", path_, " line ", number, ": cannot read '", line.substr(0, 80),
                "'; left out, it will be measured again");
  }
}

void Profiler::save() const {
  if (path_.empty()) return;
  std::error_code ignored;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ignored);
  const std::string temporary = path_ + ".tmp";
  {
    std::ofstream out(temporary);
    out.precision(9);
    out << "machine\t" << machine_key() << "\n";
    if (machine_known_) {
      out << "machine\t-\t" << machine_.cores << " " << machine_.copy_bytes_per_s << " " << machine_.message_s << " "
          << machine_.pass_overhead_s;
      for (double x : machine_.slowdown) out << " " << x;
      out << "\n";
    }
    for (const auto& [workers, s] : machine_.step_overhead_s) out << "overhead\t" << workers << "\t" << s << "\n";
    for (const auto& [key, k] : machine_.contention)
      out << "handoff\t" << key << "\t" << k.pass_s << " " << k.sync_s << "\n";
    for (const auto& [threads, b] : machine_.barrier_s) out << "barrier\t" << threads << "\t" << b << "\n";
    for (const auto& [key, u] : units_)
      out << "unit\t" << key << "\t" << u.forward_s << " " << u.backward_s << " " << u.backward_input_s << " "
          << u.backward_weight_s << " " << u.forward_cpu_s << " " << u.backward_cpu_s << " " << u.backward_input_cpu_s
          << " " << u.backward_weight_cpu_s << " " << u.activation_bytes << " " << u.stash_bytes << "\n";
    if (!out) throw Error(ErrorKind::kIo, str("profile cache ", temporary, ": cannot write"));
  }
  std::filesystem::rename(temporary, path_);
}

const UnitCost& Profiler::unit(const model::TransformerConfig& config, const UnitShape& shape) {
  const std::array<int, 15> numbers{static_cast<int>(config.kind),
                                    config.d_model,
                                    config.heads,
                                    config.tokens(),
                                    config.kind == model::TransformerKind::kGpt ? config.vocab : config.classes,
                                    config.tied_head,
                                    config.mlp_ratio,
                                    static_cast<int>(shape.unit),
                                    shape.microbatch,
                                    shape.sp,
                                    shape.tp,
                                    static_cast<int>(shape.split),
                                    shape.solo,
                                    shape.vocab_parallel,
                                    shape.vocab_ranks};
  if (auto it = by_numbers_.find(numbers); it != by_numbers_.end()) return *it->second;
  if (deferring_) {
    const std::string key = shape.key(config);
    if (auto it = units_.find(key); it != units_.end()) return it->second;
    if (!deferred_keys_[key]) {
      deferred_keys_[key] = true;
      deferred_.emplace_back(config, shape);
    }
    return stand_in_;  // not kept in by_numbers_: measured later
  }
  const UnitCost& cost = unit_by_key(config, shape);
  by_numbers_[numbers] = &cost;
  return cost;
}

const UnitCost& Profiler::unit_by_key(const model::TransformerConfig& config, const UnitShape& shape) {
  const std::string key = shape.key(config);
  auto it = units_.find(key);
  if (it != units_.end()) return it->second;
  ++measured_;
  return units_[key] = measure_unit(config, shape, repetitions_);
}

int Profiler::profile_together(const std::function<void()>& learn, const EachRound& each_round) {
  struct Restore {
    bool& deferring;
    bool outer;
    ~Restore() { deferring = outer; }
  } restore{deferring_, deferring_};
  deferring_ = true;
  learn();
  deferring_ = restore.outer;
  return measure_deferred(each_round);
}

int Profiler::measure_deferred(const EachRound& each_round) {
  const auto shapes = std::exchange(deferred_, {});
  deferred_keys_.clear();
  const std::size_t n = shapes.size();
  std::vector<std::vector<UnitCost>> rounds(n);
  for (int r = 0; r < repetitions_; ++r) {
    if (each_round) each_round(r, repetitions_, static_cast<int>(n));
    for (std::size_t j = 0; j < n; ++j) {
      const auto& [config, shape] = shapes[(j + static_cast<std::size_t>(r)) % n];
      rounds[(j + static_cast<std::size_t>(r)) % n].push_back(measure_unit(config, shape, 1));
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    auto figure = [&](double UnitCost::*field) {
      std::vector<double> v;
      for (const auto& cost : rounds[i]) v.push_back(cost.*field);
      return median(std::move(v));
    };
    UnitCost cost;
    for (auto field :
         {&UnitCost::forward_s, &UnitCost::backward_s, &UnitCost::backward_input_s, &UnitCost::backward_weight_s,
          &UnitCost::forward_cpu_s, &UnitCost::backward_cpu_s, &UnitCost::backward_input_cpu_s,
          &UnitCost::backward_weight_cpu_s, &UnitCost::activation_bytes, &UnitCost::stash_bytes})
      cost.*field = figure(field);
    set_unit(shapes[i].first, shapes[i].second, cost);
    ++measured_;
  }
  return static_cast<int>(n);
}

void Profiler::set_unit(const model::TransformerConfig& config, const UnitShape& shape, const UnitCost& cost) {
  units_[shape.key(config)] = cost;  // std::map: the address by_numbers_ may hold stays valid
}

double Profiler::barrier_s(int threads) {
  machine();
  auto it = machine_.barrier_s.find(threads);
  if (it != machine_.barrier_s.end()) return it->second;
  ++measured_;
  return machine_.barrier_s[threads] = measure_barrier(threads);
}

const Contention* Profiler::contention(const std::string& key) const {
  auto it = machine_.contention.find(key);
  return it == machine_.contention.end() ? nullptr : &it->second;
}

void Profiler::set_contention(const std::string& key, Contention costs) { machine_.contention[key] = costs; }

void Profiler::set_machine(const MachineCosts& machine) {
  machine_ = machine;
  machine_known_ = true;
}

const MachineCosts& Profiler::machine() {
  if (!machine_known_) {
    auto overheads = std::move(machine_.step_overhead_s);
    auto contention = std::move(machine_.contention);
    auto barriers = std::move(machine_.barrier_s);
    machine_ = measure_machine();
    machine_.step_overhead_s = std::move(overheads);
    machine_.contention = std::move(contention);
    machine_.barrier_s = std::move(barriers);
    machine_known_ = true;
    ++measured_;
  }
  return machine_;
}

double Profiler::step_overhead_s(int workers) {
  machine();
  auto it = machine_.step_overhead_s.find(workers);
  if (it != machine_.step_overhead_s.end()) return it->second;
  ++measured_;
  return machine_.step_overhead_s[workers] = measure_overhead(workers);
}

}  // namespace peertrain::plan
