#include "peertrain/topology/generators.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"

namespace peertrain::topology {
namespace {

[[noreturn]] void bad(std::string_view generator, const std::string& message) {
  throw Error(ErrorKind::kInvalidArgument, str("generator '", generator, "': ", message));
}

void require_peers(std::string_view generator, int n, int at_least = 1) {
  if (n < at_least) bad(generator, str("needs n >= ", at_least, ", got n = ", n));
}

std::uint64_t pair_key(int a, int b) {
  if (a > b) std::swap(a, b);
  return (static_cast<std::uint64_t>(a) << 32) | static_cast<std::uint32_t>(b);
}

// Collects edges while dropping repeats, for generators whose formula can name an edge twice.
class EdgeSet {
 public:
  void add(int a, int b) {
    if (a != b && seen_.insert(pair_key(a, b)).second) edges_.push_back({std::min(a, b), std::max(a, b)});
  }
  std::vector<Edge> take() { return std::move(edges_); }

 private:
  std::unordered_set<std::uint64_t> seen_;
  std::vector<Edge> edges_;
};

Graph ring(int n) {
  EdgeSet set;
  for (int i = 0; i < n; ++i) set.add(i, (i + 1) % n);
  return Graph::from_edges(n, set.take(), "ring");
}

Graph torus(const GeneratorParams& p) {
  if (p.rows < 1 || p.cols < 1) bad("torus", str("needs rows >= 1 and cols >= 1, got ", p.rows, "x", p.cols));
  const int n = p.rows * p.cols;
  if (p.n != 0 && p.n != n) bad("torus", str("n = ", p.n, " does not match rows*cols = ", n));
  EdgeSet set;
  for (int r = 0; r < p.rows; ++r)
    for (int c = 0; c < p.cols; ++c) {
      const int i = r * p.cols + c;
      set.add(i, r * p.cols + (c + 1) % p.cols);
      set.add(i, ((r + 1) % p.rows) * p.cols + c);
    }
  return Graph::from_edges(n, set.take(), "torus");
}

bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

Graph hypercube(int n) {
  if (!is_power_of_two(n)) bad("hypercube", str("needs n to be a power of two, got ", n));
  std::vector<Edge> edges;
  for (int i = 0; i < n; ++i)
    for (int bit = 1; bit < n; bit <<= 1)
      if ((i ^ bit) > i) edges.push_back({i, i ^ bit});
  return Graph::from_edges(n, std::move(edges), "hypercube");
}

Graph exponential(int n) {
  EdgeSet set;
  for (int i = 0; i < n; ++i)
    for (long long hop = 1; hop < n; hop <<= 1) {
      set.add(i, static_cast<int>((i + hop) % n));
      set.add(i, static_cast<int>((i - hop % n + n) % n));
    }
  return Graph::from_edges(n, set.take(), "exponential");
}

Graph complete(int n) {
  std::vector<Edge> edges;
  edges.reserve(static_cast<std::size_t>(n) * (n - 1) / 2);
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) edges.push_back({i, j});
  return Graph::from_edges(n, std::move(edges), "complete");
}

Graph star(int n) {
  std::vector<Edge> edges;
  for (int i = 1; i < n; ++i) edges.push_back({0, i});
  return Graph::from_edges(n, std::move(edges), "star");
}

// Configuration model: shuffle n·d half-edges and pair them, then remove self-loops and
// repeated edges with random degree-preserving double-edge swaps. Re-draws if the result
// is disconnected. Linear in n·d, so 100,000 peers take milliseconds.
Graph random_regular(const GeneratorParams& p) {
  const int n = p.n, d = p.degree;
  require_peers("random-regular", n, 2);
  if (d < 1 || d >= n) bad("random-regular", str("needs 1 <= degree < n, got degree ", d, " with n = ", n));
  if ((static_cast<long long>(n) * d) % 2 != 0) bad("random-regular", str("needs n*degree even, got ", n, "*", d));
  Rng rng(p.seed);
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::vector<int> stubs;
    stubs.reserve(static_cast<std::size_t>(n) * d);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < d; ++j) stubs.push_back(i);
    for (std::size_t i = stubs.size() - 1; i > 0; --i) std::swap(stubs[i], stubs[rng.uniform_below(i + 1)]);
    std::vector<Edge> edges(stubs.size() / 2);
    std::unordered_multiset<std::uint64_t> count;
    count.reserve(edges.size() * 2);
    for (std::size_t e = 0; e < edges.size(); ++e) {
      edges[e] = {stubs[2 * e], stubs[2 * e + 1]};
      count.insert(pair_key(edges[e].u, edges[e].v));
    }
    auto is_bad = [&](const Edge& e) { return e.u == e.v || count.count(pair_key(e.u, e.v)) > 1; };
    std::vector<std::size_t> bad_edges;
    for (std::size_t e = 0; e < edges.size(); ++e)
      if (is_bad(edges[e])) bad_edges.push_back(e);
    long long budget = 1000LL * (static_cast<long long>(bad_edges.size()) + 10);
    while (!bad_edges.empty() && budget-- > 0) {
      const std::size_t a = bad_edges.back();
      if (!is_bad(edges[a])) {
        bad_edges.pop_back();
        continue;
      }
      const std::size_t b = rng.uniform_below(edges.size());
      if (b == a) continue;
      Edge ea = edges[a], eb = edges[b];
      Edge na{ea.u, eb.u}, nb{ea.v, eb.v};
      if (rng.uniform() < 0.5) std::swap(nb.u, nb.v);  // the other way to rewire the pair
      if (na.u == na.v || nb.u == nb.v || count.count(pair_key(na.u, na.v)) ||
          count.count(pair_key(nb.u, nb.v)) || pair_key(na.u, na.v) == pair_key(nb.u, nb.v))
        continue;
      count.erase(count.find(pair_key(ea.u, ea.v)));
      count.erase(count.find(pair_key(eb.u, eb.v)));
      count.insert(pair_key(na.u, na.v));
      count.insert(pair_key(nb.u, nb.v));
      edges[a] = na;
      edges[b] = nb;
    }
    if (!bad_edges.empty()) continue;
    Graph g = Graph::from_edges(n, std::move(edges), "random-regular");
    if (g.is_connected()) return g;
  }
  bad("random-regular", str("no connected simple graph found in 100 draws (n = ", n, ", degree = ", d, ")"));
}

// G(n, p) drawn with geometric skips (Batagelj & Brandes), so sparse graphs cost O(n + m).
Graph erdos_renyi(const GeneratorParams& p) {
  const int n = p.n;
  require_peers("erdos-renyi", n);
  if (!(p.p > 0.0 && p.p <= 1.0)) bad("erdos-renyi", str("needs 0 < p <= 1, got p = ", p.p));
  Rng rng(p.seed);
  if (p.p >= 1.0) return complete(n);
  constexpr int kMaxDraws = 1000;
  for (int attempt = 0; attempt < kMaxDraws; ++attempt) {
    std::vector<Edge> edges;
    const double log_q = std::log1p(-p.p);
    long long v = 1, w = -1;
    while (v < n) {
      double r = rng.uniform();
      w += 1 + static_cast<long long>(std::floor(std::log1p(-r) / log_q));
      while (w >= v && v < n) {
        w -= v;
        ++v;
      }
      if (v < n) edges.push_back({static_cast<int>(w), static_cast<int>(v)});
    }
    Graph g = Graph::from_edges(n, std::move(edges), "erdos-renyi");
    if (g.is_connected()) return g;
  }
  bad("erdos-renyi", str("no connected graph in ", kMaxDraws, " draws with n = ", n, ", p = ", p.p,
                         "; connectivity needs p above about ln(n)/n = ", std::log(std::max(n, 2)) / n));
}

Graph small_world(const GeneratorParams& p) {
  const int n = p.n, k = p.k;
  require_peers("small-world", n, 3);
  if (k < 2 || k % 2 != 0 || k >= n) bad("small-world", str("needs an even k with 2 <= k < n, got k = ", k));
  if (!(p.p >= 0.0 && p.p <= 1.0)) bad("small-world", str("needs 0 <= p <= 1, got p = ", p.p));
  Rng rng(p.seed);
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::unordered_set<std::uint64_t> present;
    std::vector<Edge> edges;
    for (int i = 0; i < n; ++i)
      for (int j = 1; j <= k / 2; ++j) {
        edges.push_back({i, (i + j) % n});
        present.insert(pair_key(i, (i + j) % n));
      }
    for (Edge& e : edges) {
      if (rng.uniform() >= p.p) continue;
      for (int tries = 0; tries < 32; ++tries) {
        const int target = static_cast<int>(rng.uniform_below(n));
        if (target == e.u || present.count(pair_key(e.u, target))) continue;
        present.erase(pair_key(e.u, e.v));
        present.insert(pair_key(e.u, target));
        e.v = target;
        break;
      }
    }
    Graph g = Graph::from_edges(n, std::move(edges), "small-world");
    if (g.is_connected()) return g;
  }
  bad("small-world", str("no connected graph in 100 draws (n = ", n, ", k = ", k, ", p = ", p.p, ")"));
}

}  // namespace

const std::vector<std::string>& generator_names() {
  static const std::vector<std::string> names = {
      "ring",         "torus",          "hypercube",   "exponential", "one-peer-exponential",
      "complete",     "star",           "random-regular", "erdos-renyi", "small-world"};
  return names;
}

bool is_time_varying(std::string_view generator) {
  return generator == "one-peer-exponential" || generator == "one-peer-directed-exponential" || is_redrawn(generator);
}

Digraph generate_directed(std::string_view generator, const GeneratorParams& p, long long step) {
  if (p.n < 1) bad(generator, str("needs n >= 1, got n = ", p.n));
  if (generator == "directed-exponential") return directed_exponential(p.n);
  if (generator == "one-peer-directed-exponential") return one_peer_directed_exponential_step(p.n, step);
  if (generator == "random-out") return random_out_step(p.n, p.fanout, p.seed, step);
  if (generator == "random-regular-out") return random_regular_out_step(p.n, p.fanout, p.seed, step);
  std::string known;
  for (const auto& name : directed_generator_names()) known += (known.empty() ? "" : ", ") + name;
  bad(generator, str("is not a directed generator; expected one of ", known));
}

int one_peer_exponential_period(int n) {
  int period = 0;
  while ((1LL << period) < n) ++period;
  return std::max(period, 1);
}

Graph one_peer_exponential_step(int n, long long step) {
  require_peers("one-peer-exponential", n);
  const int bit = 1 << static_cast<int>(step % one_peer_exponential_period(n));
  std::vector<Edge> edges;
  for (int i = 0; i < n; ++i)
    if ((i ^ bit) > i && (i ^ bit) < n) edges.push_back({i, i ^ bit});
  return Graph::from_edges(n, std::move(edges), "one-peer-exponential");
}

Graph generate(std::string_view generator, const GeneratorParams& params) {
  const int n = params.n;
  if (generator == "torus") return torus(params);
  if (generator == "random-regular") return random_regular(params);
  if (generator == "erdos-renyi") return erdos_renyi(params);
  if (generator == "small-world") return small_world(params);
  require_peers(generator, n);
  if (generator == "ring") return ring(n);
  if (generator == "hypercube") return hypercube(n);
  if (generator == "exponential") return exponential(n);
  if (generator == "complete") return complete(n);
  if (generator == "star") return star(n);
  if (generator == "one-peer-exponential") {
    // The union of one period: every pair that ever averages.
    EdgeSet set;
    for (int t = 0; t < one_peer_exponential_period(n); ++t) {
      const Graph step = one_peer_exponential_step(n, t);
      for (const Edge& e : step.edges()) set.add(e.u, e.v);
    }
    return Graph::from_edges(n, set.take(), "one-peer-exponential");
  }
  std::string known;
  for (const auto& name : generator_names()) known += (known.empty() ? "" : ", ") + name;
  throw Error(ErrorKind::kInvalidArgument, str("unknown generator '", generator, "'; expected one of ", known));
}

}  // namespace peertrain::topology
