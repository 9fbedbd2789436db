// The centralized baselines of Lian et al. 2017 (C-PSGD), over the same transport:
//  - ring all-reduce of gradients: reduce-scatter then all-gather around a ring of all
//    peers (Patarasuk & Yuan), 2(n−1)/n of the data per peer per step whatever n is;
//  - a parameter server on one peer: workers push gradients and pull parameters, so the
//    server's traffic grows with n.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "peertrain/net/transport.h"

namespace peertrain::algo {

// Sums `data` over the peers of `ring` (every peer in the same order, self included) in
// place; every peer ends with bitwise the same result. Any size, 0 included.
void ring_allreduce(net::Transport& network, const std::vector<int>& ring, std::uint64_t step, std::span<float> data);

// The latency-optimal all-reduces, for small messages and slow links, where the ring's
// 2(n−1) serial hops dominate:
//  - recursive doubling: ⌈log₂ n⌉ rounds of exchanging the whole vector with the peer
//    whose position differs in one bit (Thakur, Rabenseifner, Gropp 2005); with n not a
//    power of two the first 2r positions (r = n − 2^⌊log₂ n⌋) pair up first, and the
//    even one of each pair sits the rounds out and gets the result at the end;
//  - a binomial tree: reduce to position 0 in ⌈log₂ n⌉ rounds, broadcast back in as many.
// Both sum in place over `peers` (every peer the same list, self included) and leave
// bitwise the same result everywhere (floating-point addition is commutative, and each
// partial sum is formed once and copied). Any size, 0 included.
enum class AllreduceAlgo { kRing, kTree, kRecursiveDoubling };
AllreduceAlgo parse_allreduce_algo(std::string_view name);  // throws Error naming the choices
std::string_view to_string(AllreduceAlgo algo);
void rd_allreduce(net::Transport& network, const std::vector<int>& peers, std::uint64_t step, std::span<float> data);
void tree_allreduce(net::Transport& network, const std::vector<int>& peers, std::uint64_t step, std::span<float> data);
void allreduce(AllreduceAlgo algo, net::Transport& network, const std::vector<int>& peers, std::uint64_t step,
               std::span<float> data);
// The positions in `peers` that position `self` exchanges with under `algo` (its links).
std::vector<int> allreduce_partners(AllreduceAlgo algo, int n, int self);

// Worker side: sends gradients to the server, then receives the new parameters.
void ps_push_pull(net::Transport& network, int server, std::uint64_t step, std::span<const float> grads,
                  std::span<float> params);
// Server side: adds every worker's gradients into `sum` (which holds the server's own).
void ps_gather(net::Transport& network, const std::vector<int>& workers, std::uint64_t step, std::span<float> sum);
// Server side: sends the updated parameters to every worker and waits for the sends.
void ps_broadcast(net::Transport& network, const std::vector<int>& workers, std::uint64_t step,
                  std::span<const float> params);

}  // namespace peertrain::algo
