// Forward attention on the tensor cores: FlashAttention-2's forward (Dao 2023) with BF16
// operands and FP32 accumulation, the same online softmax and the same (out, lse) contract
// as the FP32 kernel in attention.cu, which stays the reference path and the backward.
// This file holds the first pass, the mma.sync kernel (any GPU from Ampere on) and the
// choice among the tilings; attention_wgmma.cu holds the Hopper kernel.
//
// Two passes. The first converts the FP32 activations once: Q to BF16, pre-scaled by
// scale·log2 e (scores then live in the log2 domain and each exponential is one ex2); K to
// BF16 with its keys padded to a multiple of 64 with zeros; V to BF16 and transposed (Vᵀ,
// [dimension][key]) so that both K and V are read as the mma's column-major B operand with
// one 32-bit shared-memory load per register. The second is the attention: a block of
// warps owns a run of queries, 16 or 32 per warp; key/value tiles of 64 stream through two
// shared-memory buffers by cp.async, the next tile's copy in flight while the current one
// is computed. Each warp keeps its scores S = Q·Kᵀ and its output in the mma's accumulator
// registers (attention_tile.h), and the probabilities P feed the next mma (P·V) straight
// from registers, packed to BF16.
//
// Shared-memory rows are padded by 8 BF16s (16 bytes, which keeps cp.async's 16-byte
// alignment): a quad's lanes read 4 consecutive words and the 8 groups land 4 banks
// apart, so a warp's 32 lanes hit 32 distinct banks.
#include <climits>
#include <cstdint>
#include <iterator>

#include "attention_bf16.h"
#include "attention_tile.h"
#include "compat.h"
#include "peertrain/core/error.h"

namespace peertrain::kernels::detail {
namespace {

int padded_keys(int tk) { return (tk + kOperandKeyTile - 1) / kOperandKeyTile * kOperandKeyTile; }

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

// The key positions, padded with INT_MAX (after every query) to a multiple of the key tile.
__global__ void pad_positions_kernel(int tk, int padded, const int* positions, int* dst) {
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < padded;
       i += static_cast<int>(gridDim.x * blockDim.x))
    dst[i] = i < tk ? positions[i] : INT_MAX;
}

// Vᵀ in BF16: dst[r][d][key pair] for one tile of 64 keys per block, through shared memory
// so that both the read of V and the write of Vᵀ are coalesced.
template <int D>
__global__ void __launch_bounds__(256) transpose_values_kernel(int tk, int padded, const float* v, std::uint32_t* dst) {
  __shared__ float tile[kOperandKeyTile][D + 1];
  const std::size_t row = blockIdx.y;
  const int k0 = static_cast<int>(blockIdx.x) * kOperandKeyTile;
  for (int e = static_cast<int>(threadIdx.x); e < kOperandKeyTile * D; e += static_cast<int>(blockDim.x)) {
    const int key = e / D, d = e % D;
    tile[key][d] = k0 + key < tk ? v[(row * tk + k0 + key) * D + d] : 0.0f;
  }
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < D * kOperandKeyTile / 2; e += static_cast<int>(blockDim.x)) {
    const int kp = e % (kOperandKeyTile / 2), d = e / (kOperandKeyTile / 2);
    dst[(row * D + d) * (padded / 2) + k0 / 2 + kp] = pack_bf16x2(tile[2 * kp][d], tile[2 * kp + 1][d]);
  }
}

// --- pass 2: the attention on mma.sync ------------------------------------------------------

constexpr int kKeyTile = 64;
static_assert(kOperandKeyTile % kKeyTile == 0, "the key padding must hold whole tiles");

// The shared tiles of 64 keys: K rows and Vᵀ rows (one per head dimension), double-buffered.
template <int D>
struct alignas(16) Tiles {
  static constexpr int kKeyWords = D / 2 + 4;           // 32-bit words per key row: D BF16s and the pad
  static constexpr int kValueWords = kKeyTile / 2 + 4;  // per row of Vᵀ (one head dimension)
  std::uint32_t keys[2][kKeyTile * kKeyWords];
  std::uint32_t values[2][D * kValueWords];
  int positions[2][kKeyTile];
};

// Starts the copy of key tile k0 into buffer `stage`: 16 bytes per cp.async.
template <int D, int kThreads>
__device__ __forceinline__ void load_tile(Tiles<D>& tiles, int stage, int k0, int tk, const AttentionOperands& ops,
                                          const std::uint32_t* k_row, const std::uint32_t* vt_row,
                                          const int* k_positions) {
  const int tid = static_cast<int>(threadIdx.x);
  for (int e = tid; e < kKeyTile * D / 8; e += kThreads) {  // 8 BF16s per chunk
    const int key = e / (D / 8), part = e % (D / 8);
    copy_async_16(&tiles.keys[stage][key * Tiles<D>::kKeyWords + part * 4],
                  k_row + static_cast<std::size_t>(k0 + key) * (D / 2) + part * 4);
  }
  for (int e = tid; e < D * kKeyTile / 8; e += kThreads) {
    const int d = e / (kKeyTile / 8), part = e % (kKeyTile / 8);
    copy_async_16(&tiles.values[stage][d * Tiles<D>::kValueWords + part * 4],
                  vt_row + static_cast<std::size_t>(d) * (ops.padded / 2) + k0 / 2 + part * 4);
  }
  copy_async_commit();
  for (int e = tid; e < kKeyTile; e += kThreads)
    tiles.positions[stage][e] = k0 + e < tk ? k_positions[k0 + e] : INT_MAX;
}

// W warps per block, each owning MT tiles of 16 queries (the mma's M): a warp loads each K
// and Vᵀ fragment from shared memory once and feeds it to MT mmas, so MT = 2 halves the
// shared-memory traffic per FLOP at the cost of twice the accumulator registers (H200: 4
// warps × 2 tiles ran 6 % faster than 8 × 1). The register budget per thread follows from
// the blocks per multiprocessor asked for.
template <int W, int MT>
constexpr int kMinBlocks = 16 / (W * MT) > 0 ? 16 / (W * MT) : 1;

template <int D, int W, int MT>
__global__ void __launch_bounds__(W * 32, (kMinBlocks<W, MT>))
    attention_forward_mma_kernel(int tq, int tk, bool causal, AttentionOperands ops, const int* q_positions,
                                 const int* k_positions, float* out, float* lse) {
  constexpr int kQueryTile = W * MT * 16;
  __shared__ Tiles<D> tiles;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32, group = lane / 4, pair = lane % 4;
  const std::size_t row = blockIdx.y;
  const int first_query = static_cast<int>(blockIdx.x) * kQueryTile;
  const std::uint32_t* k_row = ops.k + row * ops.padded * (D / 2);
  const std::uint32_t* vt_row = ops.vt + row * D * (ops.padded / 2);

  QueryRows<D> rows[MT];
  PT_UNROLL
  for (int m = 0; m < MT; ++m)
    load_query_rows<D>(rows[m], first_query + (warp * MT + m) * 16, tq, ops.q + row * tq * (D / 2), q_positions, group,
                       pair);
  const int last_query = (first_query + kQueryTile < tq ? first_query + kQueryTile : tq) - 1;
  const int horizon = causal ? q_positions[last_query] : INT_MAX;
  const int earliest = q_positions[first_query];

  float o[MT][D / 8][4] = {};
  SoftmaxRows state[MT];
  // Tiles past the horizon hold no key any query of the block sees (positions ascend).
  bool more = k_positions[0] <= horizon;
  if (more) load_tile<D, W * 32>(tiles, 0, 0, tk, ops, k_row, vt_row, k_positions);
  for (int i = 0; more; ++i) {
    const int k0 = i * kKeyTile, stage = i % 2, next = k0 + kKeyTile;
    more = next < tk && k_positions[next] <= horizon;
    if (more) {  // the next tile's copy overlaps this tile's arithmetic
      load_tile<D, W * 32>(tiles, 1 - stage, next, tk, ops, k_row, vt_row, k_positions);
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

    // Dimensions outer, keys inner: consecutive products write different accumulators, so
    // none waits for the one before it.
    float s[MT][kKeyTile / 8][4] = {};
    PT_UNROLL
    for (int ks = 0; ks < D / 16; ++ks) PT_UNROLL
    for (int nt = 0; nt < kKeyTile / 8; ++nt) {
      const std::uint32_t* key_words = keys + (nt * 8 + group) * Tiles<D>::kKeyWords + ks * 8 + pair;
      const std::uint32_t b[2] = {key_words[0], key_words[4]};
      PT_UNROLL
      for (int m = 0; m < MT; ++m) mma_bf16_m16n8k16(s[m][nt], rows[m].a[ks], b);
    }
    PT_UNROLL
    for (int m = 0; m < MT; ++m) {
      if (!unmasked) mask_scores(s[m], rows[m], k0, tk, causal, key_pos, pair);
      rescale_rows(o[m], online_softmax(s[m], state[m]));
    }
    // O += P·V, 16 keys per step.
    PT_UNROLL
    for (int kk = 0; kk < kKeyTile / 16; ++kk) {
      std::uint32_t a[MT][4];
      PT_UNROLL
      for (int m = 0; m < MT; ++m) pack_probabilities(s[m], kk, a[m]);
      PT_UNROLL
      for (int nd = 0; nd < D / 8; ++nd) {
        const std::uint32_t* value_words = values + (nd * 8 + group) * Tiles<D>::kValueWords + kk * 8 + pair;
        const std::uint32_t b[2] = {value_words[0], value_words[4]};
        PT_UNROLL
        for (int m = 0; m < MT; ++m) mma_bf16_m16n8k16(o[m][nd], a[m], b);
      }
    }
    __syncthreads();  // every warp is done with this buffer before the copy after next refills it
  }
  PT_UNROLL
  for (int m = 0; m < MT; ++m) store_rows<D>(o[m], state[m], rows[m], tq, out + row * tq * D, lse + row * tq, pair);
}

// The BF16 operands, one buffer per host thread: each thread of peertrain drives one
// device, and work on one thread's stream runs in order, so a later call may reuse it.
DeviceArray<std::uint32_t>& operand_workspace() {
  static thread_local DeviceArray<std::uint32_t> workspace;
  return workspace;
}

template <int D, int W, int MT>
void launch_mma(Stream stream, const AttentionDims& dims, const AttentionOperands& ops, const int* q_positions,
                const int* k_positions, float* out, float* lse) {
  constexpr int kQueryTile = W * MT * 16;
  const dim3 grid((dims.tq + kQueryTile - 1) / kQueryTile, dims.rows);
  PT_LAUNCH((attention_forward_mma_kernel<D, W, MT>), grid, W * 32, 0, stream, dims.tq, dims.tk, dims.causal, ops,
            q_positions, k_positions, out, lse);
}

template <int W, int MT>
void launch_mma_any(Stream stream, const AttentionDims& dims, const AttentionOperands& ops, const int* q_positions,
                    const int* k_positions, float* out, float* lse) {
  with_head_dim(dims.head_dim,
                [&]<int D>() { launch_mma<D, W, MT>(stream, dims, ops, q_positions, k_positions, out, lse); });
}

using TensorCoreInstruction::kMmaSync;
using TensorCoreInstruction::kWgmma;

// What kernels_bench compares (H200, T 4096, D 64, 2026-11-27, the kernel alone: wgmma with
// 2 warpgroups 287–289 TFLOP/s, 3 warpgroups 260–262, 1 warpgroup 157; mma.sync 4 warps ×
// 32 queries 247–248, 8 × 16 231–233; key tiles of 32, exponentials partly on the FMA pipe
// and FlashAttention-3's overlap were slower and are gone: src/kernels/NOTES.md). {instruction, warps, queries per block, keys per tile}.
constexpr AttentionTiling kTilings[] = {
    {kMmaSync, 4, 128, 64}, {kMmaSync, 8, 128, 64}, {kWgmma, 4, 64, 64}, {kWgmma, 8, 128, 64}, {kWgmma, 12, 192, 64}};
constexpr std::size_t kMmaDefault = 0, kWgmmaDefault = 3;

// The kernels dispatch on the instruction and the warps alone: every row must be one they
// build (mma.sync: 4 warps × 32 queries or 8 × 16; wgmma: 64 queries per warpgroup), with
// key tiles of 64.
constexpr bool tilings_are_built() {
  for (const AttentionTiling& t : kTilings) {
    const bool mma = t.instruction == kMmaSync && t.queries == 128 && (t.warps == 4 || t.warps == 8);
    const bool wgmma =
        t.instruction == kWgmma && (t.warps == 4 || t.warps == 8 || t.warps == 12) && t.queries == 16 * t.warps;
    if (!(mma || wgmma) || t.key_tile != kKeyTile) return false;
  }
  return kTilings[kMmaDefault].instruction == kMmaSync && kTilings[kWgmmaDefault].instruction == kWgmma;
}
static_assert(tilings_are_built(), "a tiling no kernel builds");

}  // namespace

AttentionOperands convert_attention_operands(Stream stream, const AttentionDims& dims, float scale, const float* q,
                                             const float* k, const float* v, const int* k_positions) {
  const std::size_t rows = static_cast<std::size_t>(dims.rows);
  const int d = dims.head_dim, padded = padded_keys(dims.tk);
  const std::size_t q_words = rows * dims.tq * (d / 2), k_words = rows * padded * (d / 2);
  DeviceArray<std::uint32_t>& workspace = operand_workspace();
  workspace.resize(q_words + 2 * k_words + padded, "bf16 attention operands");
  std::uint32_t* qb = workspace.data();
  std::uint32_t* kb = qb + q_words;
  std::uint32_t* vt = kb + k_words;
  int* positions = reinterpret_cast<int*>(vt + k_words);
  PT_LAUNCH(pad_positions_kernel, grid_for(padded, 256), 256, 0, stream, dims.tk, padded, k_positions, positions);
  PT_LAUNCH(to_bf16_rows_kernel, grid_for(q_words, 256), 256, 0, stream, rows, dims.tq, dims.tq, d, scale * kLog2e, q,
            qb);
  PT_LAUNCH(to_bf16_rows_kernel, grid_for(k_words, 256), 256, 0, stream, rows, dims.tk, padded, d, 1.0f, k, kb);
  const dim3 grid(padded / kOperandKeyTile, dims.rows);
  with_head_dim(d,
                [&]<int D>() { PT_LAUNCH(transpose_values_kernel<D>, grid, 256, 0, stream, dims.tk, padded, v, vt); });
  check_launch("attention_forward (bf16 operands)");
  return {qb, kb, vt, positions, padded};
}

std::span<const AttentionTiling> attention_tilings() { return kTilings; }

std::size_t default_attention_tiling() { return wgmma_available() ? kWgmmaDefault : kMmaDefault; }

void attention_forward_bf16(Stream stream, const AttentionDims& dims, float scale, std::size_t tiling,
                            bool operands_only, const float* q, const int* q_positions, const float* k, const float* v,
                            const int* k_positions, float* out, float* lse) {
  if (tiling >= std::size(kTilings))
    throw Error(ErrorKind::kInvalidArgument,
                str("attention_forward: no tiling ", tiling, " (", std::size(kTilings), " are compiled)"));
  const AttentionTiling& t = kTilings[tiling];
  if (t.instruction == kWgmma && !wgmma_available())
    throw Error(ErrorKind::kInvalidArgument,
                str("attention_forward: tiling ", tiling, " uses wgmma, which needs a GPU of compute capability 9.0"));
  const AttentionOperands ops = convert_attention_operands(stream, dims, scale, q, k, v, k_positions);
  if (operands_only) return;
  if (t.instruction == kWgmma)
    launch_attention_wgmma(t, stream, dims, ops, q_positions, out, lse);
  else if (t.warps == 4)
    launch_mma_any<4, 2>(stream, dims, ops, q_positions, k_positions, out, lse);
  else
    launch_mma_any<8, 1>(stream, dims, ops, q_positions, k_positions, out, lse);
  check_launch("attention_forward (bf16 tensor cores)");
}

}  // namespace peertrain::kernels::detail
