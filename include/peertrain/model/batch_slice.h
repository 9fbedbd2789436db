// The one micro-batch slicer: a part of a TokenBatch, some of its sequences (a pipeline's
// micro-batch) and of each only the tokens at some indices (a sequence rank's share). The
// CPU pipeline (parallel/pipeline.h) and the device's sequence ranks (device/) both cut
// their batches with it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "peertrain/model/transformer.h"

namespace peertrain::model {

// `batch` views the source where the part is contiguous (every token of a run of
// sequences, and vit's whole images) and the vectors here otherwise, so keep the slice
// while the batch is used. Reuse one slice to avoid reallocating.
struct BatchSlice {
  TokenBatch batch;
  std::vector<int> positions;
  std::vector<std::int32_t> bytes, targets;
};

// Sequences [first, first + count) of `source`, and of each the tokens at `tokens`
// (indices into source.positions, ascending; empty: all of them). The loss divisor stays
// the source's, so the slices' gradients add up to the whole batch's. vit keeps whole
// images (a rank embeds only the patches at its positions) and its per-image labels.
void slice_batch(const TransformerConfig& config, const TokenBatch& source, int first, int count,
                 std::span<const int> tokens, BatchSlice& out);

}  // namespace peertrain::model
