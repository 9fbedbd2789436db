#include "peertrain/topology/mixing.h"

#include <algorithm>
#include <cmath>

#include "peertrain/core/error.h"
#include "peertrain/topology/spectrum.h"

namespace peertrain::topology {
namespace {

using Triplet = Eigen::Triplet<double, int>;

// W from one weight per edge; the diagonal takes what each row has left.
SparseMatrix from_edge_weights(const Graph& g, const std::vector<double>& edge_weight) {
  const int n = g.num_peers();
  std::vector<double> diagonal(n, 1.0);
  std::vector<Triplet> triplets;
  triplets.reserve(2 * g.num_edges() + n);
  for (std::size_t k = 0; k < g.num_edges(); ++k) {
    const Edge& e = g.edges()[k];
    triplets.emplace_back(e.u, e.v, edge_weight[k]);
    triplets.emplace_back(e.v, e.u, edge_weight[k]);
    diagonal[e.u] -= edge_weight[k];
    diagonal[e.v] -= edge_weight[k];
  }
  for (int i = 0; i < n; ++i) triplets.emplace_back(i, i, diagonal[i]);
  SparseMatrix w(n, n);
  w.setFromTriplets(triplets.begin(), triplets.end());
  return w;
}

}  // namespace

std::string_view to_string(WeightScheme scheme) {
  switch (scheme) {
    case WeightScheme::kMetropolis: return "metropolis";
    case WeightScheme::kMaxDegree: return "max-degree";
    case WeightScheme::kBestConstant: return "best-constant";
    case WeightScheme::kUniformNeighbors: return "uniform-neighbors";
    case WeightScheme::kExplicit: return "explicit";
    case WeightScheme::kColumnStochastic:
      return "column-stochastic";
  }
  return "?";
}

const std::vector<std::string>& weight_scheme_names() {
  static const std::vector<std::string> names = {"metropolis",        "max-degree", "best-constant",
                                                 "uniform-neighbors", "explicit",   "column-stochastic"};
  return names;
}

WeightScheme parse_weight_scheme(std::string_view name) {
  for (auto scheme : {WeightScheme::kMetropolis, WeightScheme::kMaxDegree, WeightScheme::kBestConstant,
                      WeightScheme::kUniformNeighbors, WeightScheme::kExplicit, WeightScheme::kColumnStochastic})
    if (to_string(scheme) == name) return scheme;
  throw Error(ErrorKind::kInvalidArgument,
              str("unknown weight scheme '", name,
                  "'; expected one of metropolis, max-degree, best-constant, uniform-neighbors, explicit, "
                  "column-stochastic"));
}

SparseMatrix build_mixing_matrix(const Graph& g, WeightScheme scheme) {
  const auto& edges = g.edges();
  std::vector<double> weight(edges.size());
  switch (scheme) {
    case WeightScheme::kMetropolis:
      for (std::size_t k = 0; k < edges.size(); ++k)
        weight[k] = 1.0 / (1.0 + std::max(g.degree(edges[k].u), g.degree(edges[k].v)));
      break;
    case WeightScheme::kMaxDegree:
      std::fill(weight.begin(), weight.end(), 1.0 / (1.0 + g.max_degree()));
      break;
    case WeightScheme::kBestConstant: {
      std::fill(weight.begin(), weight.end(), laplacian_best_constant(g));
      break;
    }
    case WeightScheme::kUniformNeighbors:
      if (g.min_degree() != g.max_degree()) {
        int low = 0, high = 0;
        for (int i = 0; i < g.num_peers(); ++i) {
          if (g.degree(i) < g.degree(low)) low = i;
          if (g.degree(i) > g.degree(high)) high = i;
        }
        throw Error(ErrorKind::kInvalidArgument,
                    str("weights 'uniform-neighbors' need a regular graph to be symmetric, but peer ", low,
                        " has degree ", g.degree(low), " and peer ", high, " has degree ", g.degree(high),
                        "; use metropolis instead"));
      }
      std::fill(weight.begin(), weight.end(), 1.0 / (1.0 + g.max_degree()));
      break;
    case WeightScheme::kExplicit:
      throw Error(ErrorKind::kInvalidArgument, "weights 'explicit' need the matrix itself, not a scheme");
    case WeightScheme::kColumnStochastic:
      throw Error(ErrorKind::kInvalidArgument,
                  "weights 'column-stochastic' need a directed graph (graph: {directed: true, ...}); an undirected "
                  "one takes metropolis, max-degree, best-constant or uniform-neighbors");
  }
  return from_edge_weights(g, weight);
}

SparseMatrix mixing_from_entries(const Graph& g, const std::vector<MatrixEntry>& entries, const std::string& what) {
  const int n = g.num_peers();
  std::vector<Triplet> triplets;
  triplets.reserve(entries.size());
  for (const MatrixEntry& e : entries) {
    const std::string place = e.where.empty() ? what : e.where;
    if (e.row < 0 || e.row >= n || e.col < 0 || e.col >= n)
      throw Error(ErrorKind::kInvalidArgument, str(place, ": W[", e.row, "][", e.col, "] is outside the ", n, "x", n,
                                                   " matrix of this graph"));
    if (!std::isfinite(e.value))
      throw Error(ErrorKind::kInvalidArgument, str(place, ": W[", e.row, "][", e.col, "] = ", e.value, " is not finite"));
    if (e.value == 0.0) continue;
    if (e.row != e.col && !g.has_edge(e.row, e.col))
      throw Error(ErrorKind::kInvalidArgument,
                  str(place, ": W[", e.row, "][", e.col, "] = ", e.value, " but peers ", e.row, " and ", e.col,
                      " are not linked; weight is allowed only on edges and the diagonal"));
    triplets.emplace_back(e.row, e.col, e.value);
  }
  SparseMatrix w(n, n);
  bool repeated = false;
  w.setFromTriplets(triplets.begin(), triplets.end(), [&](double a, double) {
    repeated = true;
    return a;
  });
  if (repeated) throw Error(ErrorKind::kInvalidArgument, str(what, ": an entry of W is given twice"));
  return w;
}

MixingCheck validate_mixing_matrix(const Graph& g, const SparseMatrix& w, const std::string& what) {
  const int n = g.num_peers();
  if (w.rows() != n || w.cols() != n)
    throw Error(ErrorKind::kInvalidArgument,
                str(what, ": W is ", w.rows(), "x", w.cols(), "; expected ", n, "x", n));
  MixingCheck check;
  check.min_entry = n > 0 ? 1.0 : 0.0;
  std::vector<double> row_sum(n, 0.0), col_sum(n, 0.0);
  SparseMatrix transpose = w.transpose();
  for (int j = 0; j < n; ++j) {
    for (SparseMatrix::InnerIterator it(w, j); it; ++it) {
      const int i = it.row();
      const double x = it.value();
      if (!std::isfinite(x))
        throw Error(ErrorKind::kInvalidArgument, str(what, ": W[", i, "][", j, "] = ", x, " is not finite"));
      if (x < 0)
        throw Error(ErrorKind::kInvalidArgument, str(what, ": W[", i, "][", j, "] = ", x, " is negative"));
      if (x != 0 && i != j && !g.has_edge(i, j))
        throw Error(ErrorKind::kInvalidArgument,
                    str(what, ": W[", i, "][", j, "] = ", x, " but peers ", i, " and ", j, " are not linked"));
      row_sum[i] += x;
      col_sum[j] += x;
      check.min_entry = std::min(check.min_entry, x);
    }
  }
  SparseMatrix asym = w - transpose;
  for (int j = 0; j < n; ++j)
    for (SparseMatrix::InnerIterator it(asym, j); it; ++it)
      if (std::abs(it.value()) > check.max_asymmetry) {
        check.max_asymmetry = std::abs(it.value());
        if (check.max_asymmetry > kSymmetryTolerance)
          throw Error(ErrorKind::kInvalidArgument,
                      str(what, ": W is not symmetric: W[", it.row(), "][", j, "] = ", w.coeff(it.row(), j),
                          " but W[", j, "][", it.row(), "] = ", w.coeff(j, it.row())));
      }
  for (int i = 0; i < n; ++i) {
    check.max_row_error = std::max(check.max_row_error, std::abs(row_sum[i] - 1));
    check.max_column_error = std::max(check.max_column_error, std::abs(col_sum[i] - 1));
    if (std::abs(row_sum[i] - 1) > kStochasticTolerance)
      throw Error(ErrorKind::kInvalidArgument,
                  str(what, ": W is not doubly stochastic: row ", i, " sums to ", row_sum[i],
                      ", expected 1 within ", kStochasticTolerance));
    if (std::abs(col_sum[i] - 1) > kStochasticTolerance)
      throw Error(ErrorKind::kInvalidArgument,
                  str(what, ": W is not doubly stochastic: column ", i, " sums to ", col_sum[i],
                      ", expected 1 within ", kStochasticTolerance));
  }
  return check;
}

}  // namespace peertrain::topology
