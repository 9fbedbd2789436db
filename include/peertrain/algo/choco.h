// CHOCO-SGD's gossip (Koloskova, Stich, Jaggi, ICML 2019): every peer keeps public copies
// x̂_j of its neighbours' parameters and of its own, which all who hold them update
// identically from compressed differences, so only Q(x_i − x̂_i) travels:
//
//   q_i = Q(x_i − x̂_i);  send q_i;  x̂_j += q_j for j ∈ {i} ∪ neighbours;
//   x_i ← x_i + γ Σ_j W_ij (x̂_j − x̂_i)
//
// With Q the identity and γ = 1 this is x ← W·x, D-PSGD's mix. The copies start at 0, as
// in the paper, or, when every peer starts from the same x_0 (the trainer: the model is
// initialized from the shared seed), at x_0, so the first messages carry only what has
// changed since instead of the whole model at a fraction per step. A lost neighbour's weight stays home, as in
// D-PSGD (its term leaves the sum); the membership's recomputed rows only ever drop
// neighbours, whose copies are then forgotten.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "peertrain/algo/compression.h"
#include "peertrain/algo/gossip.h"
#include "peertrain/core/rng.h"

namespace peertrain::algo {

class ChocoGossip {
 public:
  // `gossip` carries the messages and keeps the rows (set_rows there), the deadlines and
  // who is lost. gamma in (0, 1]. Throws Error(kInvalidArgument) for a time-varying
  // topology (its neighbours change every step, so copies would fall out of step).
  ChocoGossip(Gossip& gossip, Compression compression, float gamma, std::uint64_t seed, bool time_varying,
              bool common_start = false);

  // Sets the x_0 the copies start from, with common_start, before the first start() (which
  // otherwise takes its own x): the adapt-then-combine form first sends x_0 − u_0.
  void prime(std::span<const float> x0);
  // Compresses x − x̂_i, sends it, and updates x̂_i. x may change right after.
  void start(std::uint64_t step, std::span<const float> x);
  // Receives the neighbours' differences, updates their copies, then
  // x ← x + γ Σ_j W_ij (x̂_j − x̂_i) − update (update may be empty). Returns the seconds
  // spent waiting.
  double finish(std::span<float> x, std::span<const float> update = {});

  // Bytes of the last message sent (to each neighbour).
  std::size_t last_message_bytes() const { return last_bytes_; }
  const Compression& compression() const { return compression_; }
  float gamma() const { return gamma_; }

 private:
  std::vector<float>& copy_of(int peer, std::size_t n);

  Gossip& gossip_;
  Compression compression_;
  float gamma_;
  Rng rng_;
  std::vector<float> self_hat_;
  std::map<int, std::vector<float>> hat_;  // neighbours' public copies
  bool common_start_;
  std::vector<float> x0_;  // what every copy starts from
  std::vector<float> diff_;
  std::size_t last_bytes_ = 0;
};

}  // namespace peertrain::algo
