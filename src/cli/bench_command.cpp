// peertrain bench step: times one training step of a model (mlp, gpt or vit: forward,
// backward and the optimizer step) on random data, and puts the rate it reaches next to the rate of Eigen's
// own float GEMM at the same thread count, the ceiling for a model made of GEMMs.
// bench/compare_mlp_step.sh runs it beside PyTorch's step for the same model.
#include <Eigen/Core>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "model_flags.h"
#include "options.h"
#include "training_options.h"
#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "peertrain/model/device_model.h"
#include "peertrain/model/gradient_engine.h"
#include "peertrain/model/mlp.h"
#include "peertrain/model/transformer.h"
#include "peertrain/parallel/pipeline.h"
#include "peertrain/parallel/random_batch.h"
#include "peertrain/train/device_update.h"
#include "peertrain/train/optimizer.h"

namespace peertrain::cli {

using Json = nlohmann::ordered_json;
namespace {

constexpr int kGemmSize = 512;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// GFLOP/s of Eigen's float GEMM on kGemmSize³ with the current thread count: the median of
// a few products after one to warm up.
double eigen_gemm_gflops() {
  const Eigen::MatrixXf a = Eigen::MatrixXf::Random(kGemmSize, kGemmSize);
  const Eigen::MatrixXf b = Eigen::MatrixXf::Random(kGemmSize, kGemmSize);
  Eigen::MatrixXf c(kGemmSize, kGemmSize);
  c.noalias() = a * b;
  std::vector<double> times;
  for (int i = 0; i < 15; ++i) {
    const auto start = std::chrono::steady_clock::now();
    c.noalias() = a * b;
    times.push_back(seconds_since(start));
  }
  return 2.0 * kGemmSize * kGemmSize * kGemmSize / median(times) / 1e9;
}

// One core's FMA peak in GFLOP/s: 24 independent chains of vector FMAs (more than the
// FMA latency times the FMA ports on any x86 core of today), the best of 5 runs of some
// 15 ms. No kernel can beat it, so a step's FLOPs at this rate bound the step from below
// on one thread: the speed-ups this project targets are checked against it as well as
// against Eigen's GEMM (bench/all.py). 0 where the build has no FMA vectors.
// Not inlined: inside the large step() GCC 12 kept the chains on the stack, a store each per
// FMA, and measured a third of the peak.
[[gnu::noinline]] double fma_peak_gflops() {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#if defined(__AVX512F__)
  using Vector = __m512;
  constexpr int kLanes = 16;
  const auto splat = [](float x) { return _mm512_set1_ps(x); };
  const auto fma = [](Vector a, Vector b, Vector c) { return _mm512_fmadd_ps(a, b, c); };
  const auto store = [](float* to, Vector a) { _mm512_storeu_ps(to, a); };
#else
  using Vector = __m256;
  constexpr int kLanes = 8;
  const auto splat = [](float x) { return _mm256_set1_ps(x); };
  const auto fma = [](Vector a, Vector b, Vector c) { return _mm256_fmadd_ps(a, b, c); };
  const auto store = [](float* to, Vector a) { _mm256_storeu_ps(to, a); };
#endif
  // The lanes' sum through memory: _mm512_reduce_add_ps trips GCC 12's -Wuninitialized.
  const auto sum = [&](Vector a) {
    float lanes[kLanes];
    store(lanes, a);
    float s = 0;
    for (float x : lanes) s += x;
    return s;
  };
  constexpr int kChains = 24;
  constexpr long kIterations = 4'000'000;  // with AVX-512, 3.1 GFLOP a run: about 14 ms at 220 GFLOP/s
  Vector chain[kChains];
  for (int i = 0; i < kChains; ++i) chain[i] = splat(0.001f * static_cast<float>(i));
  const Vector scale = splat(0.9999f), shift = splat(1e-6f);
  double best = 1e30;
  float checksum = 0;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    for (long n = 0; n < kIterations; ++n) {
#pragma GCC unroll 24
      for (int i = 0; i < kChains; ++i) chain[i] = fma(chain[i], scale, shift);
    }
    best = std::min(best, seconds_since(start));
    for (int i = 0; i < kChains; ++i) checksum += sum(chain[i]);
  }
  [[maybe_unused]] static volatile float sink;  // the chains' results stay live, so the loop cannot be dropped
  sink = checksum;
  return 2.0 * kChains * kLanes * static_cast<double>(kIterations) / best / 1e9;
#else
  return 0;
#endif
}

// The memory bandwidth one thread sees: a 64 MiB memcpy, bytes read plus bytes written, the
// best of 3 (the floor other_bytes is measured against).
double memory_gbytes_per_s() {
  constexpr std::size_t kBytes = std::size_t{64} << 20;
  std::vector<char> from(kBytes, 1), to(kBytes, 0);
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(to.data(), from.data(), kBytes);
    best = std::min(best, seconds_since(start));
  }
  return 2.0 * kBytes / best / 1e9;
}

// One model's training step on fixed random data, and what the report says about it.
struct Bench {
  std::function<void()> step;
  double flops = 0;
  double other_bytes = 0;  // transformers: Transformer::other_bytes_per_step
  std::size_t parameters = 0;
  int items = 0;       // examples per step
  long long tokens = 0;  // tokens per step (transformers)
  std::string shape;
  std::string device = "cpu";
  std::function<std::size_t()> peak_device_bytes;  // set for --device cuda
  // Seconds of each step's optimizer update (set for --device cuda, whose optimizer runs on
  // the host): the split between the device's forward/backward and the host's update.
  std::shared_ptr<std::vector<double>> optimizer_seconds;
  std::string optimizer = "host";  // where the optimizer's arithmetic runs (--optimizer-on)
};

Bench mlp_bench(const cxxopts::ParseResult& args, int batch) {
  model::MlpConfig config;
  config.inputs = at_least_flag(args, "inputs", 1);
  config.classes = at_least_flag(args, "classes", 1);
  config.hidden = parse_widths(args["hidden"].as<std::string>());
  struct State {
    model::Mlp mlp;
    std::vector<float> params, grads, inputs;
    std::vector<std::int32_t> labels;
    train::Sgd sgd;
  };
  model::Mlp mlp(config);
  const std::size_t size = mlp.num_parameters();
  auto state = std::make_shared<State>(State{std::move(mlp), std::vector<float>(size), std::vector<float>(size),
                                             std::vector<float>(static_cast<std::size_t>(config.inputs) * batch),
                                             std::vector<std::int32_t>(batch), train::Sgd(size, {})});
  state->mlp.initialize(state->params, 1);
  Rng rng(2);
  for (auto& x : state->inputs) x = static_cast<float>(rng.normal());
  for (auto& y : state->labels) y = static_cast<std::int32_t>(rng.uniform_below(config.classes));
  Bench b;
  b.step = [state, batch] {
    state->mlp.forward_backward(state->params, state->inputs.data(), state->labels.data(), batch, state->grads);
    state->sgd.step(state->params, state->grads);
  };
  b.flops = state->mlp.flops_per_step(batch);
  b.parameters = size;
  b.items = batch;
  std::ostringstream shape;
  shape << config.inputs;
  for (int w : config.hidden) shape << '-' << w;
  shape << '-' << config.classes;
  b.shape = shape.str();
  return b;
}

// The transformer step as training runs it: the gradient engine training would choose for
// these flags, then the optimizer step (Adam, as the trainer uses).
Bench transformer_bench(const cxxopts::ParseResult& args, bool gpt, int batch) {
  model::TransformerConfig config =
      transformer_shape(args, gpt ? model::TransformerKind::kGpt : model::TransformerKind::kVit, false);
  config.patch = number_flag<int>(args, "patch");
  parallel::EngineConfig engine;
  engine.sp = number_flag<int>(args, "sp");
  engine.pp = number_flag<int>(args, "pp");
  engine.microbatches = number_flag<int>(args, "microbatches");
  try {
    model::validate(config);
    engine.schedule = parallel::parse_schedule(args["schedule"].as<std::string>());
    engine.chunks = number_flag<int>(args, "chunks");
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  struct State {
    model::Transformer model;
    std::vector<float> params, grads, pixels;
    std::vector<std::int32_t> bytes, targets;
    std::vector<int> positions;
    std::unique_ptr<train::Optimizer> optimizer;
    parallel::GradientEngineMade engine;
  };
  auto state = std::make_shared<State>(State{model::Transformer(config), {}, {}, {}, {}, {}, {}, nullptr, {}});
  const std::size_t size = state->model.num_parameters();
  const int tokens = config.tokens();
  state->params.resize(size);
  state->grads.resize(size);
  state->model.initialize(state->params, 1);
  state->optimizer = train::make_optimizer(train::OptimizerKind::kAdam, size, {}, {});
  Rng rng(2);
  for (int t = 0; t < tokens; ++t) state->positions.push_back(t);
  parallel::RandomBatch data = parallel::random_batch(config, batch, rng);
  state->bytes = std::move(data.bytes);
  state->targets = std::move(data.targets);
  state->pixels = std::move(data.pixels);
  Bench b;
  const int threads = number_flag<int>(args, "threads");
  parallel::GradientEngineChoice choice;
  choice.engine = engine;
  choice.threads = threads;
  try {
    choice.device = model::parse_device(args.count("device") ? args["device"].as<std::string>() : "cpu");
    if (choice.device == model::Device::kCuda) {
      if (!gpt || engine.sp > 1) throw UsageError("--device cuda times --model gpt with --sp 1 (and any --pp)");
      choice.device_options = {.device = 0,
                               .gemm = model::parse_gemm_mode(args["gemm-precision"].as<std::string>()),
                               .pp = engine.pp,
                               .microbatches = engine.microbatches,
                               .schedule = std::string(parallel::to_string(engine.schedule))};
    }
    // The engine training would use for these flags (parallel::make_gradient_engine).
    state->engine = parallel::make_gradient_engine(state->model, choice);
    if (model::DeviceModel* device = state->engine.device) {
      b.device = device->describe();
      b.peak_device_bytes = [state] { return state->engine.device->peak_device_bytes(); };
      b.optimizer_seconds = std::make_shared<std::vector<double>>();
      std::string place = args["optimizer-on"].as<std::string>();
      if (place != "device" && place != "host")
        throw UsageError("--optimizer-on must be device or host, not '" + place + "'");
      if (place == "device") {  // as training runs it (train/device_update.h): Adam beside the model
        train::TrainConfig train_config;
        train_config.algorithm = train::Algorithm::kLocal;
        train_config.optimizer = train::OptimizerKind::kAdam;
        auto device_update = train::make_device_update(device, size, train_config);
        if (device_update)
          state->optimizer = std::move(device_update);
        else  // the device pipeline keeps it on the host, as training does
          place = "host (this device model keeps the optimizer there)";
      }
      b.optimizer = place;
    }
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  b.step = [state, batch, tokens, gpt, optimizer_seconds = b.optimizer_seconds] {
    model::TokenBatch whole;
    whole.batch = batch;
    whole.tokens = tokens;
    whole.positions = state->positions;
    whole.bytes = state->bytes;
    whole.pixels = state->pixels;
    whole.targets = state->targets;
    whole.loss_divisor = gpt ? static_cast<double>(batch) * tokens : batch;
    state->engine.engine->forward_backward(state->params, whole, state->grads);  // overwrites grads
    const auto update = std::chrono::steady_clock::now();
    state->optimizer->step(state->params, state->grads);
    if (optimizer_seconds) optimizer_seconds->push_back(seconds_since(update));
  };
  b.flops = state->model.flops_per_step(batch, tokens);
  b.other_bytes = state->model.other_bytes_per_step(batch, tokens, threads == 1 && model::gemm_fuses_epilogues());
  b.parameters = size;
  b.items = batch;
  b.tokens = static_cast<long long>(batch) * tokens;
  b.shape = str("d", config.d_model, " L", config.layers, " H", config.heads, " T", tokens, " sp", engine.sp, " pp",
                engine.pp);
  return b;
}

int step(int argc, char** argv) {
  cxxopts::Options options("peertrain bench step",
                           "Time one training step (forward, backward, optimizer step) on random data, after a "
                           "warm-up, next to Eigen's GEMM rate.");
  options.add_options()("model", "mlp | gpt | vit", cxxopts::value<std::string>()->default_value("mlp"))(
      "batch", "examples (sequences, images) per step", cxxopts::value<std::string>()->default_value("128"))(
      "threads", "mlp: Eigen threads (OpenMP); gpt/vit with --sp 1 --pp 1: the batch split over threads",
      cxxopts::value<std::string>()->default_value("1"))("hidden", "mlp: hidden widths",
                                                         cxxopts::value<std::string>()->default_value("512,512"))(
      "inputs", "mlp: input features", cxxopts::value<std::string>()->default_value("784"))(
      "classes", "mlp: classes", cxxopts::value<std::string>()->default_value("10"))(
      "d-model", "gpt/vit: width", cxxopts::value<std::string>()->default_value("128"))(
      "layers", "gpt/vit: blocks", cxxopts::value<std::string>()->default_value("4"))(
      "heads", "gpt/vit: attention heads", cxxopts::value<std::string>()->default_value("4"))(
      "seq", "gpt: context length", cxxopts::value<std::string>()->default_value("256"))(
      "patch", "vit: patch side", cxxopts::value<std::string>()->default_value("7"))(
      "sp", "gpt/vit: sequence ranks", cxxopts::value<std::string>()->default_value("1"))(
      "pp", "gpt/vit: pipeline stages", cxxopts::value<std::string>()->default_value("1"))(
      "microbatches", "gpt/vit: micro-batches", cxxopts::value<std::string>()->default_value("1"))(
      "chunks", "interleaved: model chunks per stage", cxxopts::value<std::string>()->default_value("2"))(
      "schedule", "gpipe | 1f1b | eager-1f1b | interleaved | zb-h1 | zb-h2 | zb-v | v-half | pipedream",
      cxxopts::value<std::string>()->default_value("1f1b"))(
      "device",
      "gpt: cpu (the default) | cuda (with --sp 1: the GPU step, parameters and gradients through pinned host memory; "
      "with --pp, "
      "gpipe, 1f1b or eager-1f1b stages on the GPUs round robin)",
      cxxopts::value<std::string>())("optimizer-on",
                                     "--device cuda: device (Adam beside the model, only its update comes back, as "
                                     "training runs it) | host (the gradient comes back, Adam on the CPU)",
                                     cxxopts::value<std::string>()->default_value("device"))(
      "gemm-precision", "--device cuda: fp32 | tf32 | bf16", cxxopts::value<std::string>()->default_value("tf32"))(
      "steps", "timed steps", cxxopts::value<std::string>()->default_value("20"))(
      "warmup", "untimed steps first", cxxopts::value<std::string>()->default_value("3"))(
      "format", "text | json", cxxopts::value<std::string>()->default_value("text"))("h,help", "show this help");
  cxxopts::ParseResult args;
  if (auto code = parse_or_exit(options, argc, argv, &args)) return *code;

  const std::string model_name = args["model"].as<std::string>();
  const std::string format = args["format"].as<std::string>();
  int batch = 0, threads = 0, steps = 0, warmup = 0;
  Bench bench;
  try {
    if (model_name != "mlp" && model_name != "gpt" && model_name != "vit")
      throw UsageError("--model '" + model_name + "' is not one of mlp, gpt, vit");
    if (format != "text" && format != "json") throw UsageError("--format '" + format + "' is not one of text, json");
    batch = number_flag<int>(args, "batch");
    threads = number_flag<int>(args, "threads");
    steps = number_flag<int>(args, "steps");
    warmup = number_flag<int>(args, "warmup");
    if (batch < 1) throw UsageError("--batch " + std::to_string(batch) + " must be at least 1");
    if (threads < 1) throw UsageError("--threads " + std::to_string(threads) + " must be at least 1");
    if (steps < 1) throw UsageError("--steps " + std::to_string(steps) + " must be at least 1");
    if (warmup < 0) throw UsageError("--warmup " + std::to_string(warmup) + " must not be negative");
    if (model_name == "mlp") {
      refuse_flags(args, {"d-model", "layers", "heads", "sp", "pp", "microbatches", "chunks", "schedule"},
                   "--model gpt or vit");
      refuse_flags(args, {"seq"}, "--model gpt");  // a ViT's --seq: transformer_shape
    } else {
      refuse_flags(args, {"hidden", "inputs", "classes"}, "--model mlp");
    }
    if (model_name != "vit") refuse_flags(args, {"patch"}, "--model vit");
    const bool cuda =
        args.count("device") && model::parse_device(args["device"].as<std::string>()) == model::Device::kCuda;
    if (!cuda) refuse_flags(args, {"optimizer-on", "gemm-precision"}, "--device cuda");
    if (cuda && model_name != "gpt")
      throw UsageError("--device cuda times --model gpt; " + model_name + " runs on the CPU");
    Eigen::setNbThreads(threads);
    bench = model_name == "mlp" ? mlp_bench(args, batch) : transformer_bench(args, model_name == "gpt", batch);
  } catch (const std::exception& e) {  // UsageError, or the model's Error for a bad shape
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }

  std::vector<double> times;
  for (int i = 0; i < warmup + steps; ++i) {
    if (i == warmup && bench.optimizer_seconds) bench.optimizer_seconds->clear();
    const auto start = std::chrono::steady_clock::now();
    bench.step();
    if (i >= warmup) times.push_back(seconds_since(start));
  }
  const double seconds = median(times);
  const double optimizer_ms = bench.optimizer_seconds ? median(*bench.optimizer_seconds) * 1e3 : 0.0;
  const double gflops = bench.flops / seconds / 1e9;
  Eigen::setNbThreads(threads);  // the ceiling at --threads (a batch-parallel step set Eigen to one)
  const double gemm_gflops = eigen_gemm_gflops();
  // One core's peak: the bound of a one-thread CPU step (a GPU step or more threads have their own).
  const bool one_core = threads == 1 && !bench.peak_device_bytes;
  const double peak_gflops = one_core ? fma_peak_gflops() : 0.0;
  const double memory_gbps = bench.other_bytes > 0 ? memory_gbytes_per_s() : 0.0;

  if (format == "json") {
    Json out;
    out["model"] = model_name;
    out["shape"] = bench.shape;
    out["parameters"] = bench.parameters;
    out["batch"] = batch;
    out["threads"] = threads;
    out["steps"] = steps;
    out["ms_per_step"] = seconds * 1e3;
    out["items_per_s"] = bench.items / seconds;
    if (bench.tokens > 0) {
      out["tokens_per_s"] = static_cast<double>(bench.tokens) / seconds;
    }
    if (bench.peak_device_bytes) {
      out["device"] = bench.device;
      out["peak_device_bytes"] = bench.peak_device_bytes();
      out["optimizer_on"] = bench.optimizer;
      out["host_optimizer_ms"] = optimizer_ms;
    }
    out["flops_per_step"] = bench.flops;
    out["gflops"] = gflops;
    out["eigen_gemm_gflops"] = gemm_gflops;
    out["eigen_gemm_size"] = kGemmSize;
    if (peak_gflops > 0) {
      out["fma_peak_gflops"] = peak_gflops;
    }
    if (bench.other_bytes > 0) {
      out["other_bytes_per_step"] = bench.other_bytes;
      out["memory_gbytes_per_s"] = memory_gbps;
    }
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("model        %s %s (%zu parameters)\n", model_name.c_str(), bench.shape.c_str(), bench.parameters);
  if (bench.peak_device_bytes)
    std::printf("device       %s, peak %.1f MiB allocated\n", bench.device.c_str(),
                static_cast<double>(bench.peak_device_bytes()) / (1 << 20));
  std::printf("batch        %d\n", batch);
  std::printf("threads      %d\n", threads);
  std::printf("step         %.3f ms (median of %d, after %d warm-up)\n", seconds * 1e3, steps, warmup);
  if (bench.optimizer_seconds)
    std::printf("of which      %.3f ms the optimizer's host part (optimizer on the %s)\n", optimizer_ms,
                bench.optimizer.c_str());
  std::printf("throughput   %.0f items/s", bench.items / seconds);
  if (bench.tokens > 0) std::printf(", %.0f tokens/s", static_cast<double>(bench.tokens) / seconds);
  std::printf("\ncompute      %.1f GFLOP/s (%.3f GFLOP a step), %.0f%% of Eigen's GEMM: %.1f GFLOP/s at %d^3\n", gflops,
              bench.flops / 1e9, 100 * gflops / gemm_gflops, gemm_gflops, kGemmSize);
  if (peak_gflops > 0)
    std::printf(
        "peak         %.1f GFLOP/s, one core's FMA peak (24 chains): the step runs at %.0f%% of it, "
        "and its FLOPs at it take %.1f ms\n",
        peak_gflops, 100 * gflops / peak_gflops, bench.flops / peak_gflops / 1e6);
  if (bench.other_bytes > 0) {
    const double floor_s = bench.flops / (gemm_gflops * 1e9) + bench.other_bytes / (memory_gbps * 1e9);
    std::printf("memory       %.0f MB a step outside the GEMMs and attention, %.1f ms at %.1f GB/s (memcpy)\n",
                bench.other_bytes / 1e6, bench.other_bytes / memory_gbps / 1e6, memory_gbps);
    std::printf(
        "limit        %.1f ms = FLOPs at the GEMM rate + those bytes at the memcpy rate; the step is %.0f%% of "
        "it\n",
        floor_s * 1e3, 100 * floor_s / seconds);
  }
  return 0;
}

}  // namespace

int run_bench(int argc, char** argv) {
  auto usage = [] {
    std::printf(
        "usage: peertrain bench step|schedule|pipeline|reshard|memory [options]\n\n"
        "  step --model mlp --batch 128 --threads 1 [--hidden 512,512] [--steps N] [--format text|json]\n"
        "  step --model gpt --batch 8 --seq 256 --d-model 128 --layers 4 --heads 4 [--sp S --pp P]\n"
        "       time one training step and compare its GFLOP/s with Eigen's GEMM\n"
        "  schedule --pp 4 --microbatches 8 [--schedule all|NAME] [--times F,B,W] [--timeline] [--format table|json]\n"
        "       replay the pipeline schedules: bubble and peak memory against the papers'\n"
        "  pipeline --model gpt --vocab-size 32000 --pp 4 --microbatches 8 --schedule 1f1b [--format table|json]\n"
        "           [--stage-mesh \"sp=2,tp=1;sp=1,tp=4\" --reshard broadcast --link-between-gbps 10 --plan]\n"
        "       run the pipeline engine: each stage's mesh, parameters, compute and activations; bubble, throughput\n"
        "  reshard [--source 2 --destination 2x2 --source-layout S0,R --destination-layout R,S0] [--plan]\n"
        "       carry out cross-mesh resharding over emulated links: send-recv, broadcast, local-allgather\n"
        "       against the lower bound\n"
        "  memory [--workers 4 --cap-gib 16 --d-model 768 --layers 12 --heads 12]\n"
        "       sequence against tensor parallelism under one memory cap: the largest batch, the longest sequence\n");
  };
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string sub = argv[1];
  if (sub == "step") return step(argc - 1, argv + 1);
  if (sub == "schedule") return bench_schedule(argc - 1, argv + 1);
  if (sub == "pipeline") return bench_pipeline(argc - 1, argv + 1);
  if (sub == "reshard") return bench_reshard(argc - 1, argv + 1);
  if (sub == "memory") return bench_memory(argc - 1, argv + 1);
  std::fprintf(stderr, "error: unknown bench command '%s'; expected step, schedule, pipeline, reshard or memory\n",
               sub.c_str());
  return 2;
}

}  // namespace peertrain::cli
