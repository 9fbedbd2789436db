// LocalAttention and the online-softmax block kernels against a direct, double-precision
// softmax(QKᵀ/√d)V with its textbook backward.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "peertrain/model/attention.h"

namespace peertrain::model {
namespace {

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// One (sequence, head) block at a time, every score held: the serial twin.
Reference direct_attention(const AttentionShape& s, const std::vector<int>& pos, const std::vector<float>& q,
                           const std::vector<float>& k, const std::vector<float>& v, const std::vector<float>& dout) {
  const int T = s.tokens, d = s.head_dim;
  Reference r;
  r.out.assign(q.size(), 0);
  r.dq.assign(q.size(), 0);
  r.dk.assign(q.size(), 0);
  r.dv.assign(q.size(), 0);
  r.lse.assign(static_cast<std::size_t>(s.rows()), 0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int bh = 0; bh < s.batch * s.heads; ++bh) {
    const std::size_t at = static_cast<std::size_t>(bh) * T * d;
    for (int i = 0; i < T; ++i) {
      std::vector<double> p(T, 0.0);
      double top = -1e300;
      for (int j = 0; j < T; ++j) {
        if (s.causal && pos[j] > pos[i]) continue;
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(q[at + i * d + c]) * k[at + j * d + c];
        p[j] = dot * scale;
        top = std::max(top, p[j]);
      }
      double sum = 0;
      for (int j = 0; j < T; ++j) {
        p[j] = (s.causal && pos[j] > pos[i]) ? 0.0 : std::exp(p[j] - top);
        sum += p[j];
      }
      r.lse[static_cast<std::size_t>(bh) * T + i] = top + std::log(sum);
      for (int j = 0; j < T; ++j) p[j] /= sum;
      for (int j = 0; j < T; ++j)
        for (int c = 0; c < d; ++c) r.out[at + i * d + c] += p[j] * v[at + j * d + c];
      // dP_j = dO_i · v_j; dS_j = P_j (dP_j − Σ_l P_l dP_l)
      std::vector<double> dp(T, 0.0);
      double dot_sum = 0;
      for (int j = 0; j < T; ++j) {
        for (int c = 0; c < d; ++c) dp[j] += double(dout[at + i * d + c]) * v[at + j * d + c];
        dot_sum += p[j] * dp[j];
      }
      for (int j = 0; j < T; ++j) {
        const double ds = p[j] * (dp[j] - dot_sum) * scale;
        for (int c = 0; c < d; ++c) {
          r.dv[at + j * d + c] += p[j] * dout[at + i * d + c];
          r.dq[at + i * d + c] += ds * k[at + j * d + c];
          r.dk[at + j * d + c] += ds * q[at + i * d + c];
        }
      }
    }
  }
  return r;
}

double normalized_error(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  // One key per query makes dq and dk exactly zero: then the absolute error is the measure.
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

void check(AttentionShape s, std::vector<int> pos, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto n = static_cast<std::size_t>(s.elements());
  std::vector<float> q(n), k(n), v(n), dout(n);
  for (auto* t : {&q, &k, &v, &dout})
    for (float& x : *t) x = normal(rng);
  std::vector<float> out(n), lse(static_cast<std::size_t>(s.rows())), dq(n, 7.0f), dk(n, 7.0f), dv(n, 7.0f);
  LocalAttention attention;
  attention.forward(s, pos, q.data(), k.data(), v.data(), out.data(), lse.data());
  attention.backward(s, pos, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                     dv.data());
  const Reference r = direct_attention(s, pos, q, k, v, dout);
  EXPECT_LT(normalized_error(out, r.out), 1e-5);
  EXPECT_LT(normalized_error(lse, r.lse), 1e-5);
  EXPECT_LT(normalized_error(dq, r.dq), 1e-5);
  EXPECT_LT(normalized_error(dk, r.dk), 1e-5);
  EXPECT_LT(normalized_error(dv, r.dv), 1e-5);
}

std::vector<int> iota_positions(int tokens) {
  std::vector<int> pos(tokens);
  for (int t = 0; t < tokens; ++t) pos[t] = t;
  return pos;
}

TEST(LocalAttention, MatchesDirectSoftmaxCausalAndNot) {
  for (bool causal : {true, false}) {
    check({2, 3, 8, 37, causal}, iota_positions(37), 1);
    check({1, 2, 16, 1, causal}, iota_positions(1), 2);
  }
}

// Longer than one 256-token tile: the online softmax merges tiles.
TEST(LocalAttention, MatchesAcrossTiles) {
  check({1, 1, 8, 600, true}, iota_positions(600), 3);
  check({1, 1, 8, 300, false}, iota_positions(300), 4);
}

// Positions with gaps, as a zigzag rank holds them: the mask follows positions, not indices.
TEST(LocalAttention, MasksByPosition) {
  std::vector<int> pos = {0, 1, 2, 3, 12, 13, 14, 15};
  check({2, 2, 4, 8, true}, pos, 5);
}

// A key block that every query is before: nothing computed, state unchanged.
TEST(AttentionBlock, HiddenBlockIsSkipped) {
  const int d = 4, tq = 2, tk = 3;
  std::vector<float> q(d * tq, 1.0f), k(d * tk, 1.0f), v(d * tk, 1.0f), max(tq), sum(tq), acc(d * tq);
  const int qp[] = {0, 1}, kp[] = {5, 6, 7};
  attention_block::start(d, tq, max.data(), sum.data(), acc.data());
  EXPECT_FALSE(attention_block::accumulate(d, tq, tk, q.data(), qp, k.data(), v.data(), kp, true, max.data(),
                                           sum.data(), acc.data()));
  EXPECT_EQ(sum[0], 0.0f);
  std::vector<float> out(d * tq), lse(tq);
  attention_block::finish(d, tq, max.data(), sum.data(), acc.data(), out.data(), lse.data());
  EXPECT_TRUE(std::isinf(lse[0]) && lse[0] < 0);
}

TEST(LocalAttention, RejectsPositionsOfAnotherLength) {
  LocalAttention a;
  std::vector<float> x(8);
  std::vector<int> pos = {0};
  EXPECT_ANY_THROW(a.forward({1, 1, 4, 2, true}, pos, x.data(), x.data(), x.data(), x.data(), x.data()));
}

}  // namespace
}  // namespace peertrain::model
