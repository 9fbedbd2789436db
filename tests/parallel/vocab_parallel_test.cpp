// Vocabulary parallelism against its serial twin: the softmax cross-entropy of the whole
// head on one rank. Over p ranks of a ThreadGroup, each holding V/p rows, vocab-1 and
// vocab-2 give the unsplit loss, input gradient and (assembled from the shards) weight
// gradient within 1e-5, for untied and tied heads, on fresh random data.
// GCC 12 flags Eigen's AVX-512 double paths, which the serial twin's double matrices use,
// as -Wuninitialized: a false positive like the -Wmaybe-uninitialized one the build
// already silences. It is reported where the intrinsics header is read, so this comes first.
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "test_support/normalized_error.h"
#include "peertrain/parallel/vocab_parallel.h"

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <thread>
#include <vector>

#include "peertrain/comm/thread_group.h"
#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"

namespace peertrain::parallel {
namespace {

struct Problem {
  int vocab, d, n;
  bool tied;
  std::vector<float> w, y;
  std::vector<std::int32_t> targets;
};

Problem random_problem(int vocab, int d, int n, bool tied, std::uint64_t seed) {
  Problem p{vocab, d, n, tied, {}, {}, {}};
  Rng rng(seed);
  for (int i = 0; i < vocab * d; ++i) p.w.push_back(static_cast<float>(rng.normal()));
  for (int i = 0; i < d * n; ++i) p.y.push_back(static_cast<float>(0.5 * rng.normal()));
  for (int j = 0; j < n; ++j) p.targets.push_back(static_cast<std::int32_t>(rng.uniform_below(vocab)));
  return p;
}

// The serial twin: whole logits, softmax cross-entropy in double.
double serial(const Problem& p, float scale, std::vector<float>& dy, std::vector<float>& dw) {
  using M = Eigen::MatrixXd;
  M W(p.vocab, p.d);  // V × d
  for (int v = 0; v < p.vocab; ++v)
    for (int j = 0; j < p.d; ++j)
      W(v, j) = p.tied ? p.w[static_cast<std::size_t>(v) * p.d + j] : p.w[static_cast<std::size_t>(j) * p.vocab + v];
  const M Y = Eigen::Map<const Eigen::MatrixXf>(p.y.data(), p.d, p.n).cast<double>();
  const M L = W * Y;
  M G(p.vocab, p.n);
  double loss = 0;
  for (int j = 0; j < p.n; ++j) {
    const double m = L.col(j).maxCoeff();
    const double s = (L.col(j).array() - m).exp().sum();
    loss += std::log(s) + m - L(p.targets[j], j);
    G.col(j) = ((L.col(j).array() - m).exp() / s).matrix();
    G(p.targets[j], j) -= 1;
  }
  G *= scale;
  const M DY = W.transpose() * G, DW = G * Y.transpose();
  dy.assign(DY.data(), DY.data() + DY.size());
  dw.resize(p.w.size());
  for (int v = 0; v < p.vocab; ++v)
    for (int j = 0; j < p.d; ++j)
      (p.tied ? dw[static_cast<std::size_t>(v) * p.d + j] : dw[static_cast<std::size_t>(j) * p.vocab + v]) =
          static_cast<float>(DW(v, j));
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = static_cast<float>(DY.data()[i]);
  return loss;
}

TEST(VocabParallel, EveryModeAndRankCountMatchesTheWholeHead) {
  std::uint64_t seed = 1;
  for (VocabParallel mode : {VocabParallel::kVocab1, VocabParallel::kVocab2})
    for (bool tied : {false, true})
      for (int ranks : {1, 2, 3, 4}) {
        SCOPED_TRACE(testing::Message() << to_string(mode) << (tied ? " tied" : "") << " p " << ranks);
        const Problem p = random_problem(12 * 5, 8, 7, tied, ++seed);
        const float scale = 1.0f / 7;
        std::vector<float> want_dy, want_dw;
        const double want = serial(p, scale, want_dy, want_dw);
        comm::ThreadGroup group(ranks, "vocab group");
        std::vector<double> losses(ranks);
        std::vector<std::vector<float>> dys(ranks, std::vector<float>(want_dy.size()));
        std::vector<float> dw(p.w.size(), 0.0f);  // the shards' rows do not overlap
        std::vector<long long> correct(ranks, 0);
        std::vector<std::thread> threads;
        for (int r = 0; r < ranks; ++r)
          threads.emplace_back([&, r] {
            losses[r] = vocab_parallel_cross_entropy(group.member(r), mode, vocab_shard(p.vocab, ranks, r), p.vocab,
                                                     p.d, p.tied, p.w.data(), p.y.data(), p.n, p.targets, scale,
                                                     dys[r].data(), dw.data(), &correct[r]);
          });
        for (auto& t : threads) t.join();
        for (int r = 0; r < ranks; ++r) {
          EXPECT_NEAR(losses[r], want, 1e-5 * std::abs(want));
          EXPECT_LT(normalized_error(dys[r], want_dy), 1e-5);
          EXPECT_EQ(correct[r], correct[0]);
        }
        EXPECT_LT(normalized_error(dw, want_dw), 1e-5);
      }
}

TEST(VocabParallel, UnevenSplitAndBadModeNameTheirFlags) {
  try {
    vocab_shard(1000, 3, 0);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--vocab-size 1000"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("--pp 3"), std::string::npos);
  }
  EXPECT_EQ(vocab_shard(1000, 4, 3).first, 750);
  EXPECT_EQ(parse_vocab_parallel("vocab-1"), VocabParallel::kVocab1);
  EXPECT_THROW(parse_vocab_parallel("vocab-3"), Error);
}

}  // namespace
}  // namespace peertrain::parallel
