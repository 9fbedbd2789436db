// The centralized baselines of Lian et al. 2017 (C-PSGD), over the same transport:
//  - ring all-reduce of gradients: reduce-scatter then all-gather around a ring of all
//    peers (Patarasuk & Yuan), 2(n−1)/n of the data per peer per step whatever n is;
//  - a parameter server on one peer: workers push gradients and pull parameters, so the
//    server's traffic grows with n.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "peertrain/net/transport.h"

namespace peertrain::algo {

// Sums `data` over the peers of `ring` (every peer in the same order, self included) in
// place; every peer ends with bitwise the same result. Any size, 0 included.
void ring_allreduce(net::Transport& network, const std::vector<int>& ring, std::uint64_t step, std::span<float> data);

// Worker side: sends gradients to the server, then receives the new parameters.
void ps_push_pull(net::Transport& network, int server, std::uint64_t step, std::span<const float> grads,
                  std::span<float> params);
// Server side: adds every worker's gradients into `sum` (which holds the server's own).
void ps_gather(net::Transport& network, const std::vector<int>& workers, std::uint64_t step, std::span<float> sum);
// Server side: sends the updated parameters to every worker and waits for the sends.
void ps_broadcast(net::Transport& network, const std::vector<int>& workers, std::uint64_t step,
                  std::span<const float> params);

}  // namespace peertrain::algo
