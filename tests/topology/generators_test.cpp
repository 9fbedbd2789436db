#include "peertrain/topology/generators.h"

#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"

namespace peertrain::topology {
namespace {

GeneratorParams peers(int n) {
  GeneratorParams p;
  p.n = n;
  return p;
}

void expect_regular(const Graph& g, int degree) {
  for (int i = 0; i < g.num_peers(); ++i) ASSERT_EQ(g.degree(i), degree) << "peer " << i;
}

TEST(Generators, DeterministicFamiliesHaveTheirShape) {
  for (int n : {1, 2, 3, 7, 16}) {
    const Graph ring = generate("ring", peers(n));
    EXPECT_EQ(ring.num_edges(), static_cast<std::size_t>(n <= 2 ? n - 1 : n)) << n;
    EXPECT_TRUE(ring.is_connected());
    EXPECT_EQ(generate("complete", peers(n)).num_edges(), static_cast<std::size_t>(n * (n - 1) / 2));
    EXPECT_EQ(generate("star", peers(n)).degree(0), n - 1);
  }
  expect_regular(generate("hypercube", peers(32)), 5);
  GeneratorParams torus;
  torus.rows = 4;
  torus.cols = 5;
  const Graph t = generate("torus", torus);
  EXPECT_EQ(t.num_peers(), 20);
  expect_regular(t, 4);
  EXPECT_TRUE(t.has_edge(0, 4));   // wraps along a row
  EXPECT_TRUE(t.has_edge(0, 15));  // wraps along a column
  torus.rows = 2;                  // wrapping twice between the same two rows is one edge
  expect_regular(generate("torus", torus), 3);
}

TEST(Generators, ExponentialLinksPowersOfTwoBothWays) {
  const Graph g = generate("exponential", peers(16));
  expect_regular(g, 7);  // ±1, ±2, ±4 and 8 (which is its own negative)
  for (int hop : {1, 2, 4, 8}) EXPECT_TRUE(g.has_edge(3, (3 + hop) % 16)) << hop;
  EXPECT_FALSE(g.has_edge(0, 3));
  const Graph odd = generate("exponential", peers(10));
  EXPECT_TRUE(odd.has_edge(0, 8));  // 0 + 8
  EXPECT_TRUE(odd.has_edge(0, 2));  // 0 − 8 ≡ 2
}

TEST(Generators, OnePeerExponentialPairsByXor) {
  const int n = 16;
  EXPECT_EQ(one_peer_exponential_period(n), 4);
  for (int t = 0; t < 8; ++t) {
    const Graph step = one_peer_exponential_step(n, t);
    expect_regular(step, 1);
    for (int i = 0; i < n; ++i) EXPECT_TRUE(step.has_edge(i, i ^ (1 << (t % 4))));
  }
  // General n: the partner is skipped when it does not exist.
  const Graph step = one_peer_exponential_step(12, 3);  // bit 8
  EXPECT_TRUE(step.has_edge(0, 8));
  EXPECT_EQ(step.degree(4), 0);  // 4 ^ 8 = 12 is not a peer
  EXPECT_TRUE(generate("one-peer-exponential", peers(12)).is_connected());
}

TEST(Generators, SeededFamiliesReproduceAndDiffer) {
  GeneratorParams p;
  p.n = 200;
  p.degree = 3;
  p.k = 4;
  p.p = 0.05;
  for (const char* kind : {"random-regular", "erdos-renyi", "small-world"}) {
    p.seed = 9;
    const Graph a = generate(kind, p), b = generate(kind, p);
    p.seed = 10;
    const Graph c = generate(kind, p);
    EXPECT_EQ(a.edges(), b.edges()) << kind;
    EXPECT_NE(a.edges(), c.edges()) << kind;
    EXPECT_TRUE(a.is_connected()) << kind;
  }
  p.seed = 1;
  expect_regular(generate("random-regular", p), 3);
  p.k = 6;
  p.p = 0.0;
  expect_regular(generate("small-world", p), 6);  // no rewiring: the ring lattice
}

TEST(Generators, LargeRandomRegularIsSimpleAndConnected) {
  GeneratorParams p;
  p.n = 100'000;
  p.degree = 4;
  p.seed = 5;
  const Graph g = generate("random-regular", p);  // from_edges rejects loops and repeats
  expect_regular(g, 4);
  EXPECT_TRUE(g.is_connected());
}

TEST(Generators, BadParametersNameTheGenerator) {
  EXPECT_ERROR_MENTIONS(generate("ring", peers(0)), "ring", "n >= 1");
  EXPECT_ERROR_MENTIONS(generate("hypercube", peers(12)), "hypercube", "power of two");
  EXPECT_ERROR_MENTIONS(generate("mesh", peers(4)), "unknown generator 'mesh'", "ring");
  GeneratorParams p = peers(5);
  p.degree = 3;
  EXPECT_ERROR_MENTIONS(generate("random-regular", p), "even");
  p.p = 1e-9;
  EXPECT_ERROR_MENTIONS(generate("erdos-renyi", p), "no connected graph");
  p.k = 3;
  p.p = 0.1;
  EXPECT_ERROR_MENTIONS(generate("small-world", p), "even k");
  GeneratorParams torus;
  EXPECT_ERROR_MENTIONS(generate("torus", torus), "rows");
}

}  // namespace
}  // namespace peertrain::topology
