// Forward attention on the tensor cores: FlashAttention-2's forward (Dao 2023) with BF16
// operands and FP32 accumulation, the same online softmax and the same (out, lse) contract
// as the FP32 kernel in attention.cu, which stays the reference path and the backward.
//
// Two passes. The first converts the FP32 activations once: Q to BF16, pre-scaled by
// scale·log2 e (scores then live in the log2 domain and each exponential is one ex2); K to
// BF16 with its keys padded to a multiple of the key tile with zeros; V to BF16 and
// transposed (Vᵀ, [dimension][key]) so that both K and V are read as the mma's
// column-major B operand with one 32-bit shared-memory load per register. The second is
// the attention: a block of 8 warps owns 128 queries, 16 per warp; key/value tiles of 64
// stream through two shared-memory buffers by cp.async, the next tile's copy in flight
// while the current one is computed. Each warp keeps its scores S = Q·Kᵀ and its output
// in the mma's accumulator registers: a lane holds rows `group` and `group + 8` of the
// warp's 16, so a row's maximum and sum need only a shuffle among the 4 lanes of a quad,
// and the probabilities P feed the next mma (P·V) straight from registers, packed to BF16
// (the accumulator layout of two n8 tiles is the A layout of one k16 step).
//
// Shared-memory rows are padded by 8 BF16s (16 bytes, which keeps cp.async's 16-byte
// alignment): a quad's lanes read 4 consecutive words and the 8 groups land 4 banks
// apart, so a warp's 32 lanes hit 32 distinct banks.
#include <climits>
#include <cstdint>

#include "attention_bf16.h"
#include "compat.h"

namespace peertrain::kernels::detail {
namespace {

constexpr int kWarps = 8;
constexpr int kQueryTile = kWarps * 16;  // queries per block, 16 per warp (the mma's M)
constexpr int kKeyTile = 64;             // keys per shared tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

int padded_keys(int tk) { return (tk + kKeyTile - 1) / kKeyTile * kKeyTile; }

// --- pass 1: FP32 → BF16 operands ---------------------------------------------------------

// dst[r][t][pair] = bf16(scale·src[r][t][2·pair … +1]) for t < tokens, 0 up to padded.
__global__ void to_bf16_rows_kernel(std::size_t rows, int tokens, int padded, int head_dim, float scale,
                                    const float* src, std::uint32_t* dst) {
  const int pairs = head_dim / 2;
  const std::size_t count = rows * padded * pairs;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = i / (static_cast<std::size_t>(padded) * pairs);
    const int t = static_cast<int>(i / pairs % padded), pair = static_cast<int>(i % pairs);
    if (t < tokens) {
      const float* x = src + (r * tokens + t) * head_dim + 2 * pair;
      dst[i] = pack_bf16x2(x[0] * scale, x[1] * scale);
    } else {
      dst[i] = 0u;
    }
  }
}

// Vᵀ in BF16: dst[r][d][key pair] for one tile of 64 keys per block, through shared memory
// so that both the read of V and the write of Vᵀ are coalesced.
template <int D>
__global__ void __launch_bounds__(256) transpose_values_kernel(int tk, int padded, const float* v, std::uint32_t* dst) {
  __shared__ float tile[kKeyTile][D + 1];
  const std::size_t row = blockIdx.y;
  const int k0 = static_cast<int>(blockIdx.x) * kKeyTile;
  for (int e = static_cast<int>(threadIdx.x); e < kKeyTile * D; e += static_cast<int>(blockDim.x)) {
    const int key = e / D, d = e % D;
    tile[key][d] = k0 + key < tk ? v[(row * tk + k0 + key) * D + d] : 0.0f;
  }
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < D * kKeyTile / 2; e += static_cast<int>(blockDim.x)) {
    const int kp = e % (kKeyTile / 2), d = e / (kKeyTile / 2);
    dst[(row * D + d) * (padded / 2) + k0 / 2 + kp] = pack_bf16x2(tile[2 * kp][d], tile[2 * kp + 1][d]);
  }
}

// --- pass 2: the attention -----------------------------------------------------------------

template <int D>
struct alignas(16) Tiles {
  static constexpr int kKeyWords = D / 2 + 4;           // 32-bit words per key row: D BF16s and the pad
  static constexpr int kValueWords = kKeyTile / 2 + 4;  // per row of Vᵀ (one head dimension)
  std::uint32_t keys[2][kKeyTile * kKeyWords];
  std::uint32_t values[2][D * kValueWords];
  int positions[2][kKeyTile];
};

// Starts the copy of key tile k0 into buffer `stage`: 16 bytes per cp.async.
template <int D>
__device__ __forceinline__ void load_tile(Tiles<D>& tiles, int stage, int k0, int tk, int padded,
                                          const std::uint32_t* k_row, const std::uint32_t* vt_row,
                                          const int* k_positions) {
  const int tid = static_cast<int>(threadIdx.x);
  constexpr int kKeyChunks = kKeyTile * D / 8;  // 8 BF16s per chunk
  for (int e = tid; e < kKeyChunks; e += kWarps * 32) {
    const int key = e / (D / 8), part = e % (D / 8);
    copy_async_16(&tiles.keys[stage][key * Tiles<D>::kKeyWords + part * 4],
                  k_row + static_cast<std::size_t>(k0 + key) * (D / 2) + part * 4);
  }
  for (int e = tid; e < D * kKeyTile / 8; e += kWarps * 32) {
    const int d = e / (kKeyTile / 8), part = e % (kKeyTile / 8);
    copy_async_16(&tiles.values[stage][d * Tiles<D>::kValueWords + part * 4],
                  vt_row + static_cast<std::size_t>(d) * (padded / 2) + k0 / 2 + part * 4);
  }
  copy_async_commit();
  if (tid < kKeyTile) tiles.positions[stage][tid] = k0 + tid < tk ? k_positions[k0 + tid] : INT_MAX;
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32, 2)
    attention_forward_bf16_kernel(int tq, int tk, int padded, bool causal, const std::uint32_t* qb,
                                  const int* q_positions, const std::uint32_t* kb, const std::uint32_t* vt,
                                  const int* k_positions, float* out, float* lse) {
  __shared__ Tiles<D> tiles;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32, group = lane / 4, pair = lane % 4;
  const std::size_t row = blockIdx.y;
  const int first_query = static_cast<int>(blockIdx.x) * kQueryTile;
  const int r0 = first_query + warp * 16 + group, r1 = r0 + 8;  // this lane's two query rows
  const std::uint32_t* k_row = kb + row * padded * (D / 2);
  const std::uint32_t* vt_row = vt + row * D * (padded / 2);

  // Q (BF16, already in the log2 domain) as the A operand, one fragment per 16 dimensions.
  std::uint32_t qa[D / 16][4];
  const std::uint32_t* q0 = qb + (row * tq + r0) * (D / 2);
  const std::uint32_t* q1 = qb + (row * tq + r1) * (D / 2);
  for (int ks = 0; ks < D / 16; ++ks) {
    const int w = ks * 8 + pair;
    qa[ks][0] = r0 < tq ? q0[w] : 0u;
    qa[ks][1] = r1 < tq ? q1[w] : 0u;
    qa[ks][2] = r0 < tq ? q0[w + 4] : 0u;
    qa[ks][3] = r1 < tq ? q1[w + 4] : 0u;
  }
  const int qp0 = r0 < tq ? q_positions[r0] : INT_MIN, qp1 = r1 < tq ? q_positions[r1] : INT_MIN;
  const int last_query = (first_query + kQueryTile < tq ? first_query + kQueryTile : tq) - 1;
  const int horizon = causal ? q_positions[last_query] : INT_MAX;
  const int earliest = q_positions[first_query];

  float o[D / 8][4] = {};
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // per row; l is this lane's share
  // Tiles past the horizon hold no key any query of the block sees (positions ascend).
  bool more = k_positions[0] <= horizon;
  if (more) load_tile<D>(tiles, 0, 0, tk, padded, k_row, vt_row, k_positions);
  for (int i = 0; more; ++i) {
    const int k0 = i * kKeyTile, stage = i % 2, next = k0 + kKeyTile;
    more = next < tk && k_positions[next] <= horizon;
    if (more) {  // the next tile's copy overlaps this tile's arithmetic
      load_tile<D>(tiles, 1 - stage, next, tk, padded, k_row, vt_row, k_positions);
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    __syncthreads();  // this tile has landed for every thread's copies
    const std::uint32_t* keys = tiles.keys[stage];
    const std::uint32_t* values = tiles.values[stage];
    const int* key_pos = tiles.positions[stage];
    // No query of the block loses a key of this tile: skip the per-score mask.
    const bool unmasked = next <= tk && (!causal || key_pos[kKeyTile - 1] <= earliest);

    float s[kKeyTile / 8][4] = {};
    for (int nt = 0; nt < kKeyTile / 8; ++nt)
      for (int ks = 0; ks < D / 16; ++ks) {
        const std::uint32_t* key_words = keys + (nt * 8 + group) * Tiles<D>::kKeyWords + ks * 8 + pair;
        const std::uint32_t b[2] = {key_words[0], key_words[4]};
        mma_bf16_m16n8k16(s[nt], qa[ks], b);
      }
    if (!unmasked)
      for (int nt = 0; nt < kKeyTile / 8; ++nt)
        for (int e = 0; e < 4; ++e) {
          const int key = nt * 8 + 2 * pair + e % 2;
          const bool visible = k0 + key < tk && (!causal || key_pos[key] <= (e < 2 ? qp0 : qp1));
          if (!visible) s[nt][e] = -INFINITY;
        }

    float top0 = -INFINITY, top1 = -INFINITY;
    for (int nt = 0; nt < kKeyTile / 8; ++nt) {
      top0 = fmaxf(top0, fmaxf(s[nt][0], s[nt][1]));
      top1 = fmaxf(top1, fmaxf(s[nt][2], s[nt][3]));
    }
    for (int mask = 1; mask < 4; mask *= 2) {  // the quad holding the row
      top0 = fmaxf(top0, PT_SHFL_XOR(top0, mask));
      top1 = fmaxf(top1, PT_SHFL_XOR(top1, mask));
    }
    const float new0 = fmaxf(m0, top0), new1 = fmaxf(m1, top1);
    // A row that has seen no key yet keeps m = −inf: no rescaling and p = 0, never NaN.
    const float base0 = new0 == -INFINITY ? 0.0f : new0, base1 = new1 == -INFINITY ? 0.0f : new1;
    const float correction0 = fast_exp2(m0 - base0), correction1 = fast_exp2(m1 - base1);
    float sum0 = 0.0f, sum1 = 0.0f;
    for (int nt = 0; nt < kKeyTile / 8; ++nt) {
      s[nt][0] = fast_exp2(s[nt][0] - base0);
      s[nt][1] = fast_exp2(s[nt][1] - base0);
      s[nt][2] = fast_exp2(s[nt][2] - base1);
      s[nt][3] = fast_exp2(s[nt][3] - base1);
      sum0 += s[nt][0] + s[nt][1];
      sum1 += s[nt][2] + s[nt][3];
    }
    l0 = l0 * correction0 + sum0;
    l1 = l1 * correction1 + sum1;
    m0 = new0;
    m1 = new1;
    for (int nd = 0; nd < D / 8; ++nd) {
      o[nd][0] *= correction0;
      o[nd][1] *= correction0;
      o[nd][2] *= correction1;
      o[nd][3] *= correction1;
    }
    // O += P·V, 16 keys per step: score tiles 2kk and 2kk+1 are P's A fragment.
    for (int kk = 0; kk < kKeyTile / 16; ++kk) {
      const std::uint32_t a[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                                  pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                  pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      for (int nd = 0; nd < D / 8; ++nd) {
        const std::uint32_t* value_words = values + (nd * 8 + group) * Tiles<D>::kValueWords + kk * 8 + pair;
        const std::uint32_t b[2] = {value_words[0], value_words[4]};
        mma_bf16_m16n8k16(o[nd], a, b);
      }
    }
    __syncthreads();  // every warp is done with this buffer before the copy after next refills it
  }
  for (int mask = 1; mask < 4; mask *= 2) {
    l0 += PT_SHFL_XOR(l0, mask);
    l1 += PT_SHFL_XOR(l1, mask);
  }
  const float inverse0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inverse1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
  for (int nd = 0; nd < D / 8; ++nd) {
    const int c = nd * 8 + 2 * pair;
    if (r0 < tq) {
      float* dst = out + (row * tq + r0) * D + c;
      dst[0] = o[nd][0] * inverse0;
      dst[1] = o[nd][1] * inverse0;
    }
    if (r1 < tq) {
      float* dst = out + (row * tq + r1) * D + c;
      dst[0] = o[nd][2] * inverse1;
      dst[1] = o[nd][3] * inverse1;
    }
  }
  if (pair == 0) {
    if (r0 < tq) lse[row * tq + r0] = l0 > 0.0f ? (m0 + log2f(l0)) * kLn2 : -INFINITY;
    if (r1 < tq) lse[row * tq + r1] = l1 > 0.0f ? (m1 + log2f(l1)) * kLn2 : -INFINITY;
  }
}

// The BF16 operands, one buffer per host thread: each thread of peertrain drives one
// device, and work on one thread's stream runs in order, so a later call may reuse it.
DeviceArray<std::uint32_t>& operand_workspace() {
  static thread_local DeviceArray<std::uint32_t> workspace;
  return workspace;
}

template <int D>
void launch_typed(Stream stream, const AttentionDims& dims, float scale, const float* q, const int* q_positions,
                  const float* k, const float* v, const int* k_positions, float* out, float* lse) {
  const std::size_t rows = static_cast<std::size_t>(dims.rows);
  const int padded = padded_keys(dims.tk);
  const std::size_t q_words = rows * dims.tq * (D / 2), k_words = rows * padded * (D / 2);
  DeviceArray<std::uint32_t>& workspace = operand_workspace();
  workspace.resize(q_words + 2 * k_words, "bf16 attention operands");
  std::uint32_t* qb = workspace.data();
  std::uint32_t* kb = qb + q_words;
  std::uint32_t* vt = kb + k_words;
  PT_LAUNCH(to_bf16_rows_kernel, grid_for(q_words, 256), 256, 0, stream, rows, dims.tq, dims.tq, D, scale * kLog2e, q,
            qb);
  PT_LAUNCH(to_bf16_rows_kernel, grid_for(k_words, 256), 256, 0, stream, rows, dims.tk, padded, D, 1.0f, k, kb);
  PT_LAUNCH(transpose_values_kernel<D>, dim3(padded / kKeyTile, dims.rows), 256, 0, stream, dims.tk, padded, v, vt);
  check_launch("attention_forward (bf16 operands)");
  const dim3 grid((dims.tq + kQueryTile - 1) / kQueryTile, dims.rows);
  PT_LAUNCH(attention_forward_bf16_kernel<D>, grid, kWarps * 32, 0, stream, dims.tq, dims.tk, padded, dims.causal, qb,
            q_positions, kb, vt, k_positions, out, lse);
}

}  // namespace

void attention_forward_bf16(Stream stream, const AttentionDims& dims, float scale, const float* q,
                            const int* q_positions, const float* k, const float* v, const int* k_positions, float* out,
                            float* lse) {
  switch (dims.head_dim) {
    case 16:
      launch_typed<16>(stream, dims, scale, q, q_positions, k, v, k_positions, out, lse);
      break;
    case 32:
      launch_typed<32>(stream, dims, scale, q, q_positions, k, v, k_positions, out, lse);
      break;
    default:
      launch_typed<64>(stream, dims, scale, q, q_positions, k, v, k_positions, out, lse);
      break;
  }
  check_launch("attention_forward (bf16 tensor cores)");
}

}  // namespace peertrain::kernels::detail
