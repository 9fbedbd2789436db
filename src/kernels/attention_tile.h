// What the two tensor-core attention forwards share (attention_bf16.cu on mma.sync,
// attention_wgmma.cu on Hopper's wgmma): the BF16 operands the first pass writes, and the
// per-tile arithmetic a thread does on the scores it holds. Both keep scores and outputs
// in the m16n8 accumulator layout (per 8 columns, a lane holds rows `group` and
// `group + 8`, columns 2·pair and 2·pair + 1), so one online softmax serves both.
#pragma once

#include <climits>
#include <cstdint>

#include "compat.h"
#include "peertrain/kernels/ops.h"

namespace peertrain::kernels::detail {

constexpr int kOperandKeyTile = 64;  // keys are padded with zeros to a multiple of this
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The first pass's output, in this host thread's workspace: Q in BF16 pairs, pre-scaled by
// scale·log2 e ([row][query][D/2]); K in BF16 pairs ([row][padded key][D/2]); Vᵀ in BF16
// pairs ([row][dimension][padded/2]); the key positions padded with INT_MAX.
struct AttentionOperands {
  const std::uint32_t* q;
  const std::uint32_t* k;
  const std::uint32_t* vt;
  const int* key_positions;
  int padded;
};
AttentionOperands convert_attention_operands(Stream stream, const AttentionDims& dims, float scale, const float* q,
                                             const float* k, const float* v, const int* k_positions);

// f.template operator()<D>() for D = head_dim, one of the head dims the kernels are built
// for (16, 32, 64; attention_supports has refused any other).
template <typename F>
void with_head_dim(int head_dim, F&& f) {
  switch (head_dim) {
    case 16:
      return f.template operator()<16>();
    case 32:
      return f.template operator()<32>();
    default:
      return f.template operator()<64>();
  }
}

// This lane's two query rows of a 16-row tile starting at `tile_row`, their positions, and
// Q's A fragments (one per 16 dimensions).
template <int D>
struct QueryRows {
  int r0, r1, p0, p1;
  std::uint32_t a[D / 16][4];
};
template <int D>
__device__ __forceinline__ void load_query_rows(QueryRows<D>& rows, int tile_row, int tq, const std::uint32_t* q_row,
                                                const int* q_positions, int group, int pair) {
  rows.r0 = tile_row + group;
  rows.r1 = rows.r0 + 8;
  const std::uint32_t* q0 = q_row + static_cast<std::size_t>(rows.r0) * (D / 2);
  const std::uint32_t* q1 = q_row + static_cast<std::size_t>(rows.r1) * (D / 2);
  PT_UNROLL
  for (int ks = 0; ks < D / 16; ++ks) {
    const int w = ks * 8 + pair;
    rows.a[ks][0] = rows.r0 < tq ? q0[w] : 0u;
    rows.a[ks][1] = rows.r1 < tq ? q1[w] : 0u;
    rows.a[ks][2] = rows.r0 < tq ? q0[w + 4] : 0u;
    rows.a[ks][3] = rows.r1 < tq ? q1[w + 4] : 0u;
  }
  rows.p0 = rows.r0 < tq ? q_positions[rows.r0] : INT_MIN;
  rows.p1 = rows.r1 < tq ? q_positions[rows.r1] : INT_MIN;
}

// Scores of keys past tk, or (causal) after the query's position, to −inf.
template <int NT, int D>
__device__ __forceinline__ void mask_scores(float (&s)[NT][4], const QueryRows<D>& rows, int k0, int tk, bool causal,
                                            const int* key_pos, int pair) {
  PT_UNROLL
  for (int nt = 0; nt < NT; ++nt) PT_UNROLL
  for (int e = 0; e < 4; ++e) {
    const int key = nt * 8 + 2 * pair + e % 2;
    const bool visible = k0 + key < tk && (!causal || key_pos[key] <= (e < 2 ? rows.p0 : rows.p1));
    if (!visible) s[nt][e] = -INFINITY;
  }
}

// The running softmax state of a lane's two rows: maxima (log2 domain) and this lane's
// share of the sums.
struct SoftmaxRows {
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
};

// One key tile's online softmax: scores become probabilities p = 2^(s − m) against the new
// maxima and the sums take them in; returns in `correction` the factors 2^(m_old − m_new)
// by which the output accumulators must be rescaled (rescale_rows). A row that has seen no
// key yet keeps m = −inf: p = 0, never NaN.
struct RowCorrection {
  float c0, c1;
};
template <int NT>
__device__ __forceinline__ RowCorrection online_softmax(float (&s)[NT][4], SoftmaxRows& r) {
  float top0 = -INFINITY, top1 = -INFINITY;
  PT_UNROLL
  for (int nt = 0; nt < NT; ++nt) {
    top0 = fmaxf(top0, fmaxf(s[nt][0], s[nt][1]));
    top1 = fmaxf(top1, fmaxf(s[nt][2], s[nt][3]));
  }
  PT_UNROLL
  for (int mask = 1; mask < 4; mask *= 2) {  // the quad holding the row
    top0 = fmaxf(top0, PT_SHFL_XOR(top0, mask));
    top1 = fmaxf(top1, PT_SHFL_XOR(top1, mask));
  }
  const float new0 = fmaxf(r.m0, top0), new1 = fmaxf(r.m1, top1);
  const float base0 = new0 == -INFINITY ? 0.0f : new0, base1 = new1 == -INFINITY ? 0.0f : new1;
  const RowCorrection correction{fast_exp2(r.m0 - base0), fast_exp2(r.m1 - base1)};
  float sum0 = 0.0f, sum1 = 0.0f;
  PT_UNROLL
  for (int nt = 0; nt < NT; ++nt) {
    s[nt][0] = fast_exp2(s[nt][0] - base0);
    s[nt][1] = fast_exp2(s[nt][1] - base0);
    s[nt][2] = fast_exp2(s[nt][2] - base1);
    s[nt][3] = fast_exp2(s[nt][3] - base1);
    sum0 += s[nt][0] + s[nt][1];
    sum1 += s[nt][2] + s[nt][3];
  }
  r.l0 = r.l0 * correction.c0 + sum0;
  r.l1 = r.l1 * correction.c1 + sum1;
  r.m0 = new0;
  r.m1 = new1;
  return correction;
}

template <int ND>
__device__ __forceinline__ void rescale_rows(float (&o)[ND][4], RowCorrection correction) {
  PT_UNROLL
  for (int nd = 0; nd < ND; ++nd) {
    o[nd][0] *= correction.c0;
    o[nd][1] *= correction.c0;
    o[nd][2] *= correction.c1;
    o[nd][3] *= correction.c1;
  }
}

// Probabilities for keys 16kk … 16kk + 15 as a BF16 A fragment: the accumulator layout of
// two n8 tiles is the A layout of one k16 step.
template <int NT>
__device__ __forceinline__ void pack_probabilities(const float (&s)[NT][4], int kk, std::uint32_t (&a)[4]) {
  a[0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
  a[1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
  a[2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// out = o / l and lse = (m + log2 l)·ln 2 for the lane's rows that exist.
template <int D>
__device__ __forceinline__ void store_rows(const float (&o)[D / 8][4], const SoftmaxRows& r, const QueryRows<D>& rows,
                                           int tq, float* out_row, float* lse_row, int pair) {
  float sum0 = r.l0, sum1 = r.l1;
  PT_UNROLL
  for (int mask = 1; mask < 4; mask *= 2) {
    sum0 += PT_SHFL_XOR(sum0, mask);
    sum1 += PT_SHFL_XOR(sum1, mask);
  }
  const float inverse0 = sum0 > 0.0f ? 1.0f / sum0 : 0.0f, inverse1 = sum1 > 0.0f ? 1.0f / sum1 : 0.0f;
  PT_UNROLL
  for (int nd = 0; nd < D / 8; ++nd) {
    const int c = nd * 8 + 2 * pair;
    if (rows.r0 < tq) {
      float* dst = out_row + static_cast<std::size_t>(rows.r0) * D + c;
      dst[0] = o[nd][0] * inverse0;
      dst[1] = o[nd][1] * inverse0;
    }
    if (rows.r1 < tq) {
      float* dst = out_row + static_cast<std::size_t>(rows.r1) * D + c;
      dst[0] = o[nd][2] * inverse1;
      dst[1] = o[nd][3] * inverse1;
    }
  }
  if (pair == 0) {
    if (rows.r0 < tq) lse_row[rows.r0] = sum0 > 0.0f ? (r.m0 + log2f(sum0)) * kLn2 : -INFINITY;
    if (rows.r1 < tq) lse_row[rows.r1] = sum1 > 0.0f ? (r.m1 + log2f(sum1)) * kLn2 : -INFINITY;
  }
}

}  // namespace peertrain::kernels::detail
