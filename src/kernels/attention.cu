// Flash-style attention on CUDA cores (FP32), with the layout and the semantics of
// model::attention_block: scores are never stored, the softmax runs online over key tiles,
// the backward pass recomputes the scores from the saved log-sum-exp.
//
// Forward and dQ: a block of 64 threads owns 64 queries, one each, with its query (and,
// backward, dout and dq) in registers; key/value tiles of 64 pass through shared memory
// and every thread reads the same key at once (a broadcast, no bank conflicts). dK/dV: a
// block owns 64 keys and the query tiles pass through instead, so no gradient is ever
// written by two blocks and nothing needs atomics. Causal blocks stop at the first tile
// that no query of theirs can see (positions ascend), which halves the causal work.
// head_dim is a template parameter so the per-thread vectors stay in registers.
#include <climits>

#include "attention_bf16.h"
#include "attention_tile.h"
#include "compat.h"
#include "peertrain/kernels/ops.h"
#include "peertrain/core/error.h"

namespace peertrain::kernels {
namespace {

constexpr int kTile = 64;   // queries per block (one per thread) and keys per shared tile
constexpr int kChunk = 16;  // scores held in registers between two rescalings of the output

// Keys k0 … k0+63 of a row into shared memory, zeros (and position INT_MAX) past tk; the
// barrier in front keeps it from overwriting a tile that a thread still reads.
template <int D>
__device__ __forceinline__ void load_key_tile(int k0, int tk, const float* k_row, const float* v_row,
                                              const int* k_positions, float* k_tile, float* v_tile, int* k_pos) {
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < kTile * D; e += kTile) {
    const bool real = k0 + e / D < tk;
    k_tile[e] = real ? k_row[static_cast<std::size_t>(k0) * D + e] : 0.0f;
    v_tile[e] = real ? v_row[static_cast<std::size_t>(k0) * D + e] : 0.0f;
  }
  k_pos[threadIdx.x] = k0 + static_cast<int>(threadIdx.x) < tk ? k_positions[k0 + threadIdx.x] : INT_MAX;
  __syncthreads();
}

template <int D>
__global__ void __launch_bounds__(kTile)
    attention_forward_kernel(int tq, int tk, bool causal, float scale, const float* q, const int* q_positions,
                             const float* k, const float* v, const int* k_positions, float* out, float* lse) {
  __shared__ float k_tile[kTile * D];
  __shared__ float v_tile[kTile * D];
  __shared__ int k_pos[kTile];
  const std::size_t row = blockIdx.y;
  const int first_query = static_cast<int>(blockIdx.x) * kTile;
  const int i = first_query + static_cast<int>(threadIdx.x);
  const bool active = i < tq;
  const float* k_row = k + row * tk * D;
  const float* v_row = v + row * tk * D;
  float qi[D], acc[D];
  for (int e = 0; e < D; ++e) {
    qi[e] = active ? q[(row * tq + i) * D + e] * scale : 0.0f;
    acc[e] = 0.0f;
  }
  const int qp = active ? q_positions[i] : INT_MIN;
  const int last_query = (first_query + kTile < tq ? first_query + kTile : tq) - 1;
  const int horizon = causal ? q_positions[last_query] : INT_MAX;
  float m = -INFINITY, l = 0.0f;
  for (int k0 = 0; k0 < tk; k0 += kTile) {
    if (k_positions[k0] > horizon) break;  // the same for the whole block: positions ascend
    load_key_tile<D>(k0, tk, k_row, v_row, k_positions, k_tile, v_tile, k_pos);
    if (!active) continue;
    for (int c = 0; c < kTile; c += kChunk) {
      float s[kChunk];
      float top = -INFINITY;
      for (int u = 0; u < kChunk; ++u) {
        const int key = c + u;
        const bool visible = k0 + key < tk && (!causal || k_pos[key] <= qp);
        float dot = 0.0f;
        for (int e = 0; e < D; ++e) dot += qi[e] * k_tile[key * D + e];
        s[u] = visible ? dot : -INFINITY;
        top = fmaxf(top, s[u]);
      }
      if (top == -INFINITY) continue;
      const float new_m = fmaxf(m, top);
      const float correction = expf(m - new_m);  // 0 while m is −inf
      l *= correction;
      for (int e = 0; e < D; ++e) acc[e] *= correction;
      for (int u = 0; u < kChunk; ++u) {
        const float p = expf(s[u] - new_m);
        l += p;
        for (int e = 0; e < D; ++e) acc[e] += p * v_tile[(c + u) * D + e];
      }
      m = new_m;
    }
  }
  if (!active) return;
  const std::size_t at = row * tq + i;
  for (int e = 0; e < D; ++e) out[at * D + e] = l > 0.0f ? acc[e] / l : 0.0f;
  lse[at] = l > 0.0f ? m + logf(l) : -INFINITY;
}

__global__ void fill_kernel(std::size_t count, float value, float* x) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    x[i] = value;
}

__global__ void attention_merge_kernel(std::size_t count, int head_dim, float* out, float* lse, const float* block_out,
                                       const float* block_lse) {
  for (std::size_t r = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < count;
       r += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float a = lse[r], b = block_lse[r];
    if (b == -INFINITY) continue;  // the block saw nothing for this query
    float* o = out + r * head_dim;
    const float* bo = block_out + r * head_dim;
    if (a == -INFINITY) {
      for (int e = 0; e < head_dim; ++e) o[e] = bo[e];
      lse[r] = b;
      continue;
    }
    const float top = fmaxf(a, b);
    const float merged = top + logf(expf(a - top) + expf(b - top));
    const float wa = expf(a - merged), wb = expf(b - merged);
    for (int e = 0; e < head_dim; ++e) o[e] = o[e] * wa + bo[e] * wb;
    lse[r] = merged;
  }
}

__global__ void attention_delta_kernel(std::size_t count, int head_dim, const float* out, const float* dout,
                                       float* delta) {
  for (std::size_t r = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < count;
       r += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int e = 0; e < head_dim; ++e) sum += out[r * head_dim + e] * dout[r * head_dim + e];
    delta[r] = sum;
  }
}

template <int D>
__global__ void __launch_bounds__(kTile)
    attention_backward_dq_kernel(int tq, int tk, bool causal, float scale, const float* q, const int* q_positions,
                                 const float* k, const float* v, const int* k_positions, const float* lse,
                                 const float* delta, const float* dout, float* dq) {
  __shared__ float k_tile[kTile * D];
  __shared__ float v_tile[kTile * D];
  __shared__ int k_pos[kTile];
  const std::size_t row = blockIdx.y;
  const int first_query = static_cast<int>(blockIdx.x) * kTile;
  const int i = first_query + static_cast<int>(threadIdx.x);
  const bool active = i < tq;
  const std::size_t at = row * tq + (active ? i : 0);
  const float* k_row = k + row * tk * D;
  const float* v_row = v + row * tk * D;
  float qi[D], doi[D], dqi[D];
  for (int e = 0; e < D; ++e) {
    qi[e] = active ? q[at * D + e] : 0.0f;
    doi[e] = active ? dout[at * D + e] : 0.0f;
    dqi[e] = 0.0f;
  }
  const int qp = active ? q_positions[i] : INT_MIN;
  const float lse_i = active ? lse[at] : -INFINITY;
  const float delta_i = active ? delta[at] : 0.0f;
  const int last_query = (first_query + kTile < tq ? first_query + kTile : tq) - 1;
  const int horizon = causal ? q_positions[last_query] : INT_MAX;
  for (int k0 = 0; k0 < tk; k0 += kTile) {
    if (k_positions[k0] > horizon) break;
    load_key_tile<D>(k0, tk, k_row, v_row, k_positions, k_tile, v_tile, k_pos);
    if (!active || lse_i == -INFINITY) continue;
    for (int key = 0; key < kTile; ++key) {
      if (k0 + key >= tk || (causal && k_pos[key] > qp)) continue;
      float s = 0.0f, dp = 0.0f;
      for (int e = 0; e < D; ++e) {
        s += qi[e] * k_tile[key * D + e];
        dp += doi[e] * v_tile[key * D + e];
      }
      const float p = expf(s * scale - lse_i);
      const float ds = p * (dp - delta_i) * scale;
      for (int e = 0; e < D; ++e) dqi[e] += ds * k_tile[key * D + e];
    }
  }
  if (!active) return;
  for (int e = 0; e < D; ++e) dq[at * D + e] += dqi[e];
}

template <int D>
__global__ void __launch_bounds__(kTile)
    attention_backward_dkdv_kernel(int tq, int tk, bool causal, float scale, const float* q, const int* q_positions,
                                   const float* k, const float* v, const int* k_positions, const float* lse,
                                   const float* delta, const float* dout, float* dk, float* dv) {
  __shared__ float q_tile[kTile * D];
  __shared__ float do_tile[kTile * D];
  __shared__ int q_pos[kTile];
  __shared__ float lse_tile[kTile];
  __shared__ float delta_tile[kTile];
  const std::size_t row = blockIdx.y;
  const int first_key = static_cast<int>(blockIdx.x) * kTile;
  const int j = first_key + static_cast<int>(threadIdx.x);
  const bool active = j < tk;
  const std::size_t at = row * tk + (active ? j : 0);
  const float* q_row = q + row * tq * D;
  const float* do_row = dout + row * tq * D;
  float kj[D], vj[D], dkj[D], dvj[D];
  for (int e = 0; e < D; ++e) {
    kj[e] = active ? k[at * D + e] : 0.0f;
    vj[e] = active ? v[at * D + e] : 0.0f;
    dkj[e] = 0.0f;
    dvj[e] = 0.0f;
  }
  const int kp = active ? k_positions[j] : INT_MAX;
  const int earliest_key = k_positions[first_key];
  for (int q0 = 0; q0 < tq; q0 += kTile) {
    const int last_query = (q0 + kTile < tq ? q0 + kTile : tq) - 1;
    if (causal && q_positions[last_query] < earliest_key) continue;  // no query of the tile sees a key of ours
    __syncthreads();
    for (int e = static_cast<int>(threadIdx.x); e < kTile * D; e += kTile) {
      const bool real = q0 + e / D < tq;
      q_tile[e] = real ? q_row[static_cast<std::size_t>(q0) * D + e] : 0.0f;
      do_tile[e] = real ? do_row[static_cast<std::size_t>(q0) * D + e] : 0.0f;
    }
    {
      const int u = static_cast<int>(threadIdx.x);
      const bool real = q0 + u < tq;
      q_pos[u] = real ? q_positions[q0 + u] : INT_MIN;
      lse_tile[u] = real ? lse[row * tq + q0 + u] : -INFINITY;
      delta_tile[u] = real ? delta[row * tq + q0 + u] : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    for (int u = 0; u < kTile; ++u) {
      if (q0 + u >= tq || lse_tile[u] == -INFINITY || (causal && kp > q_pos[u])) continue;
      float s = 0.0f, dp = 0.0f;
      for (int e = 0; e < D; ++e) {
        s += q_tile[u * D + e] * kj[e];
        dp += do_tile[u * D + e] * vj[e];
      }
      const float p = expf(s * scale - lse_tile[u]);
      const float ds = p * (dp - delta_tile[u]) * scale;
      for (int e = 0; e < D; ++e) {
        dvj[e] += p * do_tile[u * D + e];
        dkj[e] += ds * q_tile[u * D + e];
      }
    }
  }
  if (!active) return;
  for (int e = 0; e < D; ++e) {
    dk[at * D + e] += dkj[e];
    dv[at * D + e] += dvj[e];
  }
}

void check_dims(const AttentionDims& dims, const char* what) {
  if (!attention_supports(dims.head_dim))
    throw Error(ErrorKind::kInvalidArgument, str(what, ": head_dim ", dims.head_dim,
                                                 " is not supported on the GPU (16, 32 or 64; d_model / heads)"));
  if (dims.rows < 0 || dims.tq < 0 || dims.tk < 0)
    throw Error(ErrorKind::kInvalidArgument,
                str(what, ": bad shape rows ", dims.rows, " tq ", dims.tq, " tk ", dims.tk));
}

template <int D>
void forward_typed(Stream stream, const AttentionDims& dims, float scale, const float* q, const int* q_positions,
                   const float* k, const float* v, const int* k_positions, float* out, float* lse) {
  const dim3 grid((dims.tq + kTile - 1) / kTile, dims.rows);
  PT_LAUNCH(attention_forward_kernel<D>, grid, kTile, 0, stream, dims.tq, dims.tk, dims.causal, scale, q, q_positions,
            k, v, k_positions, out, lse);
}

template <int D>
void backward_typed(Stream stream, const AttentionDims& dims, float scale, const float* q, const int* q_positions,
                    const float* k, const float* v, const int* k_positions, const float* lse, const float* delta,
                    const float* dout, float* dq, float* dk, float* dv) {
  const dim3 query_grid((dims.tq + kTile - 1) / kTile, dims.rows);
  PT_LAUNCH(attention_backward_dq_kernel<D>, query_grid, kTile, 0, stream, dims.tq, dims.tk, dims.causal, scale, q,
            q_positions, k, v, k_positions, lse, delta, dout, dq);
  detail::check_launch("attention_backward (dq)");
  const dim3 key_grid((dims.tk + kTile - 1) / kTile, dims.rows);
  PT_LAUNCH(attention_backward_dkdv_kernel<D>, key_grid, kTile, 0, stream, dims.tq, dims.tk, dims.causal, scale, q,
            q_positions, k, v, k_positions, lse, delta, dout, dk, dv);
  detail::check_launch("attention_backward (dk, dv)");
}

float score_scale(int head_dim) { return 1.0f / sqrtf(static_cast<float>(head_dim)); }

// Checks the shape; answers the shapes with nothing to compute (true when it did).
bool forward_trivially(Stream stream, const AttentionDims& dims, float* out, float* lse) {
  check_dims(dims, "attention_forward");
  if (dims.rows == 0 || dims.tq == 0) return true;
  if (dims.tk == 0) {  // nothing to attend to: out 0, lse −inf, as for a fully masked query
    const std::size_t count = static_cast<std::size_t>(dims.rows) * dims.tq;
    zero(out, sizeof(float) * count * dims.head_dim, stream);
    PT_LAUNCH(fill_kernel, detail::grid_for(count, 256), 256, 0, stream, count, -INFINITY, lse);
    detail::check_launch("attention_forward (empty key block)");
    return true;
  }
  return false;
}

}  // namespace

bool attention_supports(int head_dim) { return head_dim == 16 || head_dim == 32 || head_dim == 64; }

std::span<const AttentionTiling> attention_tilings() { return detail::attention_tilings(); }

std::size_t attention_default_tiling() { return detail::default_attention_tiling(); }

void attention_forward_tiled(Stream stream, const AttentionDims& dims, std::size_t tiling, bool operands_only,
                             const float* q, const int* q_positions, const float* k, const float* v,
                             const int* k_positions, float* out, float* lse) {
  if (forward_trivially(stream, dims, out, lse)) return;
  detail::attention_forward_bf16(stream, dims, score_scale(dims.head_dim), tiling, operands_only, q, q_positions, k, v,
                                 k_positions, out, lse);
}

void attention_forward(Stream stream, const AttentionDims& dims, const float* q, const int* q_positions, const float* k,
                       const float* v, const int* k_positions, float* out, float* lse) {
  if (dims.precision == AttentionPrecision::kBf16) {
    attention_forward_tiled(stream, dims, detail::default_attention_tiling(), false, q, q_positions, k, v, k_positions,
                            out, lse);
    return;
  }
  if (forward_trivially(stream, dims, out, lse)) return;
  const float scale = score_scale(dims.head_dim);
  detail::with_head_dim(dims.head_dim, [&]<int D>() {
    forward_typed<D>(stream, dims, scale, q, q_positions, k, v, k_positions, out, lse);
  });
  detail::check_launch("attention_forward");
}

void attention_merge(Stream stream, int rows, int tq, int head_dim, float* out, float* lse, const float* block_out,
                     const float* block_lse) {
  const std::size_t count = static_cast<std::size_t>(rows) * tq;
  if (count == 0) return;
  PT_LAUNCH(attention_merge_kernel, detail::grid_for(count, 256), 256, 0, stream, count, head_dim, out, lse, block_out,
            block_lse);
  detail::check_launch("attention_merge");
}

void attention_backward_delta(Stream stream, int rows, int tq, int head_dim, const float* out, const float* dout,
                              float* delta) {
  const std::size_t count = static_cast<std::size_t>(rows) * tq;
  if (count == 0) return;
  PT_LAUNCH(attention_delta_kernel, detail::grid_for(count, 256), 256, 0, stream, count, head_dim, out, dout, delta);
  detail::check_launch("attention_backward_delta");
}

void attention_backward(Stream stream, const AttentionDims& dims, const float* q, const int* q_positions,
                        const float* k, const float* v, const int* k_positions, const float* lse, const float* delta,
                        const float* dout, float* dq, float* dk, float* dv) {
  check_dims(dims, "attention_backward");
  if (dims.rows == 0 || dims.tq == 0 || dims.tk == 0) return;
  const float scale = score_scale(dims.head_dim);
  detail::with_head_dim(dims.head_dim, [&]<int D>() {
    backward_typed<D>(stream, dims, scale, q, q_positions, k, v, k_positions, lse, delta, dout, dq, dk, dv);
  });
}

}  // namespace peertrain::kernels
