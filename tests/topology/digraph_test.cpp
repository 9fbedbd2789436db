// Directed graphs: arcs, strong connectivity, push-sum's column-stochastic P, the directed
// generators and their seeded draws, the spectrum, and the topology file's directed form.
#include "peertrain/topology/digraph.h"

#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cmath>

#include "peertrain/topology/generators.h"
#include "peertrain/topology/topology.h"
#include "test_util.h"

namespace peertrain::topology::directed_test {
namespace {

Topology parse(const std::string& yaml) { return parse_topology(yaml, "d.yaml", "."); }

TEST(Digraph, ArcsAreCheckedAndIndexedBothWays) {
  const Digraph g = Digraph::from_arcs(4, {{2, 0}, {0, 1}, {1, 2}, {0, 3}, {3, 0}}, "test");
  EXPECT_EQ(g.num_arcs(), 5u);
  EXPECT_EQ(std::vector<int>(g.out(0).begin(), g.out(0).end()), (std::vector<int>{1, 3}));
  EXPECT_EQ(std::vector<int>(g.in(0).begin(), g.in(0).end()), (std::vector<int>{2, 3}));
  EXPECT_TRUE(g.has_arc(2, 0));
  EXPECT_FALSE(g.has_arc(0, 2));
  EXPECT_TRUE(g.strongly_connected());
  EXPECT_EQ(g.support().num_edges(), 4u);  // 0–3 both ways is one link
  EXPECT_ERROR_MENTIONS(Digraph::from_arcs(3, {{0, 1}, {0, 1}}, "test"), "duplicate arc [0, 1]");
  EXPECT_ERROR_MENTIONS(Digraph::from_arcs(3, {{0, 3}}, "test"), "out of range");
  EXPECT_ERROR_MENTIONS(Digraph::from_arcs(3, {{1, 1}}, "test"), "self-loop");
}

TEST(Digraph, NamesWhatIsNotStronglyConnected) {
  // 0 → 1 → 2, nothing back: 0 reaches everyone, nobody reaches 0.
  const Digraph chain = Digraph::from_arcs(3, {{0, 1}, {1, 2}}, "test");
  bool from_zero = true;
  EXPECT_EQ(chain.unreachable(&from_zero), 1);
  EXPECT_FALSE(from_zero);
  EXPECT_NE(chain.describe_unreachable().find("nothing peer 1 sends reaches peer 0"), std::string::npos);
  const Digraph cut = Digraph::from_arcs(3, {{1, 0}, {2, 0}}, "test");
  EXPECT_EQ(cut.unreachable(&from_zero), 1);
  EXPECT_TRUE(from_zero);
}

TEST(Digraph, UniformOutWeightsAreColumnStochastic) {
  const Digraph g = Digraph::from_arcs(3, {{0, 1}, {0, 2}, {1, 2}, {2, 0}}, "test");
  const SparseMatrix p = column_stochastic_weights(g);
  const Eigen::MatrixXd dense(p);
  EXPECT_NEAR(dense(0, 0), 1.0 / 3, 1e-15);
  EXPECT_NEAR(dense(1, 0), 1.0 / 3, 1e-15);
  EXPECT_NEAR(dense(2, 1), 0.5, 1e-15);
  EXPECT_EQ(dense(0, 1), 0.0);  // no arc 1 → 0
  const MixingCheck check = validate_column_stochastic(g, p, "test");
  EXPECT_LT(check.max_column_error, 1e-15);
  EXPECT_GT(check.max_row_error, 0.1);  // the rows are not stochastic: push-sum's w corrects that
  Eigen::MatrixXd bad = dense;
  bad(0, 0) += 0.25;
  EXPECT_ERROR_MENTIONS(validate_column_stochastic(g, bad.sparseView(), "P"),
                        "P is not column-stochastic: column 0 sums to 1.2");
  bad = dense;
  bad(1, 2) = 0.1;  // no arc 2 → 1
  EXPECT_ERROR_MENTIONS(validate_column_stochastic(g, bad.sparseView(), "P"), "no arc from 2 to 1");
}

TEST(DirectedGenerators, ExponentialGraphsAndTheirPeriod) {
  const Digraph g = directed_exponential(12);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(g.out_degree(i), 4);  // hops 1, 2, 4, 8
  EXPECT_TRUE(g.has_arc(11, 7));                               // 11 + 8 mod 12
  EXPECT_EQ(one_peer_exponential_period(12), 4);
  const Digraph step5 = one_peer_directed_exponential_step(12, 5);  // hop 2^(5 mod 4) = 2
  for (int i = 0; i < 12; ++i)
    EXPECT_EQ(std::vector<int>(step5.out(i).begin(), step5.out(i).end()), std::vector<int>{(i + 2) % 12});
}

TEST(DirectedGenerators, DrawsAreTheSameFromTheSameSeedAndStepAndDifferOtherwise) {
  for (auto* draw : {&random_out_step, &random_regular_out_step}) {
    const Digraph a = draw(20, 3, 7, 11), b = draw(20, 3, 7, 11);
    EXPECT_EQ(a.arcs(), b.arcs());
    EXPECT_NE(a.arcs(), draw(20, 3, 7, 12).arcs());
    EXPECT_NE(a.arcs(), draw(20, 3, 8, 11).arcs());
    for (int i = 0; i < 20; ++i) EXPECT_EQ(a.out_degree(i), 3);
  }
  // The s-regular draw: every peer also hears from s.
  const Digraph regular = random_regular_out_step(20, 3, 7, 11);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(regular.in_degree(i), 3);
  // Each peer's targets are uniform over the others: over many draws, every target about
  // equally often (3/19 of draws each; 4,000 draws give about ±6 % at 3 sigma).
  std::vector<int> count(20, 0);
  for (int step = 0; step < 4000; ++step) {
    const Digraph draw = random_out_step(20, 3, 1, step);
    for (int q : draw.out(0)) ++count[static_cast<std::size_t>(q)];
  }
  EXPECT_EQ(count[0], 0);
  for (int q = 1; q < 20; ++q) EXPECT_NEAR(count[static_cast<std::size_t>(q)] / 4000.0, 3.0 / 19, 0.03) << q;
  EXPECT_ERROR_MENTIONS(random_out_step(4, 4, 1, 0), "fanout must be 1..3");
}

TEST(DirectedSpectrum, MatchesTheCirculantsEigenvalues) {
  // The directed ring with uniform out-weights is (I + S)/2, S the cyclic shift: its
  // eigenvalues are (1 + e^{2πik/n})/2, so SLEM = |1 + e^{2πi/n}|/2 = cos(π/n).
  std::vector<Arc> ring;
  for (int i = 0; i < 9; ++i) ring.push_back({i, (i + 1) % 9});
  const DirectedSpectrum s = analyze_directed(column_stochastic_weights(Digraph::from_arcs(9, ring, "ring")));
  EXPECT_NEAR(s.slem, std::cos(M_PI / 9), 1e-12);
  EXPECT_NEAR(s.mixing_steps, 1 / -std::log(std::cos(M_PI / 9)), 1e-9);
  // One period of the one-peer exponential graph on a power of two is exact averaging.
  const SequenceSpectrum period = analyze_sequence(
      [](long long t) { return column_stochastic_weights(one_peer_directed_exponential_step(16, t)); }, 4, 1);
  EXPECT_EQ(period.slem, 0.0);
  // Redrawn: an interval around the mean.
  const SequenceSpectrum drawn =
      analyze_sequence([](long long t) { return column_stochastic_weights(random_out_step(24, 2, 5, t)); }, 5, 12);
  EXPECT_GT(drawn.slem, 0.0);
  EXPECT_LT(drawn.slem, 1.0);
  EXPECT_LE(drawn.low, drawn.slem);
  EXPECT_GE(drawn.high, drawn.slem);
}

TEST(DirectedTopologyFile, ReadsArcsGeneratorsAndWritesThemBack) {
  const Topology t = parse("graph: {n: 3, directed: true, edges: [[0, 1], [1, 2], [2, 0]]}\n");
  EXPECT_TRUE(t.directed);
  EXPECT_EQ(t.weights, WeightScheme::kColumnStochastic);
  EXPECT_EQ(t.graph.num_edges(), 3u);
  EXPECT_NEAR(t.mixing.coeff(1, 0), 0.5, 1e-15);
  const Topology back = parse(to_yaml(t));
  EXPECT_EQ(back.digraph.arcs(), t.digraph.arcs());
  EXPECT_EQ(back.fingerprint(), t.fingerprint());

  const Topology one_peer = parse("graph: {generator: one-peer-directed-exponential, n: 8}\n");
  EXPECT_TRUE(one_peer.time_varying());
  EXPECT_EQ(one_peer.period(), 3);
  EXPECT_TRUE(one_peer.digraph_at(4).has_arc(0, 2));
  const Topology drawn = parse("graph: {generator: random-out, n: 10, fanout: 2, seed: 4}\n");
  EXPECT_TRUE(drawn.redrawn());
  EXPECT_EQ(drawn.graph.num_edges(), 45u);  // every pair may be drawn
  EXPECT_EQ(drawn.digraph_at(9).arcs(), random_out_step(10, 2, 4, 9).arcs());
  EXPECT_EQ(parse(to_yaml(drawn)).fingerprint(), drawn.fingerprint());
  EXPECT_NE(parse("graph: {generator: random-out, n: 10, fanout: 2, seed: 5}\n").fingerprint(), drawn.fingerprint());
}

TEST(DirectedTopologyFile, EveryMistakeIsNamedWithItsPlace) {
  EXPECT_ERROR_MENTIONS(parse("graph:\n  n: 3\n  directed: true\n  edges: [[0, 1], [1, 2]]\n"), "d.yaml",
                        "not strongly connected", "peer 1");
  EXPECT_ERROR_MENTIONS(parse("graph: {n: 3, directed: true, edges: [[0, 1], [1, 2], [2, 0]]}\nweights: metropolis\n"),
                        "d.yaml:2", "weights: column-stochastic");
  EXPECT_ERROR_MENTIONS(parse("graph: {generator: ring, n: 4}\nweights: column-stochastic\n"), "d.yaml",
                        "need a directed graph");
  EXPECT_ERROR_MENTIONS(parse("graph: {generator: ring, n: 4, directed: true}\n"), "d.yaml:1", "undirected");
  EXPECT_ERROR_MENTIONS(parse("graph: {generator: random-out, n: 4}\n"), "d.yaml:1", "needs fanout");
  EXPECT_ERROR_MENTIONS(parse("graph: {generator: random-out, n: 4, fanout: 4}\n"), "d.yaml:1", "fanout must be 1..3");
  EXPECT_ERROR_MENTIONS(parse("graph: {generator: directed-exponential, n: 4, directed: false}\n"), "d.yaml:1",
                        "makes a directed graph");
  EXPECT_ERROR_MENTIONS(parse("graph: {n: 3, directed: maybe, edges: [[0, 1]]}\n"), "d.yaml:1", "true or false");
  EXPECT_ERROR_MENTIONS(parse("graph:\n  n: 3\n  directed: true\n  edges:\n    - [0, 1]\n    - [0, 1]\n"), "line 6",
                        "duplicate arc");
  EXPECT_ERROR_MENTIONS(parse("graph: {generator: ring, n: 4, fanout: 2}\n"), "d.yaml:1", "fanout is for random-out");
}

}  // namespace
}  // namespace peertrain::topology::directed_test
