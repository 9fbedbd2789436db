#include "peertrain/model/batch_slice.h"

#include "peertrain/core/error.h"

namespace peertrain::model {

void slice_batch(const TransformerConfig& config, const TokenBatch& source, int first, int count,
                 std::span<const int> tokens, BatchSlice& out) {
  PEERTRAIN_CHECK(first >= 0 && count > 0 && first + count <= source.batch, "slice of sequences [", first, ", ",
                  first + count, ") of a batch of ", source.batch);
  const bool all_tokens = tokens.empty();
  const int held = all_tokens ? source.tokens : static_cast<int>(tokens.size());
  out.positions.resize(static_cast<std::size_t>(held));
  for (int t = 0; t < held; ++t) {
    const int index = all_tokens ? t : tokens[static_cast<std::size_t>(t)];
    PEERTRAIN_CHECK(index >= 0 && index < source.tokens, "token index ", index, " of ", source.tokens);
    out.positions[static_cast<std::size_t>(t)] = source.positions[static_cast<std::size_t>(index)];
  }
  TokenBatch& b = out.batch;
  b = TokenBatch{};
  b.batch = count;
  b.tokens = held;
  b.positions = out.positions;
  b.loss_divisor = source.loss_divisor;
  if (config.kind == TransformerKind::kVit) {
    const std::size_t pixels = source.pixels.size() / static_cast<std::size_t>(source.batch);
    b.pixels =
        source.pixels.subspan(static_cast<std::size_t>(first) * pixels, static_cast<std::size_t>(count) * pixels);
    b.targets = source.targets.subspan(static_cast<std::size_t>(first), static_cast<std::size_t>(count));
    return;
  }
  const std::size_t per = static_cast<std::size_t>(source.tokens);
  const std::size_t start = static_cast<std::size_t>(first) * per;
  if (all_tokens) {
    b.bytes = source.bytes.subspan(start, static_cast<std::size_t>(count) * per);
    b.targets = source.targets.subspan(start, static_cast<std::size_t>(count) * per);
    return;
  }
  out.bytes.resize(static_cast<std::size_t>(count) * held);
  out.targets.resize(out.bytes.size());
  for (int s = 0; s < count; ++s)
    for (int t = 0; t < held; ++t) {
      const std::size_t from = start + s * per + static_cast<std::size_t>(tokens[static_cast<std::size_t>(t)]);
      const std::size_t to = static_cast<std::size_t>(s) * held + t;
      out.bytes[to] = source.bytes[from];
      out.targets[to] = source.targets[from];
    }
  b.bytes = out.bytes;
  b.targets = out.targets;
}

}  // namespace peertrain::model
