// Online-softmax attention: the block kernels and the single-rank core built from them.
// Scores are a tk × tq tile (one column per query), so the softmax runs down columns, the
// contiguous direction in Eigen's column-major storage.
#include "peertrain/model/attention.h"

#include "attention_blocks.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>
#include <cmath>
#include <limits>
#include <vector>

#include "peertrain/core/aligned.h"
#include "peertrain/core/error.h"

namespace peertrain::model {
namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;
using ConstMap = Eigen::Map<const Matrix>;
using Map = Eigen::Map<Matrix>;
using ConstVector = Eigen::Map<const Eigen::VectorXf>;
using Vector = Eigen::Map<Eigen::VectorXf>;

constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();
// Query and key tiles of LocalAttention. Small enough that the causal mask skips whole
// tiles (at T = 256 one 256-token tile computes every score, 64-token tiles 10 of 16), and
// that a score tile (16 KiB) stays in L1; large enough that the tile GEMMs still run near
// Eigen's rate. Measured on the GPT step (d 128, T 256): attention 37 ms with 256, 29 with 64.
constexpr int kTile = 64;

// Scratch tiles reused between calls of one thread (each worker thread has its own).
struct Scratch {
  Matrix scores, probs, dprobs;
  std::vector<int> visible;  // keys visible to each query of the tile
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// visible[j]: how many leading keys query j may see. Positions ascend, so the visible keys
// of a query are a prefix of the block. Returns the largest count.
int count_visible(int tq, int tk, const int* q_positions, const int* k_positions, bool causal,
                  std::vector<int>& visible) {
  visible.resize(static_cast<std::size_t>(tq));
  int widest = 0;
  for (int j = 0; j < tq; ++j) {
    visible[j] = causal ? static_cast<int>(std::upper_bound(k_positions, k_positions + tk, q_positions[j]) - k_positions)
                        : tk;
    widest = std::max(widest, visible[j]);
  }
  return widest;
}

// One key tile (tk ≤ kTile) of the portable forward.
bool accumulate_tile(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k,
                     const float* v, const int* k_positions, bool causal, float* max, float* sum, float* acc) {
  Scratch& s = scratch();
  const int widest = count_visible(tq, tk, q_positions, k_positions, causal, s.visible);
  if (widest == 0) return false;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  ConstMap Q(q, head_dim, tq), K(k, head_dim, widest), V(v, head_dim, widest);
  s.scores.resize(widest, tq);
  s.scores.noalias() = K.transpose() * Q;
  Map A(acc, head_dim, tq);
  for (int j = 0; j < tq; ++j) {
    const int visible = s.visible[j];
    auto column = s.scores.col(j);
    if (visible == 0) {
      column.setZero();
      continue;
    }
    const float top = column.head(visible).maxCoeff() * scale;
    const float new_max = std::max(max[j], top);
    const float correction = std::exp(max[j] - new_max);  // 0 when max[j] was −inf
    column.head(visible) = (column.head(visible).array() * scale - new_max).exp().matrix();
    column.tail(widest - visible).setZero();
    sum[j] = sum[j] * correction + column.head(visible).sum();
    max[j] = new_max;
    if (correction != 1.0f) A.col(j) *= correction;
  }
  A.noalias() += V * s.scores;
  return true;
}

// One key tile (tk ≤ kTile) of the portable backward.
void accumulate_backward_tile(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k,
                              const float* v, const int* k_positions, bool causal, const float* lse, const float* delta,
                              const float* dout, float* dq, float* dk, float* dv) {
  Scratch& s = scratch();
  const int widest = count_visible(tq, tk, q_positions, k_positions, causal, s.visible);
  if (widest == 0) return;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  ConstMap Q(q, head_dim, tq), K(k, head_dim, widest), V(v, head_dim, widest), dO(dout, head_dim, tq);
  // P: the attention probabilities, recomputed from the saved log-sum-exp.
  Matrix& P = s.probs;
  P.resize(widest, tq);
  P.noalias() = K.transpose() * Q;
  for (int j = 0; j < tq; ++j) {
    const int visible = s.visible[j];
    auto column = P.col(j);
    if (visible == 0 || lse[j] == kMinusInfinity) {
      column.setZero();
      continue;
    }
    column.head(visible) = (column.head(visible).array() * scale - lse[j]).exp().matrix();
    column.tail(widest - visible).setZero();
  }
  Map dV(dv, head_dim, widest), dK(dk, head_dim, widest), dQ(dq, head_dim, tq);
  dV.noalias() += dO * P.transpose();
  // dS = P ∘ (dP − delta), dP = Vᵀ dO; the scale of the scores folds into dS.
  Matrix& dS = s.dprobs;
  dS.resize(widest, tq);
  dS.noalias() = V.transpose() * dO;
  dS = (P.array() * (dS.array().rowwise() - ConstVector(delta, tq).transpose().array()) * scale).matrix();
  dQ.noalias() += K * dS;
  dK.noalias() += Q * dS.transpose();
}

}  // namespace

namespace portable {

bool accumulate(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k, const float* v,
                const int* k_positions, bool causal, float* max, float* sum, float* acc) {
  bool computed = false;
  for (int k0 = 0; k0 < tk; k0 += kTile) {
    const std::ptrdiff_t at = static_cast<std::ptrdiff_t>(head_dim) * k0;
    if (!accumulate_tile(head_dim, tq, std::min(kTile, tk - k0), q, q_positions, k + at, v + at, k_positions + k0,
                         causal, max, sum, acc))
      break;  // keys ascend: no query sees a later tile either
    computed = true;
  }
  return computed;
}

void accumulate_backward(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k,
                         const float* v, const int* k_positions, bool causal, const float* lse, const float* delta,
                         const float* dout, float* dq, float* dk, float* dv) {
  for (int k0 = 0; k0 < tk; k0 += kTile) {
    const std::ptrdiff_t at = static_cast<std::ptrdiff_t>(head_dim) * k0;
    accumulate_backward_tile(head_dim, tq, std::min(kTile, tk - k0), q, q_positions, k + at, v + at, k_positions + k0,
                             causal, lse, delta, dout, dq, dk + at, dv + at);
  }
}

}  // namespace portable

namespace {
std::atomic<bool>& fused_kernels_flag() {
  static std::atomic<bool> enabled = [] {
    const char* choice = std::getenv("PEERTRAIN_KERNELS");
    return choice == nullptr || std::string_view(choice) != "portable";
  }();
  return enabled;
}
bool fused(int head_dim) { return fused_kernels_flag().load(std::memory_order_relaxed) && avx512::supports(head_dim); }
}  // namespace

bool fused_kernels_enabled() { return fused_kernels_flag().load(); }
void set_fused_kernels_enabled(bool enabled) { fused_kernels_flag().store(enabled); }

namespace attention_block {

void start(int head_dim, int tq, float* max, float* sum, float* acc) {
  std::fill(max, max + tq, kMinusInfinity);
  std::fill(sum, sum + tq, 0.0f);
  std::fill(acc, acc + static_cast<std::ptrdiff_t>(head_dim) * tq, 0.0f);
}

bool accumulate(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k, const float* v,
                const int* k_positions, bool causal, float* max, float* sum, float* acc) {
  if (fused(head_dim))
    return avx512::accumulate(head_dim, tq, tk, q, q_positions, k, v, k_positions, causal, max, sum, acc);
  return portable::accumulate(head_dim, tq, tk, q, q_positions, k, v, k_positions, causal, max, sum, acc);
}

void finish(int head_dim, int tq, const float* max, const float* sum, const float* acc, float* out, float* lse) {
  ConstMap A(acc, head_dim, tq);
  Map O(out, head_dim, tq);
  for (int j = 0; j < tq; ++j) {
    if (sum[j] == 0.0f) {
      O.col(j).setZero();
      lse[j] = kMinusInfinity;
      continue;
    }
    O.col(j) = A.col(j) / sum[j];
    lse[j] = max[j] + std::log(sum[j]);
  }
}

void backward_delta(int head_dim, int tq, const float* out, const float* dout, float* delta) {
  ConstMap O(out, head_dim, tq), dO(dout, head_dim, tq);
  Vector(delta, tq) = O.cwiseProduct(dO).colwise().sum().transpose();
}

void accumulate_backward(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k,
                         const float* v, const int* k_positions, bool causal, const float* lse, const float* delta,
                         const float* dout, float* dq, float* dk, float* dv) {
  if (fused(head_dim))
    return avx512::accumulate_backward(head_dim, tq, tk, q, q_positions, k, v, k_positions, causal, lse, delta, dout,
                                       dq, dk, dv);
  portable::accumulate_backward(head_dim, tq, tk, q, q_positions, k, v, k_positions, causal, lse, delta, dout, dq, dk,
                                dv);
}

}  // namespace attention_block

namespace {

void check_shape(const AttentionShape& shape, std::span<const int> positions) {
  if (shape.batch < 0 || shape.heads <= 0 || shape.head_dim <= 0 || shape.tokens < 0)
    throw Error(ErrorKind::kInvalidArgument, str("attention: bad shape batch ", shape.batch, " heads ", shape.heads,
                                                 " head_dim ", shape.head_dim, " tokens ", shape.tokens));
  if (static_cast<int>(positions.size()) != shape.tokens)
    throw Error(ErrorKind::kInvalidArgument,
                str("attention: ", positions.size(), " positions for ", shape.tokens, " tokens"));
}

}  // namespace

void LocalAttention::forward(const AttentionShape& shape, std::span<const int> positions, const float* q,
                             const float* k, const float* v, float* out, float* lse) {
  check_shape(shape, positions);
  const int T = shape.tokens, d = shape.head_dim;
  const std::ptrdiff_t block = static_cast<std::ptrdiff_t>(T) * d;
  AlignedVector<float> max(kTile), sum(kTile), acc(static_cast<std::size_t>(kTile) * d);
  const int* pos = positions.data();
  for (int bh = 0; bh < shape.batch * shape.heads; ++bh) {
    const float *Q = q + bh * block, *K = k + bh * block, *V = v + bh * block;
    for (int q0 = 0; q0 < T; q0 += kTile) {
      const int tq = std::min(kTile, T - q0);
      attention_block::start(d, tq, max.data(), sum.data(), acc.data());
      // Every key at once: the kernels tile them, and stop where the causal mask hides the rest.
      attention_block::accumulate(d, tq, T, Q + q0 * d, pos + q0, K, V, pos, shape.causal, max.data(), sum.data(),
                                  acc.data());
      attention_block::finish(d, tq, max.data(), sum.data(), acc.data(), out + bh * block + q0 * d,
                              lse + static_cast<std::ptrdiff_t>(bh) * T + q0);
    }
  }
}

void LocalAttention::backward(const AttentionShape& shape, std::span<const int> positions, const float* q,
                              const float* k, const float* v, const float* out, const float* lse, const float* dout,
                              float* dq, float* dk, float* dv) {
  check_shape(shape, positions);
  const int T = shape.tokens, d = shape.head_dim;
  const std::ptrdiff_t block = static_cast<std::ptrdiff_t>(T) * d;
  std::fill(dq, dq + shape.elements(), 0.0f);
  std::fill(dk, dk + shape.elements(), 0.0f);
  std::fill(dv, dv + shape.elements(), 0.0f);
  AlignedVector<float> delta(kTile);
  const int* pos = positions.data();
  for (int bh = 0; bh < shape.batch * shape.heads; ++bh) {
    const std::ptrdiff_t at = bh * block;
    for (int q0 = 0; q0 < T; q0 += kTile) {
      const int tq = std::min(kTile, T - q0);
      attention_block::backward_delta(d, tq, out + at + q0 * d, dout + at + q0 * d, delta.data());
      attention_block::accumulate_backward(d, tq, T, q + at + q0 * d, pos + q0, k + at, v + at, pos, shape.causal,
                                           lse + static_cast<std::ptrdiff_t>(bh) * T + q0, delta.data(),
                                           dout + at + q0 * d, dq + at + q0 * d, dk + at, dv + at);
    }
  }
}

}  // namespace peertrain::model
