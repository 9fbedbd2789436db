// Ring Attention with the online softmax (Liu, Zaharia & Abbeel 2023, "Ring Attention with
// Blockwise Transformers for Near-Infinite Context"; Milakov & Gimelshein 2018 for the
// online softmax), backward as in ring-flash-attention (zhuzilin 2024): the dK/dV of a
// travelling block ride with it and come home after the full circle, dQ stays local.
//
// The travelling unit is one (sequence, head, block of ≤ block_tokens keys): its K, V and
// positions; where a head's keys fit one block, several whole heads travel together, up
// to block_tokens keys in all (Units, below). Every query tile of the rank folds it into
// its running max/sum/output with attention_block::accumulate, unless the causal mask
// hides the whole unit from the tile, in which case nothing is computed — that skip is
// what the zigzag split balances. The
// running output lives in `out` and the running max in `lse` (the caller's memory), so the
// rank's own buffers are the running sums, two transfer units and one score tile: their
// size does not grow with the sequence beyond the per-token sums.
#include <algorithm>
#include <utility>
#include <vector>

#include "peertrain/model/attention.h"
#include "ring_modes.h"

namespace peertrain::parallel::detail {
namespace {

namespace block = model::attention_block;

constexpr int kForwardTags = 100;
constexpr int kBackwardTags = 200;

struct Tiling {
  int tokens, block, tiles;
  explicit Tiling(int t, int b) : tokens(t), block(b), tiles((t + b - 1) / b) {}
  int begin(int tile) const { return tile * block; }
  int size(int tile) const { return std::min(block, tokens - tile * block); }
};

// The units the ring carries. A (sequence, head) whose keys span several blocks travels a
// block at a time, one unit each. One whose keys fit a block travels with the next ones,
// whole heads, up to block_tokens keys a unit: every unit is a rendezvous of each part on
// every hop, so a unit per head would make a short sequence's step (--sp 2 --pp 2, 12
// sequences of 32 tokens a rank, 4 heads) switch threads hundreds of times. Each head still
// meets its hops in the same order, so its sums are the same to the bit. The heads of a unit are
// consecutive in K, V, dK and dV ([sequence·head][token][d]), and share their positions.
struct Units {
  Tiling tiles;
  int heads;  // (sequence, head) pairs
  int group;  // whole heads a unit carries (1 where a head spans several blocks)
  int count;
  Units(int tokens, int all_heads, int block)
      : tiles(tokens, block),
        heads(all_heads),
        group(tiles.tiles == 1 ? std::max(1, std::min(all_heads, block / std::max(1, tokens))) : 1),
        count(tiles.tiles == 1 ? (all_heads + group - 1) / group : all_heads * tiles.tiles) {}
  int first_head(int u) const { return tiles.tiles == 1 ? u * group : u / tiles.tiles; }
  int heads_in(int u) const { return tiles.tiles == 1 ? std::min(group, heads - u * group) : 1; }
  int tile(int u) const { return tiles.tiles == 1 ? 0 : u % tiles.tiles; }
  int keys(int u) const { return tiles.size(tile(u)); }  // of each of its heads
  // Where its first head's keys begin in K, V, dK or dV.
  std::ptrdiff_t offset(int u, int d) const {
    return (static_cast<std::ptrdiff_t>(first_head(u)) * tiles.tokens + tiles.begin(tile(u))) * d;
  }
  std::size_t words(int u, int d) const { return static_cast<std::size_t>(heads_in(u)) * keys(u) * d; }
  // The parts it carries: its K, its V, and its keys' positions (its heads share them).
  Part part(int u, int p, const float* k, const float* v, const int* positions, int d) const {
    if (p == 0) return {k + offset(u, d), words(u, d)};
    if (p == 1) return {v + offset(u, d), words(u, d)};
    return {positions + tiles.begin(tile(u)), static_cast<std::size_t>(keys(u))};
  }
};

// Query tiles: runs of consecutive positions cut into blocks, so that a tile never spans
// the two chunks of a zigzag rank; a tile holding both would be computed as wide as its
// late chunk needs, and the balance zigzag buys would be lost. (Key units need no such
// cut: the keys a query sees are a prefix of any unit, whatever its chunks.)
std::vector<std::pair<int, int>> query_tiles(const int* positions, int tokens, int block) {
  std::vector<std::pair<int, int>> tiles;  // first token, tokens
  int begin = 0;
  for (int t = 1; t <= tokens; ++t)
    if (t == tokens || positions[t] != positions[t - 1] + 1 || t - begin == block) {
      tiles.emplace_back(begin, t - begin);
      begin = t;
    }
  return tiles;
}

// Keys of the unit the tile's last (latest) query sees: the widest prefix the kernel
// computes; 0 when the causal mask hides the unit from the whole tile.
int visible_keys(const int* k_positions, int keys, int last_query_position, bool causal) {
  if (!causal) return keys;
  return static_cast<int>(std::upper_bound(k_positions, k_positions + keys, last_query_position) - k_positions);
}

}  // namespace

std::size_t online_planned_bytes(const model::AttentionShape& local, int ranks, bool backward, int block_tokens) {
  const std::size_t tl = static_cast<std::size_t>(local.tokens), d = static_cast<std::size_t>(local.head_dim);
  if (tl == 0 || local.batch * local.heads == 0) return 0;
  const std::size_t m = std::min<std::size_t>(static_cast<std::size_t>(block_tokens), tl);
  const auto g = static_cast<std::size_t>(Units(local.tokens, local.batch * local.heads, block_tokens).group);
  const std::vector<std::size_t> parts = {g * d * m, g * d * m, m};  // a unit's K, V and positions
  if (!backward)  // sums, the finish tile, the score tile, the ring
    return 4 * (g * tl + d * m + m + m * m) + ring_pass_bytes(ranks, parts, {});
  return 4 * (g * tl + 2 * m * m) + ring_pass_bytes(ranks, parts, {g * d * m, g * d * m});  // deltas, P and dS tiles
}

int online_units(const model::AttentionShape& local, int block_tokens) {
  if (local.tokens == 0 || local.batch * local.heads == 0) return 0;
  return Units(local.tokens, local.batch * local.heads, block_tokens).count;
}

void online_forward(const RingCall& call, const float* q, const float* k, const float* v, float* out, float* lse) {
  const auto& shape = call.shape;
  const int tl = shape.tokens, d = shape.head_dim, heads = shape.batch * shape.heads;
  if (tl == 0 || heads == 0) return;
  const int ranks = call.group.size();
  const Units units(tl, heads, call.block_tokens);
  const int last_tile = units.tiles.tiles - 1;
  const std::ptrdiff_t per_head = static_cast<std::ptrdiff_t>(tl) * d;
  const int* qpos = call.positions;
  const int m = std::min(call.block_tokens, tl);
  const auto queries = query_tiles(qpos, tl, call.block_tokens);

  // Of the heads being computed: unit-major order finishes a unit's heads before the next.
  Tracked<float> sum(call.meter, static_cast<std::size_t>(units.group) * tl);
  Tracked<float> tile_acc(call.meter, static_cast<std::size_t>(d) * m), tile_max(call.meter, m);
  const Counted score_tile(call.meter, 4 * static_cast<std::size_t>(m) * m);

  RingPassSpec spec;
  spec.units = units.count;
  spec.parts = 3;
  spec.source = [&](int u, int p) { return units.part(u, p, k, v, qpos, d); };
  spec.compute = [&](int u, int hop, const std::vector<const void*>& parts, const std::vector<float*>&) {
    const int t = units.tile(u), keys = units.keys(u);
    const auto* kpos = static_cast<const int*>(parts[2]);
    for (int j = 0; j < units.heads_in(u); ++j) {
      const int h = units.first_head(u) + j;
      const std::ptrdiff_t at = static_cast<std::ptrdiff_t>(j) * keys * d;
      const auto* K = static_cast<const float*>(parts[0]) + at;
      const auto* V = static_cast<const float*>(parts[1]) + at;
      float* O = out + h * per_head;
      float* running_max = lse + static_cast<std::ptrdiff_t>(h) * tl;
      float* head_sum = sum.data() + static_cast<std::ptrdiff_t>(j) * tl;
      const float* Q = q + h * per_head;
      if (t == 0 && hop == 0) block::start(d, tl, running_max, head_sum, O);
      for (const auto& [q0, tq] : queries) {
        const int widest = visible_keys(kpos, keys, qpos[q0 + tq - 1], shape.causal);
        if (widest == 0) continue;
        block::accumulate(d, tq, keys, Q + static_cast<std::ptrdiff_t>(q0) * d, qpos + q0, K, V, kpos, shape.causal,
                          running_max + q0, head_sum + q0, O + static_cast<std::ptrdiff_t>(q0) * d);
        call.work += static_cast<long long>(tq) * widest;
      }
      if (t == last_tile && hop == ranks - 1)
        for (const auto& [q0, tq] : queries) {
          // finish() reads the running state and writes out/lse, which hold that state.
          std::copy_n(O + static_cast<std::ptrdiff_t>(q0) * d, static_cast<std::ptrdiff_t>(tq) * d, tile_acc.data());
          std::copy_n(running_max + q0, tq, tile_max.data());
          block::finish(d, tq, tile_max.data(), head_sum + q0, tile_acc.data(), O + static_cast<std::ptrdiff_t>(q0) * d,
                        running_max + q0);
        }
    }
  };
  ring_pass(call.group, call.timeout_s, kForwardTags, call.meter, spec);
}

void online_backward(const RingCall& call, const float* q, const float* k, const float* v, const float* out,
                     const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  const auto& shape = call.shape;
  const int tl = shape.tokens, d = shape.head_dim, heads = shape.batch * shape.heads;
  std::fill_n(dq, shape.elements(), 0.0f);
  if (tl == 0 || heads == 0) return;
  const Units units(tl, heads, call.block_tokens);
  const std::ptrdiff_t per_head = static_cast<std::ptrdiff_t>(tl) * d;
  const int* qpos = call.positions;
  const int m = std::min(call.block_tokens, tl);
  const auto queries = query_tiles(qpos, tl, call.block_tokens);

  Tracked<float> delta(call.meter, static_cast<std::size_t>(units.group) * tl);  // of the unit's heads
  const Counted score_tiles(call.meter, 2 * 4 * static_cast<std::size_t>(m) * m);

  RingPassSpec spec;
  spec.units = units.count;
  spec.parts = 3;
  spec.accumulators = 2;
  spec.source = [&](int u, int p) { return units.part(u, p, k, v, qpos, d); };
  spec.home = [&](int u, int a) -> std::span<float> {
    return {(a == 0 ? dk : dv) + units.offset(u, d), units.words(u, d)};
  };
  spec.compute = [&](int u, int hop, const std::vector<const void*>& parts, const std::vector<float*>& sums) {
    const int t = units.tile(u), keys = units.keys(u);
    const auto* kpos = static_cast<const int*>(parts[2]);
    for (int j = 0; j < units.heads_in(u); ++j) {
      const int h = units.first_head(u) + j;
      const std::ptrdiff_t in_unit = static_cast<std::ptrdiff_t>(j) * keys * d;
      const auto* K = static_cast<const float*>(parts[0]) + in_unit;
      const auto* V = static_cast<const float*>(parts[1]) + in_unit;
      const std::ptrdiff_t at = h * per_head;
      const float* head_lse = lse + static_cast<std::ptrdiff_t>(h) * tl;
      float* head_delta = delta.data() + static_cast<std::ptrdiff_t>(j) * tl;
      if (t == 0 && hop == 0)
        for (const auto& [q0, tq] : queries) {
          const std::ptrdiff_t qa = at + static_cast<std::ptrdiff_t>(q0) * d;
          block::backward_delta(d, tq, out + qa, dout + qa, head_delta + q0);
        }
      for (const auto& [q0, tq] : queries) {
        const int widest = visible_keys(kpos, keys, qpos[q0 + tq - 1], shape.causal);
        if (widest == 0) continue;
        const std::ptrdiff_t qa = at + static_cast<std::ptrdiff_t>(q0) * d;
        block::accumulate_backward(d, tq, keys, q + qa, qpos + q0, K, V, kpos, shape.causal, head_lse + q0,
                                   head_delta + q0, dout + qa, dq + qa, sums[0] + in_unit, sums[1] + in_unit);
        call.work += static_cast<long long>(tq) * widest;
      }
    }
  };
  ring_pass(call.group, call.timeout_s, kBackwardTags, call.meter, spec);
}

}  // namespace peertrain::parallel::detail
