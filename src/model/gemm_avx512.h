// A float GEMM of our own for AVX-512 cores, one thread (internal to the model module).
//
// Why not only Eigen's: Eigen's GEMM kernel holds a 48×4 tile of C in 12 of the 32 vector
// registers and reaches about 65–75 % of this core's FMA peak; its driver always adds into
// C, so every product is preceded by a pass that clears C or fills it with the bias. This
// one follows BLIS (Van Zee and van de Geijn 2015; Goto and van de Geijn 2008): panels of
// op(A) and op(B) packed for a 32×12 register tile (24 accumulators), B's micro-panel in
// L1 and A's block in L2, and C written once per inner-dimension block. The first block's
// store is the epilogue: it overwrites or adds to C, and adds a bias per row and a matrix
// of the same shape (a residual) on the way, so no pass over C comes before or after.
#pragma once

#include <cstddef>

#include "gemm_epilogue.h"
#include "peertrain/core/aligned.h"

namespace peertrain::model::avx512_gemm {

// The stores' epilogue: GemmEpilogue's terms (gemm_epilogue.h), plus whether C is added
// to and the terms' leading dimension. The first inner block's store adds; the last one's
// applies the activation, to each column of C's tile as soon as it is stored (still in
// L1). gelu_out and gelu_grad_at have the addend's leading dimension.
struct Epilogue : GemmEpilogue {
  bool accumulate = false;
  std::ptrdiff_t ld_addend = 0;
};

// Whether this build has the kernel (compiled for AVX-512); run() must not be called if not.
bool available();

// The packing buffers; they only grow. One per thread.
struct Buffers {
  AlignedVector<float> a, b;
};

// C (m×n, column-major, leading dimension ldc) ← op(A)·op(B) with the epilogue. A is m×k
// (lda ≥ m) or, when trans_a, stored k×m (lda ≥ k); B is k×n (ldb ≥ k) or, when trans_b,
// stored n×k (ldb ≥ n). Needs m, n, k ≥ 1.
void run(bool trans_a, bool trans_b, std::ptrdiff_t m, std::ptrdiff_t n, std::ptrdiff_t k, const float* a,
         std::ptrdiff_t lda, const float* b, std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc, const Epilogue& epilogue,
         Buffers& buffers);

}  // namespace peertrain::model::avx512_gemm
