// The step algorithms as the trainer drives them (start, gradient, finish with the
// optimizer), n peers on loopback links in one process, on fresh random gradients that do
// not depend on x: what their serial twins are checked against.
#pragma once

#include <Eigen/Dense>
#include <mutex>
#include <utility>
#include <vector>

#include "../../src/train/membership.h"
#include "../../src/train/step_algorithm.h"
#include "peertrain/core/rng.h"
#include "peertrain/net/loopback.h"
#include "test_support/cluster.h"

namespace peertrain::train::harness {

inline topology::Topology topology_from(const std::string& yaml) {
  return topology::parse_topology(yaml, "test.yaml", ".");
}

// Peer i's gradient at step k: fresh normal entries from (i, k).
inline std::vector<float> gradient(int rank, int step, int dim) {
  Rng rng(1000 * static_cast<std::uint64_t>(step) + static_cast<std::uint64_t>(rank) + 7);
  std::vector<float> g(static_cast<std::size_t>(dim));
  for (float& v : g) v = static_cast<float>(rng.normal());
  return g;
}

// x_0, the same on every peer.
inline Eigen::RowVectorXf initial_x(int dim) {
  Rng init(3);
  Eigen::RowVectorXf x(dim);
  for (int j = 0; j < dim; ++j) x(j) = static_cast<float>(init.normal());
  return x;
}

using testing::every_peer_linked;

struct Shape {
  int steps = 6;
  int dim = 257;
  std::vector<std::pair<std::size_t, std::size_t>> layers;  // StepContext::layers (empty: one layer)
};

// Every peer's x (a row each) after every step, all starting from initial_x.
inline std::vector<Eigen::MatrixXf> run_steps(const topology::Topology& t, const TrainConfig& config,
                                              const Shape& shape) {
  const int n = t.num_peers();
  net::LoopbackFabric fabric(every_peer_linked(n, 10));
  std::vector<Eigen::MatrixXf> out(static_cast<std::size_t>(shape.steps), Eigen::MatrixXf(n, shape.dim));
  std::mutex mutex;
  testing::run_peers(n, [&](int rank) {
    auto net = fabric.transport(rank);
    algo::Gossip gossip(*net, algo::mixing_rows(t, rank));
    Membership membership(*net, t, rank, {SplitPolicy::kContinue, 0, shape.steps, 0});
    auto algorithm =
        make_step_algorithm(config, {*net, rank, n, &gossip, &membership, {}, &t, shape.steps, shape.layers},
                            static_cast<std::size_t>(shape.dim));
    auto optimizer = make_optimizer(config.optimizer, static_cast<std::size_t>(shape.dim), config.sgd, config.adam);
    const Eigen::RowVectorXf x0 = initial_x(shape.dim);
    std::vector<float> x(x0.data(), x0.data() + shape.dim);
    for (int k = 0; k < shape.steps; ++k) {
      algorithm->start(k, x);
      std::vector<float> g = gradient(rank, k, shape.dim);
      algorithm->finish(k, x, g, *optimizer);
      std::lock_guard lock(mutex);
      for (int j = 0; j < shape.dim; ++j) out[static_cast<std::size_t>(k)](rank, j) = x[static_cast<std::size_t>(j)];
    }
    net->close();
  });
  return out;
}

inline double relative(const Eigen::MatrixXf& a, const Eigen::MatrixXf& b) { return (a - b).norm() / b.norm(); }

}  // namespace peertrain::train::harness
