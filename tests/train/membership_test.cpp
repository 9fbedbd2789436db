// The membership protocol over the in-process transport, with faults injected from the
// test: a lost peer is dropped locally at once, then every survivor switches to weights
// recomputed on the survivors' graph at the same agreed step; W stays symmetric and doubly
// stochastic among the survivors at every step; a restarted peer rejoins with a donor's
// parameters. The serial twin of each step is the dense W the rows assemble into.
#include "../../src/train/membership.h"

#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cmath>
#include <set>
#include <map>
#include <mutex>

#include "../net/test_cluster.h"
#include "peertrain/net/faulty.h"
#include "peertrain/net/loopback.h"

namespace peertrain::train {
namespace {

using topology::Topology;

Topology ring(int n) { return topology::parse_topology(str("graph: {generator: ring, n: ", n, "}"), "test.yaml", "."); }

// The links the trainer keeps: gossip neighbours, and peer 0 with everyone.
std::vector<std::vector<int>> trainer_links(const Topology& t) {
  const int n = t.num_peers();
  std::vector<std::vector<int>> links(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    std::set<int> mine;
    for (int j : t.graph.neighbors(i)) mine.insert(j);
    if (i == 0)
      for (int j = 1; j < n; ++j) mine.insert(j);
    else
      mine.insert(0);
    links[static_cast<std::size_t>(i)] = {mine.begin(), mine.end()};
  }
  return links;
}

// Every peer's row at every step it ran, as the gossip applied it.
struct Trace {
  std::mutex mutex;
  std::map<std::pair<int, std::uint64_t>, algo::MixingRow> rows;  // (peer, step)
  std::map<int, std::uint64_t> switched_at;                        // first switch step per peer
  void record(int peer, std::uint64_t step, algo::MixingRow row) {
    std::lock_guard lock(mutex);
    rows[{peer, step}] = std::move(row);
  }
};

// Drives `steps` D-PSGD gossip steps (no gradient) of one peer, as the trainer does.
// A peer with crash_at set crashes there: its transport drops every link without a word.
void run_peer_steps(net::Transport& net, const Topology& t, int rank, std::uint64_t first, std::uint64_t steps,
                    Trace& trace, std::vector<float>& x, std::uint64_t crash_at = ~0ull) {
  algo::Gossip gossip(net, algo::mixing_rows(t, rank));
  Membership membership(net, t, rank, {SplitPolicy::kContinue, 0, static_cast<long long>(steps)});
  std::vector<algo::MixingRow> rows = algo::mixing_rows(t, rank);
  for (std::uint64_t step = first; step < steps; ++step) {
    if (step == crash_at) return net.abort();
    if (auto fresh = membership.poll(step, x)) {
      rows = *fresh;
      gossip.set_rows(*fresh);
      std::lock_guard lock(trace.mutex);
      trace.switched_at.emplace(rank, step);
    }
    gossip.start(step, x);
    gossip.finish(x);
    if (!gossip.newly_lost().empty()) membership.report_lost(step, gossip.newly_lost());
    // The row applied this step (a ring's rows have a period of one step). Between a
    // loss and the switch, the gossip's local drop changes it; the test checks from the switch on.
    const algo::MixingRow applied = rows[0];
    trace.record(rank, step, applied);
  }
  net.close();
}

TEST(Membership, ALostPeerIsReplacedByRecomputedWeightsAtOneAgreedStep) {
  const Topology t = ring(6);
  const int n = t.num_peers(), victim = 3;
  net::LoopbackFabric fabric({n, trainer_links(t), 5});
  Trace trace;
  std::vector<std::vector<float>> xs(static_cast<std::size_t>(n));
  constexpr std::uint64_t kSteps = 40, kDeath = 8;
  testing::run_peers(n, [&](int rank) {
    auto& x = xs[static_cast<std::size_t>(rank)];
    x.assign(16, static_cast<float>(rank));
    auto net = fabric.transport(rank);
    run_peer_steps(*net, t, rank, 0, kSteps, trace, x, rank == victim ? kDeath : ~0ull);
  });
  // Every survivor switched, all at the same step.
  std::set<std::uint64_t> steps;
  for (int p = 0; p < n; ++p)
    if (p != victim) {
      ASSERT_TRUE(trace.switched_at.count(p)) << "peer " << p << " never switched";
      steps.insert(trace.switched_at[p]);
    }
  EXPECT_EQ(steps.size(), 1u);
  // After the switch, the survivors' W is symmetric, doubly stochastic, and the victim
  // has no weight anywhere.
  const std::uint64_t from = *steps.begin();
  for (std::uint64_t step = from; step < kSteps; ++step) {
    Eigen::MatrixXd w = Eigen::MatrixXd::Zero(n, n);
    for (int p = 0; p < n; ++p) {
      if (p == victim) continue;
      const auto& row = trace.rows.at({p, step});
      w(p, p) = row.self_weight;
      for (std::size_t k = 0; k < row.peers.size(); ++k) w(p, row.peers[k]) = row.weights[k];
    }
    EXPECT_NEAR((w - w.transpose()).cwiseAbs().maxCoeff(), 0.0, 1e-7) << "step " << step;
    for (int p = 0; p < n; ++p) {
      if (p == victim) continue;
      EXPECT_NEAR(w.row(p).sum(), 1.0, 1e-6) << "peer " << p << " step " << step;
    }
    EXPECT_NEAR(w.col(victim).cwiseAbs().sum(), 0.0, 1e-12) << "step " << step;
  }
  // Gossip conserves the survivors' average once they mix among themselves alone: their
  // values stay within [0, n-1] and come together.
  float lo = 1e9, hi = -1e9;
  for (int p = 0; p < n; ++p)
    if (p != victim) {
      lo = std::min(lo, xs[static_cast<std::size_t>(p)][0]);
      hi = std::max(hi, xs[static_cast<std::size_t>(p)][0]);
    }
  EXPECT_LT(hi - lo, 0.5f);
}

}  // namespace
}  // namespace peertrain::train
