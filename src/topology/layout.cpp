#include "peertrain/topology/layout.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <numbers>

namespace peertrain::topology {
namespace {

std::vector<std::array<double, 2>> circle(int n) {
  std::vector<std::array<double, 2>> out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const double angle = 2 * std::numbers::pi * i / std::max(n, 1) - std::numbers::pi / 2;
    out[static_cast<std::size_t>(i)] = {std::cos(angle), std::sin(angle)};
  }
  return out;
}

// Scaled into [-1, 1] on both axes together (keeping the aspect), or nothing if the
// points do not separate: two peers closer than a tenth of the mean spacing of a circle.
bool normalize(std::vector<std::array<double, 2>>& points) {
  const int n = static_cast<int>(points.size());
  double reach = 0;
  for (const auto& p : points) reach = std::max({reach, std::abs(p[0]), std::abs(p[1])});
  if (reach < 1e-12) return false;
  for (auto& p : points) p = {p[0] / reach, p[1] / reach};
  const double spacing = 0.1 * 2 * std::numbers::pi / n;
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j)
      if (std::hypot(points[i][0] - points[j][0], points[i][1] - points[j][1]) < spacing) return false;
  return true;
}

}  // namespace

std::vector<std::array<double, 2>> spectral_layout(const Topology& topology, int max_dense) {
  const int n = topology.num_peers();
  if (n <= 3 || n > max_dense) return circle(n);
  // A directed topology is drawn by the links it needs (their Metropolis W is symmetric).
  const Eigen::MatrixXd w = Eigen::MatrixXd(
      topology.directed ? build_mixing_matrix(topology.graph, WeightScheme::kMetropolis) : topology.mixing);
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> solver(w);
  if (solver.info() != Eigen::Success) return circle(n);
  // Ascending eigenvalues: n − 1 is λ₁ = 1 (constant vector), n − 2 and n − 3 the next two.
  std::vector<std::array<double, 2>> points(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    points[static_cast<std::size_t>(i)] = {solver.eigenvectors()(i, n - 2), solver.eigenvectors()(i, n - 3)};
  if (!normalize(points)) return circle(n);
  return points;
}

}  // namespace peertrain::topology
