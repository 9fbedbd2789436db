// CHOCO-SGD's gossip against its serial twins: with the identity compressor and γ = 1 it
// is D-PSGD's x ← W·x − u; with the real compressors, gossip alone still reaches the
// average (which it keeps exactly: W symmetric), and a lost neighbour is survived.
#include "peertrain/algo/choco.h"

#include <gtest/gtest.h>

#include <Eigen/Dense>

#include "test_support/cluster.h"
#include "gossip_test_data.h"
#include "peertrain/core/rng.h"
#include "peertrain/net/loopback.h"

namespace peertrain::algo {
namespace {

using testdata::consensus_distance;
using testdata::random_rows;
using testdata::topology_from;

using topology::Topology;

struct ChocoRun {
  Eigen::MatrixXf x;
  std::vector<std::string> errors;
  std::size_t bytes = 0;  // peer 0's last message
};

// `steps` CHOCO rounds on every peer from x0, subtracting updates(k).row(i) after step k
// (none when `updates` is empty). Peer `crash` aborts its transport at step crash_at.
ChocoRun choco_steps(const Topology& t, const Eigen::MatrixXf& x0, int steps, const std::string& compression,
                     float gamma, const std::vector<Eigen::MatrixXf>& updates = {}, int crash = -1, int crash_at = 0,
                     bool common_start = false) {
  const int n = t.num_peers();
  net::LoopbackOptions options{n, {}, 10};
  for (int i = 0; i < n; ++i) {
    auto nb = t.graph.neighbors(i);
    options.links.emplace_back(nb.begin(), nb.end());
  }
  net::LoopbackFabric fabric(options);
  ChocoRun run{x0, std::vector<std::string>(n), 0};
  testing::run_peers(n, [&](int rank) {
    auto net = fabric.transport(rank);
    Gossip gossip(*net, mixing_rows(t, rank));
    ChocoGossip choco(gossip, parse_compression(compression), gamma, 77 + rank, false, common_start);
    std::vector<float> x(x0.cols()), u(x0.cols());
    for (Eigen::Index j = 0; j < x0.cols(); ++j) x[j] = x0(rank, j);
    try {
      for (int k = 0; k < steps; ++k) {
        if (rank == crash && k == crash_at) return net->abort();
        choco.start(k, x);
        if (!updates.empty())
          for (Eigen::Index j = 0; j < x0.cols(); ++j) u[j] = updates[k](rank, j);
        choco.finish(x, updates.empty() ? std::span<const float>() : std::span<const float>(u));
      }
    } catch (const std::exception& e) {
      run.errors[rank] = e.what();
    }
    for (Eigen::Index j = 0; j < x0.cols(); ++j) run.x(rank, j) = x[j];
    if (rank == 0) run.bytes = choco.last_message_bytes();
    net->close();
  });
  return run;
}

TEST(Choco, IdentityCompressionWithGammaOneIsDpsgd) {
  for (const char* yaml :
       {"graph: {generator: ring, n: 6}", "graph: {generator: exponential, n: 8}", "graph: {generator: star, n: 5}"}) {
    SCOPED_TRACE(yaml);
    const Topology t = topology_from(yaml);
    const int n = t.num_peers(), d = 301, steps = 8;
    std::vector<Eigen::MatrixXf> updates;
    for (int k = 0; k < steps; ++k) updates.push_back(0.1f * random_rows(n, d, 100 + k));
    // Copies from 0 and any x_0; copies from a common x_0, as the trainer starts.
    const Eigen::MatrixXf common = random_rows(1, d, 4).replicate(n, 1);
    for (const auto& [x0, common_start] : {std::pair{random_rows(n, d, 3), false}, std::pair{common, true}}) {
      SCOPED_TRACE(common_start ? "common start" : "copies from zero");
      const ChocoRun run = choco_steps(t, x0, steps, "none", 1.0f, updates, -1, 0, common_start);
      Eigen::MatrixXf expected = x0;
      const Eigen::MatrixXf w = Eigen::MatrixXd(t.mixing).cast<float>();
      for (int k = 0; k < steps; ++k) expected = (w * expected - updates[k]).eval();
      EXPECT_LT((run.x - expected).norm() / expected.norm(), 1e-6);
    }
  }
}

// Gossip alone, from random vectors: every compressor reaches the average at its default γ,
// and the average itself does not move (Σ_i Σ_j W_ij (x̂_j − x̂_i) = 0 for symmetric W).
TEST(Choco, EveryCompressorReachesTheAverage) {
  const Topology t = topology_from("graph: {generator: ring, n: 8}");
  const Eigen::MatrixXf x0 = random_rows(8, 1000, 4);
  const Eigen::RowVectorXf mean = x0.colwise().mean();
  const double start = consensus_distance(x0);
  for (const auto& [spec, steps] : std::vector<std::pair<std::string, int>>{
           {"top-k:0.1", 400}, {"random-k:0.25", 400}, {"qsgd:4", 300}, {"qsgd:8", 100}, {"sign", 300}}) {
    SCOPED_TRACE(spec);
    const float gamma = static_cast<float>(parse_compression(spec).default_gossip_step());
    const ChocoRun run = choco_steps(t, x0, steps, spec, gamma);
    for (const auto& e : run.errors) EXPECT_EQ(e, "");
    EXPECT_LT(consensus_distance(run.x), 1e-4 * start) << "from " << start;
    EXPECT_LT((run.x.colwise().mean() - mean).norm() / mean.norm(), 1e-4);
  }
}

// A neighbour that crashes is dropped (its weight stays home), and the survivors, a path of
// five, still reach their own average.
TEST(Choco, SurvivesALostNeighbour) {
  const Topology t = topology_from("graph: {generator: ring, n: 6}");
  const Eigen::MatrixXf x0 = random_rows(6, 200, 5);
  const ChocoRun run = choco_steps(t, x0, 300, "qsgd:8", 0.8f, {}, 3, 5);
  Eigen::MatrixXf survivors(5, 200);
  int row = 0;
  for (int p = 0; p < 6; ++p) {
    if (p == 3) continue;
    EXPECT_EQ(run.errors[p], "") << "peer " << p;
    survivors.row(row++) = run.x.row(p);
  }
  EXPECT_LT(consensus_distance(survivors), 1e-4 * consensus_distance(x0));
}

TEST(Choco, RefusesATimeVaryingTopologyAndABadStep) {
  const Topology t = topology_from("graph: {generator: ring, n: 4}");
  net::LoopbackFabric fabric({4, {{1, 3}, {0, 2}, {1, 3}, {0, 2}}, 10});
  auto net = fabric.transport(0);
  Gossip gossip(*net, mixing_rows(t, 0));
  EXPECT_THROW(ChocoGossip(gossip, {}, 1.0f, 1, true), Error);
  EXPECT_THROW(ChocoGossip(gossip, {}, 0.0f, 1, false), Error);
  EXPECT_THROW(ChocoGossip(gossip, {}, 1.5f, 1, false), Error);
  net->abort();
}

}  // namespace
}  // namespace peertrain::algo
