// Forward attention on Hopper's warpgroup matrix products (wgmma, sm_90a): the
// FlashAttention-2 loop of attention_bf16.cu with each warpgroup of 4 warps owning 64
// queries and doing S = Q·Kᵀ as one m64n64k16 product per 16 dimensions and O += P·V as
// one m64nDk16 product per 16 keys, where mma.sync needs 32 products of m16n8k16 per warp
// for each. A (Q, then P) comes from registers in the layout the softmax already holds;
// B (K, then Vᵀ) is read by the tensor cores straight from shared memory, so no thread
// loads B fragments at all. This is the instruction cuBLAS's BF16 GEMM runs on; mma.sync
// issues at about two-thirds of its rate on Hopper (FlashAttention-3, Shah et al. 2024).
// Not here from FlashAttention-3: the tensor-memory accelerator for the copies, warp
// specialisation, and the softmax of one tile overlapped with the products of the next
// (its Algorithm 2 was tried: slower here, 219 against 248 TFLOP/s on the H200, with one
// barrier and a synchronous load of key positions per tile still in the loop); several
// blocks per multiprocessor overlap one block's softmax with another's products.
//
// The shared tiles hold K and Vᵀ as the canonical unswizzled K-major layout: core
// matrices of 8 rows × 8 BF16s (128 contiguous bytes), along K (the contraction) 128
// bytes apart and along N (keys for K, dimensions for Vᵀ) (K/8)·128 bytes apart. A
// cp.async chunk of 16 bytes is one row of one core matrix, and the 8 lanes that fill a
// core matrix write 128 contiguous bytes (no bank conflicts).
//
// Built for sm_90a alone (CMake gives this file its own target); the emulated build runs
// it on emulator.h's model of wgmma.
#include <atomic>
#include <climits>
#include <cstdint>

#include "attention_bf16.h"
#include "attention_tile.h"
#include "compat.h"
#include "wgmma.h"

namespace peertrain::kernels::detail {
namespace {

constexpr int kWgmmaKeyTile = 64;
static_assert(kOperandKeyTile % kWgmmaKeyTile == 0, "the key padding must hold whole tiles");
constexpr int kStages = 3;  // tile j computed while j + 1 and j + 2 are in flight

// K and Vᵀ tiles, three deep: 48 KB at D 64, the most a block may hold statically.
template <int D>
struct alignas(128) WgmmaTiles {
  std::uint32_t keys[kStages][kWgmmaKeyTile * D / 2];    // K, N = keys, K = dimensions
  std::uint32_t values[kStages][D * kWgmmaKeyTile / 2];  // Vᵀ, N = dimensions, K = keys
};

// Starts the copy of key tile k0 into buffer `stage` as one cp.async group. Chunk c is row
// c % 8 of core matrix c / 8; its 16 bytes sit at word 4c.
template <int D, int kThreads>
__device__ __forceinline__ void load_tile(WgmmaTiles<D>& tiles, int stage, int k0, const AttentionOperands& ops,
                                          const std::uint32_t* k_row, const std::uint32_t* vt_row) {
  const int tid = static_cast<int>(threadIdx.x);
  for (int c = tid; c < kWgmmaKeyTile * D / 8; c += kThreads) {
    const int matrix = c / 8, key = matrix / (D / 8) * 8 + c % 8, part = matrix % (D / 8);
    copy_async_16(&tiles.keys[stage][4 * c], k_row + static_cast<std::size_t>(k0 + key) * (D / 2) + part * 4);
  }
  for (int c = tid; c < D * kWgmmaKeyTile / 8; c += kThreads) {
    const int matrix = c / 8, d = matrix / (kWgmmaKeyTile / 8) * 8 + c % 8, part = matrix % (kWgmmaKeyTile / 8);
    copy_async_16(&tiles.values[stage][4 * c],
                  vt_row + static_cast<std::size_t>(d) * (ops.padded / 2) + k0 / 2 + part * 4);
  }
  copy_async_commit();
}

// The key tiles the block's queries see: all of them, or (causal) those whose first key is
// at or before the block's last query (positions ascend; the padding is INT_MAX).
__device__ __forceinline__ int tiles_seen(int tk, bool causal, int horizon, const int* key_positions) {
  const int tiles = (tk + kWgmmaKeyTile - 1) / kWgmmaKeyTile;
  if (!causal) return tiles;
  int lo = 0, hi = tiles;  // the first tile past the horizon, by bisection
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (key_positions[mid * kWgmmaKeyTile] <= horizon)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// G warpgroups of 64 queries per block. The loop holds one barrier per key tile: after it,
// every warp is done with tile j − 1, whose buffer then takes tile j + 2. The only global
// loads in the loop are key positions (padded, so never out of range): with a causal mask,
// the last of each tile (does any query lose a key?), and all of a tile that needs a mask.
template <int D, int G>
__global__ void __launch_bounds__(G * 128, (G >= 3 ? 1 : 2))
    attention_forward_wgmma_kernel(int tq, int tk, bool causal, AttentionOperands ops, const int* q_positions,
                                   float* out, float* lse) {
  constexpr int kQueryTile = G * 64, kThreads = G * 128;
  constexpr unsigned kKeyStride = D / 8 * 128, kValueStride = kWgmmaKeyTile / 8 * 128;  // bytes between N core matrices
  __shared__ WgmmaTiles<D> tiles;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32, group = lane / 4, pair = lane % 4;
  const std::size_t row = blockIdx.y;
  const int first_query = static_cast<int>(blockIdx.x) * kQueryTile;
  const std::uint32_t* k_row = ops.k + row * ops.padded * (D / 2);
  const std::uint32_t* vt_row = ops.vt + row * D * (ops.padded / 2);

  // Warp w of warpgroup g holds rows 16w … 16w + 15 of the group's 64.
  QueryRows<D> rows;
  load_query_rows<D>(rows, first_query + warp * 16, tq, ops.q + row * tq * (D / 2), q_positions, group, pair);
  const int last_query = (first_query + kQueryTile < tq ? first_query + kQueryTile : tq) - 1;
  const int horizon = causal ? q_positions[last_query] : INT_MAX;
  const int earliest = q_positions[first_query];
  const int tiles_to_see = tiles_seen(tk, causal, horizon, ops.key_positions);

  float o[D / 8][4] = {};
  SoftmaxRows state;
  for (int t = 0; t < kStages - 1; ++t)  // one group per tile, empty past the last
    if (t < tiles_to_see)
      load_tile<D, kThreads>(tiles, t, t * kWgmmaKeyTile, ops, k_row, vt_row);
    else
      copy_async_commit();
  for (int j = 0; j < tiles_to_see; ++j) {
    const int k0 = j * kWgmmaKeyTile, stage = j % kStages;
    // No query of the block loses a key of this tile: skip the per-score mask.
    const bool unmasked =
        k0 + kWgmmaKeyTile <= tk && (!causal || ops.key_positions[k0 + kWgmmaKeyTile - 1] <= earliest);
    copy_async_wait<kStages - 2>();  // tile j has landed; j + 1 may still be in flight
    fence_async_shared();            // this thread's copies, visible to the tensor cores' reads
    __syncthreads();
    if (j + kStages - 1 < tiles_to_see)
      load_tile<D, kThreads>(tiles, (j + kStages - 1) % kStages, k0 + (kStages - 1) * kWgmmaKeyTile, ops, k_row,
                             vt_row);
    else
      copy_async_commit();

    // S = Q·Kᵀ: D/16 products, each over 16 dimensions (two core matrices along K).
    float s[kWgmmaKeyTile / 8][4];  // written whole by the first product (accumulate off)
    wgmma_fence();
    PT_UNROLL
    for (int ks = 0; ks < D / 16; ++ks)
      wgmma_bf16<kWgmmaKeyTile>(s, rows.a[ks], wgmma_descriptor(&tiles, &tiles.keys[stage][ks * 64], 128, kKeyStride),
                                ks > 0);
    wgmma_commit();
    wgmma_wait<0>();
    keep_registers(s);

    if (!unmasked) mask_scores(s, rows, k0, tk, causal, ops.key_positions + k0, pair);
    rescale_rows(o, online_softmax(s, state));

    // O += P·V: 4 products, each over 16 keys.
    std::uint32_t p[kWgmmaKeyTile / 16][4];
    PT_UNROLL
    for (int kk = 0; kk < kWgmmaKeyTile / 16; ++kk) pack_probabilities(s, kk, p[kk]);
    keep_registers(o);
    keep_registers(p);
    wgmma_fence();
    PT_UNROLL
    for (int kk = 0; kk < kWgmmaKeyTile / 16; ++kk)
      wgmma_bf16<D>(o, p[kk], wgmma_descriptor(&tiles, &tiles.values[stage][kk * 64], 128, kValueStride), true);
    wgmma_commit();
    wgmma_wait<0>();
    keep_registers(o);
    keep_registers(p);  // the products read p until the wait
  }
  copy_async_wait<0>();  // the empty groups
  store_rows<D>(o, state, rows, tq, out + row * tq * D, lse + row * tq, pair);
}

template <int D, int G>
void launch(Stream stream, const AttentionDims& dims, const AttentionOperands& ops, const int* q_positions, float* out,
            float* lse) {
  const dim3 grid((dims.tq + G * 64 - 1) / (G * 64), dims.rows);
  PT_LAUNCH((attention_forward_wgmma_kernel<D, G>), grid, G * 128, 0, stream, dims.tq, dims.tk, dims.causal, ops,
            q_positions, out, lse);
}

template <int G>
void launch_any(Stream stream, const AttentionDims& dims, const AttentionOperands& ops, const int* q_positions,
                float* out, float* lse) {
  with_head_dim(dims.head_dim, [&]<int D>() { launch<D, G>(stream, dims, ops, q_positions, out, lse); });
}

}  // namespace

bool wgmma_available() {
#if defined(__CUDACC__)
  // Asked on every attention call: the answer for each of the first 16 devices is kept.
  static std::atomic<signed char> known[16] = {};  // 0 not asked yet, 1 no, 2 yes
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  const bool cached = device >= 0 && device < 16;
  if (cached) {
    const signed char answer = known[device].load(std::memory_order_relaxed);
    if (answer != 0) return answer == 2;
  }
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    return false;                             // not kept: ask again next time
  const bool yes = major == 9 && minor == 0;  // sm_90a code runs on compute capability 9.0 alone
  if (cached) known[device].store(yes ? 2 : 1, std::memory_order_relaxed);
  return yes;
#else
  return true;
#endif
}

void launch_attention_wgmma(const AttentionTiling& tiling, Stream stream, const AttentionDims& dims,
                            const AttentionOperands& ops, const int* q_positions, float* out, float* lse) {
  switch (tiling.warps / 4) {
    case 1:
      return launch_any<1>(stream, dims, ops, q_positions, out, lse);
    case 2:
      return launch_any<2>(stream, dims, ops, q_positions, out, lse);
    default:
      return launch_any<3>(stream, dims, ops, q_positions, out, lse);
  }
}

}  // namespace peertrain::kernels::detail
