// The tensor-core (BF16 operands, FP32 accumulation) forward attention, which
// kernels::attention_forward dispatches to for AttentionPrecision::kBf16.
#pragma once

#include <cstddef>
#include <span>

#include "attention_tile.h"
#include "peertrain/kernels/ops.h"

namespace peertrain::kernels::detail {

std::span<const AttentionTiling> attention_tilings();
// The tiling attention_forward uses: the wgmma kernel where the device runs it, else mma.sync.
std::size_t default_attention_tiling();

// `tiling` indexes attention_tilings(); with operands_only, only the FP32 → BF16 pass runs.
void attention_forward_bf16(Stream stream, const AttentionDims& dims, float scale, std::size_t tiling,
                            bool operands_only, const float* q, const int* q_positions, const float* k, const float* v,
                            const int* k_positions, float* out, float* lse);

// attention_wgmma.cu (built for sm_90a alone): whether this thread's device runs it
// (compute capability 9.0; always in the emulator), and its launch with a wgmma tiling.
bool wgmma_available();
void launch_attention_wgmma(const AttentionTiling& tiling, Stream stream, const AttentionDims& dims,
                            const AttentionOperands& ops, const int* q_positions, float* out, float* lse);

}  // namespace peertrain::kernels::detail
