// Ring Self-Attention (Li, Xue, Baranwal, Li & You 2021, "Sequence Parallelism: Long
// Sequence Training from System Perspective", section 3.2): the whole local K chunk (every
// sequence and head) travels the ring once to build the score strip of the local queries
// against all T keys; a plain softmax runs down each query's column of the strip; then the
// V chunks travel to compute the output. Backward recomputes the strip from the saved
// log-sum-exp, then a V pass (dP, with dV travelling home) and a K pass (dQ, with dK
// travelling home).
//
// The strip is (T keys × local queries) per (sequence, head), for all of them at once, as
// the paper's implementation holds its attention scores: memory quadratic in T over SP.
// It is kept as the baseline the online-softmax ring is measured against. Blocks the causal
// mask hides entirely are not computed (their probabilities are zero), as in the ring.
// Strip rows are in hop order, not position order: rows [hop·tl, (hop+1)·tl) hold the keys
// of rank r − hop, whose positions arrive with them in the first pass.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>

#include "peertrain/model/attention.h"
#include "ring_modes.h"

namespace peertrain::parallel::detail {
namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;
using ConstMap = Eigen::Map<const Matrix>;
using Map = Eigen::Map<Matrix>;

constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();
constexpr int kForwardKeyTags = 300, kForwardValueTags = 400;
constexpr int kBackwardKeyTags = 500, kBackwardValueTags = 600, kBackwardGradTags = 700;

struct Strip {
  int tokens, keys, head_dim;  // local queries, all keys (tokens · SP)
  std::ptrdiff_t per_head() const { return static_cast<std::ptrdiff_t>(tokens) * head_dim; }
  std::ptrdiff_t strip_size() const { return static_cast<std::ptrdiff_t>(keys) * tokens; }
};

// Whether the causal mask hides the keys of `hop` from every local query; positions ascend
// inside a rank's chunk, so its first key is its earliest.
bool hidden(const RingCall& call, const int* key_positions, int hop) {
  const int tl = call.shape.tokens;
  return call.shape.causal && key_positions[static_cast<std::ptrdiff_t>(hop) * tl] > call.positions[tl - 1];
}

// First pass, shared by forward and backward: receives the keys of every rank, computes
// the score blocks the mask does not hide, remembers the keys' positions. `finish_block`
// turns a fresh block of raw scores into what the caller keeps (probabilities in backward).
template <typename FinishBlock>
void key_pass(const RingCall& call, int tags, const float* q, const float* k, float* strip, int* key_positions,
              FinishBlock finish_block) {
  const auto& shape = call.shape;
  const int tl = shape.tokens, heads = shape.batch * shape.heads;
  const Strip s{tl, tl * call.group.size(), shape.head_dim};
  RingPassSpec spec;
  spec.units = 1;
  spec.parts = 2;
  spec.source = [&](int, int p) -> Part {
    if (p == 0) return {k, static_cast<std::size_t>(shape.elements())};
    return {call.positions, static_cast<std::size_t>(tl)};
  };
  spec.compute = [&](int, int hop, const std::vector<const void*>& parts, const std::vector<float*>&) {
    const auto* K = static_cast<const float*>(parts[0]);
    std::copy_n(static_cast<const int*>(parts[1]), tl, key_positions + static_cast<std::ptrdiff_t>(hop) * tl);
    const bool masked = hidden(call, key_positions, hop);
    for (int h = 0; h < heads; ++h) {
      auto block = Map(strip + h * s.strip_size(), s.keys, tl).middleRows(static_cast<std::ptrdiff_t>(hop) * tl, tl);
      if (masked) {
        block.setZero();
        continue;
      }
      block.noalias() = ConstMap(K + h * s.per_head(), s.head_dim, tl).transpose() *
                        ConstMap(q + h * s.per_head(), s.head_dim, tl);
      call.work += static_cast<long long>(tl) * tl;
      finish_block(h, hop, block);
    }
  };
  ring_pass(call.group, call.timeout_s, tags, call.meter, spec);
}

}  // namespace

std::size_t rsa_planned_bytes(const model::AttentionShape& local, int ranks, bool backward) {
  const std::size_t tl = static_cast<std::size_t>(local.tokens), heads = static_cast<std::size_t>(local.batch) * local.heads;
  if (tl == 0 || heads == 0) return 0;
  const std::size_t e = static_cast<std::size_t>(local.elements()), keys = tl * static_cast<std::size_t>(ranks);
  const std::size_t strip = 4 * heads * keys * tl, positions = 4 * keys;
  const std::size_t key_ring = ring_pass_bytes(ranks, {e, tl}, {});
  if (!backward) return strip + positions + std::max(key_ring, ring_pass_bytes(ranks, {e}, {}));
  // P and dS strips, positions, deltas; the passes run one after another.
  return 2 * strip + positions + 4 * heads * tl + std::max(key_ring, ring_pass_bytes(ranks, {e}, {e}));
}

void rsa_forward(const RingCall& call, const float* q, const float* k, const float* v, float* out, float* lse) {
  const auto& shape = call.shape;
  const int tl = shape.tokens, heads = shape.batch * shape.heads;
  if (tl == 0 || heads == 0) return;
  const Strip s{tl, tl * call.group.size(), shape.head_dim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  Tracked<float> strip(call.meter, static_cast<std::size_t>(heads * s.strip_size()));
  Tracked<int> key_positions(call.meter, static_cast<std::size_t>(s.keys));

  key_pass(call, kForwardKeyTags, q, k, strip.data(), key_positions.data(), [](int, int, auto&) {});

  // Softmax down each query's column: the keys it may see are those at or before it.
  for (int h = 0; h < heads; ++h) {
    Map S(strip.data() + h * s.strip_size(), s.keys, tl);
    for (int j = 0; j < tl; ++j) {
      const int qp = call.positions[j];
      auto visible = [&](int i) { return !shape.causal || key_positions[i] <= qp; };
      float top = kMinusInfinity;
      for (int i = 0; i < s.keys; ++i)
        if (visible(i)) top = std::max(top, S(i, j) * scale);
      float total = 0;
      for (int i = 0; i < s.keys; ++i) {
        const float p = visible(i) ? std::exp(S(i, j) * scale - top) : 0.0f;
        S(i, j) = p;
        total += p;
      }
      float& l = lse[static_cast<std::ptrdiff_t>(h) * tl + j];
      if (total == 0) {  // a query that sees no key: output 0, as attention_block::finish
        l = kMinusInfinity;
        continue;
      }
      S.col(j) /= total;
      l = top + std::log(total);
    }
  }

  std::fill_n(out, shape.elements(), 0.0f);
  RingPassSpec spec;
  spec.units = 1;
  spec.parts = 1;
  spec.source = [&](int, int) -> Part { return {v, static_cast<std::size_t>(shape.elements())}; };
  spec.compute = [&](int, int hop, const std::vector<const void*>& parts, const std::vector<float*>&) {
    if (hidden(call, key_positions.data(), hop)) return;
    const auto* V = static_cast<const float*>(parts[0]);
    for (int h = 0; h < heads; ++h)
      Map(out + h * s.per_head(), s.head_dim, tl).noalias() +=
          ConstMap(V + h * s.per_head(), s.head_dim, tl) *
          Map(strip.data() + h * s.strip_size(), s.keys, tl).middleRows(static_cast<std::ptrdiff_t>(hop) * tl, tl);
  };
  ring_pass(call.group, call.timeout_s, kForwardValueTags, call.meter, spec);
}

void rsa_backward(const RingCall& call, const float* q, const float* k, const float* v, const float* out,
                  const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  const auto& shape = call.shape;
  const int tl = shape.tokens, heads = shape.batch * shape.heads;
  std::fill_n(dq, shape.elements(), 0.0f);
  if (tl == 0 || heads == 0) return;
  const Strip s{tl, tl * call.group.size(), shape.head_dim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  const std::size_t strip_floats = static_cast<std::size_t>(heads * s.strip_size());
  Tracked<float> probs(call.meter, strip_floats), dscores(call.meter, strip_floats);
  Tracked<int> key_positions(call.meter, static_cast<std::size_t>(s.keys));
  Tracked<float> delta(call.meter, static_cast<std::size_t>(heads) * tl);

  // P recomputed block by block from the saved log-sum-exp, masked entries 0.
  key_pass(call, kBackwardKeyTags, q, k, probs.data(), key_positions.data(), [&](int h, int hop, auto& block) {
    const int* kpos = key_positions.data() + static_cast<std::ptrdiff_t>(hop) * tl;
    for (int j = 0; j < tl; ++j) {
      const float l = lse[static_cast<std::ptrdiff_t>(h) * tl + j];
      for (int i = 0; i < tl; ++i) {
        const bool visible = (!shape.causal || kpos[i] <= call.positions[j]) && l != kMinusInfinity;
        block(i, j) = visible ? std::exp(block(i, j) * scale - l) : 0.0f;
      }
    }
  });
  for (int h = 0; h < heads; ++h)
    model::attention_block::backward_delta(shape.head_dim, tl, out + h * s.per_head(), dout + h * s.per_head(),
                                           delta.data() + static_cast<std::ptrdiff_t>(h) * tl);

  // V pass: dP = Vᵀ dO into the dS strip; dV = dO Pᵀ travels home.
  RingPassSpec values;
  values.units = 1;
  values.parts = 1;
  values.accumulators = 1;
  values.source = [&](int, int) -> Part { return {v, static_cast<std::size_t>(shape.elements())}; };
  values.home = [&](int, int) { return std::span<float>(dv, static_cast<std::size_t>(shape.elements())); };
  values.compute = [&](int, int hop, const std::vector<const void*>& parts, const std::vector<float*>& sums) {
    const auto* V = static_cast<const float*>(parts[0]);
    const std::ptrdiff_t row = static_cast<std::ptrdiff_t>(hop) * tl;
    for (int h = 0; h < heads; ++h) {
      auto dp = Map(dscores.data() + h * s.strip_size(), s.keys, tl).middleRows(row, tl);
      if (hidden(call, key_positions.data(), hop)) {
        dp.setZero();
        continue;
      }
      const ConstMap dO(dout + h * s.per_head(), s.head_dim, tl);
      dp.noalias() = ConstMap(V + h * s.per_head(), s.head_dim, tl).transpose() * dO;
      Map(sums[0] + h * s.per_head(), s.head_dim, tl).noalias() +=
          dO * Map(probs.data() + h * s.strip_size(), s.keys, tl).middleRows(row, tl).transpose();
    }
  };
  ring_pass(call.group, call.timeout_s, kBackwardValueTags, call.meter, values);

  // dS = P ∘ (dP − delta), with the scores' scale folded in.
  for (int h = 0; h < heads; ++h) {
    Map dS(dscores.data() + h * s.strip_size(), s.keys, tl);
    const Map P(probs.data() + h * s.strip_size(), s.keys, tl);
    for (int j = 0; j < tl; ++j)
      dS.col(j) = (P.col(j).array() * (dS.col(j).array() - delta[static_cast<std::size_t>(h) * tl + j]) * scale).matrix();
  }

  // K pass: dQ = K dS stays, dK = Q dSᵀ travels home.
  RingPassSpec keys;
  keys.units = 1;
  keys.parts = 1;
  keys.accumulators = 1;
  keys.source = [&](int, int) -> Part { return {k, static_cast<std::size_t>(shape.elements())}; };
  keys.home = [&](int, int) { return std::span<float>(dk, static_cast<std::size_t>(shape.elements())); };
  keys.compute = [&](int, int hop, const std::vector<const void*>& parts, const std::vector<float*>& sums) {
    if (hidden(call, key_positions.data(), hop)) return;
    const auto* K = static_cast<const float*>(parts[0]);
    const std::ptrdiff_t row = static_cast<std::ptrdiff_t>(hop) * tl;
    for (int h = 0; h < heads; ++h) {
      const auto dS = Map(dscores.data() + h * s.strip_size(), s.keys, tl).middleRows(row, tl);
      Map(dq + h * s.per_head(), s.head_dim, tl).noalias() += ConstMap(K + h * s.per_head(), s.head_dim, tl) * dS;
      Map(sums[0] + h * s.per_head(), s.head_dim, tl).noalias() +=
          ConstMap(q + h * s.per_head(), s.head_dim, tl) * dS.transpose();
    }
  };
  ring_pass(call.group, call.timeout_s, kBackwardGradTags, call.meter, keys);
}

}  // namespace peertrain::parallel::detail
