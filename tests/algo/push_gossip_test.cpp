// Push-sum against its serial twin, the dense column-stochastic product P·V; its
// convergence to the exact average at the rate P's spectrum predicts; the delayed form's
// conservation of mass; and a lost peer's share kept home.
#include "peertrain/algo/push_gossip.h"

#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "peertrain/core/rng.h"
#include "peertrain/net/loopback.h"
#include "peertrain/topology/topology.h"
#include "test_support/cluster.h"

namespace peertrain::algo::directed_test {
namespace {

using topology::SparseMatrix;

net::LoopbackOptions all_linked(int n, double peer_timeout_s = 10) {
  return testing::every_peer_linked(n, peer_timeout_s);
}

Eigen::MatrixXf random_rows(int n, int d, std::uint64_t seed) {
  Rng rng(seed);
  Eigen::MatrixXf v(n, d);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) v(i, j) = static_cast<float>(rng.normal());
  return v;
}

// Every peer's vector after each of `steps` push-sum steps with P(t), from V (row i = peer i).
std::vector<Eigen::MatrixXf> push_steps(const std::function<SparseMatrix(long long)>& p_at, const Eigen::MatrixXf& v0,
                                        int steps, int max_delay = 0) {
  const int n = static_cast<int>(v0.rows());
  const auto d = static_cast<std::size_t>(v0.cols());
  net::LoopbackFabric fabric(all_linked(n));
  std::vector<Eigen::MatrixXf> history(static_cast<std::size_t>(steps), Eigen::MatrixXf(n, v0.cols()));
  std::mutex mutex;
  testing::run_peers(n, [&](int rank) {
    auto net = fabric.transport(rank);
    PushGossip gossip(*net, DirectedMixing::kPushSum, max_delay);
    std::vector<float> v(d);
    for (std::size_t j = 0; j < d; ++j) v[j] = v0(rank, static_cast<Eigen::Index>(j));
    for (int k = 0; k < steps; ++k) {
      if (max_delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(300 * rank));  // uneven speeds
      gossip.start(static_cast<std::uint64_t>(k), directed_row(p_at(k), rank), v);
      gossip.finish(v);
      if (k + 1 == steps && max_delay > 0) gossip.drain(v);
      std::lock_guard lock(mutex);
      for (std::size_t j = 0; j < d; ++j)
        history[static_cast<std::size_t>(k)](rank, static_cast<Eigen::Index>(j)) = v[j];
    }
    net->close();
  });
  return history;
}

SparseMatrix p_of(const std::string& yaml) { return topology::parse_topology(yaml, "p.yaml", ".").mixing; }

TEST(PushGossip, OneStepEqualsTheDenseColumnStochasticProduct) {
  const std::vector<SparseMatrix> graphs = {
      p_of("graph: {n: 5, directed: true, edges: [[0, 1], [1, 2], [2, 3], [3, 4], [4, 0], [0, 3], [2, 0]]}"),
      p_of("graph: {generator: directed-exponential, n: 7}"),
      topology::column_stochastic_weights(topology::random_out_step(9, 3, 4, 2))};
  for (const SparseMatrix& p : graphs) {
    const Eigen::MatrixXf v0 = random_rows(static_cast<int>(p.rows()), 33, 11);
    const Eigen::MatrixXf expected = Eigen::MatrixXd(p).cast<float>() * v0;
    const auto got = push_steps([&](long long) { return p; }, v0, 1);
    EXPECT_LT((got[0] - expected).norm() / expected.norm(), 1e-6);
  }
}

// The de-biased z_i = x_i / w_i of every peer against the exact average of the initial x.
double worst_debiased_error(const Eigen::MatrixXf& xw, const Eigen::RowVectorXf& average) {
  double worst = 0;
  const Eigen::Index d = average.size();
  for (Eigen::Index i = 0; i < xw.rows(); ++i) {
    const Eigen::RowVectorXf z = xw.row(i).head(d) / xw(i, d);
    worst = std::max(worst, static_cast<double>((z - average).norm() / average.norm()));
  }
  return worst;
}

TEST(PushGossip, PushSumReachesTheExactAverageAtTheRateTheSpectrumPredicts) {
  // A directed ring with one chord: P is far from symmetric, its rows far from summing to 1.
  const SparseMatrix p =
      p_of("graph: {n: 8, directed: true, edges: [[0,1],[1,2],[2,3],[3,4],[4,5],[5,6],[6,7],[7,0],[0,4]]}");
  const double slem = topology::analyze_directed(p).slem;
  ASSERT_GT(slem, 0.8);  // slow enough to measure the rate over 40 steps
  const int d = 16;
  Eigen::MatrixXf v0(8, d + 1);
  v0.leftCols(d) = random_rows(8, d, 5);
  v0.col(d).setOnes();  // w_0 = 1
  const Eigen::RowVectorXf average = v0.leftCols(d).colwise().mean();
  const auto history = push_steps([&](long long) { return p; }, v0, 160);
  const double at20 = worst_debiased_error(history[19], average), at60 = worst_debiased_error(history[59], average);
  // The error shrinks by SLEM per step, up to a constant: over 40 steps by SLEM^40 within 5×.
  const double predicted = std::pow(slem, 40);
  EXPECT_LT(at60 / at20, 5 * predicted) << "SLEM " << slem;
  EXPECT_GT(at60 / at20, predicted / 5) << "SLEM " << slem;
  EXPECT_LT(worst_debiased_error(history.back(), average), 1e-5);
  // Without the weights the plain x_i do not reach the average: the rows of P are uneven.
  EXPECT_GT((history.back().row(0).head(d) - average).norm() / average.norm(), 1e-2);
}

TEST(PushGossip, TheDelayedFormKeepsEveryMessageOnceAndConverges) {
  const int n = 6, d = 8;
  Eigen::MatrixXf v0(n, d + 1);
  v0.leftCols(d) = random_rows(n, d, 9);
  v0.col(d).setOnes();
  const Eigen::RowVectorXf sums = v0.colwise().sum();
  auto p_at = [n](long long t) {
    return topology::column_stochastic_weights(topology::one_peer_directed_exponential_step(n, t));
  };
  const auto history = push_steps(p_at, v0, 120, 3);
  const Eigen::RowVectorXf after = history.back().colwise().sum();
  EXPECT_LT((after - sums).norm() / sums.norm(), 1e-5);  // Σx and Σw: nothing lost or counted twice
  EXPECT_LT(worst_debiased_error(history.back(), v0.leftCols(d).colwise().mean()), 1e-4);
}

TEST(PushGossip, ALostTargetsShareStaysHomeSoTheSurvivorsKeepTheirMass) {
  const int n = 5, d = 4, lost = 3, steps = 40;
  const SparseMatrix p = p_of("graph: {generator: directed-exponential, n: 5}");
  Eigen::MatrixXf v0(n, d + 1);
  v0.leftCols(d) = random_rows(n, d, 21);
  v0.col(d).setOnes();
  // Silent for half the timeout: lost. (A neighbour waiting on it is waited for up to the
  // whole timeout, so the loss does not spread; receives wait in slices of 1 s.)
  net::LoopbackFabric fabric(all_linked(n, 6.0));
  std::vector<Eigen::MatrixXf> history(steps, Eigen::MatrixXf::Zero(n, d + 1));
  std::vector<std::vector<int>> gave_up(n);
  std::mutex mutex;
  std::vector<std::unique_ptr<net::Transport>> nets(n);
  for (int rank = 0; rank < n; ++rank) nets[static_cast<std::size_t>(rank)] = fabric.transport(rank);
  testing::run_peers(n, [&](int rank) {
    net::Transport* net = nets[static_cast<std::size_t>(rank)].get();
    PushGossip gossip(*net, DirectedMixing::kPushSum);
    std::vector<float> v(static_cast<std::size_t>(d + 1));
    for (int j = 0; j <= d; ++j) v[static_cast<std::size_t>(j)] = v0(rank, j);
    for (int k = 0; k < steps; ++k) {
      if (rank == lost && k == 3) {
        fabric.stall(lost);  // it falls silent mid-run, as a killed process whose links hang does
        return;
      }
      gossip.start(static_cast<std::uint64_t>(k), directed_row(p, rank), v);
      gossip.finish(v);
      std::lock_guard lock(mutex);
      for (int j = 0; j <= d; ++j) history[static_cast<std::size_t>(k)](rank, j) = v[static_cast<std::size_t>(j)];
    }
    gave_up[static_cast<std::size_t>(rank)] = gossip.lost();
    net->close();
  });
  for (int i = 0; i < n; ++i) {
    if (i != lost) {
      EXPECT_EQ(gave_up[static_cast<std::size_t>(i)], std::vector<int>{lost}) << "peer " << i;
    }
  }
  // Once every survivor has given up on it, their Σx and Σw stay put: no share leaks into it.
  const Eigen::RowVectorXf at20 = history[19].colwise().sum(), at40 = history[39].colwise().sum();
  EXPECT_LT((at40 - at20).norm() / at20.norm(), 1e-5);
  // And their de-biased values agree: the average of what they hold.
  const Eigen::RowVectorXf target = at40.head(d) / at40(d);
  double worst = 0;
  for (int i = 0; i < n; ++i)
    if (i != lost) {
      const Eigen::RowVectorXf z = history[39].row(i).head(d) / history[39](i, d);
      worst = std::max(worst, static_cast<double>((z - target).norm() / target.norm()));
    }
  EXPECT_LT(worst, 1e-4);
}

TEST(PushGossip, ASourceThatLeftIsGivenUpOnAtOnceNotAfterTheTimeout) {
  // Peer 2 closes its links before it sends anything (a process that failed at start): its
  // targets give up on it within a slice, not after the 20 s --peer-timeout.
  const int n = 3;
  const SparseMatrix p = p_of("graph: {n: 3, directed: true, edges: [[0, 1], [1, 2], [2, 0]]}");
  net::LoopbackFabric fabric(all_linked(n, 20.0));
  std::vector<std::vector<std::pair<int, std::string>>> gave_up(n);
  testing::run_peers(n, [&](int rank) {
    auto net = fabric.transport(rank);
    if (rank == 2) {
      net->close();
      return;
    }
    PushGossip gossip(*net, DirectedMixing::kPushSum);
    std::vector<float> v(4, static_cast<float>(rank));
    gossip.start(0, directed_row(p, rank), v);
    gossip.finish(v);
    gave_up[static_cast<std::size_t>(rank)] = gossip.newly_lost();
    net->close();
  });
  ASSERT_EQ(gave_up[0].size(), 1u);  // 0 hears from 2 only
  EXPECT_EQ(gave_up[0][0].first, 2);
  // Given up on because it left, not because the bound ran out.
  EXPECT_NE(gave_up[0][0].second.find("left"), std::string::npos) << gave_up[0][0].second;
}

}  // namespace
}  // namespace peertrain::algo::directed_test
