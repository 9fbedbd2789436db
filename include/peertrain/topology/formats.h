// Reading and writing the graph and matrix formats around the topology file: plain edge
// lists, Matrix Market, and Graphviz DOT. Every parse error names the file and the line.
#pragma once

#include <string>
#include <vector>

#include "peertrain/topology/graph.h"
#include "peertrain/topology/mixing.h"

namespace peertrain::topology {

// The text of a file, refusing what cannot be a text file (empty, or containing NUL bytes).
std::string read_text_file(const std::string& path, const std::string& what);
void write_text_file(const std::string& path, const std::string& text);

struct EdgeListData {
  int n = 0;                        // max id + 1, or the size a Matrix Market header declares
  std::vector<Edge> edges;
  std::vector<int> lines;           // 1-based line of each edge, for error messages
  std::vector<double> values;       // Matrix Market entry values (1 for pattern files and edge lists)
  std::vector<double> diagonal;     // Matrix Market diagonal entries when present (else empty)

  // Builds the validated graph, naming `origin` and each edge's line in errors.
  Graph to_graph(const std::string& origin, int n_override = 0) const;
};

// `u v` per line; '#' starts a comment; blank lines ignored.
EdgeListData parse_edge_list(const std::string& text, const std::string& origin);
// "%%MatrixMarket matrix coordinate real|integer|pattern symmetric|general", 1-based.
// Off-diagonal entries become edges; a general file may list both (i, j) and (j, i).
EdgeListData parse_matrix_market(const std::string& text, const std::string& origin);
// Either format, chosen by the "%%MatrixMarket" banner.
EdgeListData read_graph_file(const std::string& path);

// W as "coordinate real symmetric", lower triangle with the diagonal, 17 significant digits;
// with symmetric = false (a directed graph's P) as "general", every entry.
std::string to_matrix_market(const SparseMatrix& w, const std::string& comment, bool symmetric = true);
// An undirected DOT graph; edge labels and pen widths show W's weights when given.
std::string to_dot(const std::string& name, const Graph& graph, const SparseMatrix* w);

}  // namespace peertrain::topology
