// Gossip over directed graphs: each peer sends to its out-neighbours and mixes what its
// in-neighbours sent, with no reply and no agreement on a symmetric W.
//
// Push-sum (Kempe, Dobra, Gehrke 2003; Stochastic Gradient Push, Assran et al. 2019): P is
// column-stochastic, so Σ_i v_i is conserved however unbalanced the graph; the vector
// carries a weight w beside x, and x/w is the de-biased average. A target that is lost
// keeps its share home (its mass stays in the sum); a source that is lost takes its mass
// with it, and the weights account for that without any renormalisation.
//
// Row-stochastic mixing (Epidemic Learning, de Vos et al. 2023): each peer averages what it
// received with its own, with weights that sum to 1 over its row. A lost source's weight
// stays home, so the row still sums to 1.
//
// With max_delay D > 0 (overlap push-sum, Assran et al. 2019, Algorithm 2) a peer mixes,
// at step k, every message that has arrived from any step s ≤ k, each exactly once, and
// waits only for those of steps s ≤ k − D. Mass is never counted twice or dropped: a
// message late by up to D steps is added late, and drain() takes what is still owed at the
// end of a run. D = 0 is synchronous push-sum.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "peertrain/net/transport.h"
#include "peertrain/topology/mixing.h"

namespace peertrain::algo {

// One peer's part of a step: whom it sends to and the share each receives (P_ki), whom it
// hears from and the weight each gets (P_ij), and what it keeps (P_ii).
struct DirectedRow {
  std::vector<int> targets;
  std::vector<float> shares;
  std::vector<int> sources;
  std::vector<float> weights;
  float self_weight = 1.0f;
};

// Peer `self`'s row and column of P.
DirectedRow directed_row(const topology::SparseMatrix& p, int self);

enum class DirectedMixing {
  kPushSum,  // column-stochastic: a lost target's share stays home; a lost source is dropped
  kRows,     // row-stochastic: a lost source's weight stays home
};

class PushGossip {
 public:
  // Throws Error(kInvalidArgument) for max_delay < 0.
  PushGossip(net::Transport& network, DirectedMixing mixing, int max_delay = 0);
  ~PushGossip();  // waits for sends still in flight
  PushGossip(const PushGossip&) = delete;
  PushGossip& operator=(const PushGossip&) = delete;

  // Sends v to the row's targets that are not lost (tag 0). Synchronous: v must not change
  // until finish() returns; with a delay the message is copied.
  void start(std::uint64_t step, DirectedRow row, std::span<const float> v);
  // v ← self·v + Σ w_j·v_j − update over the messages taken this step (update may be
  // empty). Synchronous: every source of this step, each waited for while it sounds alive
  // (--peer-timeout bounds it). Returns the seconds spent waiting.
  double finish(std::span<float> v, std::span<const float> update = {});
  // Takes every message still owed, waiting for each (the end of a run with a delay).
  double drain(std::span<float> v);

  int max_delay() const { return max_delay_; }
  const std::vector<int>& lost() const { return lost_; }
  // Sources given up on during the last finish() or drain(), with the reason.
  const std::vector<std::pair<int, std::string>>& newly_lost() const { return newly_lost_; }
  // The row the last finish() applied, with lost peers' weights moved as the mode says.
  const DirectedRow& applied_row() const { return applied_; }
  // Messages mixed at a later step than they were sent, and all messages mixed.
  long long delayed_terms() const { return delayed_terms_; }
  long long mixed_terms() const { return mixed_terms_; }

 private:
  struct Owed {
    std::uint64_t step = 0;
    int source = 0;
    float weight = 0;
  };
  bool is_lost(int peer) const;
  void give_up_on(int peer, const std::string& why);
  // The message owed, waited for when `wait`; empty when not there (yet) or the peer is lost.
  net::SharedPayload take(const Owed& owed, bool wait, std::size_t size);
  // Takes what is owed (all of it, or what has arrived and what is due) and mixes it in.
  double take_and_mix(std::span<float> v, std::span<const float> update, bool all);
  void wait_sends();

  net::Transport& network_;
  DirectedMixing mixing_;
  int max_delay_ = 0;
  std::uint64_t step_ = 0;
  bool started_ = false;
  DirectedRow row_, applied_;
  std::vector<Work> sends_;
  std::deque<Owed> owed_;
  std::vector<float> sum_;  // delayed mode: the messages taken this step, weighted
  std::vector<int> lost_;
  std::vector<std::pair<int, std::string>> newly_lost_;
  long long delayed_terms_ = 0, mixed_terms_ = 0;
};

}  // namespace peertrain::algo
