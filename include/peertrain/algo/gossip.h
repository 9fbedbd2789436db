// D-PSGD's gossip (Lian et al., NeurIPS 2017): every step, peer i sends its parameters x_i
// to its neighbours and replaces them by Σ_j W_ij x_j. Sending x_k runs while the gradient
// at x_k is computed, because both only read x_k; the mix waits for the neighbours' x_k
// once the gradient is done. Time-varying topologies (one-peer exponential) change the
// neighbours and weights each step; the rows for one period are precomputed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "peertrain/net/network.h"
#include "peertrain/topology/topology.h"

namespace peertrain::algo {

// Peer i's row of W at one step: its neighbours, their weights, and its own weight.
struct MixingRow {
  std::vector<int> peers;
  std::vector<float> weights;
  float self_weight = 1.0f;
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
class Gossip {
 public:
  Gossip(net::Network& network, std::vector<MixingRow> rows);
  void set_rows(std::vector<MixingRow> rows);
  // Peers this one has dropped; finish() adds to it.
  const std::vector<int>& lost() const { return lost_; }

  // Starts sending x to this step's neighbours. x must not change until finish() returns.
  void start(std::uint64_t step, std::span<const float> x);
  // Waits for the sends and for every neighbour's x of this step, then mixes in place:
  // x ← W_ii·x + Σ_j W_ij·x_j − update (update may be empty). Folding D-PSGD's optimizer
  // update into the mix saves a pass over the parameters after the exchange, where it
  // cannot overlap anything. Returns the seconds spent waiting.
  double finish(std::span<float> x, std::span<const float> update = {});
  // How long a neighbour may keep us waiting before it counts as lost: 30 times the
  // slowest recent round (a decaying maximum), at least 10 s, at most --peer-timeout. A
  // fixed timeout must be guessed for the slowest network a run might see; this one
  // follows the rounds actually observed, so a stalled peer on a fast network is
  // dropped in seconds while a slow emulated link is given the time it needs.
  double deadline_s() const;
  // The next round may be slow for a known reason (the peers just evaluated or wrote a
  // checkpoint, at different speeds): it waits up to --peer-timeout.
  void expect_slow_round() { slow_round_expected_ = true; }
  // Neighbours lost during the last finish(), with the reason.
  const std::vector<std::pair<int, std::string>>& newly_lost() const { return newly_lost_; }

 private:
  bool is_lost(int peer) const;
  net::Payload receive_or_give_up(int peer);

  net::Network& network_;
  std::vector<MixingRow> rows_;
  std::uint64_t step_ = 0;
  std::vector<net::SendHandle> sends_;
  std::vector<int> lost_;
  std::vector<std::pair<int, std::string>> newly_lost_;
  double slowest_round_s_ = 0;  // decaying maximum of the wait per round
  long long rounds_ = 0;
  bool slow_round_expected_ = false;
};

}  // namespace peertrain::algo
