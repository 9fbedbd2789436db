// The kernels on a GPU against the machine's own limits (kernels/NOTES.md holds the
// figures): each memory-bound kernel's bytes moved per second against the device's
// memory bandwidth, attention's TFLOP/s against the cuBLAS BF16 GEMM rate measured here,
// on this card. Built with the CUDA kernels; needs a GPU to run.
//
//   build/bench/kernels_bench [--quick]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "peertrain/kernels/device.h"
#include "peertrain/kernels/ops.h"

namespace {

using namespace peertrain::kernels;

// Median-free and simple: warm up, then the mean over enough repetitions to pass 50 ms.
double seconds_per_call(const std::function<void()>& call) {
  for (int i = 0; i < 3; ++i) call();
  synchronize({});
  int reps = 1;
  for (;;) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) call();
    synchronize({});
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s > 0.05 || reps >= 1 << 16) return s / reps;
    reps *= 4;
  }
}

DeviceArray<float> random_device(std::size_t count, unsigned seed) {
  std::vector<float> host(count);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (float& x : host) x = normal(rng);
  DeviceArray<float> d(count);
  copy_to_device(d.data(), host.data(), sizeof(float) * count, {});
  return d;
}

double peak_bandwidth_gbs() {
  // Theoretical DRAM bandwidth: 2 (DDR) × memory clock × bus width.
  int clock_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
  return 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
}

double cublas_bf16_tflops(int n) {
  cublasHandle_t handle;
  cublasCreate(&handle);
  std::vector<__nv_bfloat16> host(static_cast<std::size_t>(n) * n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (auto& x : host) x = __float2bfloat16(normal(rng));
  __nv_bfloat16 *a, *b;
  float* c;
  cudaMalloc(&a, host.size() * sizeof(__nv_bfloat16));
  cudaMalloc(&b, host.size() * sizeof(__nv_bfloat16));
  cudaMalloc(&c, host.size() * sizeof(float));
  cudaMemcpy(a, host.data(), host.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice);
  cudaMemcpy(b, host.data(), host.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice);
  const float alpha = 1, beta = 0;
  // C in BF16 (what PyTorch's bf16 matmul writes) and in FP32; the faster is the limit.
  double s = 1e30;
  for (cudaDataType c_type : {CUDA_R_16BF, CUDA_R_32F})
    s = std::min(s, seconds_per_call([&] {
                   cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n,
                                &beta, c, c_type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                 }));
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cublasDestroy(handle);
  return 2.0 * n * n * n / s / 1e12;
}

// The tensor-core forward's tilings side by side at the target shape (T 4096, D 64), the
// whole call and the attention kernel alone (the FP32 → BF16 operand pass timed apart).
// once: each tiling's kernel runs once, untimed, full mask only (for a profiler).
void compare_tilings(double bf16, bool once) {
  const int rows = 128, tokens = 4096, head_dim = 64;
  const std::size_t size = static_cast<std::size_t>(rows) * tokens * head_dim;
  auto q = random_device(size, 30), k = random_device(size, 31), v = random_device(size, 32);
  DeviceArray<float> out(size), lse(static_cast<std::size_t>(rows) * tokens);
  std::vector<int> positions(tokens);
  std::iota(positions.begin(), positions.end(), 0);
  DeviceArray<int> pos(tokens);
  copy_to_device(pos.data(), positions.data(), sizeof(int) * tokens, {});
  std::printf("\ntensor-core forward tilings, rows %d T %d D %d (instruction, warps, queries and keys per block)\n",
              rows, tokens, head_dim);
  std::printf("%-40s %-6s %12s %12s %12s %12s\n", "tiling", "mask", "whole TF/s", "kernel TF/s", "whole/GEMM",
              "kernel/GEMM");
  for (bool causal : {false, true}) {
    if (once && causal) break;
    const AttentionDims dims{.rows = rows, .tq = tokens, .tk = tokens, .head_dim = head_dim, .causal = causal};
    const double flops = 4.0 * rows * tokens * tokens * head_dim * (causal ? 0.5 : 1.0);
    const double operands = once ? 0.0 : seconds_per_call([&] {
      attention_forward_tiled({}, dims, attention_default_tiling(), true, q.data(), pos.data(), k.data(), v.data(),
                              pos.data(), out.data(), lse.data());
    });
    for (std::size_t t = 0; t < attention_tilings().size(); ++t) {
      const AttentionTiling tiling = attention_tilings()[t];
      if (tiling.instruction == TensorCoreInstruction::kWgmma &&
          attention_tilings()[attention_default_tiling()].instruction != TensorCoreInstruction::kWgmma)
        continue;  // this device runs no wgmma
      if (once) {
        attention_forward_tiled({}, dims, t, false, q.data(), pos.data(), k.data(), v.data(), pos.data(), out.data(),
                                lse.data());
        synchronize({});
        continue;
      }
      const double whole = seconds_per_call([&] {
        attention_forward_tiled({}, dims, t, false, q.data(), pos.data(), k.data(), v.data(), pos.data(), out.data(),
                                lse.data());
      });
      char name[64];
      std::snprintf(name, sizeof name, "%s %dw %dq %dk%s",
                    tiling.instruction == TensorCoreInstruction::kWgmma ? "wgmma" : "mma.sync", tiling.warps,
                    tiling.queries, tiling.key_tile, t == attention_default_tiling() ? " (used)" : "");
      const double whole_tf = flops / whole / 1e12, kernel_tf = flops / (whole - operands) / 1e12;
      std::printf("%-40s %-6s %12.1f %12.1f %11.1f%% %11.1f%%\n", name, causal ? "causal" : "full", whole_tf, kernel_tf,
                  100 * whole_tf / bf16, 100 * kernel_tf / bf16);
    }
    if (!once) std::printf("operand pass (FP32 -> BF16, V transposed): %.1f us\n", operands * 1e6);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const bool profile = argc > 1 && std::strcmp(argv[1], "--profile-tilings") == 0;
  if (argc > 1 && !quick && !profile) {
    std::printf(
        "usage: kernels_bench [--quick | --profile-tilings]\n  times every kernel on GPU 0 against its roofline;\n"
        "  --profile-tilings runs each tensor-core attention tiling once (T 4096, D 64), for a profiler\n");
    return std::strcmp(argv[1], "--help") == 0 ? 0 : 2;
  }
  if (device_count() == 0) {
    std::fprintf(stderr, "error: kernels_bench: no CUDA device\n");
    return 1;
  }
  if (profile) {
    compare_tilings(0, true);
    return 0;
  }
  const double bandwidth = peak_bandwidth_gbs();
  std::printf("device: %s, DRAM %.0f GB/s (theoretical)\n", device_name(0).c_str(), bandwidth);
  const double bf16 = cublas_bf16_tflops(quick ? 4096 : 8192);
  std::printf("cuBLAS BF16 GEMM %d^3: %.1f TFLOP/s\n\n", quick ? 4096 : 8192, bf16);

  std::printf("%-34s %10s %12s %10s %8s\n", "kernel (shape)", "time us", "bytes/flops", "rate", "roofline");
  auto memory_row = [&](const char* name, double bytes, const std::function<void()>& call) {
    const double s = seconds_per_call(call);
    std::printf("%-34s %10.1f %10.1f MB %7.0f GB/s %7.0f%%\n", name, s * 1e6, bytes / 1e6, bytes / s / 1e9,
                100 * bytes / s / 1e9 / bandwidth);
  };
  // GPT shapes: d 128 (F 512), batch 32 × T 256 tokens; the optimizer over 0.86 M parameters.
  const int d = 128, f = 512, n = 32 * 256, vocab = 256;
  const std::size_t dn = static_cast<std::size_t>(d) * n;
  auto x = random_device(static_cast<std::size_t>(f) * n, 1), y = random_device(static_cast<std::size_t>(f) * n, 2),
       dy = random_device(static_cast<std::size_t>(f) * n, 3), gamma = random_device(d, 4), beta = random_device(d, 5),
       mean = random_device(n, 6), rstd = random_device(n, 7), dg = random_device(d, 8), db = random_device(d, 9);
  memory_row("gelu_forward (512 x 8192)", 8.0 * f * n, [&] { gelu_forward({}, std::size_t(f) * n, x.data(), y.data()); });
  memory_row("gelu_backward (512 x 8192)", 12.0 * f * n,
             [&] { gelu_backward({}, std::size_t(f) * n, x.data(), dy.data(), y.data()); });
  // The bias pair of every linear layer: add_bias forward, add_row_sums (its gradient) backward.
  memory_row("add_bias (512 x 8192)", 8.0 * f * n, [&] { add_bias({}, f, n, dg.data(), y.data()); });
  memory_row("add_row_sums (512 x 8192)", 4.0 * f * n, [&] { add_row_sums({}, f, n, dy.data(), y.data()); });
  memory_row("add_row_sums (128 x 8192)", 4.0 * dn, [&] { add_row_sums({}, d, n, dy.data(), y.data()); });
  memory_row("split_heads (128 x 8192, 4 heads)", 8.0 * dn,
             [&] { split_heads({}, 32, 256, 4, 32, d, 0, x.data(), y.data()); });
  memory_row("layernorm_forward (128 x 8192)", 8.0 * dn,
             [&] { layernorm_forward({}, d, n, x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data()); });
  memory_row("layernorm_backward (128 x 8192)", 20.0 * dn, [&] {
    layernorm_backward({}, d, n, x.data(), mean.data(), rstd.data(), gamma.data(), dy.data(), nullptr, y.data(), dg.data(),
                       db.data());
  });
  {
    auto logits = random_device(static_cast<std::size_t>(vocab) * n, 10);
    std::vector<std::int32_t> host_targets(n);
    for (int j = 0; j < n; ++j) host_targets[j] = j % vocab;
    DeviceArray<std::int32_t> targets(n);
    copy_to_device(targets.data(), host_targets.data(), sizeof(std::int32_t) * n, {});
    DeviceArray<float> loss(n);
    DeviceArray<int> correct(n);
    memory_row("softmax_cross_entropy (256 x 8192)", 8.0 * vocab * n, [&] {
      softmax_cross_entropy({}, vocab, n, logits.data(), targets.data(), 1e-4f, loss.data(), correct.data());
    });
    std::vector<int> positions(256);
    std::iota(positions.begin(), positions.end(), 0);
    DeviceArray<int> pos(256);
    copy_to_device(pos.data(), positions.data(), sizeof(int) * 256, {});
    auto wte = random_device(static_cast<std::size_t>(d) * vocab, 11), wpe = random_device(static_cast<std::size_t>(d) * 256, 12);
    memory_row("token_embedding_forward (128 x 8192)", 4.0 * dn + 4.0 * n, [&] {
      token_embedding_forward({}, d, 32, 256, targets.data(), pos.data(), wte.data(), wpe.data(), y.data());
    });
  }
  const std::size_t params = 860000;
  auto p = random_device(params, 13), g = random_device(params, 14), m1 = random_device(params, 15),
       m2 = random_device(params, 16), u = random_device(params, 17);
  memory_row("adamw_update (0.86 M)", 28.0 * params, [&] {
    adamw_update({}, params, p.data(), g.data(), m1.data(), m2.data(), u.data(), 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 10.0f);
  });
  memory_row("sgd_update (0.86 M)", 20.0 * params,
             [&] { sgd_update({}, params, p.data(), g.data(), m1.data(), u.data(), 0.05f, 0.9f, 1e-4f); });
  {
    const float* inputs[3] = {g.data(), m1.data(), m2.data()};
    const float weights[3] = {1.0f / 3, 1.0f / 3, 1.0f / 3};
    memory_row("gossip_mix (3 x 0.86 M)", 16.0 * params, [&] { gossip_mix({}, p.data(), inputs, weights, 3, params); });
  }

  std::printf(
      "\nattention, TFLOP/s (FLOPs: forward 4·T²·D per (sequence, head), backward 8·T²·D (dV, dP, dQ, dK);"
      " causal half)\n");
  std::printf("%-34s %12s %12s %12s %14s\n", "shape", "fwd fp32", "fwd bf16 TC", "bwd fp32", "bf16 fwd/GEMM");
  for (int head_dim : {32, 64})
    for (int tokens : quick ? std::vector<int>{1024} : std::vector<int>{1024, 4096})
      for (bool causal : {false, true}) {
        const int rows = (quick ? 16 : 64) * 1024 / tokens * 16 / (head_dim / 32);  // ~constant work per shape
        const std::size_t size = static_cast<std::size_t>(rows) * tokens * head_dim;
        auto q = random_device(size, 20), k = random_device(size, 21), v = random_device(size, 22),
             dout = random_device(size, 23);
        DeviceArray<float> out(size), lse(static_cast<std::size_t>(rows) * tokens), delta(lse.size()), dq(size), dk(size),
            dv(size);
        std::vector<int> positions(tokens);
        std::iota(positions.begin(), positions.end(), 0);
        DeviceArray<int> pos(tokens);
        copy_to_device(pos.data(), positions.data(), sizeof(int) * tokens, {});
        const AttentionDims dims{.rows = rows, .tq = tokens, .tk = tokens, .head_dim = head_dim, .causal = causal};
        const double pairs = static_cast<double>(rows) * tokens * tokens * (causal ? 0.5 : 1.0);
        const double fwd = seconds_per_call(
            [&] { attention_forward({}, dims, q.data(), pos.data(), k.data(), v.data(), pos.data(), out.data(), lse.data()); });
        attention_backward_delta({}, rows, tokens, head_dim, out.data(), dout.data(), delta.data());
        const double bwd = seconds_per_call([&] {
          attention_backward({}, dims, q.data(), pos.data(), k.data(), v.data(), pos.data(), lse.data(), delta.data(),
                             dout.data(), dq.data(), dk.data(), dv.data());
        });
        AttentionDims tensor_cores = dims;
        tensor_cores.precision = AttentionPrecision::kBf16;
        const double fwd_tc = seconds_per_call([&] {
          attention_forward({}, tensor_cores, q.data(), pos.data(), k.data(), v.data(), pos.data(), out.data(),
                            lse.data());
        });
        const double fwd_tflops = 4 * pairs * head_dim / fwd / 1e12, bwd_tflops = 8 * pairs * head_dim / bwd / 1e12;
        const double tc_tflops = 4 * pairs * head_dim / fwd_tc / 1e12;
        char shape[64];
        std::snprintf(shape, sizeof shape, "rows %d T %d D %d %s", rows, tokens, head_dim, causal ? "causal" : "full");
        std::printf("%-34s %12.2f %12.2f %12.2f %13.1f%%\n", shape, fwd_tflops, tc_tflops, bwd_tflops,
                    100 * tc_tflops / bf16);
      }
  compare_tilings(bf16, false);
  std::printf("\npeak device memory held by this process: %.1f MiB\n",
              static_cast<double>(peak_allocated_bytes()) / (1 << 20));
  return 0;
}
