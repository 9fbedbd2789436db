// The tensor-core (BF16 mma, FP32 accumulation) forward attention, which
// kernels::attention_forward dispatches to for AttentionPrecision::kBf16.
#pragma once

#include "peertrain/kernels/ops.h"

namespace peertrain::kernels::detail {

void attention_forward_bf16(Stream stream, const AttentionDims& dims, float scale, const float* q,
                            const int* q_positions, const float* k, const float* v, const int* k_positions, float* out,
                            float* lse);

}  // namespace peertrain::kernels::detail
