// Fused attention kernels for AVX-512 (FlashAttention's tiling, Dao et al. 2022, on a CPU
// core): a 64-query tile is packed once, transposed so that 16 queries fill a vector, and
// meets the keys 64 at a time. The scores of a tile (64 × 64 floats, 16 KiB) stay in L1
// between the two products, the softmax runs down the vectors (a query's max and sum are
// lane-wise, no horizontal reduction), and the exponential is a base-2 polynomial whose
// scale by log2(e)/√d is folded into the packed queries.
//
// Two register-blocked products do all the arithmetic:
//   scores:     S[q, i] = Σ_c Qp[c, q] · K[c, i]        queries in lanes, 4 × 6 accumulators
//   accumulate: Out[:, j] += Σ_i A[:, i] · B(i, j)     head_dim in lanes, (d/16) × NC
// Forward: S = scores(Q, K); P = exp2(S − m); O += accumulate(V, P).
// Backward (P recomputed from the log-sum-exp): dP = scores(dO, V), dS = P ∘ (dP − delta),
//   dV += accumulate(dO, Pᵀ), dK += accumulate(Q, dSᵀ), dQ += accumulate(K, dS).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <limits>
#include <utility>

#include "attention_blocks.h"

#if defined(__AVX512F__)
#include <immintrin.h>

#include "peertrain/core/aligned.h"
#endif

namespace peertrain::model::avx512 {

#if !defined(__AVX512F__)

bool supports(int) { return false; }
bool accumulate(int, int, int, const float*, const int*, const float*, const float*, const int*, bool, float*, float*,
                float*, const Strides&) {
  return false;
}
void accumulate_backward(int, int, int, const float*, const int*, const float*, const float*, const int*, bool,
                         const float*, const float*, const float*, float*, float*, float*, const Strides&) {}

#else

namespace {

using std::ptrdiff_t;

constexpr int kLanes = 16;
constexpr int kQueryTile = 64;  // queries packed together: 4 vectors
constexpr int kQueryVectors = kQueryTile / kLanes;
constexpr int kKeyTile = 64;        // keys per score tile
constexpr int kMaxHeadVectors = 8;  // head_dim ≤ 128
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;
constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// 2^x for x ≤ 0: x = n + f with n an integer and |f| ≤ ½, 2^f by a degree-6 polynomial
// (relative error below 1e-7, fitted on Chebyshev nodes), and vscalefps for 2^n. Inputs
// below −126 give 2^−126 (not 0, and never a denormal): callers mask what must be 0.
inline __m512 exp2(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-126.0f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.5337577497e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3399859890e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6185198054e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5503290147e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022646248e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718246e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Keys of one scores register block for QV query vectors: as many as the 32 vector
// registers hold beside the QV loaded query vectors and one broadcast.
constexpr int block_keys(int qv) { return std::min(24, (31 - qv) / qv); }

// s[q + 64·i] = Σ_c qp[64·c + q] · k[c + ld·i], for the first 16·QV packed queries and NK keys.
template <int QV, int NK>
void scores_block(int d, const float* qp, const float* k, ptrdiff_t ld, float* s) {
  __m512 acc[QV][NK];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (int c = 0; c < d; ++c) {
    __m512 a[QV];
    for (int r = 0; r < QV; ++r) a[r] = _mm512_loadu_ps(qp + kQueryTile * c + kLanes * r);
    for (int i = 0; i < NK; ++i) {
      const __m512 b = _mm512_set1_ps(k[c + ld * i]);
      for (int r = 0; r < QV; ++r) acc[r][i] = _mm512_fmadd_ps(a[r], b, acc[r][i]);
    }
  }
  for (int i = 0; i < NK; ++i)
    for (int r = 0; r < QV; ++r) _mm512_storeu_ps(s + kQueryTile * i + kLanes * r, acc[r][i]);
}

template <int QV, int... N>
void scores_rest(int keys, int d, const float* qp, const float* k, ptrdiff_t ld, float* s,
                 std::integer_sequence<int, N...>) {
  ((keys == N + 1 ? scores_block<QV, N + 1>(d, qp, k, ld, s) : void()), ...);
}

template <int QV>
void scores_keys(int d, const float* qp, const float* k, ptrdiff_t ld, int nk, float* s) {
  constexpr int kKeys = block_keys(QV);
  int i = 0;
  for (; i + kKeys <= nk; i += kKeys) scores_block<QV, kKeys>(d, qp, k + ld * i, ld, s + kQueryTile * i);
  if (i < nk)
    scores_rest<QV>(nk - i, d, qp, k + ld * i, ld, s + kQueryTile * i, std::make_integer_sequence<int, kKeys - 1>{});
}

// The score tile of the first 16·vectors packed queries against nk keys, ld floats apart.
void scores(int vectors, int d, const float* qp, const float* k, ptrdiff_t ld, int nk, float* s) {
  switch (vectors) {
    case 1:
      scores_keys<1>(d, qp, k, ld, nk, s);
      break;
    case 2:
      scores_keys<2>(d, qp, k, ld, nk, s);
      break;
    case 3:
      scores_keys<3>(d, qp, k, ld, nk, s);
      break;
    default:
      scores_keys<4>(d, qp, k, ld, nk, s);
      break;
  }
}

// Columns of one accumulate register block for head_dim = 16·DV: as many as the 32 vector
// registers hold beside DV loaded head vectors and one broadcast.
constexpr int block_columns(int dv) { return std::min(24, (31 - dv) / dv); }

// out[:, j] += Σ_i a[:, i] · b[si·i + sj·j] for NC columns of 16·DV floats; a's columns lie
// lda floats apart, out's ldc.
template <int DV, int NC>
void accumulate_block(int inner, const float* a, ptrdiff_t lda, const float* b, ptrdiff_t si, ptrdiff_t sj, float* out,
                      ptrdiff_t ldc) {
  __m512 acc[DV][NC];
  for (int j = 0; j < NC; ++j)
    for (int r = 0; r < DV; ++r) acc[r][j] = _mm512_loadu_ps(out + ldc * j + kLanes * r);
  for (int i = 0; i < inner; ++i) {
    __m512 x[DV];
    for (int r = 0; r < DV; ++r) x[r] = _mm512_loadu_ps(a + lda * i + kLanes * r);
    const float* bi = b + si * i;
    for (int j = 0; j < NC; ++j) {
      const __m512 y = _mm512_set1_ps(bi[sj * j]);
      for (int r = 0; r < DV; ++r) acc[r][j] = _mm512_fmadd_ps(x[r], y, acc[r][j]);
    }
  }
  for (int j = 0; j < NC; ++j)
    for (int r = 0; r < DV; ++r) _mm512_storeu_ps(out + ldc * j + kLanes * r, acc[r][j]);
}

// One multiply_add's operands: A (head_dim × inner, columns lda apart), B(i, j) = b[si·i + sj·j],
// out (head_dim × columns, columns ldc apart).
struct Product {
  const float* a;
  ptrdiff_t lda;
  const float* b;
  ptrdiff_t si, sj;
  float* out;
  ptrdiff_t ldc;
};

template <int DV, int... N>
void accumulate_rest(int columns, int inner, const Product& p, std::integer_sequence<int, N...>) {
  ((columns == N + 1 ? accumulate_block<DV, N + 1>(inner, p.a, p.lda, p.b, p.si, p.sj, p.out, p.ldc) : void()), ...);
}

template <int DV>
void accumulate_columns(int columns, int inner, Product p) {
  constexpr int kColumns = block_columns(DV);
  int j = 0;
  for (; j + kColumns <= columns; j += kColumns, p.b += p.sj * kColumns, p.out += p.ldc * kColumns)
    accumulate_block<DV, kColumns>(inner, p.a, p.lda, p.b, p.si, p.sj, p.out, p.ldc);
  if (j < columns) accumulate_rest<DV>(columns - j, inner, p, std::make_integer_sequence<int, kColumns - 1>{});
}

// out (d × columns) += A (d × inner) · B.
void multiply_add(int d, int columns, int inner, const Product& p) {
  if (columns <= 0 || inner <= 0) return;
  switch (d / kLanes) {
    case 1:
      accumulate_columns<1>(columns, inner, p);
      break;
    case 2:
      accumulate_columns<2>(columns, inner, p);
      break;
    case 3:
      accumulate_columns<3>(columns, inner, p);
      break;
    case 4:
      accumulate_columns<4>(columns, inner, p);
      break;
    case 5:
      accumulate_columns<5>(columns, inner, p);
      break;
    case 6:
      accumulate_columns<6>(columns, inner, p);
      break;
    case 7:
      accumulate_columns<7>(columns, inner, p);
      break;
    case 8:
      accumulate_columns<8>(columns, inner, p);
      break;
    default:
      break;
  }
}

// Per-thread scratch.
struct Scratch {
  AlignedVector<float> packed_q, packed_dout, probs, dprobs;
  Scratch()
      : packed_q(kQueryTile * kLanes * kMaxHeadVectors),
        packed_dout(kQueryTile * kLanes * kMaxHeadVectors),
        probs(kQueryTile * kKeyTile),
        dprobs(kQueryTile * kKeyTile) {}
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// packed[64·c + j] = scale · x[c + ld·j] for the tile's nq queries, zero up to the vector.
void pack(int d, int nq, const float* x, ptrdiff_t ld, float scale, float* packed) {
  for (int j = 0; j < nq; ++j)
    for (int c = 0; c < d; ++c) packed[kQueryTile * c + j] = scale * x[c + ld * j];
  const int padded = (nq + kLanes - 1) / kLanes * kLanes;
  if (nq < padded)
    for (int c = 0; c < d; ++c) std::fill(packed + kQueryTile * c + nq, packed + kQueryTile * c + padded, 0.0f);
}

// The queries of one tile: their positions as vectors (padding lanes see every key), and
// how many leading keys any of them sees.
struct QueryTile {
  int vectors;  // of 16 queries, the last one padded
  __m512i positions[kQueryVectors];
  int lowest = INT_MAX;
  int highest = INT_MIN;
  QueryTile(const int* q_positions, int nq) : vectors((nq + kLanes - 1) / kLanes) {
    alignas(64) int pos[kQueryTile];
    for (int j = 0; j < kQueryTile; ++j) pos[j] = j < nq ? q_positions[j] : INT_MAX;
    for (int j = 0; j < nq; ++j) {
      lowest = std::min(lowest, q_positions[j]);
      highest = std::max(highest, q_positions[j]);
    }
    for (int r = 0; r < kQueryVectors; ++r) positions[r] = _mm512_load_si512(pos + kLanes * r);
  }
  int visible_keys(const int* k_positions, int tk, bool causal) const {
    if (!causal) return tk;
    return static_cast<int>(std::upper_bound(k_positions, k_positions + tk, highest) - k_positions);
  }
  // Whether some key of the block lies after some query: the block needs its mask.
  bool masked(const int* k_positions, int nk, bool causal) const { return causal && k_positions[nk - 1] > lowest; }
  __mmask16 sees(int r, int key_position) const {
    return _mm512_cmp_epi32_mask(positions[r], _mm512_set1_epi32(key_position), _MM_CMPINT_NLT);
  }
};

// The lanes of query vector r that hold one of the tile's nq queries.
__mmask16 query_lanes(int nq, int r) {
  const int n = std::clamp(nq - kLanes * r, 0, kLanes);
  return static_cast<__mmask16>((1u << n) - 1u);
}

// A tile's per-query values as vectors (times scale), padding lanes at pad.
__m512 load_lanes(const float* x, int nq, int r, float scale, float pad) {
  const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(pad), query_lanes(nq, r), x + kLanes * r);
  return _mm512_mul_ps(v, _mm512_set1_ps(scale));
}
void store_lanes(float* x, int nq, int r, __m512 v) { _mm512_mask_storeu_ps(x + kLanes * r, query_lanes(nq, r), v); }

// One query tile of the forward pass against keys [0, keys). acc: d × nq, contiguous.
void forward_tile(int d, int nq, const float* q, const QueryTile& tile, const float* k, const float* v,
                  const int* k_positions, int keys, bool causal, const Strides& ld, float* max, float* sum,
                  float* acc) {
  Scratch& s = scratch();
  const int vectors = tile.vectors;
  pack(d, nq, q, ld.q, kLog2e / std::sqrt(static_cast<float>(d)), s.packed_q.data());
  __m512 m[kQueryVectors], l[kQueryVectors];
  for (int r = 0; r < vectors; ++r) {
    m[r] = load_lanes(max, nq, r, kLog2e, kMinusInfinity);  // −inf · log2 e stays −inf
    l[r] = load_lanes(sum, nq, r, 1.0f, 0.0f);
  }
  float* p = s.probs.data();
  alignas(64) float correction[kQueryTile];
  const __m512 minus_infinity = _mm512_set1_ps(kMinusInfinity);
  for (int k0 = 0; k0 < keys; k0 += kKeyTile) {
    const int nk = std::min(kKeyTile, keys - k0);
    const int* kpos = k_positions + k0;
    scores(vectors, d, s.packed_q.data(), k + ld.kv * k0, ld.kv, nk, p);
    const bool masked = tile.masked(kpos, nk, causal);
    bool rescale = false;
    for (int r = 0; r < vectors; ++r) {
      float* column = p + kLanes * r;
      __m512 top = minus_infinity;
      for (int i = 0; i < nk; ++i) {
        const __m512 x = _mm512_loadu_ps(column + kQueryTile * i);
        top = masked ? _mm512_mask_max_ps(top, tile.sees(r, kpos[i]), top, x) : _mm512_max_ps(top, x);
      }
      const __m512 new_max = _mm512_max_ps(m[r], top);
      // A query that has seen no key yet keeps max −inf; subtract 0 instead, so that no
      // −inf − (−inf) appears (its exponentials are masked to 0 anyway).
      const __m512 shift =
          _mm512_mask_blend_ps(_mm512_cmp_ps_mask(new_max, minus_infinity, _CMP_EQ_OQ), new_max, _mm512_setzero_ps());
      const __m512 factor = exp2(_mm512_sub_ps(m[r], shift));
      __m512 row_sum = _mm512_setzero_ps();
      for (int i = 0; i < nk; ++i) {
        __m512 e = exp2(_mm512_sub_ps(_mm512_loadu_ps(column + kQueryTile * i), shift));
        if (masked) e = _mm512_maskz_mov_ps(tile.sees(r, kpos[i]), e);
        row_sum = _mm512_add_ps(row_sum, e);
        _mm512_storeu_ps(column + kQueryTile * i, e);
      }
      l[r] = _mm512_fmadd_ps(l[r], factor, row_sum);
      m[r] = new_max;
      _mm512_storeu_ps(correction + kLanes * r, factor);
      rescale |= _mm512_cmp_ps_mask(factor, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ) != 0;
    }
    if (rescale)
      for (int j = 0; j < nq; ++j) {
        const __m512 f = _mm512_set1_ps(correction[j]);
        float* column = acc + static_cast<ptrdiff_t>(d) * j;
        for (int c = 0; c < d; c += kLanes) _mm512_storeu_ps(column + c, _mm512_mul_ps(_mm512_loadu_ps(column + c), f));
      }
    multiply_add(d, nq, nk, {v + ld.kv * k0, ld.kv, p, kQueryTile, 1, acc, d});  // O += V P
  }
  for (int r = 0; r < vectors; ++r) {
    store_lanes(max, nq, r, _mm512_mul_ps(m[r], _mm512_set1_ps(kLn2)));
    store_lanes(sum, nq, r, l[r]);
  }
}

// One query tile of the backward pass against keys [0, keys).
void backward_tile(int d, int nq, const float* q, const QueryTile& tile, const float* k, const float* v,
                   const int* k_positions, int keys, bool causal, const Strides& ld, const float* lse,
                   const float* delta, const float* dout, float* dq, float* dk, float* dv) {
  Scratch& s = scratch();
  const int vectors = tile.vectors;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  pack(d, nq, q, ld.q, kLog2e * scale, s.packed_q.data());
  pack(d, nq, dout, ld.out, 1.0f, s.packed_dout.data());
  __m512 base[kQueryVectors], deltas[kQueryVectors];
  __mmask16 live[kQueryVectors];  // queries that saw a key in forward (lse finite)
  for (int r = 0; r < vectors; ++r) {
    const __m512 lse2 = load_lanes(lse, nq, r, kLog2e, kMinusInfinity);
    live[r] = _mm512_cmp_ps_mask(lse2, _mm512_set1_ps(kMinusInfinity), _CMP_NEQ_OQ);
    base[r] = _mm512_maskz_mov_ps(live[r], lse2);
    deltas[r] = load_lanes(delta, nq, r, 1.0f, 0.0f);
  }
  float* p = s.probs.data();
  float* ds = s.dprobs.data();
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int k0 = 0; k0 < keys; k0 += kKeyTile) {
    const int nk = std::min(kKeyTile, keys - k0);
    const ptrdiff_t at = ld.kv * k0;
    const int* kpos = k_positions + k0;
    scores(vectors, d, s.packed_q.data(), k + at, ld.kv, nk, p);
    scores(vectors, d, s.packed_dout.data(), v + at, ld.kv, nk, ds);
    const bool masked = tile.masked(kpos, nk, causal);
    for (int r = 0; r < vectors; ++r)
      for (int i = 0; i < nk; ++i) {
        const ptrdiff_t e = kQueryTile * i + kLanes * r;
        const __mmask16 keep = masked ? static_cast<__mmask16>(live[r] & tile.sees(r, kpos[i])) : live[r];
        const __m512 prob = _mm512_maskz_mov_ps(keep, exp2(_mm512_sub_ps(_mm512_loadu_ps(p + e), base[r])));
        _mm512_storeu_ps(p + e, prob);
        const __m512 dp = _mm512_sub_ps(_mm512_loadu_ps(ds + e), deltas[r]);
        _mm512_storeu_ps(ds + e, _mm512_mul_ps(_mm512_mul_ps(prob, dp), scale_v));
      }
    multiply_add(d, nk, nq, {dout, ld.out, p, 1, kQueryTile, dv + at, ld.kv});  // dV += dO Pᵀ
    multiply_add(d, nk, nq, {q, ld.q, ds, 1, kQueryTile, dk + at, ld.kv});      // dK += Q dSᵀ
    multiply_add(d, nq, nk, {k + at, ld.kv, ds, kQueryTile, 1, dq, ld.q});      // dQ += K dS
  }
}

}  // namespace

bool supports(int head_dim) { return head_dim > 0 && head_dim % kLanes == 0 && head_dim <= kLanes * kMaxHeadVectors; }

bool accumulate(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k, const float* v,
                const int* k_positions, bool causal, float* max, float* sum, float* acc, const Strides& ld) {
  const int d = head_dim;
  bool computed = false;
  for (int q0 = 0; q0 < tq; q0 += kQueryTile) {
    const int nq = std::min(kQueryTile, tq - q0);
    const QueryTile tile(q_positions + q0, nq);
    const int keys = tile.visible_keys(k_positions, tk, causal);
    if (keys == 0) continue;
    computed = true;
    forward_tile(d, nq, q + ld.q * q0, tile, k, v, k_positions, keys, causal, ld, max + q0, sum + q0,
                 acc + static_cast<ptrdiff_t>(d) * q0);
  }
  return computed;
}

void accumulate_backward(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k,
                         const float* v, const int* k_positions, bool causal, const float* lse, const float* delta,
                         const float* dout, float* dq, float* dk, float* dv, const Strides& ld) {
  const int d = head_dim;
  for (int q0 = 0; q0 < tq; q0 += kQueryTile) {
    const int nq = std::min(kQueryTile, tq - q0);
    const QueryTile tile(q_positions + q0, nq);
    const int keys = tile.visible_keys(k_positions, tk, causal);
    if (keys == 0) continue;
    backward_tile(d, nq, q + ld.q * q0, tile, k, v, k_positions, keys, causal, ld, lse + q0, delta + q0,
                  dout + ld.out * q0, dq + ld.q * q0, dk, dv);
  }
}

#endif  // __AVX512F__

}  // namespace peertrain::model::avx512
