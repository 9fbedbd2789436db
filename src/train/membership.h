// Who is still training, agreed across the peers after a failure, and who coordinates.
//
// A neighbour that stops answering is dropped at once by each peer that notices (the
// gossip moves its weight to the diagonal, which keeps W doubly stochastic among the
// survivors with local knowledge only). The peers that noticed report it to the
// coordinator, which also collects the evaluation reports; the coordinator announces the
// new set of lost peers and a step a few steps ahead (more than any peer can run ahead of
// it, since gossip couples neighbours step by step), at which every survivor switches to
// Metropolis–Hastings weights recomputed on the survivors' graph. If the survivors' graph
// falls into pieces, the coordinator says so and, by the --on-split policy, either lets
// each piece go on alone (the default) or stops everyone.
//
// No single point of failure. The coordinator is peer 0 at the start. A peer that counts
// its coordinator lost (a broken link, a report or an evaluation it cannot deliver, a
// silent gossip neighbour) drops its link to it and turns to the lowest id it does not
// count lost; that peer, once it counts every lower id lost (by its own view or by the
// reports sent to it), takes over: it opens a new epoch and announces, with the whole
// record of the run (failures, rejoins, takeovers), so any survivor can take over again.
// A peer adopts an announcement of a higher epoch (a takeover) before anything else it
// reads, and drops its links to every peer the announcement counts lost, so no peer keeps
// applying the switches of a coordinator the others have left. It adopts a claim only
// from the rightful successor, and settles two claims of one epoch for the higher id
// (judge_claim, membership_codec.h), whose claim names the lower one lost. Every peer is linked to
// every other under D-PSGD (trainer.cpp, links_for), so any survivor can coordinate.
//
// A peer that counts every other peer lost stops with an error: it cannot tell a run
// where all the others died from one that dropped it (it was stalled or cut off past
// --peer-timeout), and training alone is not this run. Likewise a peer named lost in an
// announcement stops. Either may come back with --rejoin.
//
// Rejoining. A process restarted for a lost peer p (`peertrain peer --rank p --rejoin`,
// same flags) dials its links; a peer that has dropped p accepts it (net::Transport).
// p asks the lowest peer it reached to take it back (rejoin()); a peer that is not the
// coordinator answers with the coordinator's id. The coordinator picks a switch step s
// ahead, as for a loss, and a donor, p's lowest-numbered surviving neighbour, and
// announces "p back at step s from donor d" to everyone, p included. At step s every peer
// switches to Metropolis–Hastings weights on the graph with p in it again; the donor sends
// p its x at the start of step s, which p takes (take_parameters()) before its first step
// s. p restores its sampler to step s itself (its batches are a function of its seed and
// the step), starts with zero momentum, and trains on to the end. Reports of p's old loss
// that arrive late (noticed before s) are ignored. An old coordinator rejoins like any
// peer; the role stays where it moved.
//
// Not survived (docs/faults.md): a coordinator that dies in the middle of sending an
// announcement may leave some peers with a switch the others never hear of until the next
// announcement; a link that breaks between two live peers makes each count the other lost.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "membership_codec.h"
#include "peertrain/algo/gossip.h"
#include "peertrain/net/transport.h"
#include "peertrain/topology/topology.h"
#include "peertrain/train/trainer.h"

namespace peertrain::train {

// Throws Error(kInvalidArgument) when --rejoin cannot work with this configuration
// (--resume, a centralized baseline), or --max-staleness with a topology that changes its
// neighbours every step.
void check_fault_options(const TrainConfig& config, const topology::Topology& topology, int rank);

enum class SplitPolicy { kContinue, kStop };

struct MembershipOptions {
  SplitPolicy policy = SplitPolicy::kContinue;
  int max_staleness = 0;      // of the gossip: a peer may run that much further ahead
  long long total_steps = 0;  // of the run: too late to rejoin past it
  // Steps between the barriers every peer meets at (the evaluations); 0: none. Pieces of a
  // split graph run apart by up to this many steps, so a switch is then put just after one.
  long long sync_every = 0;
};

// What a rejoining peer learns from the coordinator.
struct RejoinTicket {
  std::uint64_t step = 0;  // the step it starts at
  int donor = 0;           // who sends it the parameters of that step
};

class Membership {
 public:
  Membership(net::Transport& network, const topology::Topology& topology, int rank, MembershipOptions options);

  // The peer that coordinates the run as this peer knows it, and whether that is us.
  int coordinator() const { return coordinator_; }
  bool is_coordinator() const { return coordinator_ == rank_; }

  // Peers this one gave up on at `step` (the gossip's newly lost neighbours, a peer whose
  // evaluation report never came, or the coordinator it cannot reach). Each is dropped
  // and reported to the coordinator; a lost coordinator is replaced (see above).
  void report_lost(std::uint64_t step, const std::vector<std::pair<int, std::string>>& lost);
  void report_lost(std::uint64_t step, int peer, const std::string& reason) { report_lost(step, {{peer, reason}}); }

  // Once per step, before the gossip starts: exchanges reports and announcements, and
  // returns the rows to use from this step on when this is an agreed switch step. x is
  // this peer's parameters at the start of the step: a donor sends them to a peer that
  // rejoins at this step. Throws Error(kPeerLost) when the coordinator announced a stop
  // (split graph under --on-split stop), named this peer lost, or when this peer counts
  // every other peer lost.
  std::optional<std::vector<algo::MixingRow>> poll(std::uint64_t step, std::span<const float> x = {});
  // Throws Error(kPeerLost) when this peer counts every other peer lost (see above); poll()
  // calls it, and so does a coordinator before it writes an evaluation.
  void stop_if_cut_off(std::uint64_t step) const;

  // On a restarted peer, once connected: asks to be taken back and returns the step to
  // start at and the donor. Throws Error naming the reason when the coordinator refuses
  // (no neighbour left, the run about to end) or nobody answers within --peer-timeout.
  RejoinTicket rejoin();
  // Waits for the donor's parameters of the ticket's step (at most --peer-timeout).
  void take_parameters(const RejoinTicket& ticket, std::span<float> x);

  // After this peer lost a peer in a collective (DiLoCo's all-reduce): waits, at most
  // timeout_s, until the coordinator has announced the switch that leaves it out (the
  // coordinator, having counted the loss itself, announces it here). True when a switch is
  // pending; poll() makes it at its step. Keeps a peer whose rounds fail at once from
  // running ahead of that step before it hears of it.
  bool await_switch(std::uint64_t step, double timeout_s);

  // The agreed step of the last switch poll() made (a peer that learnt of it late switched
  // at a later step): a key every survivor shares for what it exchanges there.
  std::uint64_t last_switch_step() const { return last_switch_; }

  bool is_lost(int peer) const;
  const std::vector<int>& lost() const { return lost_; }  // as this peer counts them now
  // What every survivor that switched at `step` to the survivors' graph without `lost`
  // must agree on, hashed (W's every row included, in runs of up to 512 peers); logged at
  // each switch, compared by the chaos soak (tests/chaos/).
  std::uint64_t view_hash(std::uint64_t step, const std::vector<int>& lost) const;
  // The run's record: the coordinator's own, or as its last announcement told it.
  const std::vector<Failure>& failures() const { return failures_; }
  const std::vector<Rejoin>& rejoins() const { return rejoins_; }
  const std::vector<Takeover>& takeovers() const { return takeovers_; }

 private:
  std::uint64_t last_switch_ = 0;
  struct Pending {
    std::uint64_t switch_step = 0;
    std::vector<int> lost;
    std::vector<Rejoin> joins;  // peers back at switch_step
  };
  void count_lost(std::uint64_t step, int peer, const std::string& reason);
  void coordinator_gone(std::uint64_t step);
  void send_report(std::uint64_t step, const std::vector<int>& peers, const std::string& reason);
  void read_announcements();
  void adopt(int from, Announcement a);
  void read_reports(std::uint64_t step);
  void answer_rejoins(std::uint64_t step);
  void answer_rejoin(std::uint64_t step, int peer);
  void announce(std::uint64_t step, const std::vector<Rejoin>& joins = {});
  void add_pending(Pending p);
  void record_rejoin(const Rejoin& r);
  std::uint64_t switch_lead() const;
  // The step a switch announced at `step` takes effect: far enough ahead for every peer to
  // have read it, and, while the survivors' graph is in pieces (`apart`), the first step
  // after a barrier, because pieces run apart between barriers.
  std::uint64_t switch_step_after(std::uint64_t step, bool apart) const;
  int pieces_without(const std::vector<int>& lost) const;
  bool joining(int peer) const;
  std::string name(int peer) const { return network_.peer_name(peer); }

  net::Transport& network_;
  const topology::Topology& topology_;
  int rank_;
  int n_;
  MembershipOptions options_;
  std::vector<char> linked_;            // peers we have a link to (all of them under D-PSGD)
  int coordinator_ = 0;
  std::uint32_t epoch_ = 0;             // coordinators lost so far, as far as we know
  std::vector<int> lost_;               // sorted; their links are dropped
  std::vector<Failure> local_;          // what this peer noticed itself, for a new coordinator
  std::vector<Failure> failures_;       // the run's record (see failures())
  std::vector<Rejoin> rejoins_;
  std::vector<Takeover> takeovers_;
  std::vector<Rejoin> joining_;         // coordinator: announced, switch step not reached
  bool changed_ = false;                // coordinator: the lost set changed since the last announcement
  std::vector<std::uint64_t> reports_sent_, reports_read_, announcements_read_;
  bool apart_ = false;  // the survivors' graph of the last announcement was in pieces
  bool reading_last_words_ = false;  // count_lost() reading a lost coordinator's last announcements
  std::uint64_t announcements_sent_ = 0;
  std::vector<std::uint64_t> back_at_;  // the step each peer last rejoined at
  std::vector<Pending> pending_;        // announced switches, by switch step
};

}  // namespace peertrain::train
