// What the gossip tests share: a topology from inline YAML, fresh random rows (one peer's
// vector a row), and the consensus distance of the rows.
#pragma once

#include <Eigen/Dense>
#include <cstdint>
#include <string>

#include "peertrain/core/rng.h"
#include "peertrain/topology/topology.h"

namespace peertrain::algo::testdata {

inline topology::Topology topology_from(const std::string& yaml) {
  return topology::parse_topology(yaml, "test.yaml", ".");
}

inline Eigen::MatrixXf random_rows(int n, int d, std::uint64_t seed) {
  Rng rng(seed);
  Eigen::MatrixXf x(n, d);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = static_cast<float>(rng.normal());
  return x;
}

// (1/n) Σ_i ‖x_i − x̄‖².
inline double consensus_distance(const Eigen::MatrixXf& x) {
  const Eigen::RowVectorXf mean = x.colwise().mean();
  return (x.rowwise() - mean).squaredNorm() / static_cast<double>(x.rows());
}

}  // namespace peertrain::algo::testdata
