#include "peertrain/topology/graph.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace peertrain::topology {
namespace {

TEST(Graph, BuildsSortedAdjacency) {
  Graph g = Graph::from_edges(4, {{2, 0}, {0, 1}, {3, 0}}, "star");
  EXPECT_EQ(g.num_edges(), 3u);
  EXPECT_EQ(g.degree(0), 3);
  EXPECT_EQ(std::vector<int>(g.neighbors(0).begin(), g.neighbors(0).end()), (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(g.has_edge(2, 0));
  EXPECT_FALSE(g.has_edge(1, 2));
  EXPECT_EQ(g.edges().front(), (Edge{0, 1}));  // stored with u < v, sorted
  EXPECT_TRUE(g.is_connected());
  EXPECT_TRUE(g.is_bipartite());
}

TEST(Graph, RejectsBadEdgesNamingThePlace) {
  EXPECT_ERROR_MENTIONS(Graph::from_edges(3, {{0, 1}, {1, 3}}, "g.txt"), "g.txt", "edge #1", "out of range");
  EXPECT_ERROR_MENTIONS(Graph::from_edges(3, {{0, -1}}, "g.txt"), "out of range");
  EXPECT_ERROR_MENTIONS(Graph::from_edges(3, {{2, 2}}, "g.txt", [](std::size_t) { return std::string("line 9"); }),
                        "line 9", "self-loop");
  EXPECT_ERROR_MENTIONS(Graph::from_edges(3, {{0, 1}, {1, 2}, {1, 0}}, "g.txt"), "duplicate edge (0, 1)", "edge #2",
                        "edge #0");
  EXPECT_ERROR_MENTIONS(Graph::from_edges(0, {}, "g.txt"), "at least 1");
}

TEST(Graph, FindsComponentsAndOddCycles) {
  Graph split = Graph::from_edges(5, {{0, 1}, {2, 3}, {3, 4}}, "split");
  int count = 0;
  const auto label = split.components(&count);
  EXPECT_EQ(count, 2);
  EXPECT_EQ(label[1], label[0]);
  EXPECT_NE(label[2], label[0]);
  EXPECT_FALSE(split.is_connected());
  Graph triangle = Graph::from_edges(3, {{0, 1}, {1, 2}, {2, 0}}, "triangle");
  EXPECT_FALSE(triangle.is_bipartite());
  EXPECT_TRUE(Graph::from_edges(1, {}, "one").is_connected());
}

}  // namespace
}  // namespace peertrain::topology
