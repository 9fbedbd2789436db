// Graph generators. Static ones return a Graph; the one-peer exponential topology is
// time-varying, and its per-step graphs come from `one_peer_exponential_step`.
//
// Definitions (docs/topology.md has the details):
//   ring, torus (rows×cols, wrapping), hypercube (n a power of two), complete, star (hub 0);
//   exponential: i ~ i ± 2^k (mod n) for every 2^k < n, as in BlueFog;
//   one-peer-exponential: at step t, with τ = ceil(log2 n) and k = t mod τ, peer i pairs
//     with i XOR 2^k when that is < n, otherwise it sits the step out. For n a power of two
//     this is BlueFog's schedule, and the product of one period is exact averaging;
//   random-regular (degree, seed): a uniform pairing, repaired by degree-preserving swaps;
//   erdos-renyi (p, seed): G(n, p), re-drawn until connected;
//   small-world (k, p, seed): Watts–Strogatz ring lattice with k neighbours, rewired with p.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "peertrain/topology/digraph.h"
#include "peertrain/topology/graph.h"

namespace peertrain::topology {

struct GeneratorParams {
  int n = 0;       // peers; for torus, rows*cols when 0
  int rows = 0;    // torus
  int cols = 0;    // torus
  int degree = 0;  // random-regular
  int k = 0;       // small-world: lattice neighbours (even)
  double p = -1;   // erdos-renyi and small-world
  int fanout = 0;  // random-out, random-regular-out: arcs out of each peer per step
  std::uint64_t seed = 0;
};

const std::vector<std::string>& generator_names();
bool is_time_varying(std::string_view generator);

// Throws Error(kInvalidArgument) naming the generator and the bad or missing parameter.
Graph generate(std::string_view generator, const GeneratorParams& params);

// The union over one period, for the one-peer exponential topology.
int one_peer_exponential_period(int n);
Graph one_peer_exponential_step(int n, long long step);

// The directed generators (digraph.h): the digraph at `step` (the same at every step for
// directed-exponential). Throws Error(kInvalidArgument) naming the generator and the bad
// or missing parameter.
Digraph generate_directed(std::string_view generator, const GeneratorParams& params, long long step = 0);

}  // namespace peertrain::topology
