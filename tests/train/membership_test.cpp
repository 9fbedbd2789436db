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
#include <thread>

#include "test_support/cluster.h"
#include "peertrain/net/faulty.h"
#include "peertrain/net/loopback.h"

namespace peertrain::train {
namespace {

using topology::Topology;

Topology ring(int n) { return topology::parse_topology(str("graph: {generator: ring, n: ", n, "}"), "test.yaml", "."); }

// The links the trainer keeps under D-PSGD: every peer with every other (any survivor
// may take over coordinating).
std::vector<std::vector<int>> trainer_links(const Topology& t) {
  const int n = t.num_peers();
  std::vector<std::vector<int>> links(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (j != i) links[static_cast<std::size_t>(i)].push_back(j);
  return links;
}

// Every peer's row at every step, as the gossip applied it, and how each peer ended.
struct Trace {
  std::mutex mutex;
  std::map<std::pair<int, std::uint64_t>, algo::MixingRow> rows;  // (peer, step)
  std::map<int, std::uint64_t> switched_at;                        // first switch step per peer
  std::map<int, int> coordinator;                                  // at the end, per peer
  std::map<int, std::vector<Takeover>> takeovers;
  std::map<int, std::string> error;  // a peer that stopped with an error
  void record(int peer, std::uint64_t step, algo::MixingRow row) {
    std::lock_guard lock(mutex);
    rows[{peer, step}] = std::move(row);
  }
};

// What happens to one peer: it crashes (its transport drops every link without a word),
// or stalls (falls silent and stops for stall_s, as under SIGSTOP) at a step.
struct Fault {
  std::uint64_t crash_at = ~0ull;
  std::uint64_t stall_at = ~0ull;
  double stall_s = 0;
};

// Drives `steps` D-PSGD gossip steps (no gradient) of one peer, as the trainer does.
void run_peer_steps(net::Transport& net, const Topology& t, int rank, std::uint64_t steps, Trace& trace,
                    std::vector<float>& x, Fault fault = {}, net::LoopbackFabric* fabric = nullptr,
                    SplitPolicy policy = SplitPolicy::kContinue) {
  algo::Gossip gossip(net, algo::mixing_rows(t, rank));
  Membership membership(net, t, rank, {policy, 0, static_cast<long long>(steps)});
  try {
    for (std::uint64_t step = 0; step < steps; ++step) {
      if (step == fault.crash_at) return net.abort();
      if (step == fault.stall_at) {
        fabric->stall(rank);
        std::this_thread::sleep_for(std::chrono::duration<double>(fault.stall_s));
        fabric->resume(rank);
      }
      if (auto fresh = membership.poll(step, x)) {
        gossip.set_rows(*fresh);
        std::lock_guard lock(trace.mutex);
        trace.switched_at.emplace(rank, step);
      }
      gossip.start(step, x);
      gossip.finish(x);
      if (!gossip.newly_lost().empty()) membership.report_lost(step, gossip.newly_lost());
      trace.record(rank, step, gossip.applied_row());
    }
  } catch (const Error& e) {
    std::lock_guard lock(trace.mutex);
    trace.error[rank] = e.what();
    return net.abort();
  }
  std::lock_guard lock(trace.mutex);
  trace.coordinator[rank] = membership.coordinator();
  trace.takeovers[rank] = membership.takeovers();
  net.close();
}

// Runs every peer of `t` as a thread over the fabric, each with its fault, for `steps`
// steps; returns their x (each starts as its rank in 16 floats).
std::vector<std::vector<float>> run_all(const Topology& t, net::LoopbackFabric& fabric, Trace& trace,
                                        std::uint64_t steps, const std::map<int, Fault>& faults,
                                        SplitPolicy policy = SplitPolicy::kContinue) {
  const int n = t.num_peers();
  std::vector<std::vector<float>> xs(static_cast<std::size_t>(n));
  testing::run_peers(n, [&](int rank) {
    auto& x = xs[static_cast<std::size_t>(rank)];
    x.assign(16, static_cast<float>(rank));
    auto net = fabric.transport(rank);
    run_peer_steps(*net, t, rank, steps, trace, x, faults.count(rank) ? faults.at(rank) : Fault{}, &fabric, policy);
  });
  return xs;
}

// W assembled from the rows the peers applied is symmetric and doubly stochastic at
// every step, among the peers still in the run (`out_from[p]`: the first step p is not).
void expect_w_symmetric_doubly_stochastic(Trace& trace, int n, std::uint64_t steps,
                                          const std::map<int, std::uint64_t>& out_from) {
  for (std::uint64_t step = 0; step < steps; ++step) {
    std::vector<int> in;
    for (int p = 0; p < n; ++p)
      if (!out_from.count(p) || step < out_from.at(p)) in.push_back(p);
    Eigen::MatrixXd w = Eigen::MatrixXd::Zero(n, n);
    for (int p : in) {
      const auto it = trace.rows.find({p, step});
      ASSERT_NE(it, trace.rows.end()) << "peer " << p << " has no row at step " << step;
      w(p, p) = it->second.self_weight;
      for (std::size_t k = 0; k < it->second.peers.size(); ++k) w(p, it->second.peers[k]) = it->second.weights[k];
    }
    for (int p : in) {
      double sum = 0;
      for (int q : in) {
        sum += w(p, q);
        EXPECT_NEAR(w(p, q), w(q, p), 1e-7) << "W(" << p << "," << q << ") at step " << step;
      }
      EXPECT_NEAR(sum, 1.0, 1e-6) << "row " << p << " among the peers in the run at step " << step;
    }
  }
}

float spread(const std::vector<std::vector<float>>& xs, const std::set<int>& skip) {
  float lo = 1e9, hi = -1e9;
  for (std::size_t p = 0; p < xs.size(); ++p)
    if (!skip.count(static_cast<int>(p))) {
      lo = std::min(lo, xs[p][0]);
      hi = std::max(hi, xs[p][0]);
    }
  return hi - lo;
}

// The membership messages round-trip, and bad bytes are an error naming the sender.
TEST(MembershipCodec, AnnouncementsRoundTripAndBadBytesNameTheSender) {
  Announcement a;
  a.epoch = 2;
  a.switch_step = 1234;
  a.lost = {0, 3};
  a.joins = {{5, 1234, 4}};
  a.failures = {{0, 1000, "peer 1 gave up"}, {3, 1100, std::string(1000, 'x')}};
  a.rejoins = {{6, 900, 7}};
  a.takeovers = {{1, 1000, 0}, {2, 1100, 1}};
  const net::Payload bytes = encode_announcement(a);
  const Announcement b = decode_announcement(bytes, 8, "peer 2");
  EXPECT_EQ(b.epoch, 2u);
  EXPECT_EQ(b.switch_step, 1234u);
  EXPECT_EQ(b.lost, a.lost);
  ASSERT_EQ(b.joins.size(), 1u);
  EXPECT_EQ(b.joins[0].donor, 4);
  ASSERT_EQ(b.failures.size(), 2u);
  EXPECT_EQ(b.failures[1].reason.size(), kMaxReasonBytes);  // cut, not refused
  ASSERT_EQ(b.takeovers.size(), 2u);
  EXPECT_EQ(b.takeovers[1].from, 1);
  // Truncated, an id past the run's peers, a count the bytes cannot hold.
  auto expect_parse_error = [](auto decode, const std::string& want) {
    try {
      decode();
      ADD_FAILURE() << "no error, expected one naming " << want;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kParse);
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  const net::Payload cut(bytes.begin(), bytes.begin() + 20);
  expect_parse_error([&] { decode_announcement(cut, 8, "peer 2"); }, "announcement from peer 2");
  expect_parse_error([&] { decode_announcement(bytes, 4, "peer 2"); }, "names peer 5 of a run of 4");
  net::Payload huge = encode_report({7, {1}, "why"});
  huge[8] = std::byte{0xff};  // the id count
  expect_parse_error([&] { decode_report(huge, 8, "peer 6"); }, "report from peer 6");
  const RejoinAnswer answer = decode_rejoin_answer(
      encode_rejoin_answer({RejoinStatus::kAskCoordinator, 3, 1, 99, 2, 1, ""}), 8, "peer 4");
  EXPECT_EQ(answer.status, RejoinStatus::kAskCoordinator);
  EXPECT_EQ(answer.coordinator, 1);
}

// Takeovers: who may claim to coordinate, and how two claims of one epoch settle.
TEST(MembershipClaims, OnlyTheLowestPeerLeftMayTakeOverAndTheHigherOfTwoTiedClaimsWins) {
  Announcement claim;
  claim.epoch = 1;
  claim.lost = {0};
  // Peer 1 takes over from the lost peer 0: adopted.
  EXPECT_EQ(judge_claim(1, claim, 0, 0, {}), ClaimVerdict::kAdopt);
  // Peer 3 claims while peers 1 and 2 are live and it does not count them lost: refused,
  // its stop flag with it.
  claim.stop = true;
  EXPECT_EQ(judge_claim(3, claim, 0, 0, {}), ClaimVerdict::kNotSuccessor);
  EXPECT_EQ(judge_claim(3, claim, 0, 0, {1}), ClaimVerdict::kNotSuccessor);
  EXPECT_EQ(judge_claim(3, claim, 0, 0, {1, 2}), ClaimVerdict::kAdopt);  // we count them lost
  claim.stop = false;
  // The tie: peer 1 woke from a stall and took over epoch 1 from the lost peer 0 just as
  // peer 2, counting 1 lost too, took over the same epoch. A peer that follows 1 switches
  // to 2; a peer that follows 2 keeps it; an older epoch is stale.
  Announcement from2;
  from2.epoch = 1;
  from2.lost = {0, 1};
  Announcement from1;
  from1.epoch = 1;
  from1.lost = {0};
  EXPECT_EQ(judge_claim(2, from2, 1, 1, {0}), ClaimVerdict::kAdopt);
  EXPECT_EQ(judge_claim(1, from1, 2, 1, {0, 1}), ClaimVerdict::kStale);
  EXPECT_EQ(judge_claim(1, from1, 2, 1, {0}), ClaimVerdict::kStale);
  from1.epoch = 0;
  EXPECT_EQ(judge_claim(1, from1, 0, 1, {0}), ClaimVerdict::kStale);
}

// A linked peer that is not the lowest one left announces a takeover with the stop flag
// (a stranger on a keyless run, or a confused peer): the others neither stop nor follow it.
TEST(Membership, AStopFromAPeerThatMayNotCoordinateIsIgnored) {
  const Topology t = ring(4);
  net::LoopbackFabric fabric({4, trainer_links(t), 5});
  std::map<int, std::string> errors;
  std::map<int, int> coordinators;
  std::mutex mutex;
  testing::run_peers(4, [&](int rank) {
    auto net = fabric.transport(rank);
    if (rank == 3) {
      Announcement forged;
      forged.epoch = 1;
      forged.switch_step = 2;
      forged.stop = true;
      forged.lost = {0};  // but not 1 or 2, which are live
      for (int p = 0; p < 3; ++p)
        net->send(p, net::MessageType::kMembership, 0, kAnnounceTag, encode_announcement(forged), false).wait();
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      net->close();
      return;
    }
    Membership membership(*net, t, rank, {SplitPolicy::kContinue, 0, 20});
    std::vector<float> x(4, 1.0f);
    try {
      for (std::uint64_t step = 0; step < 10; ++step) {
        membership.poll(step, x);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    } catch (const Error& e) {
      std::lock_guard lock(mutex);
      errors[rank] = e.what();
    }
    std::lock_guard lock(mutex);
    coordinators[rank] = membership.coordinator();
    net->close();
  });
  for (int p = 0; p < 3; ++p) {
    EXPECT_FALSE(errors.count(p)) << "peer " << p << ": " << errors[p];
    EXPECT_EQ(coordinators[p], 0) << "peer " << p;
  }
}

TEST(Membership, ALostPeerIsReplacedByRecomputedWeightsAtOneAgreedStep) {
  const Topology t = ring(6);
  const int n = t.num_peers(), victim = 3;
  net::LoopbackFabric fabric({n, trainer_links(t), 5});
  Trace trace;
  constexpr std::uint64_t kSteps = 40, kDeath = 8;
  const auto xs = run_all(t, fabric, trace, kSteps, {{victim, Fault{kDeath}}});
  // Every survivor switched, all at the same step.
  std::set<std::uint64_t> steps;
  for (int p = 0; p < n; ++p)
    if (p != victim) {
      ASSERT_TRUE(trace.switched_at.count(p)) << "peer " << p << " never switched";
      steps.insert(trace.switched_at[p]);
      EXPECT_EQ(trace.coordinator[p], 0);
    }
  EXPECT_EQ(steps.size(), 1u);
  // W is symmetric and doubly stochastic at every step, the victim out from its crash.
  expect_w_symmetric_doubly_stochastic(trace, n, kSteps, {{victim, kDeath}});
  // Gossip conserves the survivors' average once they mix among themselves alone: their
  // values stay within [0, n-1] and come together.
  EXPECT_LT(spread(xs, {victim}), 0.5f);
}

// The coordinator crashes: peer 1, the lowest survivor, takes over and every survivor
// follows it, switching to recomputed weights at one agreed step.
TEST(Membership, ALostCoordinatorIsReplacedByTheLowestSurvivor) {
  const Topology t = ring(6);
  const int n = t.num_peers();
  net::LoopbackFabric fabric({n, trainer_links(t), 5});
  Trace trace;
  constexpr std::uint64_t kSteps = 40, kDeath = 8;
  const auto xs = run_all(t, fabric, trace, kSteps, {{0, Fault{kDeath}}});
  std::set<std::uint64_t> steps;
  for (int p = 1; p < n; ++p) {
    EXPECT_FALSE(trace.error.count(p)) << "peer " << p << ": " << trace.error[p];
    EXPECT_EQ(trace.coordinator[p], 1) << "peer " << p;
    ASSERT_EQ(trace.takeovers[p].size(), 1u) << "peer " << p;
    EXPECT_EQ(trace.takeovers[p][0].peer, 1);
    EXPECT_EQ(trace.takeovers[p][0].from, 0);
    ASSERT_TRUE(trace.switched_at.count(p)) << "peer " << p << " never switched";
    steps.insert(trace.switched_at[p]);
  }
  EXPECT_EQ(steps.size(), 1u);
  expect_w_symmetric_doubly_stochastic(trace, n, kSteps, {{0, kDeath}});
  EXPECT_LT(spread(xs, {0}), 0.5f);
}

// The coordinator stalls past the deadline, then goes on: the others drop it and peer 1
// takes over; the old coordinator finds itself dropped and stops instead of training on
// alone (or coordinating a run of one); W stays symmetric and doubly stochastic.
TEST(Membership, AStalledCoordinatorIsReplacedAndStopsWhenItWakes) {
  const Topology t = ring(6);
  const int n = t.num_peers();
  net::LoopbackFabric fabric({n, trainer_links(t), 2});
  Trace trace;
  constexpr std::uint64_t kSteps = 40, kStall = 8;
  const auto xs = run_all(t, fabric, trace, kSteps, {{0, Fault{~0ull, kStall, 4}}});  // 4 s: past the 2 s timeout
  ASSERT_TRUE(trace.error.count(0)) << "the stalled coordinator trained on alone";
  EXPECT_NE(trace.error[0].find("lost"), std::string::npos) << trace.error[0];
  for (int p = 1; p < n; ++p) {
    EXPECT_FALSE(trace.error.count(p)) << "peer " << p << ": " << trace.error[p];
    EXPECT_EQ(trace.coordinator[p], 1) << "peer " << p;
  }
  expect_w_symmetric_doubly_stochastic(trace, n, kSteps, {{0, kStall}});
  EXPECT_LT(spread(xs, {0}), 0.5f);
}

// --on-split: losing 1 and 4 of a ring of 6 leaves two pieces; losing 3, 4 and 5 leaves
// one piece of half the peers, which is what one side of a partition into halves sees.
// Under kStop every survivor stops, naming the flag; under kContinue they all go on.
TEST(Membership, OnSplitStopStopsASplitGraphAndAMinorityAndContinueGoesOn) {
  const Topology t = ring(6);
  const int n = t.num_peers();
  // A piece cut off from the coordinator's gossips only within itself, so nothing holds it
  // back while the stop is on its way: under kStop it is given steps enough to hear it
  // (it stops within a few; 40 were too few on a loaded machine, where the piece finished
  // before the coordinator had even noticed its second loss).
  constexpr std::uint64_t kDeath = 8;
  const std::vector<std::pair<std::string, std::set<int>>> cases = {{"two pieces", {1, 4}},
                                                                    {"half the peers", {3, 4, 5}}};
  for (const auto& [what, lost] : cases)
    for (SplitPolicy policy : {SplitPolicy::kStop, SplitPolicy::kContinue}) {
      SCOPED_TRACE(what + (policy == SplitPolicy::kStop ? ", stop" : ", continue"));
      const std::uint64_t kSteps = policy == SplitPolicy::kStop ? 20000 : 40;
      net::LoopbackFabric fabric({n, trainer_links(t), 5});
      Trace trace;
      std::map<int, Fault> faults;
      for (int p : lost) faults[p] = Fault{kDeath};
      run_all(t, fabric, trace, kSteps, faults, policy);
      for (int p = 0; p < n; ++p) {
        if (lost.count(p)) continue;
        if (policy == SplitPolicy::kStop) {
          ASSERT_TRUE(trace.error.count(p)) << "peer " << p << " trained on";
          EXPECT_NE(trace.error[p].find("--on-split stop"), std::string::npos) << trace.error[p];
        } else {
          EXPECT_FALSE(trace.error.count(p)) << "peer " << p << ": " << trace.error[p];
        }
      }
    }
}

// A majority that hangs together goes on under kStop: losing 2 of 6 on a ring leaves one
// path of 4.
TEST(Membership, OnSplitStopLetsAConnectedMajorityGoOn) {
  const Topology t = ring(6);
  const int n = t.num_peers();
  net::LoopbackFabric fabric({n, trainer_links(t), 5});
  Trace trace;
  constexpr std::uint64_t kSteps = 40, kDeath = 8;
  run_all(t, fabric, trace, kSteps, {{2, Fault{kDeath}}, {3, Fault{kDeath}}}, SplitPolicy::kStop);
  for (int p : {0, 1, 4, 5}) EXPECT_FALSE(trace.error.count(p)) << "peer " << p << ": " << trace.error[p];
  expect_w_symmetric_doubly_stochastic(trace, n, kSteps, {{2, kDeath}, {3, kDeath}});
}

}  // namespace
}  // namespace peertrain::train
