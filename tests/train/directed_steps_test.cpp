// SGP and Epidemic Learning as the trainer drives them, against their dense recursions,
// and SGP on a symmetric W against D-PSGD.
#include <gtest/gtest.h>

#include "peertrain/topology/digraph.h"
#include "step_harness.h"

namespace peertrain::train::directed_test {
namespace {

using harness::relative;
using harness::topology_from;

TrainConfig config(Algorithm algorithm, UpdateForm form) {
  TrainConfig c;
  c.algorithm = algorithm;
  c.update = form;
  c.sgd = {0.05f, 0.9f, 1e-4f};
  return c;
}

double worst(const std::vector<Eigen::MatrixXf>& got, const std::vector<Eigen::MatrixXf>& expected) {
  double e = 0;
  for (std::size_t k = 0; k < expected.size(); ++k) e = std::max(e, relative(got[k], expected[k]));
  return e;
}

// The dense recursion, rows are peers: z = x/w is where each peer's step is taken (torch's
// SGD: v ← μv + g + λz, u = ηv); cta: X ← M(t)X − U, atc: X ← M(t)(X − U); w ← M(t)w.
// For SGP M(t) is P(t), column-stochastic; for EL the row average of the round's digraph.
std::vector<Eigen::MatrixXf> dense_twin(const std::function<Eigen::MatrixXf(long long)>& m_at, int n,
                                        const TrainConfig& c, const harness::Shape& shape) {
  const int d = shape.dim;
  Eigen::MatrixXf x = harness::initial_x(d).replicate(n, 1), z = x, velocity = Eigen::MatrixXf::Zero(n, d);
  Eigen::VectorXf w = Eigen::VectorXf::Ones(n);
  std::vector<Eigen::MatrixXf> out;
  for (int k = 0; k < shape.steps; ++k) {
    Eigen::MatrixXf u(n, d);
    for (int i = 0; i < n; ++i) {
      const auto g = harness::gradient(i, k, d);
      for (int j = 0; j < d; ++j) {
        velocity(i, j) =
            c.sgd.momentum * velocity(i, j) + g[static_cast<std::size_t>(j)] + c.sgd.weight_decay * z(i, j);
        u(i, j) = c.sgd.lr * velocity(i, j);
      }
    }
    const Eigen::MatrixXf m = m_at(k);
    x = c.update == UpdateForm::kCta ? Eigen::MatrixXf(m * x - u) : Eigen::MatrixXf(m * (x - u));
    w = m * w;
    z = x.array().colwise() / w.array();
    out.push_back(z);
  }
  return out;
}

TEST(Sgp, OnASymmetricWIsDpsgd) {
  const harness::Shape shape{8, 257, {}};
  for (const char* yaml : {"graph: {generator: ring, n: 5}", "graph: {generator: one-peer-exponential, n: 6}"}) {
    const auto t = topology_from(yaml);
    for (UpdateForm form : {UpdateForm::kCta, UpdateForm::kAtc}) {
      const auto sgp = harness::run_steps(t, config(Algorithm::kSgp, form), shape);
      const auto dpsgd = harness::run_steps(t, config(Algorithm::kDpsgd, form), shape);
      EXPECT_LT(worst(sgp, dpsgd), 1e-5) << yaml;
    }
  }
}

TEST(Sgp, EqualsItsDenseRecursionOnDirectedGraphs) {
  const harness::Shape shape{9, 257, {}};
  for (const char* yaml : {"graph: {n: 5, directed: true, edges: [[0, 1], [1, 2], [2, 3], [3, 4], [4, 0], [0, 3]]}",
                           "graph: {generator: one-peer-directed-exponential, n: 6}",
                           "graph: {generator: random-out, n: 6, fanout: 2, seed: 3}"}) {
    const auto t = topology_from(yaml);
    for (UpdateForm form : {UpdateForm::kCta, UpdateForm::kAtc}) {
      const TrainConfig c = config(Algorithm::kSgp, form);
      const auto expected =
          dense_twin([&](long long k) -> Eigen::MatrixXf { return Eigen::MatrixXd(t.mixing_at(k)).cast<float>(); },
                     t.num_peers(), c, shape);
      EXPECT_LT(worst(harness::run_steps(t, c, shape), expected), 1e-5) << yaml;
    }
  }
}

TEST(EpidemicLearning, EqualsItsDenseRecursionInBothVariants) {
  const harness::Shape shape{7, 257, {}};
  const auto t = topology_from("graph: {generator: complete, n: 7}");
  for (EpidemicVariant variant : {EpidemicVariant::kLocal, EpidemicVariant::kOracle}) {
    TrainConfig c = config(Algorithm::kEl, UpdateForm::kAtc);
    c.fanout = 2;
    c.el_variant = variant;
    auto m_at = [&](long long k) {
      const std::uint64_t seed = c.seed ^ 0x5eed0fe1ULL;  // the graph's stream (make_epidemic)
      const topology::Digraph g = variant == EpidemicVariant::kOracle ? topology::random_regular_out_step(7, 2, seed, k)
                                                                      : topology::random_out_step(7, 2, seed, k);
      Eigen::MatrixXf m = Eigen::MatrixXf::Zero(7, 7);
      for (int i = 0; i < 7; ++i) {
        const float weight = 1.0f / static_cast<float>(1 + g.in_degree(i));
        m(i, i) = weight;
        for (int j : g.in(i)) m(i, j) = weight;
      }
      return m;
    };
    EXPECT_LT(worst(harness::run_steps(t, c, shape), dense_twin(m_at, 7, c, shape)), 1e-5);
  }
}

}  // namespace
}  // namespace peertrain::train::directed_test
