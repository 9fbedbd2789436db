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

class Gossip {
 public:
  Gossip(net::Network& network, std::vector<MixingRow> rows);

  // Starts sending x to this step's neighbours. x must not change until finish() returns.
  void start(std::uint64_t step, std::span<const float> x);
  // Waits for the sends and for every neighbour's x of this step, then mixes in place:
  // x ← W_ii·x + Σ_j W_ij·x_j − update (update may be empty). Folding D-PSGD's optimizer
  // update into the mix saves a pass over the parameters after the exchange, where it
  // cannot overlap anything. Returns the seconds spent waiting.
  double finish(std::span<float> x, std::span<const float> update = {});

 private:
  net::Network& network_;
  std::vector<MixingRow> rows_;
  std::uint64_t step_ = 0;
  std::vector<net::SendHandle> sends_;
};

}  // namespace peertrain::algo
