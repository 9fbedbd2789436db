#include "peertrain/topology/graph.h"

#include <algorithm>

#include "peertrain/core/error.h"

namespace peertrain::topology {

Graph Graph::from_edges(int n, std::vector<Edge> edges, const std::string& what,
                        const EdgeLocator& where) {
  auto place = [&](std::size_t k) { return where ? where(k) : str("edge #", k); };
  if (n < 1)
    throw Error(ErrorKind::kInvalidArgument, str(what, ": the number of peers must be at least 1, got ", n));
  for (std::size_t k = 0; k < edges.size(); ++k) {
    Edge& e = edges[k];
    if (e.u < 0 || e.u >= n || e.v < 0 || e.v >= n)
      throw Error(ErrorKind::kInvalidArgument,
                  str(what, ", ", place(k), ": edge (", e.u, ", ", e.v, ") is out of range; peers are 0..",
                      n - 1));
    if (e.u == e.v)
      throw Error(ErrorKind::kInvalidArgument,
                  str(what, ", ", place(k), ": self-loop (", e.u, ", ", e.v, "); a peer is not its own neighbour"));
    if (e.u > e.v) std::swap(e.u, e.v);
  }
  // Sort an index so a duplicate can be reported at both of its places.
  std::vector<std::size_t> order(edges.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  auto less = [&](std::size_t a, std::size_t b) {
    return edges[a].u != edges[b].u ? edges[a].u < edges[b].u : edges[a].v < edges[b].v;
  };
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return less(a, b) || (!less(b, a) && a < b);
  });
  for (std::size_t i = 1; i < order.size(); ++i) {
    if (edges[order[i]] == edges[order[i - 1]])
      throw Error(ErrorKind::kInvalidArgument,
                  str(what, ", ", place(order[i]), ": duplicate edge (", edges[order[i]].u, ", ",
                      edges[order[i]].v, "), already given at ", place(order[i - 1])));
  }

  Graph g;
  g.n_ = n;
  g.edges_.reserve(edges.size());
  for (std::size_t k : order) g.edges_.push_back(edges[k]);
  std::vector<int> degree(n, 0);
  for (const Edge& e : g.edges_) {
    ++degree[e.u];
    ++degree[e.v];
  }
  g.offsets_.assign(n + 1, 0);
  for (int i = 0; i < n; ++i) g.offsets_[i + 1] = g.offsets_[i] + degree[i];
  g.adjacency_.resize(g.offsets_[n]);
  std::vector<int> fill(g.offsets_.begin(), g.offsets_.end() - 1);
  for (const Edge& e : g.edges_) {
    g.adjacency_[fill[e.u]++] = e.v;
    g.adjacency_[fill[e.v]++] = e.u;
  }
  for (int i = 0; i < n; ++i)
    std::sort(g.adjacency_.begin() + g.offsets_[i], g.adjacency_.begin() + g.offsets_[i + 1]);
  return g;
}

std::span<const int> Graph::neighbors(int peer) const {
  return {adjacency_.data() + offsets_[peer], static_cast<std::size_t>(degree(peer))};
}

int Graph::min_degree() const {
  int d = n_ > 0 ? degree(0) : 0;
  for (int i = 1; i < n_; ++i) d = std::min(d, degree(i));
  return d;
}

int Graph::max_degree() const {
  int d = 0;
  for (int i = 0; i < n_; ++i) d = std::max(d, degree(i));
  return d;
}

bool Graph::has_edge(int a, int b) const {
  if (a < 0 || b < 0 || a >= n_ || b >= n_) return false;
  auto nb = neighbors(a);
  return std::binary_search(nb.begin(), nb.end(), b);
}

std::vector<int> Graph::components(int* count) const {
  std::vector<int> label(n_, -1);
  std::vector<int> stack;
  int next = 0;
  for (int start = 0; start < n_; ++start) {
    if (label[start] >= 0) continue;
    label[start] = next;
    stack.push_back(start);
    while (!stack.empty()) {
      int p = stack.back();
      stack.pop_back();
      for (int q : neighbors(p))
        if (label[q] < 0) {
          label[q] = next;
          stack.push_back(q);
        }
    }
    ++next;
  }
  if (count) *count = next;
  return label;
}

bool Graph::is_connected() const {
  int count = 0;
  components(&count);
  return count == 1;
}

bool Graph::is_bipartite() const {
  std::vector<int> side(n_, -1);
  std::vector<int> stack;
  for (int start = 0; start < n_; ++start) {
    if (side[start] >= 0) continue;
    side[start] = 0;
    stack.push_back(start);
    while (!stack.empty()) {
      int p = stack.back();
      stack.pop_back();
      for (int q : neighbors(p)) {
        if (side[q] < 0) {
          side[q] = 1 - side[p];
          stack.push_back(q);
        } else if (side[q] == side[p]) {
          return false;
        }
      }
    }
  }
  return true;
}

}  // namespace peertrain::topology
