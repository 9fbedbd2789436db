#include "peertrain/topology/formats.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "peertrain/topology/generators.h"
#include "test_util.h"

namespace peertrain::topology {
namespace {

TEST(EdgeList, ParsesCommentsBlankLinesAndCommas) {
  const auto data = parse_edge_list("# a path\n0 1\n\n1 2  # trailing comment\n2,3\n", "p.txt");
  EXPECT_EQ(data.n, 4);
  ASSERT_EQ(data.edges.size(), 3u);
  EXPECT_EQ(data.lines, (std::vector<int>{2, 4, 5}));
  EXPECT_TRUE(data.to_graph("p.txt").is_connected());
}

TEST(EdgeList, ErrorsNameFileAndLine) {
  EXPECT_ERROR_MENTIONS(parse_edge_list("0 1\n1 x\n", "p.txt"), "p.txt:2", "integer", "'x'");
  EXPECT_ERROR_MENTIONS(parse_edge_list("0 1 2\n", "p.txt"), "p.txt:1", "two peer ids");
  EXPECT_ERROR_MENTIONS(parse_edge_list("0 -4\n", "p.txt"), "p.txt:1", "out of range");
  EXPECT_ERROR_MENTIONS(parse_edge_list("# nothing\n", "p.txt"), "p.txt", "no edges");
  EXPECT_ERROR_MENTIONS(parse_edge_list("0 1\n1 0\n", "p.txt").to_graph("p.txt"), "p.txt", "line 2", "duplicate");
  EXPECT_ERROR_MENTIONS(parse_edge_list("0 1\n1 1\n", "p.txt").to_graph("p.txt"), "line 2", "self-loop");
}

TEST(MatrixMarket, ReadsSymmetricAndGeneralFiles) {
  const auto sym = parse_matrix_market(
      "%%MatrixMarket matrix coordinate real symmetric\n% comment\n3 3 4\n1 1 0.5\n2 1 0.5\n3 2 0.5\n3 3 0.5\n", "w.mtx");
  EXPECT_EQ(sym.n, 3);
  EXPECT_EQ(sym.edges.size(), 2u);
  EXPECT_EQ(sym.diagonal[0], 0.5);
  const auto general = parse_matrix_market(
      "%%MatrixMarket matrix coordinate pattern general\n3 3 4\n1 2\n2 1\n2 3\n3 2\n", "g.mtx");
  EXPECT_EQ(general.edges.size(), 2u);  // mirrored pairs are one edge
}

TEST(MatrixMarket, ErrorsNameFileAndLine) {
  EXPECT_ERROR_MENTIONS(parse_matrix_market("%%MatrixMarket matrix array real general\n", "w.mtx"), "w.mtx:1",
                        "banner");
  EXPECT_ERROR_MENTIONS(parse_matrix_market("%%MatrixMarket matrix coordinate real symmetric\n3 4 1\n", "w.mtx"),
                        "w.mtx:2", "square");
  EXPECT_ERROR_MENTIONS(
      parse_matrix_market("%%MatrixMarket matrix coordinate real symmetric\n3 3 2\n1 2 0.5\n", "w.mtx"), "declares 2",
      "has 1");
  EXPECT_ERROR_MENTIONS(
      parse_matrix_market("%%MatrixMarket matrix coordinate real symmetric\n3 3 1\n4 1 0.5\n", "w.mtx"), "w.mtx:3",
      "outside");
  EXPECT_ERROR_MENTIONS(
      parse_matrix_market("%%MatrixMarket matrix coordinate real symmetric\n3 3 2\n2 1 0.5\n2 1 0.5\n", "w.mtx"),
      "w.mtx:4", "twice");
}

TEST(MatrixMarket, RoundTripsW) {
  GeneratorParams p;
  p.n = 7;
  const Graph g = generate("ring", p);
  const SparseMatrix w = build_mixing_matrix(g, WeightScheme::kMetropolis);
  const auto data = parse_matrix_market(to_matrix_market(w, "ring7"), "w.mtx");
  EXPECT_EQ(data.to_graph("w.mtx").edges(), g.edges());
  for (std::size_t k = 0; k < data.edges.size(); ++k)
    EXPECT_DOUBLE_EQ(data.values[k], w.coeff(data.edges[k].u, data.edges[k].v));
  for (int i = 0; i < 7; ++i) EXPECT_DOUBLE_EQ(data.diagonal[i], w.coeff(i, i));
}

TEST(Dot, ListsEveryEdgeWithItsWeight) {
  const Graph g = Graph::from_edges(3, {{0, 1}, {1, 2}}, "path");
  const SparseMatrix w = build_mixing_matrix(g, WeightScheme::kMetropolis);
  const std::string dot = to_dot("my path", g, &w);
  EXPECT_NE(dot.find("graph my_path {"), std::string::npos);
  EXPECT_NE(dot.find("0 -- 1 [label=\"0.333\""), std::string::npos) << dot;
  EXPECT_NE(dot.find("1 -- 2"), std::string::npos);
}

TEST(Files, RefuseEmptyBinaryAndMissingFiles) {
  const auto dir = std::filesystem::temp_directory_path() / "peertrain_formats_test";
  std::filesystem::create_directories(dir);
  write_text_file((dir / "empty.txt").string(), "  \n");
  write_text_file((dir / "binary.txt").string(), std::string("0 1\n\0\x01\x02", 7));
  EXPECT_ERROR_MENTIONS(read_graph_file((dir / "empty.txt").string()), "empty.txt", "empty");
  EXPECT_ERROR_MENTIONS(read_graph_file((dir / "binary.txt").string()), "binary.txt", "binary");
  EXPECT_ERROR_MENTIONS(read_graph_file((dir / "absent.txt").string()), "absent.txt", "cannot read");
  EXPECT_ERROR_MENTIONS(read_graph_file(dir.string()), "peertrain_formats_test");  // a directory
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace peertrain::topology
