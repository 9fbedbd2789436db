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
//
// Rejoining. A process restarted for a lost peer p (`peertrain peer --rank p --rejoin`,
// same flags) dials its links; a neighbour that has dropped p accepts it (net::Transport).
// p asks peer 0 to come back (rejoin()); peer 0 picks a switch step s ahead, as for a
// loss, and a donor, p's lowest-numbered surviving neighbour, and announces "p back at
// step s from donor d" to everyone, p included. At step s every peer switches to
// Metropolis–Hastings weights on the graph with p in it again; the donor sends p its x at
// the start of step s, which p takes (take_parameters()) before its first step s. p
// restores its sampler to step s itself (its batches are a function of its seed and the
// step), starts with zero momentum, and trains on to the end. Reports of p's old loss
// that reach peer 0 late (noticed before s) are ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "peertrain/algo/gossip.h"
#include "peertrain/net/transport.h"
#include "peertrain/topology/topology.h"
#include "peertrain/train/trainer.h"

namespace peertrain::train {

// Throws Error(kInvalidArgument) when --rejoin cannot work with this configuration (peer 0,
// --resume, a centralized baseline), or --max-staleness with a topology that changes its
// neighbours every step.
void check_fault_options(const TrainConfig& config, const topology::Topology& topology, int rank);

enum class SplitPolicy { kContinue, kStop };

struct Failure {
  int peer = 0;
  std::uint64_t step = 0;  // the step at which a neighbour gave up on it
  std::string reason;
};

struct Rejoin {
  int peer = 0;
  std::uint64_t step = 0;  // the first step it trained again
  int donor = 0;           // the neighbour whose parameters it took
};

struct MembershipOptions {
  SplitPolicy policy = SplitPolicy::kContinue;
  int max_staleness = 0;      // of the gossip: a peer may run that much further ahead
  long long total_steps = 0;  // of the run: too late to rejoin past it
};

// What a rejoining peer learns from peer 0.
struct RejoinTicket {
  std::uint64_t step = 0;  // the step it starts at
  int donor = 0;           // who sends it the parameters of that step
};

class Membership {
 public:
  Membership(net::Transport& network, const topology::Topology& topology, int rank, MembershipOptions options);

  // Tells peer 0 (or, on peer 0, records) the neighbours lost at `step`.
  void report_lost(std::uint64_t step, const std::vector<std::pair<int, std::string>>& lost);
  // Peer 0 gave up on a peer outside the gossip (a missing evaluation report).
  void lost_outside_gossip(std::uint64_t step, int peer, const std::string& reason);
  // Once per step, before the gossip starts: exchanges reports and announcements, and
  // returns the rows to use from this step on when this is an agreed switch step. x is
  // this peer's parameters at the start of the step: a donor sends them to a peer that
  // rejoins at this step. Throws Error when peer 0 announced a stop (split graph under
  // --on-split stop).
  std::optional<std::vector<algo::MixingRow>> poll(std::uint64_t step, std::span<const float> x = {});

  // On a restarted peer, once connected: asks peer 0 to be taken back and returns the
  // step to start at and the donor. Throws Error naming the reason when peer 0 refuses
  // (no neighbour left, the run about to end) or does not answer within --peer-timeout.
  RejoinTicket rejoin();
  // Waits for the donor's parameters of the ticket's step (at most --peer-timeout).
  void take_parameters(const RejoinTicket& ticket, std::span<float> x);

  bool coordinator_lost() const { return coordinator_lost_; }
  bool is_lost(int peer) const;
  const std::vector<Failure>& failures() const { return failures_; }  // peer 0's record
  const std::vector<Rejoin>& rejoins() const { return rejoins_; }     // peer 0's record
  const std::vector<int>& lost() const { return lost_; }  // as known now (peer 0) or announced

 private:
  struct Pending {
    std::uint64_t switch_step = 0;
    std::vector<int> lost;
    std::vector<Rejoin> joins;  // peers back at switch_step
  };
  void announce(std::uint64_t step, const std::vector<Rejoin>& joins = {});
  void answer_rejoin(std::uint64_t step, int peer);
  std::uint64_t switch_lead() const;
  bool joining(int peer) const;
  void send_to_coordinator(std::uint64_t step, const std::vector<int>& peers, const std::string& reason);
  void add_failure(std::uint64_t step, int peer, const std::string& reason);

  net::Transport& network_;
  const topology::Topology& topology_;
  int rank_;
  MembershipOptions options_;
  std::vector<int> lost_;  // as announced (peer 0: as known; a joining peer stays in it until its step)
  std::vector<Failure> failures_;
  std::vector<Rejoin> rejoins_;            // peer 0: done
  std::vector<Rejoin> joining_;            // peer 0: announced, switch step not reached
  std::uint64_t reports_sent_ = 0;
  std::vector<std::uint64_t> reports_read_;  // peer 0: next report sequence per peer
  std::vector<std::uint64_t> back_at_;       // peer 0: the step each peer last rejoined at
  std::uint64_t announcements_ = 0;          // sent (peer 0) or read (others)
  std::vector<Pending> pending_;  // announced switches, oldest first
  bool coordinator_lost_ = false;
};

}  // namespace peertrain::train
