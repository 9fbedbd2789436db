#include "peertrain/topology/mixing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "peertrain/topology/generators.h"
#include "test_util.h"

namespace peertrain::topology {
namespace {

GeneratorParams random_peers(int n) {
  GeneratorParams p;
  p.n = n;
  p.degree = 3;
  p.seed = 4;
  return p;
}

TEST(Mixing, EverySchemeIsSymmetricDoublyStochasticOnItsGraphs) {
  GeneratorParams torus;
  torus.rows = 3;
  torus.cols = 5;
  const std::vector<Graph> graphs = {generate("ring", random_peers(9)), generate("star", random_peers(6)),
                                     generate("random-regular", random_peers(30)), generate("torus", torus),
                                     generate("exponential", random_peers(12))};
  for (const Graph& g : graphs)
    for (auto scheme : {WeightScheme::kMetropolis, WeightScheme::kMaxDegree}) {
      const SparseMatrix w = build_mixing_matrix(g, scheme);
      const MixingCheck check = validate_mixing_matrix(g, w, "test");
      EXPECT_LT(check.max_row_error, 1e-12);
      EXPECT_GE(check.min_entry, 0.0);
    }
}

TEST(Mixing, MetropolisUsesTheLargerDegree) {
  const Graph star = generate("star", random_peers(5));  // hub degree 4, leaves degree 1
  const SparseMatrix w = build_mixing_matrix(star, WeightScheme::kMetropolis);
  EXPECT_DOUBLE_EQ(w.coeff(0, 1), 1.0 / 5);
  EXPECT_DOUBLE_EQ(w.coeff(1, 1), 1.0 - 1.0 / 5);
  EXPECT_DOUBLE_EQ(w.coeff(0, 0), 1.0 - 4.0 / 5);
}

TEST(Mixing, BestConstantMatchesTheRingClosedForm) {
  const int n = 10;
  const Graph ring = generate("ring", random_peers(n));
  // Ring Laplacian eigenvalues 2 − 2cos(2πk/n): λ_1 = 4 for even n, λ_{n−1} = 2 − 2cos(2π/n).
  const double alpha = 2.0 / (4.0 + 2.0 - 2.0 * std::cos(2 * std::numbers::pi / n));
  const SparseMatrix w = build_mixing_matrix(ring, WeightScheme::kBestConstant);
  EXPECT_NEAR(w.coeff(0, 1), alpha, 1e-9);
  EXPECT_NEAR(w.coeff(0, 0), 1 - 2 * alpha, 1e-9);
}

TEST(Mixing, UniformNeighborsNeedsARegularGraph) {
  const SparseMatrix w = build_mixing_matrix(generate("ring", random_peers(6)), WeightScheme::kUniformNeighbors);
  EXPECT_DOUBLE_EQ(w.coeff(2, 3), 1.0 / 3);
  EXPECT_ERROR_MENTIONS(build_mixing_matrix(generate("star", random_peers(4)), WeightScheme::kUniformNeighbors),
                        "regular", "peer 1", "peer 0", "degree 3");
}

TEST(Mixing, ParsesSchemeNames) {
  for (const auto& name : weight_scheme_names()) EXPECT_EQ(to_string(parse_weight_scheme(name)), name);
  EXPECT_ERROR_MENTIONS(parse_weight_scheme("metropolis-hastings"), "unknown weight scheme", "max-degree");
}

TEST(Mixing, ValidationNamesTheBrokenEntry) {
  const Graph path = Graph::from_edges(3, {{0, 1}, {1, 2}}, "path");
  auto entries = [](std::vector<MatrixEntry> e) { return e; };
  const auto good = entries({{0, 0, 0.5, ""}, {0, 1, 0.5, ""}, {1, 0, 0.5, ""}, {1, 2, 0.5, ""}, {2, 1, 0.5, ""},
                             {2, 2, 0.5, ""}});
  EXPECT_NO_THROW(validate_mixing_matrix(path, mixing_from_entries(path, good, "W"), "W"));

  auto asymmetric = good;
  asymmetric[1].value = 0.4;
  asymmetric[0].value = 0.6;
  EXPECT_ERROR_MENTIONS(validate_mixing_matrix(path, mixing_from_entries(path, asymmetric, "W"), "W"),
                        "not symmetric", "W[");
  auto unbalanced = good;
  unbalanced[0].value = 0.6;
  EXPECT_ERROR_MENTIONS(validate_mixing_matrix(path, mixing_from_entries(path, unbalanced, "W"), "W"),
                        "not doubly stochastic", "row 0", "1.1");
  auto negative = good;
  negative[0].value = -0.5;
  EXPECT_ERROR_MENTIONS(validate_mixing_matrix(path, mixing_from_entries(path, negative, "W"), "W"), "negative");
  auto off_edge = good;
  off_edge.push_back({0, 2, 0.1, "line 7"});
  EXPECT_ERROR_MENTIONS(mixing_from_entries(path, off_edge, "W"), "line 7", "W[0][2]", "not linked");
  auto not_finite = good;
  not_finite[0].value = std::nan("");
  EXPECT_ERROR_MENTIONS(mixing_from_entries(path, not_finite, "W"), "not finite");
  EXPECT_ERROR_MENTIONS(validate_mixing_matrix(path, SparseMatrix(2, 2), "W"), "2x2", "expected 3x3");
}

}  // namespace
}  // namespace peertrain::topology
