// The portable attention kernels: Eigen products on 64-token tiles, the online softmax one
// query column at a time. Scores are a tk × tq tile (one column per query), so the softmax
// runs down columns, the contiguous direction in Eigen's column-major storage.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention_blocks.h"

namespace peertrain::model::portable {
namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;
using Strided = Eigen::OuterStride<>;
using ConstMap = Eigen::Map<const Matrix, 0, Strided>;
using Map = Eigen::Map<Matrix, 0, Strided>;
using ConstVector = Eigen::Map<const Eigen::VectorXf>;

constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();
// Key tiles. Small enough that the causal mask skips whole tiles (at T = 256 one 256-token
// tile computes every score, 64-token tiles 10 of 16), and that a score tile (16 KiB) stays
// in L1; large enough that the tile GEMMs still run near Eigen's rate. Measured on the GPT
// step (d 128, T 256): attention 37 ms with 256, 29 with 64.
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
    visible[j] =
        causal ? static_cast<int>(std::upper_bound(k_positions, k_positions + tk, q_positions[j]) - k_positions) : tk;
    widest = std::max(widest, visible[j]);
  }
  return widest;
}

// One key tile (tk ≤ kTile) of the forward. acc is contiguous (head_dim × tq).
bool accumulate_tile(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k,
                     const float* v, const int* k_positions, bool causal, float* max, float* sum, float* acc,
                     const Strides& ld) {
  Scratch& s = scratch();
  const int widest = count_visible(tq, tk, q_positions, k_positions, causal, s.visible);
  if (widest == 0) return false;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const ConstMap Q(q, head_dim, tq, Strided(ld.q)), K(k, head_dim, widest, Strided(ld.kv)),
      V(v, head_dim, widest, Strided(ld.kv));
  s.scores.resize(widest, tq);
  s.scores.noalias() = K.transpose() * Q;
  Map A(acc, head_dim, tq, Strided(head_dim));
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

// One key tile (tk ≤ kTile) of the backward.
void accumulate_backward_tile(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k,
                              const float* v, const int* k_positions, bool causal, const float* lse, const float* delta,
                              const float* dout, float* dq, float* dk, float* dv, const Strides& ld) {
  Scratch& s = scratch();
  const int widest = count_visible(tq, tk, q_positions, k_positions, causal, s.visible);
  if (widest == 0) return;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const ConstMap Q(q, head_dim, tq, Strided(ld.q)), K(k, head_dim, widest, Strided(ld.kv)),
      V(v, head_dim, widest, Strided(ld.kv)), dO(dout, head_dim, tq, Strided(ld.out));
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
  Map dV(dv, head_dim, widest, Strided(ld.kv)), dK(dk, head_dim, widest, Strided(ld.kv)),
      dQ(dq, head_dim, tq, Strided(ld.q));
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

bool accumulate(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k, const float* v,
                const int* k_positions, bool causal, float* max, float* sum, float* acc, const Strides& ld) {
  bool computed = false;
  for (int k0 = 0; k0 < tk; k0 += kTile) {
    const std::ptrdiff_t at = ld.kv * k0;
    if (!accumulate_tile(head_dim, tq, std::min(kTile, tk - k0), q, q_positions, k + at, v + at, k_positions + k0,
                         causal, max, sum, acc, ld))
      break;  // keys ascend: no query sees a later tile either
    computed = true;
  }
  return computed;
}

void accumulate_backward(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k,
                         const float* v, const int* k_positions, bool causal, const float* lse, const float* delta,
                         const float* dout, float* dq, float* dk, float* dv, const Strides& ld) {
  for (int k0 = 0; k0 < tk; k0 += kTile) {
    const std::ptrdiff_t at = ld.kv * k0;
    accumulate_backward_tile(head_dim, tq, std::min(kTile, tk - k0), q, q_positions, k + at, v + at, k_positions + k0,
                             causal, lse, delta, dout, dq, dk + at, dv + at, ld);
  }
}

}  // namespace peertrain::model::portable
