// LayerNorm over each column (d contiguous floats): one warp per column, so the mean and
// variance are warp reductions with no shared memory. The parameter gradients reduce
// across columns instead, one thread per feature over a chunk of columns, added
// atomically chunk by chunk.
#include "compat.h"
#include "peertrain/kernels/ops.h"

namespace peertrain::kernels {
namespace {

constexpr float kEps = 1e-5f;  // torch.nn.LayerNorm's default, as in model/layers.h
constexpr int kLayerNormThreads = 128;  // four columns per block
// Columns per block of the parameters' gradient: 32 gives 256 blocks for the GPT's 8,192
// columns (256 gave 32 blocks, 49 µs per call on an H200).
constexpr int kColumnsPerChunk = 32;

__global__ void layernorm_forward_kernel(int d, int n, const float* x, const float* gamma, const float* beta, float* y,
                                         float* mean, float* rstd) {
  const int lane = static_cast<int>(threadIdx.x) % detail::kWarp;
  const int j = static_cast<int>(blockIdx.x * (blockDim.x / detail::kWarp) + threadIdx.x / detail::kWarp);
  if (j >= n) return;  // whole warps leave together
  const float* xj = x + static_cast<std::size_t>(j) * d;
  float sum = 0.0f;
  for (int i = lane; i < d; i += detail::kWarp) sum += xj[i];
  const float mu = detail::warp_sum(sum) / d;
  // Two passes over the column (it is in L1 by now): the one-pass E[x²] − E[x]² loses
  // digits when the mean is large against the spread.
  float squares = 0.0f;
  for (int i = lane; i < d; i += detail::kWarp) {
    const float centred = xj[i] - mu;
    squares += centred * centred;
  }
  const float r = rsqrtf(detail::warp_sum(squares) / d + kEps);
  float* yj = y + static_cast<std::size_t>(j) * d;
  for (int i = lane; i < d; i += detail::kWarp) yj[i] = (xj[i] - mu) * r * gamma[i] + beta[i];
  if (lane == 0) {
    mean[j] = mu;
    rstd[j] = r;
  }
}

__global__ void layernorm_backward_input_kernel(int d, int n, const float* x, const float* mean, const float* rstd,
                                                const float* gamma, const float* dy, const float* residual, float* dx) {
  const int lane = static_cast<int>(threadIdx.x) % detail::kWarp;
  const int j = static_cast<int>(blockIdx.x * (blockDim.x / detail::kWarp) + threadIdx.x / detail::kWarp);
  if (j >= n) return;
  const std::size_t at = static_cast<std::size_t>(j) * d;
  const float mu = mean[j], r = rstd[j];
  float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
  for (int i = lane; i < d; i += detail::kWarp) {
    const float dxhat = dy[at + i] * gamma[i];
    sum_dxhat += dxhat;
    sum_dxhat_xhat += dxhat * (x[at + i] - mu) * r;
  }
  const float mean_dxhat = detail::warp_sum(sum_dxhat) / d;
  const float mean_dxhat_xhat = detail::warp_sum(sum_dxhat_xhat) / d;
  for (int i = lane; i < d; i += detail::kWarp) {
    const float xhat = (x[at + i] - mu) * r;
    const float g = (dy[at + i] * gamma[i] - mean_dxhat - xhat * mean_dxhat_xhat) * r;
    dx[at + i] = residual != nullptr ? residual[at + i] + g : g;  // residual may be dx: same element, read first
  }
}

// grid.x: features in blocks of kLayerNormThreads; grid.y: chunks of kColumnsPerChunk columns.
__global__ void layernorm_backward_params_kernel(int d, int n, const float* x, const float* mean, const float* rstd,
                                                 const float* dy, float* dgamma, float* dbeta) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= d) return;
  const int first = static_cast<int>(blockIdx.y) * kColumnsPerChunk;
  const int last = first + kColumnsPerChunk < n ? first + kColumnsPerChunk : n;
  float g = 0.0f, b = 0.0f;
  for (int j = first; j < last; ++j) {
    const std::size_t at = static_cast<std::size_t>(j) * d + i;
    g += dy[at] * (x[at] - mean[j]) * rstd[j];
    b += dy[at];
  }
  atomicAdd(dgamma + i, g);
  atomicAdd(dbeta + i, b);
}

int column_blocks(int n) {
  const int per_block = kLayerNormThreads / detail::kWarp;
  return (n + per_block - 1) / per_block;
}

}  // namespace

void layernorm_forward(Stream stream, int d, int n, const float* x, const float* gamma, const float* beta, float* y,
                       float* mean, float* rstd) {
  if (n == 0) return;
  PT_LAUNCH(layernorm_forward_kernel, column_blocks(n), kLayerNormThreads, 0, stream, d, n, x, gamma, beta, y, mean,
            rstd);
  detail::check_launch("layernorm_forward");
}

void layernorm_backward(Stream stream, int d, int n, const float* x, const float* mean, const float* rstd,
                        const float* gamma, const float* dy, const float* residual, float* dx, float* dgamma,
                        float* dbeta) {
  if (n == 0) return;
  const dim3 params_grid((d + kLayerNormThreads - 1) / kLayerNormThreads,
                         (n + kColumnsPerChunk - 1) / kColumnsPerChunk);
  PT_LAUNCH(layernorm_backward_params_kernel, params_grid, kLayerNormThreads, 0, stream, d, n, x, mean, rstd, dy,
            dgamma, dbeta);
  detail::check_launch("layernorm_backward (parameters)");
  PT_LAUNCH(layernorm_backward_input_kernel, column_blocks(n), kLayerNormThreads, 0, stream, d, n, x, mean, rstd, gamma,
            dy, residual, dx);
  detail::check_launch("layernorm_backward (input)");
}

}  // namespace peertrain::kernels
