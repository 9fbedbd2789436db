// Megatron's column- and row-parallel Linear layers against the unsplit layers (in double),
// T = 1, 2, 3, 4 threads: an MLP (column, tanh, row) forward and backward, and attention's
// qkv split by heads (three row blocks per rank); the ranks' gradient buffers sum to the
// serial gradient and every rank ends with the whole input gradient.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <thread>
#include <vector>

#include "peertrain/comm/thread_group.h"
#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "peertrain/parallel/tensor_parallel.h"

namespace {

using namespace peertrain;
using namespace peertrain::parallel;
using MatrixD = Eigen::MatrixXd;

std::vector<float> random_vector(Rng& rng, std::size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

MatrixD as_matrix(const std::vector<float>& v, int rows, int cols) {
  return Eigen::Map<const Eigen::MatrixXf>(v.data(), rows, cols).cast<double>();
}

double normalized_error(const std::vector<float>& got, const MatrixD& want) {
  const MatrixD g = Eigen::Map<const Eigen::MatrixXf>(got.data(), want.rows(), want.cols()).cast<double>();
  return (g - want).norm() / want.norm();
}

template <typename Fn>
void on_ranks(int ranks, Fn&& fn) {
  comm::ThreadGroup group(ranks, "tensor group");
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back([&, r] { fn(group.member(r), r); });
  for (auto& t : threads) t.join();
}

TEST(TensorParallel, MlpColumnThenRowMatchesTheUnsplitLayers) {
  constexpr int d = 8, F = 24, n = 5;
  Rng rng(21);
  for (int T : {1, 2, 3, 4}) {
    SCOPED_TRACE(str("T ", T));
    const auto w1 = random_vector(rng, F * d), b1 = random_vector(rng, F), w2 = random_vector(rng, d * F),
               b2 = random_vector(rng, d), x = random_vector(rng, d * n), dy = random_vector(rng, d * n);
    // The serial twin, in double: h = tanh(W1 x + b1), y = W2 h + b2.
    const MatrixD X = as_matrix(x, d, n), W1 = as_matrix(w1, F, d), W2 = as_matrix(w2, d, F), DY = as_matrix(dy, d, n);
    const MatrixD pre = (W1 * X).colwise() + as_matrix(b1, F, 1).col(0);
    const MatrixD H = pre.array().tanh().matrix();
    const MatrixD Y = (W2 * H).colwise() + as_matrix(b2, d, 1).col(0);
    const MatrixD DH = W2.transpose() * DY;
    const MatrixD DPRE = (DH.array() * (1 - H.array().square())).matrix();
    const MatrixD DW2 = DY * H.transpose(), DW1 = DPRE * X.transpose(), DX = W1.transpose() * DPRE;
    const MatrixD DB2 = DY.rowwise().sum(), DB1 = DPRE.rowwise().sum();

    std::vector<std::vector<float>> y(T), dx(T), gw1(T), gb1(T), gw2(T), gb2(T);
    on_ranks(T, [&](comm::Group& group, int r) {
      const Block part = tensor_shard(F, T, r, "MLP columns");
      std::vector<float> h(static_cast<std::size_t>(part.count) * n);
      const Block rows[] = {part};
      column_parallel_forward(d, F, rows, n, w1.data(), b1.data(), x.data(), h.data());
      std::vector<float> pre_r = h;
      for (auto& v : h) v = std::tanh(v);
      y[r].resize(d * n);
      row_parallel_forward(group, F, d, part, n, w2.data(), b2.data(), h.data(), y[r].data());
      gw1[r].assign(F * d, 0);
      gb1[r].assign(F, 0);
      gw2[r].assign(d * F, 0);
      gb2[r].assign(d, 0);
      std::vector<float> dh(h.size());
      row_parallel_backward(group, F, d, part, n, w2.data(), h.data(), dy.data(), gw2[r].data(), gb2[r].data(),
                            dh.data());
      for (std::size_t i = 0; i < dh.size(); ++i) dh[i] *= 1 - h[i] * h[i];
      dx[r].resize(d * n);
      column_parallel_backward(group, d, F, rows, n, w1.data(), x.data(), dh.data(), gw1[r].data(), gb1[r].data(),
                               dx[r].data());
    });
    auto sum = [&](const std::vector<std::vector<float>>& parts) {
      std::vector<float> s(parts[0].size(), 0.0f);
      for (const auto& p : parts)
        for (std::size_t i = 0; i < s.size(); ++i) s[i] += p[i];
      return s;
    };
    for (int r = 0; r < T; ++r) {
      EXPECT_LE(normalized_error(y[r], Y), 1e-5) << "rank " << r;
      EXPECT_LE(normalized_error(dx[r], DX), 1e-5) << "rank " << r;
    }
    EXPECT_LE(normalized_error(sum(gw1), DW1), 1e-5);
    EXPECT_LE(normalized_error(sum(gb1), DB1), 1e-5);
    EXPECT_LE(normalized_error(sum(gw2), DW2), 1e-5);
    EXPECT_LE(normalized_error(sum(gb2), DB2), 1e-5);
  }
}

// Attention's qkv: rank r's heads are three row blocks, [q; k; v] of those heads.
TEST(TensorParallel, QkvSplitByHeadsMatchesTheRowsOfTheWholeProduct) {
  constexpr int d = 12, heads = 6, head_dim = d / heads, n = 4;
  Rng rng(22);
  const auto w = random_vector(rng, 3 * d * d), b = random_vector(rng, 3 * d), x = random_vector(rng, d * n);
  const MatrixD Y = (as_matrix(w, 3 * d, d) * as_matrix(x, d, n)).colwise() + as_matrix(b, 3 * d, 1).col(0);
  for (int T : {1, 2, 3}) {
    for (int r = 0; r < T; ++r) {
      const Block mine = tensor_shard(heads, T, r, "attention heads");
      const Block rows[] = {{mine.first * head_dim, mine.count * head_dim},
                            {d + mine.first * head_dim, mine.count * head_dim},
                            {2 * d + mine.first * head_dim, mine.count * head_dim}};
      const int count = 3 * mine.count * head_dim;
      std::vector<float> y(static_cast<std::size_t>(count) * n);
      column_parallel_forward(d, 3 * d, rows, n, w.data(), b.data(), x.data(), y.data());
      MatrixD want(count, n);
      int at = 0;
      for (const Block& blk : rows) {
        want.middleRows(at, blk.count) = Y.middleRows(blk.first, blk.count);
        at += blk.count;
      }
      EXPECT_LE(normalized_error(y, want), 1e-5) << "T " << T << " rank " << r;
    }
  }
  try {
    tensor_shard(heads, 4, 0, "attention heads");
    ADD_FAILURE() << "4 ranks accepted for 6 heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tp 4 does not divide the 6 attention heads"), std::string::npos)
        << e.what();
  }
}

}  // namespace
