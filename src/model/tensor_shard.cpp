// A tensor-parallel rank's shard of a block; see tensor_shard.h.
#include "peertrain/model/tensor_shard.h"

#include <algorithm>

#include "peertrain/core/error.h"

namespace peertrain::model {

void check_tensor_parallel(const TransformerConfig& config, int tp, std::string_view flag) {
  if (tp < 1) throw Error(ErrorKind::kInvalidArgument, str(flag, " tp=", tp, ": expected at least 1"));
  if (config.heads % tp != 0)
    throw Error(ErrorKind::kInvalidArgument,
                str(flag, " tp=", tp, " does not divide the ", config.heads, " attention heads (--heads)"));
  const int hidden = config.mlp_ratio * config.d_model;
  if (hidden % tp != 0)
    throw Error(ErrorKind::kInvalidArgument,
                str(flag, " tp=", tp, " does not divide the MLP's width of ", hidden, " (mlp_ratio · --d-model)"));
}

TensorShard tensor_shard(const TransformerConfig& config, const BlockOffsets& o, int tp, int rank) {
  check_tensor_parallel(config, tp);
  PEERTRAIN_CHECK(rank >= 0 && rank < tp, "tensor rank ", rank, " of ", tp);
  const std::size_t d = static_cast<std::size_t>(config.d_model);
  const std::size_t f = static_cast<std::size_t>(config.mlp_ratio) * d;
  const std::size_t a = d / static_cast<std::size_t>(tp), fl = f / static_cast<std::size_t>(tp);
  const std::size_t r = static_cast<std::size_t>(rank);
  TensorShard s;
  std::size_t at = 0;
  auto run = [&](std::size_t from, std::size_t count) {
    s.runs.push_back({from, at, count});
    at += count;
  };
  auto whole = [&](std::size_t from, std::size_t count) {
    const std::size_t here = at;
    run(from, count);
    return here;
  };
  s.offsets.ln1_w = whole(o.ln1_w, d);
  s.offsets.ln1_b = whole(o.ln1_b, d);
  // qkv (3d × d, column-major): per column, this rank's rows of q, of k and of v.
  s.offsets.qkv_w = at;
  for (std::size_t c = 0; c < d; ++c)
    for (std::size_t part = 0; part < 3; ++part) run(o.qkv_w + c * 3 * d + part * d + r * a, a);
  s.offsets.qkv_b = at;
  for (std::size_t part = 0; part < 3; ++part) run(o.qkv_b + part * d + r * a, a);
  s.offsets.proj_w = whole(o.proj_w + r * a * d, a * d);  // columns r·a … (d rows each)
  s.offsets.proj_b = whole(o.proj_b, d);
  s.offsets.ln2_w = whole(o.ln2_w, d);
  s.offsets.ln2_b = whole(o.ln2_b, d);
  s.offsets.fc_w = at;  // fc (F × d): per column, rows r·F/T …
  for (std::size_t c = 0; c < d; ++c) run(o.fc_w + c * f + r * fl, fl);
  s.offsets.fc_b = whole(o.fc_b + r * fl, fl);
  s.offsets.fc2_w = whole(o.fc2_w + r * fl * d, fl * d);  // columns r·F/T … (d rows each)
  s.offsets.fc2_b = whole(o.fc2_b, d);
  s.floats = at;
  return s;
}

std::size_t tensor_shard_floats(const TransformerConfig& config, int tp) {
  const std::size_t d = static_cast<std::size_t>(config.d_model);
  const std::size_t a = d / static_cast<std::size_t>(tp), f = config.mlp_ratio * d / static_cast<std::size_t>(tp);
  // ln1, qkv (3a × d and 3a), proj (d × a and d), ln2, fc (f × d and f), fc2 (d × f and d).
  return 2 * d + 3 * a * d + 3 * a + d * a + d + 2 * d + f * d + f + d * f + d;
}

void gather_shard(const TensorShard& shard, const float* full, float* into) {
  for (const auto& r : shard.runs) std::copy_n(full + r.from, r.count, into + r.at);
}

void add_shard(const TensorShard& shard, const float* from, float* full) {
  for (const auto& r : shard.runs)
    for (std::size_t i = 0; i < r.count; ++i) full[r.from + i] += from[r.at + i];
}

}  // namespace peertrain::model
