// LocalAttention and the online-softmax block kernels against a direct, double-precision
// softmax(QKᵀ/√d)V with its textbook backward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <vector>

#include "test_support/normalized_error.h"
#include "../../src/model/attention_blocks.h"
#include "peertrain/core/error.h"
#include "peertrain/model/attention.h"
#include "peertrain/model/transformer.h"
#include "transformer_test_util.h"

namespace peertrain::model {
namespace {

struct AttentionReference {
  std::vector<double> out, lse, dq, dk, dv;
};

// One (sequence, head) block at a time, every score held: the serial twin.
AttentionReference direct_attention(const AttentionShape& s, const std::vector<int>& pos, const std::vector<float>& q,
                                    const std::vector<float>& k, const std::vector<float>& v,
                                    const std::vector<float>& dout) {
  const int T = s.tokens, d = s.head_dim;
  AttentionReference r;
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

struct Inputs {
  std::vector<float> q, k, v, dout;
};
Inputs random_inputs(const AttentionShape& s, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto n = static_cast<std::size_t>(s.elements());
  Inputs in{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (auto* t : {&in.q, &in.k, &in.v, &in.dout})
    for (float& x : *t) x = normal(rng);
  return in;
}

void check(AttentionShape s, std::vector<int> pos, unsigned seed) {
  const auto n = static_cast<std::size_t>(s.elements());
  const auto [q, k, v, dout] = random_inputs(s, seed);
  std::vector<float> out(n), lse(static_cast<std::size_t>(s.rows())), dq(n, 7.0f), dk(n, 7.0f), dv(n, 7.0f);
  LocalAttention attention;
  attention.forward(s, pos, q.data(), k.data(), v.data(), out.data(), lse.data());
  attention.backward(s, pos, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                     dv.data());
  const AttentionReference r = direct_attention(s, pos, q, k, v, dout);
  EXPECT_LT(normalized_or_absolute_error(out, r.out), 1e-5);
  EXPECT_LT(normalized_or_absolute_error(lse, r.lse), 1e-5);
  EXPECT_LT(normalized_or_absolute_error(dq, r.dq), 1e-5);
  EXPECT_LT(normalized_or_absolute_error(dk, r.dk), 1e-5);
  EXPECT_LT(normalized_or_absolute_error(dv, r.dv), 1e-5);
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

// One implementation of the block kernels (portable or AVX-512), driven as the ring
// attention drives them: the keys arrive in units of `unit` tokens, each folded into the
// running state of every query (forward) or adding its share of the gradients (backward).
struct Kernels {
  decltype(&portable::accumulate) accumulate;
  decltype(&portable::accumulate_backward) accumulate_backward;
};

void check_kernels(const Kernels& kernels, AttentionShape s, const std::vector<int>& pos, int unit, unsigned seed) {
  const auto [q, k, v, dout] = random_inputs(s, seed);
  const int T = s.tokens, d = s.head_dim;
  const auto n = static_cast<std::size_t>(s.elements());
  std::vector<float> out(n), lse(static_cast<std::size_t>(s.rows())), dq(n, 0.0f), dk(n, 0.0f), dv(n, 0.0f);
  std::vector<float> max(T), sum(T), acc(static_cast<std::size_t>(T) * d), delta(T);
  for (int bh = 0; bh < s.batch * s.heads; ++bh) {
    const std::size_t at = static_cast<std::size_t>(bh) * T * d, row = static_cast<std::size_t>(bh) * T;
    attention_block::start(d, T, max.data(), sum.data(), acc.data());
    for (int k0 = 0; k0 < T; k0 += unit)
      kernels.accumulate(d, T, std::min(unit, T - k0), &q[at], pos.data(), &k[at + k0 * d], &v[at + k0 * d], &pos[k0],
                         s.causal, max.data(), sum.data(), acc.data(), Strides::contiguous(d));
    attention_block::finish(d, T, max.data(), sum.data(), acc.data(), &out[at], &lse[row]);
    attention_block::backward_delta(d, T, &out[at], &dout[at], delta.data());
    for (int k0 = 0; k0 < T; k0 += unit)
      kernels.accumulate_backward(d, T, std::min(unit, T - k0), &q[at], pos.data(), &k[at + k0 * d], &v[at + k0 * d],
                                  &pos[k0], s.causal, &lse[row], delta.data(), &dout[at], &dq[at], &dk[at + k0 * d],
                                  &dv[at + k0 * d], Strides::contiguous(d));
  }
  const AttentionReference r = direct_attention(s, pos, q, k, v, dout);
  const std::string where = "d " + std::to_string(d) + " T " + std::to_string(T) + " unit " + std::to_string(unit) +
                            (s.causal ? " causal" : " full");
  EXPECT_LT(normalized_or_absolute_error(out, r.out), 1e-5) << where;
  EXPECT_LT(normalized_or_absolute_error(lse, r.lse), 1e-5) << where;
  EXPECT_LT(normalized_or_absolute_error(dq, r.dq), 1e-5) << where;
  EXPECT_LT(normalized_or_absolute_error(dk, r.dk), 1e-5) << where;
  EXPECT_LT(normalized_or_absolute_error(dv, r.dv), 1e-5) << where;
}

// Positions of a zigzag rank: two runs of `chunk` tokens, far apart, ascending.
std::vector<int> zigzag_positions(int chunk) {
  std::vector<int> pos;
  for (int t = 0; t < chunk; ++t) pos.push_back(t);
  for (int t = 0; t < chunk; ++t) pos.push_back(5 * chunk + t);
  return pos;
}

// Head sizes the fused kernels take (16·1 … 16·8), token counts on both sides of the
// 64-query and 64-key tiles, keys in units as the ring sends them, gapped positions.
void check_every_shape(const Kernels& kernels) {
  for (int d : {16, 32, 48, 64, 128})
    for (bool causal : {true, false}) {
      check_kernels(kernels, {1, 2, d, 1, causal}, iota_positions(1), 1, 11);
      check_kernels(kernels, {1, 2, d, 70, causal}, iota_positions(70), 70, 12);
      check_kernels(kernels, {2, 1, d, 131, causal}, iota_positions(131), 50, 13);
    }
  check_kernels(kernels, {1, 2, 32, 96, true}, zigzag_positions(48), 40, 14);
  check_kernels(kernels, {1, 1, 64, 200, true}, iota_positions(200), 7, 15);
}

TEST(AttentionKernels, PortableMatchesDirectSoftmax) {
  check_every_shape({portable::accumulate, portable::accumulate_backward});
}

TEST(AttentionKernels, Avx512MatchesDirectSoftmax) {
  if (!avx512::supports(64)) GTEST_SKIP() << "this build has no AVX-512 kernels";
  EXPECT_FALSE(avx512::supports(8));
  EXPECT_FALSE(avx512::supports(40));
  EXPECT_FALSE(avx512::supports(144));
  check_every_shape({avx512::accumulate, avx512::accumulate_backward});
}

// Large scores (a sharp softmax) and a query that sees no key: the base-2 exponential and
// its masks keep exact zeros and no NaN.
TEST(AttentionKernels, Avx512SharpScoresAndUnseenQueries) {
  if (!avx512::supports(32)) GTEST_SKIP() << "this build has no AVX-512 kernels";
  const Kernels kernels{avx512::accumulate, avx512::accumulate_backward};
  // Keys at positions 3.. : query 0..2 see none of them, and get out = 0, lse = −inf.
  std::vector<int> q_pos = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  const int d = 32, tq = 10, tk = 7;
  const std::vector<int> k_pos = {3, 4, 5, 6, 7, 8, 9};
  const AttentionShape qs{1, 1, d, tq, true};
  auto [q, k, v, dout] = random_inputs(qs, 21);
  for (float& x : q) x *= 20.0f;  // scores in the hundreds: exp underflows unless shifted
  std::vector<float> max(tq), sum(tq), acc(static_cast<std::size_t>(tq) * d), out(acc.size()), lse(tq);
  attention_block::start(d, tq, max.data(), sum.data(), acc.data());
  EXPECT_TRUE(kernels.accumulate(d, tq, tk, q.data(), q_pos.data(), k.data(), v.data(), k_pos.data(), true, max.data(),
                                 sum.data(), acc.data(), Strides::contiguous(d)));
  attention_block::finish(d, tq, max.data(), sum.data(), acc.data(), out.data(), lse.data());
  for (int j = 0; j < 3; ++j) {
    EXPECT_TRUE(std::isinf(lse[j]) && lse[j] < 0) << j;
    for (int c = 0; c < d; ++c) EXPECT_EQ(out[j * d + c], 0.0f);
  }
  for (int j = 3; j < tq; ++j) EXPECT_TRUE(std::isfinite(lse[j])) << j;
  std::vector<float> delta(tq), dq(acc.size(), 0.0f), dk(static_cast<std::size_t>(tk) * d, 0.0f), dv(dk.size(), 0.0f);
  attention_block::backward_delta(d, tq, out.data(), dout.data(), delta.data());
  kernels.accumulate_backward(d, tq, tk, q.data(), q_pos.data(), k.data(), v.data(), k_pos.data(), true, lse.data(),
                              delta.data(), dout.data(), dq.data(), dk.data(), dv.data(), Strides::contiguous(d));
  for (float x : dq) ASSERT_TRUE(std::isfinite(x));
  for (float x : dk) ASSERT_TRUE(std::isfinite(x));
  for (int j = 0; j < 3 * d; ++j) EXPECT_EQ(dq[j], 0.0f);
  // The same call on the portable kernels: the two agree.
  std::vector<float> max2(tq), sum2(tq), acc2(acc.size()), out2(acc.size()), lse2(tq);
  attention_block::start(d, tq, max2.data(), sum2.data(), acc2.data());
  portable::accumulate(d, tq, tk, q.data(), q_pos.data(), k.data(), v.data(), k_pos.data(), true, max2.data(),
                       sum2.data(), acc2.data(), Strides::contiguous(d));
  attention_block::finish(d, tq, max2.data(), sum2.data(), acc2.data(), out2.data(), lse2.data());
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    diff += (out[i] - out2[i]) * (out[i] - out2[i]);
    norm += out2[i] * out2[i];
  }
  EXPECT_LT(std::sqrt(diff / norm), 1e-5);
}

// A core that keeps AttentionCore's token-major bridge (heads copied out and back): the
// serial twin of LocalAttention's in-place token-major path.
class SplittingCore final : public AttentionCore {
 public:
  void forward(const AttentionShape& s, std::span<const int> p, const float* q, const float* k, const float* v,
               float* out, float* lse) override {
    local_.forward(s, p, q, k, v, out, lse);
  }
  void backward(const AttentionShape& s, std::span<const int> p, const float* q, const float* k, const float* v,
                const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv) override {
    local_.backward(s, p, q, k, v, out, lse, dout, dq, dk, dv);
  }

 private:
  LocalAttention local_;
};

// LocalAttention on the layers' token-major columns (q, k, v read in place from the qkv
// projection's output) against the bridge that copies the heads out: both kernels, head
// sizes on and off the fused path, sequences across the 64-token tiles.
TEST(LocalAttention, TokenMajorMatchesTheHeadLayout) {
  const bool was = fused_kernels_enabled();
  for (bool fused : {true, false})
    for (int d : {8, 32, 64})
      for (bool causal : {true, false}) {
        set_fused_kernels_enabled(fused);
        const AttentionShape s{2, 3, d, 70, causal};
        const auto n = static_cast<std::size_t>(s.elements());
        const auto pos = iota_positions(s.tokens);
        const auto qkv = test::normal_vector(3 * n, 41), dout = test::normal_vector(n, 42);
        std::vector<float> out(n), lse(static_cast<std::size_t>(s.rows())), dqkv(3 * n, 7.0f);
        std::vector<float> out2(n), lse2(lse.size()), dqkv2(3 * n, 7.0f);
        LocalAttention local;
        SplittingCore splitting;
        local.forward_qkv(s, pos, qkv.data(), out.data(), lse.data());
        local.backward_qkv(s, pos, qkv.data(), out.data(), lse.data(), dout.data(), dqkv.data());
        splitting.forward_qkv(s, pos, qkv.data(), out2.data(), lse2.data());
        splitting.backward_qkv(s, pos, qkv.data(), out2.data(), lse2.data(), dout.data(), dqkv2.data());
        const std::string where = str("d ", d, causal ? " causal" : " full", fused ? " fused" : " portable");
        EXPECT_LT(normalized_error(out, out2), 1e-6) << where;
        EXPECT_LT(normalized_error(lse, lse2), 1e-6) << where;
        EXPECT_LT(normalized_error(dqkv, dqkv2), 1e-6) << where;
      }
  set_fused_kernels_enabled(was);
}

// Training does not move when the fused kernels replace the portable ones: 50 SGD steps of
// a GPT whose heads the fused kernels take (head_dim 32; 80 tokens cross the 64-token
// tiles), losses within 1e-5 relative step by step.
TEST(AttentionKernels, GptLossesMatchThePortableKernelsFor50Steps) {
  if (!avx512::supports(32)) GTEST_SKIP() << "this build has no AVX-512 kernels";
  const TransformerConfig config{
      .kind = TransformerKind::kGpt, .d_model = 64, .layers = 2, .heads = 2, .seq = 80, .vocab = 32};
  Transformer model(config);
  const test::Batch batch = test::make_batch(config, 2, test::all_positions(80), 31);
  auto train = [&](bool fused) {
    const bool was = fused_kernels_enabled();
    set_fused_kernels_enabled(fused);
    // Every weight at scale 0.3 (not GPT-2's small init, under which the attention is a
    // faint term in the residual stream and the losses agree to the last bit anyway).
    std::vector<float> params = test::random_params(model, 32), grads(params.size());
    std::vector<float> losses;
    for (int step = 0; step < 50; ++step) {
      std::fill(grads.begin(), grads.end(), 0.0f);
      losses.push_back(model.forward_backward(params, batch.view, grads));
      for (std::size_t i = 0; i < params.size(); ++i) params[i] -= 0.02f * grads[i];
    }
    set_fused_kernels_enabled(was);
    return losses;
  };
  const std::vector<float> fused = train(true), plain = train(false);
  EXPECT_LT(fused.back(), 0.9f * fused.front());  // it learns the batch
  double worst = 0;
  for (int step = 0; step < 50; ++step) {
    EXPECT_NEAR(fused[step], plain[step], 1e-5 * std::abs(plain[step])) << "step " << step;
    worst = std::max(worst, std::abs(double(fused[step]) - plain[step]) / std::abs(plain[step]));
  }
  std::cout << "losses " << plain.front() << " -> " << plain.back() << ", largest relative difference " << worst
            << "\n";
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
