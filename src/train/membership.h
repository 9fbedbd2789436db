// Who is still training, agreed across the peers after a failure.
//
// A neighbour that stops answering is dropped at once by each peer that notices (the
// gossip moves its weight to the diagonal, which keeps W doubly stochastic among the
// survivors with local knowledge only). The peers that noticed report it to peer 0, which
// already collects the evaluation reports; peer 0 announces the new set of lost peers and
// a step a few steps ahead (n + 2, more than any peer can run ahead of it, since gossip
// couples neighbours step by step), at which every survivor switches to Metropolis–
// Hastings weights recomputed on the survivors' graph. If the survivors' graph falls into
// pieces, peer 0 says so and, by the --on-split policy, either lets each piece go on
// alone (the default) or stops everyone.
//
// Peer 0 is the coordinator: if it is lost, the others keep training with their local
// drop (no recompute, no evaluation, no summary), and launch reports the run as failed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "peertrain/algo/gossip.h"
#include "peertrain/net/network.h"
#include "peertrain/topology/topology.h"

namespace peertrain::train {

enum class SplitPolicy { kContinue, kStop };

struct Failure {
  int peer = 0;
  std::uint64_t step = 0;  // the step at which a neighbour gave up on it
  std::string reason;
};

class Membership {
 public:
  Membership(net::Network& network, const topology::Topology& topology, int rank, SplitPolicy policy);

  // Tells peer 0 (or, on peer 0, records) the neighbours lost at `step`.
  void report_lost(std::uint64_t step, const std::vector<std::pair<int, std::string>>& lost);
  // Peer 0 gave up on a peer outside the gossip (a missing evaluation report).
  void lost_outside_gossip(std::uint64_t step, int peer, const std::string& reason);
  // Once per step, before the gossip starts: exchanges reports and announcements, and
  // returns the rows to use from this step on when this is an agreed switch step.
  // Throws Error when peer 0 announced a stop (split graph under --on-split stop).
  std::optional<std::vector<algo::MixingRow>> poll(std::uint64_t step);

  bool coordinator_lost() const { return coordinator_lost_; }
  bool is_lost(int peer) const;
  const std::vector<Failure>& failures() const { return failures_; }  // peer 0's record

 private:
  void announce(std::uint64_t step);
  void send_to_coordinator(std::uint64_t step, const std::vector<int>& peers, const std::string& reason);
  void add_failure(std::uint64_t step, int peer, const std::string& reason);

  net::Network& network_;
  const topology::Topology& topology_;
  int rank_;
  SplitPolicy policy_;
  std::vector<int> lost_;  // as announced (peer 0: as known)
  std::vector<Failure> failures_;
  std::uint64_t reports_sent_ = 0;
  std::vector<std::uint64_t> reports_read_;  // peer 0: next report sequence per peer
  std::uint64_t announcements_ = 0;          // sent (peer 0) or read (others)
  std::optional<std::pair<std::uint64_t, std::vector<int>>> pending_;  // switch step, lost set
  bool coordinator_lost_ = false;
};

}  // namespace peertrain::train
