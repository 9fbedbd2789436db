// Tensor parallelism's split of a block (Megatron-LM, Shoeybi et al. 2019): which of the
// block's parameters rank r of T holds, laid out as a smaller block so that
// block_composition.h runs on it unchanged.
//
// Rank r holds heads [r·H/T, (r+1)·H/T): their q, k and v rows of qkv (column-parallel)
// and their columns of the attention's output projection (row-parallel); rows
// [r·F/T, (r+1)·F/T) of fc (column-parallel) and those columns of the MLP's second Linear
// (row-parallel); and the LayerNorms and the row-parallel biases whole. The shard is
// gathered from the flat buffer before a pass and its gradient added back after: a copy of
// 12·d²/T floats against GEMMs of 24·d²·n/T flops, negligible once a micro-batch holds more
// than a few tokens.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "peertrain/model/transformer_layout.h"

namespace peertrain::model {

// Throws Error(kInvalidArgument) naming `flag` (e.g. "--tp", or "--stage-mesh stage 1") when
// tp is not positive or does not divide the heads, or the MLP's width.
void check_tensor_parallel(const TransformerConfig& config, int tp, std::string_view flag = "--tp");

struct TensorShard {
  BlockOffsets offsets;    // of each tensor in the shard's own buffer
  std::size_t floats = 0;  // the shard's size
  // Where the shard's pieces live in the flat buffer: shard[at + i] = full[from + i], i < count.
  struct Run {
    std::size_t from = 0, at = 0, count = 0;
  };
  std::vector<Run> runs;
};

// Rank `rank` of `tp`'s shard of the block at `block` (offsets in the flat buffer).
TensorShard tensor_shard(const TransformerConfig& config, const BlockOffsets& block, int tp, int rank);

// tensor_shard(…).floats without building the runs: what one rank holds of a block.
std::size_t tensor_shard_floats(const TransformerConfig& config, int tp);

void gather_shard(const TensorShard& shard, const float* full, float* into);
// full[from + i] += shard[at + i] over every run.
void add_shard(const TensorShard& shard, const float* from, float* full);

}  // namespace peertrain::model
