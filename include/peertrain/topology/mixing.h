// The mixing matrix W of D-PSGD: symmetric, doubly stochastic, nonnegative, and nonzero
// only on the graph's edges and diagonal. Built from a weight scheme or given explicitly,
// and validated before anything uses it.
#pragma once

#include <Eigen/Core>
#include <Eigen/SparseCore>
#include <string>
#include <string_view>
#include <vector>

#include "peertrain/topology/graph.h"

namespace peertrain::topology {

using SparseMatrix = Eigen::SparseMatrix<double, Eigen::ColMajor, int>;

// kColumnStochastic: push-sum's uniform out-weights on a directed graph (digraph.h).
enum class WeightScheme { kMetropolis, kMaxDegree, kBestConstant, kUniformNeighbors, kExplicit, kColumnStochastic };

std::string_view to_string(WeightScheme scheme);
WeightScheme parse_weight_scheme(std::string_view name);  // throws Error naming the choices
const std::vector<std::string>& weight_scheme_names();

// Builds W for every scheme but kExplicit. Throws Error when the scheme cannot give a
// symmetric W for this graph (uniform-neighbors on an irregular graph).
//   metropolis:        W_ij = 1/(1 + max(d_i, d_j)) on edges, the rest on the diagonal
//   max-degree:        W_ij = 1/(1 + d_max) on edges
//   best-constant:     W = I − αL, α = 2/(λ_1(L) + λ_{n−1}(L))  (Xiao & Boyd 2004)
//   uniform-neighbors: W_ij = 1/(1 + d_i) on edges and the diagonal (regular graphs only)
SparseMatrix build_mixing_matrix(const Graph& graph, WeightScheme scheme);

// One entry of an explicit W, with the place it came from for error messages.
struct MatrixEntry {
  int row = 0;
  int col = 0;
  double value = 0;
  std::string where;
};

// Builds an explicit W from its nonzero entries after checking that each is finite, in
// range and on an edge or the diagonal. `what` names the input in errors. Entries given
// twice are an error.
SparseMatrix mixing_from_entries(const Graph& graph, const std::vector<MatrixEntry>& entries, const std::string& what);

struct MixingCheck {
  double max_asymmetry = 0;     // max |W_ij − W_ji|
  double max_row_error = 0;     // max |Σ_j W_ij − 1|
  double max_column_error = 0;  // max |Σ_i W_ij − 1|
  double min_entry = 0;
};

inline constexpr double kStochasticTolerance = 1e-9;
inline constexpr double kSymmetryTolerance = 1e-12;

// Throws Error naming `what` and the first entry that breaks a rule: square of size n,
// finite, symmetric, nonnegative, rows and columns summing to 1 within 1e-9, support on
// edges and the diagonal. Returns the measured deviations when all hold.
MixingCheck validate_mixing_matrix(const Graph& graph, const SparseMatrix& w, const std::string& what);

}  // namespace peertrain::topology
