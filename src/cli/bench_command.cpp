// peertrain bench step: times one training step of a model (forward, backward and the
// optimizer step) on random data, and puts the rate it reaches next to the rate of Eigen's
// own float GEMM at the same thread count, the ceiling for a model made of GEMMs.
// bench/compare_mlp_step.sh runs it beside PyTorch's step for the same model.
#include <Eigen/Core>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "options.h"
#include "peertrain/core/error.h"
#include "peertrain/core/json.h"
#include "peertrain/core/rng.h"
#include "peertrain/model/mlp.h"
#include "peertrain/train/optimizer.h"

namespace peertrain::cli {
namespace {

constexpr int kGemmSize = 512;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::vector<int> parse_widths(const std::string& text) {
  std::vector<int> widths;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    int width = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), width);
    if (ec != std::errc() || ptr != item.data() + item.size() || width < 1)
      throw UsageError("--hidden '" + text + "' is not a list of positive widths like 512,512");
    widths.push_back(width);
  }
  return widths;
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

int step(int argc, char** argv) {
  cxxopts::Options options("peertrain bench step",
                           "Time one training step (forward, backward, SGD step) on random data, after a warm-up.");
  options.add_options()
      ("model", "mlp (gpt is a later issue)", cxxopts::value<std::string>()->default_value("mlp"))
      ("batch", "examples per step", cxxopts::value<std::string>()->default_value("128"))
      ("threads", "Eigen threads (OpenMP)", cxxopts::value<std::string>()->default_value("1"))
      ("hidden", "hidden widths of the MLP", cxxopts::value<std::string>()->default_value("512,512"))
      ("inputs", "input features of the MLP", cxxopts::value<std::string>()->default_value("784"))
      ("classes", "classes of the MLP", cxxopts::value<std::string>()->default_value("10"))
      ("steps", "timed steps", cxxopts::value<std::string>()->default_value("200"))
      ("warmup", "untimed steps first", cxxopts::value<std::string>()->default_value("20"))
      ("format", "text | json", cxxopts::value<std::string>()->default_value("text"))
      ("h,help", "show this help");
  cxxopts::ParseResult args;
  if (auto code = parse_or_exit(options, argc, argv, &args)) return *code;

  const std::string model_name = args["model"].as<std::string>();
  const std::string format = args["format"].as<std::string>();
  model::MlpConfig config;
  int batch = 0, threads = 0, steps = 0, warmup = 0;
  try {
    if (model_name == "gpt") throw UsageError("--model gpt is not implemented yet; only mlp can be benchmarked");
    if (model_name != "mlp") throw UsageError("--model '" + model_name + "' is not one of mlp");
    if (format != "text" && format != "json") throw UsageError("--format '" + format + "' is not one of text, json");
    batch = number_flag<int>(args, "batch");
    threads = number_flag<int>(args, "threads");
    steps = number_flag<int>(args, "steps");
    warmup = number_flag<int>(args, "warmup");
    config.inputs = number_flag<int>(args, "inputs");
    config.classes = number_flag<int>(args, "classes");
    config.hidden = parse_widths(args["hidden"].as<std::string>());
    if (batch < 1) throw UsageError("--batch " + std::to_string(batch) + " must be at least 1");
    if (threads < 1) throw UsageError("--threads " + std::to_string(threads) + " must be at least 1");
    if (steps < 1) throw UsageError("--steps " + std::to_string(steps) + " must be at least 1");
    if (warmup < 0) throw UsageError("--warmup " + std::to_string(warmup) + " must not be negative");
    if (config.inputs < 1 || config.classes < 1) throw UsageError("--inputs and --classes must be at least 1");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  Eigen::setNbThreads(threads);

  model::Mlp mlp(config);
  std::vector<float> params(mlp.num_parameters()), grads(params.size());
  mlp.initialize(params, 1);
  train::Sgd sgd(params.size(), {});
  Rng rng(2);
  std::vector<float> inputs(static_cast<std::size_t>(config.inputs) * batch);
  for (auto& x : inputs) x = static_cast<float>(rng.normal());
  std::vector<std::int32_t> labels(batch);
  for (auto& y : labels) y = static_cast<std::int32_t>(rng.uniform_below(config.classes));

  std::vector<double> times;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    mlp.forward_backward(params, inputs.data(), labels.data(), batch, grads);
    sgd.step(params, grads);
    if (i >= warmup) times.push_back(seconds_since(start));
  }
  const double seconds = median(times);
  const double gflops = mlp.flops_per_step(batch) / seconds / 1e9;
  const double gemm_gflops = eigen_gemm_gflops();
  std::vector<int> widths = {config.inputs};
  widths.insert(widths.end(), config.hidden.begin(), config.hidden.end());
  widths.push_back(config.classes);

  if (format == "json") {
    json::Object out;
    out.add("model", model_name)
        .add_raw("widths", json::array(widths))
        .add("parameters", mlp.num_parameters())
        .add("batch", batch)
        .add("threads", threads)
        .add("steps", steps)
        .add("ms_per_step", seconds * 1e3)
        .add("items_per_s", batch / seconds)
        .add("flops_per_step", mlp.flops_per_step(batch))
        .add("gflops", gflops)
        .add("eigen_gemm_gflops", gemm_gflops)
        .add("eigen_gemm_size", kGemmSize);
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::string shape;
  for (int w : widths) shape += (shape.empty() ? "" : "-") + std::to_string(w);
  std::printf("model        %s %s (%zu parameters)\n", model_name.c_str(), shape.c_str(), mlp.num_parameters());
  std::printf("batch        %d\n", batch);
  std::printf("threads      %d\n", threads);
  std::printf("step         %.3f ms (median of %d, after %d warm-up)\n", seconds * 1e3, steps, warmup);
  std::printf("throughput   %.0f items/s\n", batch / seconds);
  std::printf("compute      %.1f GFLOP/s (%.3f GFLOP a step), %.0f%% of Eigen's GEMM: %.1f GFLOP/s at %d^3\n", gflops,
              mlp.flops_per_step(batch) / 1e9, 100 * gflops / gemm_gflops, gemm_gflops, kGemmSize);
  return 0;
}

}  // namespace

int run_bench(int argc, char** argv) {
  auto usage = [] {
    std::printf(
        "usage: peertrain bench step [options]\n\n"
        "  step --model mlp --batch 128 --threads 1 [--hidden 512,512] [--steps N] [--format text|json]\n"
        "       time one training step and compare its GFLOP/s with Eigen's GEMM\n");
  };
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string sub = argv[1];
  if (sub == "step") return step(argc - 1, argv + 1);
  std::fprintf(stderr, "error: unknown bench command '%s'; expected step\n", sub.c_str());
  return 2;
}

}  // namespace peertrain::cli
