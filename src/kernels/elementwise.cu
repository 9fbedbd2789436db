// Memory-bound kernels: one pass, each element read and written once, grid-stride loops
// of 256 threads so one launch covers any size.
#include "compat.h"
#include "peertrain/kernels/ops.h"
#include "peertrain/core/error.h"

namespace peertrain::kernels {
namespace {

constexpr int kThreads = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // √(2/π)
constexpr float kGeluCube = 0.044715f;

__device__ __forceinline__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

__global__ void add_bias_kernel(int rows, std::size_t count, const float* bias, float* y) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) y[i] += bias[i % rows];
}

// grid.x: rows in blocks of kThreads; grid.y: chunks of kRowSumColumns columns. A thread
// sums its row over one chunk (neighbouring threads read neighbouring rows of a column: one
// coalesced load per column step) and adds that into the row's sum. The chunks are what
// fill the GPU: one thread per row over every column (a bias gradient: 128–512 rows, 8,192
// columns) ran on two blocks and took 270 µs of an H200's time per call, 60% of the GPT
// step (Nsight Compute, docs/kernels.md).
constexpr int kRowSumColumns = 32;
__global__ void add_row_sums_kernel(int rows, int cols, const float* x, float* sums) {
  const int r = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= rows) return;
  const int first = static_cast<int>(blockIdx.y) * kRowSumColumns;
  const int last = first + kRowSumColumns < cols ? first + kRowSumColumns : cols;
  float total = 0.0f;
  for (int c = first; c < last; ++c) total += x[r + static_cast<std::size_t>(c) * rows];
  atomicAdd(sums + r, total);
}

__global__ void add_kernel(std::size_t count, const float* x, float* y) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) y[i] += x[i];
}

__global__ void gelu_forward_kernel(std::size_t count, const float* x, float* y) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    const float a = x[i];
    y[i] = 0.5f * a * (1.0f + tanhf(kGeluScale * (a + kGeluCube * a * a * a)));
  }
}

__global__ void gelu_backward_kernel(std::size_t count, const float* x, const float* dy, float* dx) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    const float a = x[i];
    const float t = tanhf(kGeluScale * (a + kGeluCube * a * a * a));
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * a * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCube * a * a));
  }
}

// Element e of head h of token t of sequence b; to_heads picks the direction.
__global__ void heads_kernel(int batch, int tokens, int heads, int head_dim, int rows, int row_offset,
                             const float* from, float* to, bool to_heads) {
  const std::size_t count = static_cast<std::size_t>(batch) * tokens * heads * head_dim;
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    // i walks the token layout's order (e fastest, then h, t, b), so its side is coalesced.
    const int e = static_cast<int>(i % head_dim);
    std::size_t rest = i / head_dim;
    const int h = static_cast<int>(rest % heads);
    rest /= heads;
    const int t = static_cast<int>(rest % tokens);
    const int b = static_cast<int>(rest / tokens);
    const std::size_t token_index =
        (static_cast<std::size_t>(b) * tokens + t) * rows + row_offset + static_cast<std::size_t>(h) * head_dim + e;
    const std::size_t head_index = ((static_cast<std::size_t>(b) * heads + h) * tokens + t) * head_dim + e;
    if (to_heads)
      to[head_index] = from[token_index];
    else
      to[token_index] = from[head_index];
  }
}

struct MixArgs {
  const float* inputs[kMaxMixInputs];
  float weights[kMaxMixInputs];
};

__global__ void gossip_mix_kernel(float* x, MixArgs args, int num_inputs, std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    float acc = 0.0f;
    for (int j = 0; j < num_inputs; ++j) acc += args.weights[j] * args.inputs[j][i];
    x[i] = acc;  // every input was read first, so x may be one of them
  }
}

}  // namespace

void add_bias(Stream stream, int rows, int cols, const float* bias, float* y) {
  const std::size_t count = static_cast<std::size_t>(rows) * cols;
  if (count == 0) return;
  PT_LAUNCH(add_bias_kernel, detail::grid_for(count, kThreads), kThreads, 0, stream, rows, count, bias, y);
  detail::check_launch("add_bias");
}

void add_row_sums(Stream stream, int rows, int cols, const float* x, float* sums) {
  if (rows == 0) return;
  if (cols == 0) return;
  const dim3 grid((rows + kThreads - 1) / kThreads, (cols + kRowSumColumns - 1) / kRowSumColumns);
  PT_LAUNCH(add_row_sums_kernel, grid, kThreads, 0, stream, rows, cols, x, sums);
  detail::check_launch("add_row_sums");
}

void add(Stream stream, std::size_t count, const float* x, float* y) {
  if (count == 0) return;
  PT_LAUNCH(add_kernel, detail::grid_for(count, kThreads), kThreads, 0, stream, count, x, y);
  detail::check_launch("add");
}

void gelu_forward(Stream stream, std::size_t count, const float* x, float* y) {
  if (count == 0) return;
  PT_LAUNCH(gelu_forward_kernel, detail::grid_for(count, kThreads), kThreads, 0, stream, count, x, y);
  detail::check_launch("gelu_forward");
}

void gelu_backward(Stream stream, std::size_t count, const float* x, const float* dy, float* dx) {
  if (count == 0) return;
  PT_LAUNCH(gelu_backward_kernel, detail::grid_for(count, kThreads), kThreads, 0, stream, count, x, dy, dx);
  detail::check_launch("gelu_backward");
}

void split_heads(Stream stream, int batch, int tokens, int heads, int head_dim, int rows, int row_offset,
                 const float* x, float* heads_out) {
  const std::size_t count = static_cast<std::size_t>(batch) * tokens * heads * head_dim;
  if (count == 0) return;
  PT_LAUNCH(heads_kernel, detail::grid_for(count, kThreads), kThreads, 0, stream, batch, tokens, heads, head_dim, rows,
            row_offset, x, heads_out, true);
  detail::check_launch("split_heads");
}

void merge_heads(Stream stream, int batch, int tokens, int heads, int head_dim, int rows, int row_offset,
                 const float* heads_in, float* x) {
  const std::size_t count = static_cast<std::size_t>(batch) * tokens * heads * head_dim;
  if (count == 0) return;
  PT_LAUNCH(heads_kernel, detail::grid_for(count, kThreads), kThreads, 0, stream, batch, tokens, heads, head_dim, rows,
            row_offset, heads_in, x, false);
  detail::check_launch("merge_heads");
}

void gossip_mix(Stream stream, float* x, const float* const* inputs, const float* weights, int num_inputs,
                std::size_t count) {
  if (num_inputs < 1 || num_inputs > kMaxMixInputs)
    throw Error(ErrorKind::kInvalidArgument,
                str("gossip_mix: ", num_inputs, " inputs; between 1 and ", kMaxMixInputs, " are supported"));
  if (count == 0) return;
  MixArgs args{};
  for (int j = 0; j < num_inputs; ++j) {
    args.inputs[j] = inputs[j];
    args.weights[j] = weights[j];
  }
  PT_LAUNCH(gossip_mix_kernel, detail::grid_for(count, kThreads), kThreads, 0, stream, x, args, num_inputs, count);
  detail::check_launch("gossip_mix");
}

}  // namespace peertrain::kernels
