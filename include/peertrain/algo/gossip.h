// D-PSGD's gossip (Lian et al., NeurIPS 2017): every step, peer i sends its parameters x_i
// to its neighbours and replaces them by Σ_j W_ij x_j. Sending x_k runs while the gradient
// at x_k is computed, because both only read x_k; the mix waits for the neighbours' x_k
// once the gradient is done. Time-varying topologies (one-peer exponential) change the
// neighbours and weights each step; the rows for one period are precomputed.
//
// The vector travels as a list of contiguous parts, one message per part per neighbour
// (set_parts; by default one part, the whole vector): inside a peer the transformer is
// cut into pipeline stages that each own a contiguous range of x, and a part is what a
// stage-owned sender would send. The mix is elementwise with per-neighbour weights, so
// the result is the same bit for bit whatever the parts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "peertrain/net/transport.h"
#include "peertrain/topology/topology.h"

namespace peertrain::algo {

// Peer i's row of W at one step: its neighbours, their weights, and its own weight.
struct MixingRow {
  std::vector<int> peers;
  std::vector<float> weights;
  float self_weight = 1.0f;

  // Neighbour j is left out of this round (lost before or during it): its weight stays
  // home, on the diagonal, so the row still sums to 1 and the mix stays an average.
  void keep_home(std::size_t j) {
    self_weight += weights[j];
    weights[j] = 0;
  }
};

// Rows for steps 0..period−1; step t uses rows[t % period].
std::vector<MixingRow> mixing_rows(const topology::Topology& topology, int self);

// Rows once the peers in `lost` are gone: Metropolis–Hastings recomputed on the graph of
// the survivors (so W stays symmetric and doubly stochastic), or, for a time-varying
// topology, its schedule with lost partners sitting the step out.
std::vector<MixingRow> mixing_rows_without(const topology::Topology& topology, int self, const std::vector<int>& lost);

// A neighbour that fails (its link breaks, or it sends nothing within the peer timeout) is
// dropped at once: its weight moves to the diagonal, which keeps W symmetric and doubly
// stochastic among the survivors using only what this peer knows. The trainer later
// switches everyone to rows recomputed on the survivors' graph at an agreed step.
//
// With max_staleness K > 0 (bounded-staleness gossip, src/algo/stale_gossip.cpp) a peer
// mixes with the freshest parameters it holds from each neighbour as long as they are at
// most K steps old, and waits only for a neighbour more than K steps behind. K = 0 is
// exact synchronous D-PSGD, bit for bit the same code path as before.
class Gossip {
 public:
  // Throws Error(kInvalidArgument) for max_staleness < 0, or > 0 with a topology that
  // changes every step (one-peer exponential: a neighbour does not send every step).
  Gossip(net::Transport& network, std::vector<MixingRow> rows, int max_staleness = 0);
  ~Gossip();  // waits for sends still in flight (stale mode): their buffers are ours
  Gossip(const Gossip&) = delete;
  Gossip& operator=(const Gossip&) = delete;
  // Replaces the rows from the next start() on. A peer this one had dropped that is in the
  // new rows and whose link is up again (it rejoined) is taken back into the mix.
  void set_rows(std::vector<MixingRow> rows);
  int max_staleness() const { return max_staleness_; }
  net::Transport& network() const { return network_; }

  // A contiguous range of x: (offset, size).
  using Part = std::pair<std::size_t, std::size_t>;
  // Sends and mixes x as these parts from the first start() on: each travels as its own
  // message (tag part_tag(p)) and is mixed, fused with its slice of the update, as soon as
  // every neighbour's copy of it is in. The parts must be non-empty, in order and
  // contiguous from offset 0; start() checks that they end at x.size(). Every peer must
  // use the same parts (a neighbour's part of another size counts as a failure of that
  // neighbour). Throws Error(kInvalidArgument) for bad parts; a check fails when called
  // after the first start().
  void set_parts(std::vector<Part> parts);
  // The parts in use; empty: one part, the whole vector.
  const std::vector<Part>& parts() const { return parts_; }
  // The message tag of part p. Part 0 keeps tag 0, so one part is on the wire what the
  // whole vector always was; the others start at kPartTagBase, clear of the small tags
  // other parameter messages use at the same step (a rejoining peer's parameters, tag 1).
  static constexpr std::uint32_t kPartTagBase = 1u << 16;
  static std::uint32_t part_tag(std::size_t part) {
    return part == 0 ? 0u : kPartTagBase + static_cast<std::uint32_t>(part);
  }
  // Stale mode: how many neighbour terms were mixed older than the current step, of all.
  long long stale_terms() const { return stale_terms_; }
  long long mixed_terms() const { return mixed_terms_; }
  // Peers this one has dropped; finish() adds to it.
  const std::vector<int>& lost() const { return lost_; }

  // Starts sending x to this step's neighbours. x must not change until finish() returns.
  void start(std::uint64_t step, std::span<const float> x);
  // Waits for the sends and for every neighbour's x of this step, then mixes in place:
  // x ← W_ii·x + Σ_j W_ij·x_j − update (update may be empty). Folding D-PSGD's optimizer
  // update into the mix saves a pass over the parameters after the exchange, where it
  // cannot overlap anything. Part by part: part p is received from every neighbour, its
  // sends waited for, and mixed in one pass while later parts are still arriving. A
  // neighbour lost midway counts in the parts already mixed and leaves its weight home in
  // the rest (per element, the rule for a lost neighbour). Returns the seconds spent
  // waiting (receives and sends, not the mix).
  double finish(std::span<float> x, std::span<const float> update = {});
  // The same exchange for a message of any bytes (compressed gossip): start_message sends
  // one message to this step's neighbours (tag 0; held until finish_message); finish_message
  // receives each neighbour's, with the same deadlines and the same rule for a lost
  // neighbour (its weight stays home), and calls take(peer, weight, payload) for each one
  // received. An Error(kParse) thrown by take counts that neighbour lost, as a frame it
  // could not have sent. Synchronous, one part only. Returns the seconds spent waiting;
  // applied_row() is the row with lost neighbours' weights moved home.
  void start_message(std::uint64_t step, net::Payload message);
  using TakeMessage = std::function<void(int peer, float weight, const net::Payload& payload)>;
  double finish_message(const TakeMessage& take);

  // How long a silent neighbour may keep us waiting before it counts as lost: 30 times
  // the slowest recent round (a decaying maximum), at least 10 s, at most half of
  // --peer-timeout (half in the first rounds and after an evaluation); one that still
  // sends heartbeats is waited for up to the whole --peer-timeout. A
  // fixed timeout must be guessed for the slowest network a run might see; this one
  // follows the rounds actually observed, so a stalled peer on a fast network is
  // dropped in seconds while a slow emulated link is given the time it needs.
  double deadline_s() const;
  // The next round may be slow for a known reason (the peers just evaluated or wrote a
  // checkpoint, at different speeds): it waits up to --peer-timeout.
  void expect_slow_round() { slow_round_expected_ = true; }
  // The fused pass x ← self·x + Σ_j w_j·in_j − update (update may be empty), two inputs a
  // pass; both modes use it, and so does push-sum (push_gossip.h), so that push-sum over a
  // symmetric W does D-PSGD's arithmetic.
  static void mix(std::span<float> x, float self_weight, const std::vector<float>& weights,
                  const std::vector<const float*>& inputs, std::span<const float> update);
  // Waits for every send still in flight (stale mode keeps those of up to K + 2 steps), so
  // that closing the network afterwards cuts off nothing a neighbour still reads. Not
  // between start() and finish().
  void flush();
  // The row the last finish() mixed with: this step's row with the weight of every lost
  // neighbour moved to the diagonal (the mixing trace; tests assemble W from these).
  const MixingRow& applied_row() const { return applied_; }
  // Neighbours lost during the last finish(), with the reason.
  const std::vector<std::pair<int, std::string>>& newly_lost() const { return newly_lost_; }

 private:
  bool is_lost(int peer) const;
  // Whether neighbour j of `row` is out of this round: moved home in an earlier part
  // (home[j]), or lost, when its weight moves home now. One rule for every finish().
  bool left_out(MixingRow& row, std::vector<char>& home, std::size_t j) const;
  // Neighbour j failed during the round: it is given up on and its weight moves home.
  void give_up_during_round(MixingRow& row, std::vector<char>& home, std::size_t j, const std::string& why);
  // Waits for each send and clears the list; a send to a peer lost meanwhile may fail.
  static void wait_sends(std::vector<Work>& sends);
  bool sending() const;
  MixingRow applied_;
  // The parts for a vector of n floats (the default: one part of n); checks they cover it.
  const std::vector<Part>& parts_for(std::size_t n);
  // " (part p of P)" when there are several parts, for messages.
  std::string part_name(std::size_t part) const;
  net::SharedPayload receive_or_give_up(int peer, std::uint64_t step, std::size_t part);
  void give_up_on(int peer, const std::string& why);
  void note_round(double waited);
  // Bounded staleness (stale_gossip.cpp).
  void start_stale(std::span<const float> x);
  double finish_stale(std::span<float> x, std::span<const float> update);

  net::Transport& network_;
  std::vector<MixingRow> rows_;
  std::uint64_t step_ = 0;
  std::vector<Part> parts_;  // empty until set_parts() or the first start()
  bool parts_given_ = false;
  bool started_ = false;  // set_parts() only before the first start()
  std::vector<std::vector<Work>> sends_;  // per part
  net::Payload message_;                  // start_message's, borrowed by its sends
  std::vector<int> lost_;
  std::vector<std::pair<int, std::string>> newly_lost_;
  double slowest_round_s_ = 0;  // decaying maximum of the wait per round
  long long rounds_ = 0;
  bool slow_round_expected_ = false;

  // Stale mode only.
  int max_staleness_ = 0;
  // Each part of a neighbour is held on its own: its parts may be of different steps.
  struct HeldPart {
    net::Payload payload;    // the newest copy of the part received (empty: none yet)
    std::uint64_t step = 0;  // the step it belongs to
    std::uint64_t next = 0;  // the next step to take from the mailbox
  };
  struct Freshest {
    std::vector<HeldPart> parts;
    bool started = false;  // parts are set (at the first start() that includes it)
  };
  std::map<int, Freshest> freshest_;
  struct Snapshot {
    std::uint64_t step = 0;
    std::vector<float> x;  // what was sent: x may change before the sends finish
    std::vector<Work> sends;
  };
  std::deque<Snapshot> in_flight_;
  std::vector<std::vector<float>> spare_;  // snapshot buffers to reuse
  long long stale_terms_ = 0, mixed_terms_ = 0;
};

}  // namespace peertrain::algo
