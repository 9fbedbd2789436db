// The AVX-512 GEMM (gemm_avx512.h). Loop nest, outermost first, as BLIS orders it:
//   jc over n in NC columns   — B's block (KC × NC) is packed once per (jc, pc) and read from L3;
//   pc over k in KC           — C gets one store per pc; the first one is the epilogue;
//   ic over m in MC rows      — A's block (MC × KC, ≤ 720 KiB) is packed and stays in L2;
//   jr over NC in NR = 12     — B's micro-panel (KC × 12, ≤ 18 KiB) stays in L1 ...
//   ir over MC in MR = 32     — ... while the micro-kernel streams A's micro-panels past it.
// Packing pads the last micro-panels with zeros, so the micro-kernel always runs the whole
// 32 × 12 tile and only its store is masked to the rows and columns that exist.
#include "gemm_avx512.h"

#include "gelu.h"

#include <algorithm>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace peertrain::model::avx512_gemm {

#if !defined(__AVX512F__)

bool available() { return false; }
void run(bool, bool, std::ptrdiff_t, std::ptrdiff_t, std::ptrdiff_t, const float*, std::ptrdiff_t, const float*,
         std::ptrdiff_t, float*, std::ptrdiff_t, const Epilogue&, Buffers&) {}

#else

// GCC 12 warns that the unpack and shuffle intrinsics read an uninitialized vector: their
// definitions start from _mm512_undefined_ps(), whose every lane they then overwrite.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

using Index = std::ptrdiff_t;

constexpr Index kMr = 32;  // two vectors of C's rows
constexpr Index kNr = 12;  // columns: 24 accumulators, 2 for A, 1 for B's broadcast
constexpr Index kKc = 384;
constexpr Index kMc = 480;
constexpr Index kBBlockFloats = 128 * 1024;  // B's packed block, kept in L2 beside A's

// Splits `total` into blocks of at most `limit`, as even as `multiple` allows, so that a
// dimension just over the limit does not leave a thin last block.
Index even_block(Index total, Index limit, Index multiple) {
  const Index blocks = (total + limit - 1) / limit;
  const Index size = (total + blocks - 1) / blocks;
  return std::min(limit, (size + multiple - 1) / multiple * multiple);
}

__mmask16 row_mask(Index rows) {
  if (rows <= 0) return 0;
  return rows >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << rows) - 1u);
}

// Transposes 16 vectors in place: r[q][i] ← r[i][q] (unpack pairs of floats, then of
// doubles, then swap 128-bit lanes twice).
[[gnu::always_inline]] inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  const auto lo_pd = [](__m512 x, __m512 y) {
    return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)));
  };
  const auto hi_pd = [](__m512 x, __m512 y) {
    return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)));
  };
  for (int i = 0; i < 16; i += 4) {
    r[i] = lo_pd(t[i], t[i + 2]);
    r[i + 1] = hi_pd(t[i], t[i + 2]);
    r[i + 2] = lo_pd(t[i + 1], t[i + 3]);
    r[i + 3] = hi_pd(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

// Reads `count` (≤ 16) vectors, vector v from src + v·stride, lanes [0, lanes), transposes
// them and stores the first `rows_out` results, result q (lanes [0, width) of it) at
// dst + q·dst_stride. Vectors past `count` and lanes past `lanes` read as zero.
void transpose_block(const float* src, Index stride, int count, int lanes, float* dst, Index dst_stride, int rows_out,
                     __mmask16 store_mask) {
  __m512 r[16];
  const __mmask16 mask = row_mask(lanes);
#pragma GCC unroll 16
  for (int v = 0; v < 16; ++v) r[v] = v < count ? _mm512_maskz_loadu_ps(mask, src + v * stride) : _mm512_setzero_ps();
  transpose16(r);
  for (int q = 0; q < rows_out; ++q) _mm512_mask_storeu_ps(dst + q * dst_stride, store_mask, r[q]);
}

// The operands come from memory: the activations a layer saved in the forward pass, or
// the gradient a later one wrote, megabytes back. Hardware prefetchers need not follow the
// packing's access patterns (a transposed panel reads 12 columns of 8–32 lines each; the
// row copy 12 floats from every line), so the packing asks for the lines it reads next
// itself, which packs cold operands several times faster on hosts whose prefetchers do not.
constexpr Index kPrefetchRows = 4;     // rows of op(B) ahead, in the row copy
constexpr Index kPrefetchColumns = 8;  // columns of A ahead, in the panel copy

[[gnu::always_inline]] inline void prefetch(const float* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
}

// op(A)[i0 : i0 + mc, p0 : p0 + kc] into micro-panels of kMr rows: panel r holds, for each p,
// the kMr floats of rows i0 + r·kMr ... contiguously.
// With row_sums (A not transposed), adds each packed row's sum over the block into it,
// p by p in order: the sums of a weight gradient's dy, which is the bias gradient.
void pack_a(bool trans, const float* a, Index lda, Index i0, Index p0, Index mc, Index kc, float* out,
            float* row_sums) {
  if (!trans) {
    // Column p of A holds the rows contiguously. Panel by panel, so the stores run front to
    // back: p by p across the panels, the panels kMr·kc floats apart put every store of one
    // p in the same L1 set whenever kc is a multiple of 32, and packing a weight gradient's
    // dy ran at 16 GB/s against 40 this way (512 × 512, kc 256, Zen 5).
    for (Index r = 0; r < mc; r += kMr, out += kMr * kc) {
      const Index rows = std::min(kMr, mc - r);
      const __mmask16 lo = row_mask(rows), hi = row_mask(rows - 16);
      const float* src = a + i0 + r + p0 * lda;
      float* sums = row_sums == nullptr ? nullptr : row_sums + i0 + r;
      __m512 sum_lo = _mm512_setzero_ps(), sum_hi = _mm512_setzero_ps();
      if (sums != nullptr) {
        sum_lo = _mm512_maskz_loadu_ps(lo, sums);
        sum_hi = _mm512_maskz_loadu_ps(hi, sums + 16);
      }
      for (Index p = 0; p < kc; ++p, src += lda) {
        if (p + kPrefetchColumns < kc) {
          prefetch(src + kPrefetchColumns * lda);
          prefetch(src + kPrefetchColumns * lda + 16);
        }
        const __m512 x0 = _mm512_maskz_loadu_ps(lo, src), x1 = _mm512_maskz_loadu_ps(hi, src + 16);
        _mm512_storeu_ps(out + p * kMr, x0);
        _mm512_storeu_ps(out + p * kMr + 16, x1);
        if (sums != nullptr) {  // p by p in order, as a pass over dy adds them
          sum_lo = _mm512_add_ps(sum_lo, x0);
          sum_hi = _mm512_add_ps(sum_hi, x1);
        }
      }
      if (sums != nullptr) {
        _mm512_mask_storeu_ps(sums, lo, sum_lo);
        _mm512_mask_storeu_ps(sums + 16, hi, sum_hi);
      }
    }
    return;
  }
  for (Index r = 0; r < mc; r += kMr, out += kMr * kc) {
    // A is stored k × m: row i of op(A) is contiguous in p; transpose 16 × 16
    const Index rows = std::min(kMr, mc - r);
    const float* src = a + p0 + (i0 + r) * lda;
    for (Index p = 0; p < kc; p += 16) {
      const int width = static_cast<int>(std::min<Index>(16, kc - p));
      for (Index half = 0; half < 2; ++half)
        transpose_block(src + p + half * 16 * lda, lda, static_cast<int>(std::clamp<Index>(rows - 16 * half, 0, 16)),
                        width, out + p * kMr + half * 16, kMr, width, 0xFFFF);
    }
  }
}

// Four micro-panels of a transposed op(B) (stored n × k; b points at its first column j of
// the four panels), rows p0 ... p0 + kc: each row's 48 floats are three whole vectors.
void pack_b_four_panels(const float* b, Index ldb, Index p0, Index kc, float* out) {
  const __m512i second = _mm512_setr_epi32(12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 0, 0, 0, 0);
  const __m512i third = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 0, 0, 0, 0);
  const __m512i fourth = _mm512_setr_epi32(4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 0, 0, 0);
  const float* src = b + p0 * ldb;
  for (Index p = 0; p < kc; ++p, src += ldb) {
    if (p + kPrefetchRows < kc)
      for (Index q = 0; q < 48; q += 16) prefetch(src + kPrefetchRows * ldb + q);
    const __m512 v0 = _mm512_loadu_ps(src), v1 = _mm512_loadu_ps(src + 16), v2 = _mm512_loadu_ps(src + 32);
    float* dst = out + p * kNr;
    _mm512_mask_storeu_ps(dst, 0x0FFF, v0);
    _mm512_mask_storeu_ps(dst + kNr * kc, 0x0FFF, _mm512_permutex2var_ps(v0, second, v1));
    _mm512_mask_storeu_ps(dst + 2 * kNr * kc, 0x0FFF, _mm512_permutex2var_ps(v1, third, v2));
    _mm512_mask_storeu_ps(dst + 3 * kNr * kc, 0x0FFF, _mm512_permutexvar_ps(fourth, v2));
  }
}

// op(B)[p0 : p0 + kc, j0 : j0 + nc] into micro-panels of kNr columns: panel s holds, for
// each p, the kNr floats of columns j0 + s·kNr ... contiguously.
void pack_b(bool trans, const float* b, Index ldb, Index p0, Index j0, Index kc, Index nc, float* out) {
  if (trans) {  // B is stored n × k: row p of op(B) is contiguous in j
    // Row by row, each row read once front to back, its 12-float pieces stored across the
    // panels, kNr·kc floats apart. Where kc is a multiple of 64 those pieces fall into at
    // most four L1 sets and evict each other (512 × 512 at kc 256 packed at 4.5 GB/s, Zen 5):
    // then four panels at a time instead, all rows, from three whole vectors of each row
    // (33 GB/s there; elsewhere the row order is the faster, 37–50 GB/s against 27–47).
    Index s = 0;
    if (kc % 64 == 0)
      for (; s + 4 * kNr <= nc; s += 4 * kNr, out += 4 * kNr * kc) pack_b_four_panels(b + j0 + s, ldb, p0, kc, out);
    for (Index p = 0; p < kc; ++p) {
      const float* src = b + j0 + (p0 + p) * ldb;
      if (p + kPrefetchRows < kc)
        for (Index q = s; q < nc; q += 16) prefetch(src + kPrefetchRows * ldb + q);
      float* dst = out + p * kNr;
      for (Index q = s; q < nc; q += kNr, dst += kNr * kc)
        _mm512_mask_storeu_ps(dst, 0x0FFF, _mm512_maskz_loadu_ps(row_mask(std::min(kNr, nc - q)), src + q));
    }
    return;
  }
  for (Index s = 0; s < nc; s += kNr, out += kNr * kc) {
    // column j of op(B) is contiguous in p; transpose 16 × 16
    const Index cols = std::min(kNr, nc - s);
    const float* src = b + p0 + (j0 + s) * ldb;
    const bool ahead = s + kNr < nc;  // the next panel's columns, a block of 16 rows at a time
    for (Index p = 0; p < kc; p += 16) {
      if (ahead)
        for (Index v = 0; v < kNr; ++v) prefetch(src + (kNr + v) * ldb + p);
      const int width = static_cast<int>(std::min<Index>(16, kc - p));
      transpose_block(src + p, ldb, static_cast<int>(cols), width, out + p * kNr, kNr, width, 0x0FFF);
    }
  }
}

// C[0 : rows, 0 : cols] (+)= the 32 × 12 product of one A and one B micro-panel over kc.
// `first` says this is the first inner block, whose store adds the epilogue's terms (later
// blocks add to C); `last`, the last one, whose store applies its ReLU.
void micro_kernel(Index kc, const float* a, const float* b, float* c, Index ldc, Index rows, Index cols, bool first,
                  bool last, const Epilogue& e, Index i0, Index j0) {
  // The epilogue's other operands come from memory, a column's 32 floats 4·ld bytes from
  // the next: ask for them now, so the products below hide the wait.
  const float* extra = first && e.addend != nullptr ? e.addend : last ? e.gelu_grad_at : nullptr;
  if (extra != nullptr)
    for (Index j = 0; j < cols; ++j) {
      const float* col = extra + i0 + (j0 + j) * e.ld_addend;
      _mm_prefetch(reinterpret_cast<const char*>(col), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(col + 16), _MM_HINT_T0);
    }
  __m512 lo[kNr], hi[kNr];
#pragma GCC unroll 12
  for (Index j = 0; j < kNr; ++j) lo[j] = hi[j] = _mm512_setzero_ps();
  for (Index p = 0; p < kc; ++p, a += kMr, b += kNr) {
    _mm_prefetch(reinterpret_cast<const char*>(a + 8 * kMr), _MM_HINT_T0);
    const __m512 a0 = _mm512_loadu_ps(a), a1 = _mm512_loadu_ps(a + 16);
#pragma GCC unroll 12
    for (Index j = 0; j < kNr; ++j) {
      const __m512 bj = _mm512_set1_ps(b[j]);
      lo[j] = _mm512_fmadd_ps(a0, bj, lo[j]);
      hi[j] = _mm512_fmadd_ps(a1, bj, hi[j]);
    }
  }
  const __mmask16 mlo = row_mask(rows), mhi = row_mask(rows - 16);
  const bool add_c = !first || e.accumulate;
  __m512 bias_lo = _mm512_setzero_ps(), bias_hi = _mm512_setzero_ps();
  if (first && e.row_bias != nullptr) {
    bias_lo = _mm512_maskz_loadu_ps(mlo, e.row_bias + i0);
    bias_hi = _mm512_maskz_loadu_ps(mhi, e.row_bias + i0 + 16);
  }
#pragma GCC unroll 12
  for (Index j = 0; j < kNr; ++j) {
    if (j >= cols) break;
    float* cj = c + j * ldc;
    __m512 vlo = _mm512_add_ps(lo[j], bias_lo), vhi = _mm512_add_ps(hi[j], bias_hi);
    if (add_c) {
      vlo = _mm512_add_ps(vlo, _mm512_maskz_loadu_ps(mlo, cj));
      vhi = _mm512_add_ps(vhi, _mm512_maskz_loadu_ps(mhi, cj + 16));
    }
    if (first && e.addend != nullptr) {
      const float* dj = e.addend + i0 + (j0 + j) * e.ld_addend;
      vlo = _mm512_add_ps(vlo, _mm512_maskz_loadu_ps(mlo, dj));
      vhi = _mm512_add_ps(vhi, _mm512_maskz_loadu_ps(mhi, dj + 16));
    }
    if (last && e.relu) {
      vlo = _mm512_max_ps(vlo, _mm512_setzero_ps());
      vhi = _mm512_max_ps(vhi, _mm512_setzero_ps());
    }
    _mm512_mask_storeu_ps(cj, mlo, vlo);
    _mm512_mask_storeu_ps(cj + 16, mhi, vhi);
    if (last && e.gelu_out != nullptr) {
      float* gj = e.gelu_out + i0 + (j0 + j) * e.ld_addend;
      if (rows == kMr)
        gelu::forward_fixed<kMr>(cj, gj);
      else
        gelu::forward(cj, gj, rows);
    }
    if (last && e.gelu_grad_at != nullptr) {
      const float* hj = e.gelu_grad_at + i0 + (j0 + j) * e.ld_addend;
      if (rows == kMr)
        gelu::backward_fixed<kMr>(hj, cj, cj);
      else
        gelu::backward<kMr>(hj, cj, cj, rows);
    }
  }
}

}  // namespace

bool available() { return true; }

void run(bool trans_a, bool trans_b, Index m, Index n, Index k, const float* a, Index lda, const float* b, Index ldb,
         float* c, Index ldc, const Epilogue& epilogue, Buffers& buffers) {
  const Index kc_max = even_block(k, kKc, 8);
  const Index mc_max = even_block(m, kMc, kMr);
  const Index nc_max = even_block(n, std::max(kNr, kBBlockFloats / kc_max / kNr * kNr), kNr);
  const auto need_a = static_cast<std::size_t>(kc_max * mc_max);
  const auto need_b = static_cast<std::size_t>(kc_max * nc_max);
  if (buffers.a.size() < need_a) buffers.a.resize(need_a);
  if (buffers.b.size() < need_b) buffers.b.resize(need_b);
  float* packed_a = buffers.a.data();
  float* packed_b = buffers.b.data();
  // Packing pays even for an operand already laid out as the micro-kernel reads it (op(A)
  // not transposed, op(B) transposed): reading those in place, lda floats apart, measured
  // 5–15 % slower on this model's shapes.
  for (Index jc = 0; jc < n; jc += nc_max) {
    const Index nc = std::min(nc_max, n - jc);
    for (Index pc = 0; pc < k; pc += kc_max) {
      const Index kc = std::min(kc_max, k - pc);
      const bool first = pc == 0, last = pc + kc == k;
      pack_b(trans_b, b, ldb, pc, jc, kc, nc, packed_b);
      for (Index ic = 0; ic < m; ic += mc_max) {
        const Index mc = std::min(mc_max, m - ic);
        // B's first column block packs every part of A once: the row sums are taken then.
        pack_a(trans_a, a, lda, ic, pc, mc, kc, packed_a, jc == 0 ? epilogue.a_row_sums : nullptr);
        for (Index jr = 0; jr < nc; jr += kNr) {
          const Index cols = std::min(kNr, nc - jr);
          for (Index ir = 0; ir < mc; ir += kMr) {
            const Index rows = std::min(kMr, mc - ir);
            micro_kernel(kc, packed_a + ir * kc, packed_b + jr * kc, c + (ic + ir) + (jc + jr) * ldc, ldc, rows, cols,
                         first, last, epilogue, ic + ir, jc + jr);
          }
        }
      }
    }
  }
}

#pragma GCC diagnostic pop

#endif

}  // namespace peertrain::model::avx512_gemm
