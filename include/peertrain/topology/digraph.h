// Directed graphs over peers and the column-stochastic mixing of push-sum (Kempe et al.
// 2003; Stochastic Gradient Push, Assran et al. 2019). An arc i → j means i sends to j;
// peer i keeps a share of what it holds and sends an equal share along each out-arc, so
// column i of P sums to 1 and Σ_i x_i is conserved, while the rows need not sum to 1.
//
// Generators (docs/topology.md has the details):
//   directed-exponential: i → i + 2^k (mod n) for every 2^k < n, SGP's static graph;
//   one-peer-directed-exponential: at step t, i → i + 2^(t mod τ) (mod n), τ = ⌈log₂ n⌉,
//     SGP's default: one message per peer per step;
//   random-out (fanout s, seed): at every step every peer sends to s distinct others drawn
//     uniformly from (seed, step), so every peer draws the same graph without a message
//     (Epidemic Learning's EL-Local, de Vos et al. 2023);
//   random-regular-out (fanout s, seed): at every step an s-regular digraph (every peer
//     sends to s and hears from s): a random relabelling of a circulant with s distinct
//     random offsets (EL-Oracle's graph).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "peertrain/topology/graph.h"
#include "peertrain/topology/mixing.h"

namespace peertrain::topology {

struct Arc {
  int from = 0;
  int to = 0;
  friend bool operator==(const Arc&, const Arc&) = default;
};

class Digraph {
 public:
  Digraph() = default;
  // Validates every arc: ids in [0, n), no self-loops, no repeats. `what` names the input
  // in errors; `where` (optional) names the place of arc k.
  static Digraph from_arcs(int n, std::vector<Arc> arcs, const std::string& what, const EdgeLocator& where = {});

  int num_peers() const { return n_; }
  std::size_t num_arcs() const { return arcs_.size(); }
  const std::vector<Arc>& arcs() const { return arcs_; }  // sorted by (from, to)
  std::span<const int> out(int peer) const;               // whom peer sends to
  std::span<const int> in(int peer) const;                // who sends to peer
  int out_degree(int peer) const { return static_cast<int>(out(peer).size()); }
  int in_degree(int peer) const { return static_cast<int>(in(peer).size()); }
  bool has_arc(int from, int to) const;

  // A peer that peer 0 cannot reach (*from_zero = true) or that cannot reach peer 0
  // (*from_zero = false); −1 when the digraph is strongly connected.
  int unreachable(bool* from_zero = nullptr) const;
  bool strongly_connected() const { return unreachable() < 0; }
  // Why it is not strongly connected, naming a peer and the direction; empty when it is.
  std::string describe_unreachable() const;
  // The links it needs: an undirected edge wherever an arc runs either way.
  Graph support() const;

 private:
  int n_ = 0;
  std::vector<Arc> arcs_;
  std::vector<int> out_offsets_{0}, out_;
  std::vector<int> in_offsets_{0}, in_;
};

// The union of several digraphs over the same peers (a time-varying one over a period).
Digraph union_of(const std::vector<Digraph>& graphs);

// Uniform out-weights: P_ji = 1/(1 + d_out(i)) for j an out-neighbour of i and for j = i.
SparseMatrix column_stochastic_weights(const Digraph& graph);

// Throws Error naming `what` and the first entry that breaks a rule: square of size n,
// finite, nonnegative, every column summing to 1 within 1e-9, support on arcs and the
// diagonal. Returns the measured deviations (max_column_error; max_row_error is how far
// the rows are from 1, which push-sum's weights correct).
MixingCheck validate_column_stochastic(const Digraph& graph, const SparseMatrix& p, const std::string& what);

const std::vector<std::string>& directed_generator_names();
bool is_directed_generator(std::string_view generator);
// Whether the generator draws a new digraph every step (random-out, random-regular-out).
bool is_redrawn(std::string_view generator);

Digraph directed_exponential(int n);
// Epidemic Learning's default fanout: ⌈log₂ n⌉ (de Vos et al. 2023), within 1..n − 1.
int default_fanout(int peers);
Digraph one_peer_directed_exponential_step(int n, long long step);
// The seeded draws: the same (n, fanout, seed, step) gives the same digraph everywhere.
// Throw Error(kInvalidArgument) unless 1 ≤ fanout ≤ n − 1.
Digraph random_out_step(int n, int fanout, std::uint64_t seed, long long step);
Digraph random_regular_out_step(int n, int fanout, std::uint64_t seed, long long step);

// The spectrum that governs push-sum: the second-largest eigenvalue modulus (SLEM) of the
// column-stochastic P; the consensus error shrinks by about SLEM per step, so it takes
// 1/ln(1/SLEM) steps per factor e (mixing_steps). Dense (Eigen's general eigensolver).
struct DirectedSpectrum {
  int peers = 0;
  double slem = 0;
  double mixing_steps = 0;  // steps per e-fold of the consensus error; infinite when SLEM ≥ 1
  double seconds = 0;
};
// Throws Error(kInvalidArgument) past kDirectedSpectrumMaxPeers (the dense solver's size).
inline constexpr int kDirectedSpectrumMaxPeers = 4096;
DirectedSpectrum analyze_directed(const SparseMatrix& p);

// For a time-varying sequence: the SLEM of the product of `window` consecutive steps,
// P(s+window−1)⋯P(s), as its per-step equivalent SLEM^(1/window). A periodic sequence
// gives one number (draws = 1, window = its period); a redrawn one gives the mean over
// `draws` windows and the 2.5 % and 97.5 % quantiles.
struct SequenceSpectrum {
  int window = 0;
  int draws = 0;
  double slem = 0;  // per step, mean over the draws
  double low = 0, high = 0;
  double mixing_steps = 0;
  double seconds = 0;
};
SequenceSpectrum analyze_sequence(const std::function<SparseMatrix(long long)>& p_at, int window, int draws);

// Steps per e-fold of the consensus error for a per-step contraction c (infinite at c ≥ 1).
double steps_per_e_fold(double c);

}  // namespace peertrain::topology
