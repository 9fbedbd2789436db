// Gossip against its serial twin, the dense product W·X, and against the consensus rate
// the spectral gap predicts; D-PSGD on a least-squares problem.
#include "peertrain/algo/gossip.h"

#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "test_support/cluster.h"
#include "gossip_test_data.h"
#include "peertrain/net/faulty.h"
#include "peertrain/net/loopback.h"
#include "peertrain/core/rng.h"
#include "peertrain/topology/spectrum.h"

namespace peertrain::algo {
namespace {

using testdata::consensus_distance;
using testdata::random_rows;
using testdata::topology_from;

using topology::Topology;

std::vector<int> union_links(const Topology& t, int self) {
  auto neighbours = t.graph.neighbors(self);
  return {neighbours.begin(), neighbours.end()};
}

// Runs `steps` gossip steps on every peer (threads) from X (n × d, row i = peer i) and
// returns the rows after each step.
std::vector<Eigen::MatrixXf> gossip_steps(const Topology& t, const Eigen::MatrixXf& x0, int steps) {
  const int n = t.num_peers();
  const auto endpoints = testing::loopback_endpoints(n);
  std::vector<Eigen::MatrixXf> history(steps, Eigen::MatrixXf(n, x0.cols()));
  testing::run_peers(n, [&](int rank) {
    auto net_owner = net::make_tcp_transport(testing::options_for(rank, endpoints, union_links(t, rank)));
    net::Transport& net = *net_owner;
    net.connect();
    Gossip gossip(net, mixing_rows(t, rank));
    std::vector<float> x(x0.cols());
    for (Eigen::Index j = 0; j < x0.cols(); ++j) x[j] = x0(rank, j);
    for (int k = 0; k < steps; ++k) {
      gossip.start(k, x);
      gossip.finish(x);
      for (Eigen::Index j = 0; j < x0.cols(); ++j) history[k](rank, j) = x[j];
    }
    net.close();
  });
  return history;
}

TEST(Gossip, OneStepEqualsDenseWTimesX) {
  for (const char* yaml : {"graph: {generator: ring, n: 7}", "graph: {generator: torus, rows: 3, cols: 3}",
                           "graph: {generator: exponential, n: 8}", "graph: {generator: complete, n: 5}",
                           "graph: {generator: star, n: 6}"}) {
    SCOPED_TRACE(yaml);
    const Topology t = topology_from(yaml);
    const Eigen::MatrixXf x = random_rows(t.num_peers(), 1003, 5);
    const Eigen::MatrixXf expected = (Eigen::MatrixXd(t.mixing).cast<float>() * x).eval();
    const auto got = gossip_steps(t, x, 1);
    EXPECT_LT((got[0] - expected).norm() / expected.norm(), 1e-6);
  }
}

// The same serial twin over the in-process transport, with one peer's messages held back
// by the fault injector: a slow link changes when the mix happens, never what it is.
TEST(Gossip, OverLoopbackWithADelayedPeerStillEqualsWToTheK) {
  const Topology t = topology_from("graph: {generator: ring, n: 6}");
  const int n = t.num_peers(), steps = 4;
  const Eigen::MatrixXf x0 = random_rows(n, 517, 11);
  net::LoopbackOptions options{n, {}, 10};
  for (int i = 0; i < n; ++i) options.links.push_back(union_links(t, i));
  net::LoopbackFabric fabric(options);
  Eigen::MatrixXf got(n, x0.cols());
  testing::run_peers(n, [&](int rank) {
    std::vector<net::Fault> faults;
    if (rank == 2) faults.push_back({.action = net::Fault::kDelay, .delay_s = 0.03});
    auto net = net::make_faulty_transport(fabric.transport(rank), faults);
    Gossip gossip(*net, mixing_rows(t, rank));
    std::vector<float> x(x0.cols());
    for (Eigen::Index j = 0; j < x0.cols(); ++j) x[j] = x0(rank, j);
    for (int k = 0; k < steps; ++k) {
      gossip.start(k, x);
      gossip.finish(x);
    }
    for (Eigen::Index j = 0; j < x0.cols(); ++j) got(rank, j) = x[j];
    net->close();
  });
  Eigen::MatrixXf expected = x0;
  const Eigen::MatrixXf w = Eigen::MatrixXd(t.mixing).cast<float>();
  for (int k = 0; k < steps; ++k) expected = (w * expected).eval();
  EXPECT_LT((got - expected).norm() / expected.norm(), 1e-6);
}

// A neighbour that stalls a little after we start waiting for it is given up on once it
// has been silent for the deadline (half of --peer-timeout), not at the whole bound: the
// peer waiting on us waits the whole bound, and must not give up on us first (a ring of 6
// under load lost a chain of peers to one stall that way). Peer 1 never sends and stalls
// 1 s into peer 0's wait; peer 0 drops it at about 4 s, not after the whole 6 s.
TEST(Gossip, AStallMidWaitIsGivenUpOnAtTheDeadlineNotTheWholeBound) {
  const Topology t = topology_from("graph: {generator: ring, n: 3}");
  constexpr double kTimeout = 6, kStallAfter = 1;
  net::LoopbackFabric fabric({3, {union_links(t, 0), union_links(t, 1), union_links(t, 2)}, kTimeout});
  auto net0 = fabric.transport(0);
  auto net1 = fabric.transport(1);
  auto net2 = fabric.transport(2);
  std::vector<float> x(8, 1.0f), x2(8, 2.0f);
  net2->send(0, net::MessageType::kParameters, 0, 0, net::as_bytes(std::span<const float>(x2))).wait();
  Gossip gossip(*net0, mixing_rows(t, 0));
  const auto begin = std::chrono::steady_clock::now();
  std::thread staller([&] {
    std::this_thread::sleep_for(std::chrono::duration<double>(kStallAfter));
    fabric.stall(1);
  });
  gossip.start(0, x);
  gossip.finish(x);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  staller.join();
  fabric.resume(1);
  ASSERT_EQ(gossip.newly_lost().size(), 1u);
  EXPECT_EQ(gossip.newly_lost()[0].first, 1);
  EXPECT_NE(gossip.newly_lost()[0].second.find("s in all, silent for"), std::string::npos)
      << gossip.newly_lost()[0].second;
  // Not a speed bound: which rule fired. The silence rule fires at about 4 s, the bound
  // at 6 s; 5.5 s leaves the staller's thread 1.5 s of scheduling slack.
  EXPECT_LT(waited, kTimeout - 0.5) << "peer 0 waited out the whole bound";
  EXPECT_GE(waited, kTimeout / 2) << "peer 0 gave up before the deadline";
  net0->abort();
  net1->abort();
  net2->abort();
}

TEST(Gossip, OnePeerExponentialFollowsItsScheduleAndAveragesInOnePeriod) {
  const Topology t = topology_from("graph: {generator: one-peer-exponential, n: 8}");
  const Eigen::MatrixXf x = random_rows(8, 257, 6);
  const auto got = gossip_steps(t, x, 4);
  Eigen::MatrixXf expected = x;
  for (int k = 0; k < 4; ++k) {
    expected = Eigen::MatrixXd(t.mixing_at(k)).cast<float>() * expected;
    EXPECT_LT((got[k] - expected).norm() / expected.norm(), 1e-6) << "step " << k;
  }
  // Three steps (log2 8) average exactly: every row equals the mean.
  const Eigen::RowVectorXf mean = x.colwise().mean();
  for (int i = 0; i < 8; ++i) EXPECT_LT((got[2].row(i) - mean).norm() / mean.norm(), 1e-5);
}

TEST(Gossip, ReachesTheAverageAtTheRateTheSpectralGapPredicts) {
  const Topology t = topology_from("graph: {generator: ring, n: 8}");
  const double predicted = topology::analyze_spectrum(t.mixing, t.graph).contraction_per_step();
  const Eigen::MatrixXf x = random_rows(8, 64, 7);
  const auto got = gossip_steps(t, x, 40);
  double previous = consensus_distance(x);
  for (int k = 0; k < 40; ++k) {
    const double d = consensus_distance(got[k]);
    EXPECT_LE(d, previous * predicted * (1 + 1e-3)) << "step " << k;  // never slower than the bound
    if (k == 39) {
      EXPECT_NEAR(d / previous, predicted, 0.02 * predicted);  // and asymptotically at it
    }
    previous = d;
  }
}

TEST(Dpsgd, ConvergesToTheLeastSquaresOptimum) {
  // Peer i holds f_i(x) = ½‖A_i x − b_i‖²; D-PSGD with exact gradients and a small step
  // must approach argmin Σ f_i at every peer.
  const int n = 6, dim = 5, rows = 8;
  const Topology t = topology_from("graph: {generator: ring, n: 6}");
  std::vector<Eigen::MatrixXf> a(n);
  std::vector<Eigen::VectorXf> b(n);
  Eigen::MatrixXf ata = Eigen::MatrixXf::Zero(dim, dim);
  Eigen::VectorXf atb = Eigen::VectorXf::Zero(dim);
  for (int i = 0; i < n; ++i) {
    a[i] = random_rows(rows, dim, 100 + i);
    b[i] = random_rows(rows, 1, 200 + i);
    ata += a[i].transpose() * a[i];
    atb += a[i].transpose() * b[i];
  }
  const Eigen::VectorXf optimum = ata.ldlt().solve(atb);
  const auto endpoints = testing::loopback_endpoints(n);
  std::vector<Eigen::VectorXf> final(n);
  testing::run_peers(n, [&](int rank) {
    auto net_owner = net::make_tcp_transport(testing::options_for(rank, endpoints, union_links(t, rank)));
    net::Transport& net = *net_owner;
    net.connect();
    Gossip gossip(net, mixing_rows(t, rank));
    Eigen::VectorXf x = Eigen::VectorXf::Zero(dim);
    // A decaying step removes D-PSGD's O(γ) consensus bias; γ_k ∝ 1/k keeps Σγ_k infinite.
    for (int k = 0; k < 6000; ++k) {
      const float step_size = 0.05f / (1.0f + static_cast<float>(k) / 20.0f);
      gossip.start(k, std::span<const float>(x.data(), dim));
      const Eigen::VectorXf gradient = a[rank].transpose() * (a[rank] * x - b[rank]);
      gossip.finish(std::span<float>(x.data(), dim));
      x -= step_size * gradient;
    }
    final[rank] = x;
    net.close();
  });
  for (int i = 0; i < n; ++i) EXPECT_LT((final[i] - optimum).norm() / optimum.norm(), 2e-2) << "peer " << i;
}

// --max-staleness 0 is the synchronous mix, bit for bit: the same fused float expression
// x ← W_ii·x + W_ia·x_a + W_ib·x_b − u computed serially, on a ring (two neighbours, one pass).
TEST(Gossip, StalenessZeroIsTheSynchronousMixBitForBit) {
  const Topology t = topology_from("graph: {generator: ring, n: 5}");
  const int n = 5, d = 1001, steps = 8;
  Eigen::MatrixXf x0 = random_rows(n, d, 11);
  std::vector<Eigen::MatrixXf> updates;
  for (int k = 0; k < steps; ++k) updates.push_back(random_rows(n, d, 300 + k) * 0.01f);
  const auto endpoints = testing::loopback_endpoints(n);
  Eigen::MatrixXf got(n, d);
  testing::run_peers(n, [&](int rank) {
    auto net_owner = net::make_tcp_transport(testing::options_for(rank, endpoints, union_links(t, rank)));
    net::Transport& net = *net_owner;
    net.connect();
    Gossip gossip(net, mixing_rows(t, rank), 0);
    std::vector<float> x(d), u(d);
    for (int j = 0; j < d; ++j) x[j] = x0(rank, j);
    for (int k = 0; k < steps; ++k) {
      for (int j = 0; j < d; ++j) u[j] = updates[k](rank, j);
      gossip.start(k, x);
      gossip.finish(x, u);
    }
    for (int j = 0; j < d; ++j) got(rank, j) = x[j];
    EXPECT_EQ(gossip.stale_terms(), 0);
    net.close();
  });
  Eigen::MatrixXf expected = x0;
  for (int k = 0; k < steps; ++k) {
    Eigen::MatrixXf next(n, d);
    for (int i = 0; i < n; ++i) {
      const MixingRow row = mixing_rows(t, i)[0];
      ASSERT_EQ(row.peers.size(), 2u);
      const float sw = row.self_weight, wa = row.weights[0], wb = row.weights[1];
      for (int j = 0; j < d; ++j)
        next(i, j) = sw * expected(i, j) + wa * expected(row.peers[0], j) + wb * expected(row.peers[1], j) -
                     updates[k](i, j);
    }
    expected = next;
  }
  long long wrong = 0;
  for (Eigen::Index i = 0; i < got.size(); ++i)
    wrong += std::memcmp(got.data() + i, expected.data() + i, sizeof(float)) != 0;
  EXPECT_EQ(wrong, 0) << "of " << got.size() << " values differ from the serial synchronous mix";
}

// `steps` steps of x ← W·x − u_k at every peer with the given parts (empty: the default,
// one part) and staleness; returns the rows at the end.
Eigen::MatrixXf gossip_with_parts(const Topology& t, const Eigen::MatrixXf& x0, const std::vector<Eigen::MatrixXf>& updates,
                                  const std::vector<Gossip::Part>& parts, int staleness) {
  const int n = t.num_peers();
  const auto d = x0.cols();
  const auto endpoints = testing::loopback_endpoints(n);
  Eigen::MatrixXf got(n, d);
  testing::run_peers(n, [&](int rank) {
    auto net_owner = net::make_tcp_transport(testing::options_for(rank, endpoints, union_links(t, rank)));
    net::Transport& net = *net_owner;
    net.connect();
    Gossip gossip(net, mixing_rows(t, rank), staleness);
    if (!parts.empty()) gossip.set_parts(parts);
    std::vector<float> x(d), u(d);
    for (Eigen::Index j = 0; j < d; ++j) x[j] = x0(rank, j);
    for (std::size_t k = 0; k < updates.size(); ++k) {
      for (Eigen::Index j = 0; j < d; ++j) u[j] = updates[k](rank, j);
      gossip.start(k, x);
      gossip.finish(x, u);
    }
    for (Eigen::Index j = 0; j < d; ++j) got(rank, j) = x[j];
    net.close();
  });
  return got;
}

long long values_that_differ(const Eigen::MatrixXf& a, const Eigen::MatrixXf& b) {
  long long wrong = 0;
  for (Eigen::Index i = 0; i < a.size(); ++i) wrong += std::memcmp(a.data() + i, b.data() + i, sizeof(float)) != 0;
  return wrong;
}

// The vector sent as three parts of unequal sizes, one of a single float, mixes to the
// dense W·X − U and to exactly the floats of the one-part exchange: synchronous over
// several steps, and bounded-staleness over one step (step 0 waits for every neighbour's
// step-0 parameters, so it is deterministic). A ring (one fused pass of two neighbours)
// and the complete graph (four neighbours: two passes, the update in the first).
TEST(Gossip, PartsOfUnequalSizesMixAsTheWholeVectorBitForBit) {
  const int d = 1003;
  const std::vector<Gossip::Part> parts = {{0, 600}, {600, 1}, {601, 402}};
  for (const char* yaml : {"graph: {generator: ring, n: 5}", "graph: {generator: complete, n: 5}"}) {
    const Topology t = topology_from(yaml);
    const int n = t.num_peers();
    const Eigen::MatrixXf x0 = random_rows(n, d, 21);
    const Eigen::MatrixXf w = Eigen::MatrixXd(t.mixing).cast<float>();
    for (int staleness : {0, 2}) {
      SCOPED_TRACE(std::string(yaml) + ", --max-staleness " + std::to_string(staleness));
      const int steps = staleness == 0 ? 3 : 1;
      std::vector<Eigen::MatrixXf> updates;
      Eigen::MatrixXf expected = x0;
      for (int k = 0; k < steps; ++k) {
        updates.push_back(random_rows(n, d, 400 + k) * 0.01f);
        expected = (w * expected - updates.back()).eval();
      }
      const Eigen::MatrixXf in_parts = gossip_with_parts(t, x0, updates, parts, staleness);
      const Eigen::MatrixXf whole = gossip_with_parts(t, x0, updates, {}, staleness);
      EXPECT_LT((in_parts - expected).norm() / expected.norm(), 1e-6);
      EXPECT_EQ(values_that_differ(in_parts, whole), 0) << "of " << whole.size() << " values differ from one part's";
    }
  }
}

TEST(Gossip, BadPartsAreRejected) {
  const auto endpoints = testing::loopback_endpoints(1);
  auto net_owner = net::make_tcp_transport(testing::options_for(0, endpoints, {}));
    net::Transport& net = *net_owner;
  Gossip gossip(net, {MixingRow{}});  // no neighbours: the mix is x − u
  auto expect_invalid = [&](std::vector<Gossip::Part> parts, const std::string& why) {
    try {
      gossip.set_parts(std::move(parts));
      ADD_FAILURE() << why << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << why << ": " << e.what();
    }
  };
  expect_invalid({}, "no parts");
  expect_invalid({{1, 4}}, "not from 0");
  expect_invalid({{0, 4}, {5, 4}}, "a gap");
  expect_invalid({{0, 4}, {3, 4}}, "an overlap");
  expect_invalid({{0, 4}, {4, 0}, {4, 2}}, "an empty part");
  EXPECT_TRUE(gossip.parts().empty()) << "a rejected call changed the parts";
  gossip.set_parts({{0, 4}, {4, 5}});
  std::vector<float> x(10, 1.0f), u(10, 0.5f);
  try {
    gossip.start(0, x);  // the parts cover 9 of 10
    ADD_FAILURE() << "parts short of the vector: accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
  }
  x.resize(9);
  u.resize(9);
  gossip.start(0, x);
  gossip.finish(x, u);
  for (float v : x) EXPECT_EQ(v, 0.5f);
  EXPECT_THROW(gossip.set_parts({{0, 9}}), Error) << "parts changed after the first start()";
}

TEST(Gossip, StalenessNeedsAFixedNeighbourhood) {
  const Topology t = topology_from("graph: {generator: one-peer-exponential, n: 8}");
  const auto endpoints = testing::loopback_endpoints(8);
  auto net_owner = net::make_tcp_transport(testing::options_for(0, endpoints, union_links(t, 0)));
    net::Transport& net = *net_owner;
  EXPECT_THROW(Gossip(net, mixing_rows(t, 0), 2), Error);
  EXPECT_THROW(Gossip(net, mixing_rows(t, 0), -1), Error);
}

// Bounded staleness (K = 3) with one peer that keeps falling behind (it sleeps now and
// then): the others mix its older parameters instead of waiting, and D-PSGD still reaches
// the least-squares optimum at every peer.
void stale_gossip_reaches_the_least_squares_optimum(const std::vector<Gossip::Part>& parts) {
  const int n = 6, dim = 5, rows = 8, steps = 4000, staleness = 3;
  const Topology t = topology_from("graph: {generator: ring, n: 6}");
  std::vector<Eigen::MatrixXf> a(n);
  std::vector<Eigen::VectorXf> b(n);
  Eigen::MatrixXf ata = Eigen::MatrixXf::Zero(dim, dim);
  Eigen::VectorXf atb = Eigen::VectorXf::Zero(dim);
  for (int i = 0; i < n; ++i) {
    a[i] = random_rows(rows, dim, 100 + i);
    b[i] = random_rows(rows, 1, 200 + i);
    ata += a[i].transpose() * a[i];
    atb += a[i].transpose() * b[i];
  }
  const Eigen::VectorXf optimum = ata.ldlt().solve(atb);
  const auto endpoints = testing::loopback_endpoints(n);
  std::vector<Eigen::VectorXf> final(n);
  std::vector<long long> stale(n), mixed(n);
  std::barrier finished(n);
  // A peer that throws leaves the barrier, so that the others do not wait for it forever.
  auto peer = [&](int rank) {
    auto net_owner = net::make_tcp_transport(testing::options_for(rank, endpoints, union_links(t, rank)));
    net::Transport& net = *net_owner;
    net.connect();
    Gossip gossip(net, mixing_rows(t, rank), staleness);
    if (!parts.empty()) gossip.set_parts(parts);
    Eigen::VectorXf x = Eigen::VectorXf::Zero(dim);
    for (int k = 0; k < steps; ++k) {
      const float step_size = 0.05f / (1.0f + static_cast<float>(k) / 20.0f);
      gossip.start(k, std::span<const float>(x.data(), dim));
      const Eigen::VectorXf gradient = a[rank].transpose() * (a[rank] * x - b[rank]);
      if (rank == 2 && k % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(1500));  // the straggler
      gossip.finish(std::span<float>(x.data(), dim));
      x -= step_size * gradient;
    }
    final[rank] = x;
    stale[rank] = gossip.stale_terms();
    mixed[rank] = gossip.mixed_terms();
    // Peers run up to K + 1 steps apart, and a peer's last sends may still be queued: a
    // neighbour that closed meanwhile would make those writes fail, and the failed link
    // loses the frames it had not read yet (or leaves sends unfinished until the timeout).
    // So every peer first sends everything, then all close together (the trainer's last
    // evaluation round is such a barrier).
    gossip.flush();
    finished.arrive_and_wait();
    net.close();
  };
  testing::run_peers(n, [&](int rank) {
    try {
      peer(rank);
    } catch (...) {
      finished.arrive_and_drop();
      throw;
    }
  });
  long long stale_total = 0;
  for (int i = 0; i < n; ++i) {
    EXPECT_LT((final[i] - optimum).norm() / optimum.norm(), 2e-2) << "peer " << i;
    EXPECT_EQ(mixed[i], 2LL * steps) << "peer " << i;
    stale_total += stale[i];
  }
  EXPECT_GT(stale_total, 0) << "no step mixed stale parameters: the test did not exercise staleness";
}

TEST(Dpsgd, StaleGossipStillConvergesToTheLeastSquaresOptimum) { stale_gossip_reaches_the_least_squares_optimum({}); }

// The same with the 5 parameters in three parts, each held and waited for on its own.
TEST(Dpsgd, StaleGossipInPartsStillConvergesToTheLeastSquaresOptimum) {
  stale_gossip_reaches_the_least_squares_optimum({{0, 2}, {2, 1}, {3, 2}});
}

}  // namespace
}  // namespace peertrain::algo
