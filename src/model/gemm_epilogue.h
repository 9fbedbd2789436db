// What a GEMM's stores add to its product (internal to the model module): gemm.h's Gemm
// takes it, and the AVX-512 kernel (gemm_avx512.h) applies it in its stores.
#pragma once

namespace peertrain::model {

// C ← op(A)·op(B) + [C if accumulate] + row_bias (m floats) + addend (m×n, leading
// dimension m; may be C itself when accumulate is false), then, on the finished sum, one
// of: max(·, 0) if relu; gelu_out ← GELU(C) (m×n, leading dimension m) as well; or
// C ← C ⊙ GELU'(gelu_grad_at) (m×n, leading dimension m). Apart from C: a_row_sums (m
// floats) += the row sums of A (over k), A not transposed: a Linear's bias gradient, read
// as its weight gradient's GEMM packs dy.
struct GemmEpilogue {
  const float* row_bias = nullptr;
  const float* addend = nullptr;
  bool relu = false;
  float* gelu_out = nullptr;
  const float* gelu_grad_at = nullptr;
  float* a_row_sums = nullptr;
};

}  // namespace peertrain::model
