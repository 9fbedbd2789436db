// CPU attention alone: model::LocalAttention (the online-softmax tiles the transformer and
// the ring attention run) on one thread, against Eigen's float GEMM rate measured in the
// same run on the same thread. FLOPs counted as the GPU bench counts them: forward 4·T²·D
// per (sequence, head), backward 8·T²·D (dV, dP, dQ, dK), half of each when causal.
// Random inputs (never zeros); the median of 3 timed calls after one warm-up.
//
//   attention_bench [--tokens 1024,4096] [--head-dim 64] [--causal 1] [--format table|json]
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "peertrain/model/attention.h"

namespace {

double median_seconds(const std::function<void()>& call) {
  call();
  std::vector<double> times;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    call();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[1];
}

double gemm_gflops() {
  constexpr int n = 512;
  const Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n);
  Eigen::MatrixXf c(n, n);
  return 2.0 * n * n * n / median_seconds([&] { c.noalias() = a * b; }) / 1e9;
}

std::vector<float> random_floats(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(count);
  for (float& x : v) x = normal(rng);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> token_counts = {1024, 4096};
  int head_dim = 64;
  bool causal = true, json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::printf(
          "usage: attention_bench [--tokens 1024,4096] [--head-dim 64] [--causal 1|0] [--format table|json]\n"
          "  CPU attention (model::LocalAttention) on one thread against Eigen's GEMM rate\n");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "error: attention_bench: %s needs a value (see --help)\n", flag.c_str());
      return 2;
    }
    const std::string value = argv[++i];
    try {
      if (flag == "--tokens") {
        token_counts.clear();
        std::stringstream list(value);
        for (std::string item; std::getline(list, item, ',');) token_counts.push_back(std::stoi(item));
      } else if (flag == "--head-dim") {
        head_dim = std::stoi(value);
      } else if (flag == "--causal") {
        causal = value != "0";
      } else if (flag == "--format") {
        json = value == "json";
        if (!json && value != "table") throw std::invalid_argument(value);
      } else {
        std::fprintf(stderr, "error: attention_bench: unknown flag %s (see --help)\n", flag.c_str());
        return 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "error: attention_bench: bad value '%s' for %s\n", value.c_str(), flag.c_str());
      return 2;
    }
  }
  for (int t : token_counts)
    if (t < 1 || head_dim < 1) {
      std::fprintf(stderr, "error: attention_bench: --tokens and --head-dim must be positive\n");
      return 2;
    }
  Eigen::setNbThreads(1);
  const double gemm = gemm_gflops();
  if (!json) {
    std::printf("CPU attention, one thread, head_dim %d, %s; Eigen float GEMM 512^3: %.1f GFLOP/s\n", head_dim,
                causal ? "causal" : "full", gemm);
    std::printf("%8s %6s %12s %12s %10s %10s\n", "tokens", "rows", "fwd GFLOP/s", "bwd GFLOP/s", "fwd/GEMM",
                "bwd/GEMM");
  }
  std::string results;
  for (int tokens : token_counts) {
    // About 2 GFLOP of forward per call, at least one (sequence, head).
    const int rows = std::max(1, static_cast<int>(2e9 / (4.0 * tokens * tokens * head_dim * (causal ? 0.5 : 1.0))));
    const peertrain::model::AttentionShape shape{
        .batch = rows, .heads = 1, .head_dim = head_dim, .tokens = tokens, .causal = causal};
    const std::size_t size = static_cast<std::size_t>(shape.elements());
    const auto q = random_floats(size, 1), k = random_floats(size, 2), v = random_floats(size, 3),
               dout = random_floats(size, 4);
    std::vector<float> out(size), lse(static_cast<std::size_t>(shape.rows())), dq(size), dk(size), dv(size);
    std::vector<int> positions(static_cast<std::size_t>(tokens));
    std::iota(positions.begin(), positions.end(), 0);
    peertrain::model::LocalAttention attention;
    const double pairs = static_cast<double>(rows) * tokens * tokens * (causal ? 0.5 : 1.0);
    const double fwd = median_seconds(
        [&] { attention.forward(shape, positions, q.data(), k.data(), v.data(), out.data(), lse.data()); });
    const double bwd = median_seconds([&] {
      attention.backward(shape, positions, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                         dk.data(), dv.data());
    });
    const double fwd_gflops = 4 * pairs * head_dim / fwd / 1e9, bwd_gflops = 8 * pairs * head_dim / bwd / 1e9;
    if (json) {
      char line[256];
      std::snprintf(
          line, sizeof line,
          "%s{\"tokens\": %d, \"rows\": %d, \"fwd_gflops\": %.2f, \"bwd_gflops\": %.2f, \"gemm_gflops\": %.2f}",
          results.empty() ? "" : ", ", tokens, rows, fwd_gflops, bwd_gflops, gemm);
      results += line;
    } else {
      std::printf("%8d %6d %12.1f %12.1f %9.0f%% %9.0f%%\n", tokens, rows, fwd_gflops, bwd_gflops,
                  100 * fwd_gflops / gemm, 100 * bwd_gflops / gemm);
    }
  }
  if (json)
    std::printf("{\"head_dim\": %d, \"causal\": %s, \"results\": [%s]}\n", head_dim, causal ? "true" : "false",
                results.c_str());
  return 0;
}
