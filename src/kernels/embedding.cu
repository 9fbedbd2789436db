// The byte embedding: a gather forward, a scatter-add backward. Columns that share a byte
// or a position add into the same gradient column, hence the atomics (their order varies,
// so the gradient does in its last bits; the tolerance in NOTES.md allows for it).
#include "compat.h"
#include "peertrain/kernels/ops.h"

namespace peertrain::kernels {
namespace {

constexpr int kEmbeddingThreads = 256;

__global__ void embedding_forward_kernel(int d, int tokens, std::size_t count, const std::int32_t* ids,
                                         const int* positions, const float* wte, const float* wpe, float* out) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t column = i / d;
    const int feature = static_cast<int>(i % d);
    const int t = static_cast<int>(column % tokens);
    out[i] = wte[static_cast<std::size_t>(ids[column]) * d + feature] +
             wpe[static_cast<std::size_t>(positions[t]) * d + feature];
  }
}

__global__ void embedding_backward_kernel(int d, int tokens, std::size_t count, const std::int32_t* ids,
                                          const int* positions, const float* dout, float* dwte, float* dwpe) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t column = i / d;
    const int feature = static_cast<int>(i % d);
    const int t = static_cast<int>(column % tokens);
    atomicAdd(dwte + static_cast<std::size_t>(ids[column]) * d + feature, dout[i]);
    atomicAdd(dwpe + static_cast<std::size_t>(positions[t]) * d + feature, dout[i]);
  }
}

}  // namespace

void token_embedding_forward(Stream stream, int d, int batch, int tokens, const std::int32_t* ids, const int* positions,
                             const float* wte, const float* wpe, float* out) {
  const std::size_t count = static_cast<std::size_t>(d) * batch * tokens;
  if (count == 0) return;
  PT_LAUNCH(embedding_forward_kernel, detail::grid_for(count, kEmbeddingThreads), kEmbeddingThreads, 0, stream, d,
            tokens, count, ids, positions, wte, wpe, out);
  detail::check_launch("token_embedding_forward");
}

void token_embedding_backward(Stream stream, int d, int batch, int tokens, const std::int32_t* ids,
                              const int* positions, const float* dout, float* dwte, float* dwpe) {
  const std::size_t count = static_cast<std::size_t>(d) * batch * tokens;
  if (count == 0) return;
  PT_LAUNCH(embedding_backward_kernel, detail::grid_for(count, kEmbeddingThreads), kEmbeddingThreads, 0, stream, d,
            tokens, count, ids, positions, dout, dwte, dwpe);
  detail::check_launch("token_embedding_backward");
}

}  // namespace peertrain::kernels
