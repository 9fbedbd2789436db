// An undirected simple graph over peers 0..n-1, stored as a sorted edge list plus a CSR
// adjacency, so neighbour lists are contiguous spans and edge lookups are binary searches.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace peertrain::topology {

struct Edge {
  int u = 0;  // always u < v once inside a Graph
  int v = 0;
  friend bool operator==(const Edge&, const Edge&) = default;
};

// Names where edge k came from ("line 12 of peers.txt"), for error messages.
using EdgeLocator = std::function<std::string(std::size_t edge_index)>;

class Graph {
 public:
  Graph() = default;

  // Validates every edge: ids in [0, n), no self-loops, no duplicates (in either order).
  // `what` names the input in errors; `where` (optional) names the place of edge k.
  static Graph from_edges(int n, std::vector<Edge> edges, const std::string& what,
                          const EdgeLocator& where = {});

  int num_peers() const { return n_; }
  std::size_t num_edges() const { return edges_.size(); }
  const std::vector<Edge>& edges() const { return edges_; }
  std::span<const int> neighbors(int peer) const;
  int degree(int peer) const { return offsets_[peer + 1] - offsets_[peer]; }
  int min_degree() const;
  int max_degree() const;
  bool has_edge(int a, int b) const;

  // Component label of every peer (labels 0..components-1, in order of first peer).
  std::vector<int> components(int* count = nullptr) const;
  bool is_connected() const;
  // True when the peers split into two sides with every edge across (2-colourable).
  bool is_bipartite() const;

 private:
  int n_ = 0;
  std::vector<Edge> edges_;
  std::vector<int> offsets_{0};
  std::vector<int> adjacency_;
};

}  // namespace peertrain::topology
