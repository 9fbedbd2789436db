#include "peertrain/topology/digraph.h"

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "peertrain/topology/generators.h"

namespace peertrain::topology {
namespace {

// Offsets and targets of a CSR list built from (key, value) pairs sorted by key.
void build_csr(int n, const std::vector<std::pair<int, int>>& pairs, std::vector<int>& offsets, std::vector<int>& out) {
  offsets.assign(static_cast<std::size_t>(n) + 1, 0);
  for (const auto& [key, value] : pairs) ++offsets[static_cast<std::size_t>(key) + 1];
  std::partial_sum(offsets.begin(), offsets.end(), offsets.begin());
  out.resize(pairs.size());
  std::vector<int> fill(offsets.begin(), offsets.end() - 1);
  for (const auto& [key, value] : pairs) out[static_cast<std::size_t>(fill[static_cast<std::size_t>(key)]++)] = value;
  for (int i = 0; i < n; ++i) std::sort(out.begin() + offsets[i], out.begin() + offsets[i + 1]);
}

// Peers reached from peer 0 following `next` (out-arcs, or in-arcs for who reaches 0).
std::vector<char> reached_from_zero(int n, const std::function<std::span<const int>(int)>& next) {
  std::vector<char> seen(static_cast<std::size_t>(n), 0);
  std::vector<int> stack{0};
  seen[0] = 1;
  while (!stack.empty()) {
    const int peer = stack.back();
    stack.pop_back();
    for (int q : next(peer))
      if (!seen[static_cast<std::size_t>(q)]) {
        seen[static_cast<std::size_t>(q)] = 1;
        stack.push_back(q);
      }
  }
  return seen;
}

void require_fanout(std::string_view generator, int n, int fanout) {
  if (fanout < 1 || fanout > n - 1)
    throw Error(ErrorKind::kInvalidArgument,
                str("generator '", generator, "': fanout must be 1..", n - 1, " for n = ", n, ", got ", fanout));
}

// The step's own stream: the same (seed, step) on every peer, a different one each step.
Rng step_rng(std::uint64_t seed, long long step, std::uint64_t salt) {
  return Rng(seed * 0x9e3779b97f4a7c15ULL ^ (static_cast<std::uint64_t>(step) + 1) * 0xbf58476d1ce4e5b9ULL ^ salt);
}

}  // namespace

Digraph Digraph::from_arcs(int n, std::vector<Arc> arcs, const std::string& what, const EdgeLocator& where) {
  auto place = [&](std::size_t k) { return where ? where(k) : str("arc #", k); };
  if (n < 1) throw Error(ErrorKind::kInvalidArgument, str(what, ": the number of peers must be at least 1, got ", n));
  for (std::size_t k = 0; k < arcs.size(); ++k) {
    const Arc& a = arcs[k];
    if (a.from < 0 || a.from >= n || a.to < 0 || a.to >= n)
      throw Error(ErrorKind::kInvalidArgument,
                  str(what, ", ", place(k), ": arc [", a.from, ", ", a.to, "] is out of range; peers are 0..", n - 1));
    if (a.from == a.to)
      throw Error(ErrorKind::kInvalidArgument, str(what, ", ", place(k), ": self-loop [", a.from, ", ", a.to,
                                                   "]; a peer keeps its own share anyway"));
  }
  std::vector<std::size_t> order(arcs.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  auto less = [&](std::size_t a, std::size_t b) {
    return arcs[a].from != arcs[b].from ? arcs[a].from < arcs[b].from : arcs[a].to < arcs[b].to;
  };
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return less(a, b) || (!less(b, a) && a < b); });
  for (std::size_t i = 1; i < order.size(); ++i)
    if (arcs[order[i]] == arcs[order[i - 1]])
      throw Error(ErrorKind::kInvalidArgument,
                  str(what, ", ", place(order[i]), ": duplicate arc [", arcs[order[i]].from, ", ", arcs[order[i]].to,
                      "], already given at ", place(order[i - 1])));
  Digraph g;
  g.n_ = n;
  std::vector<std::pair<int, int>> outs, ins;
  for (std::size_t k : order) {
    g.arcs_.push_back(arcs[k]);
    outs.emplace_back(arcs[k].from, arcs[k].to);
    ins.emplace_back(arcs[k].to, arcs[k].from);
  }
  build_csr(n, outs, g.out_offsets_, g.out_);
  build_csr(n, ins, g.in_offsets_, g.in_);
  return g;
}

std::span<const int> Digraph::out(int peer) const {
  return {out_.data() + out_offsets_[peer], static_cast<std::size_t>(out_offsets_[peer + 1] - out_offsets_[peer])};
}

std::span<const int> Digraph::in(int peer) const {
  return {in_.data() + in_offsets_[peer], static_cast<std::size_t>(in_offsets_[peer + 1] - in_offsets_[peer])};
}

bool Digraph::has_arc(int from, int to) const {
  const auto targets = out(from);
  return std::binary_search(targets.begin(), targets.end(), to);
}

int Digraph::unreachable(bool* from_zero) const {
  const auto forward = reached_from_zero(n_, [this](int p) { return out(p); });
  const auto backward = reached_from_zero(n_, [this](int p) { return in(p); });
  for (int i = 0; i < n_; ++i) {
    if (!forward[static_cast<std::size_t>(i)] || !backward[static_cast<std::size_t>(i)]) {
      if (from_zero) *from_zero = !forward[static_cast<std::size_t>(i)];
      return i;
    }
  }
  return -1;
}

std::string Digraph::describe_unreachable() const {
  bool from_zero = false;
  const int peer = unreachable(&from_zero);
  if (peer < 0) return {};
  return from_zero ? str("the directed graph is not strongly connected: nothing peer 0 sends reaches peer ", peer)
                   : str("the directed graph is not strongly connected: nothing peer ", peer, " sends reaches peer 0");
}

Graph Digraph::support() const {
  std::vector<Edge> edges;
  for (const Arc& a : arcs_)
    if (a.from < a.to || !has_arc(a.to, a.from)) edges.push_back({std::min(a.from, a.to), std::max(a.from, a.to)});
  return Graph::from_edges(n_, std::move(edges), "the links of a directed graph");
}

Digraph union_of(const std::vector<Digraph>& graphs) {
  PEERTRAIN_CHECK(!graphs.empty(), "union of no digraphs");
  std::vector<Arc> arcs;
  for (const Digraph& g : graphs) arcs.insert(arcs.end(), g.arcs().begin(), g.arcs().end());
  std::sort(arcs.begin(), arcs.end(),
            [](const Arc& a, const Arc& b) { return a.from != b.from ? a.from < b.from : a.to < b.to; });
  arcs.erase(std::unique(arcs.begin(), arcs.end()), arcs.end());
  return Digraph::from_arcs(graphs.front().num_peers(), std::move(arcs), "a union of directed graphs");
}

SparseMatrix column_stochastic_weights(const Digraph& g) {
  const int n = g.num_peers();
  std::vector<Eigen::Triplet<double, int>> entries;
  entries.reserve(g.num_arcs() + static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const double share = 1.0 / (1.0 + g.out_degree(i));
    entries.emplace_back(i, i, share);
    for (int j : g.out(i)) entries.emplace_back(j, i, share);
  }
  SparseMatrix p(n, n);
  p.setFromTriplets(entries.begin(), entries.end());
  p.makeCompressed();
  return p;
}

MixingCheck validate_column_stochastic(const Digraph& g, const SparseMatrix& p, const std::string& what) {
  const int n = g.num_peers();
  if (p.rows() != n || p.cols() != n)
    throw Error(ErrorKind::kInvalidArgument, str(what, ": P is ", p.rows(), "x", p.cols(), "; expected ", n, "x", n));
  MixingCheck check;
  check.min_entry = 1.0;
  std::vector<double> row_sum(static_cast<std::size_t>(n), 0.0);
  for (int j = 0; j < n; ++j) {
    double column = 0;
    for (SparseMatrix::InnerIterator it(p, j); it; ++it) {
      const int i = static_cast<int>(it.row());
      const double x = it.value();
      if (!std::isfinite(x) || x < 0)
        throw Error(ErrorKind::kInvalidArgument,
                    str(what, ": P[", i, "][", j, "] = ", x, " is not a finite number >= 0"));
      if (x != 0 && i != j && !g.has_arc(j, i))
        throw Error(ErrorKind::kInvalidArgument,
                    str(what, ": P[", i, "][", j, "] = ", x, " but there is no arc from ", j, " to ", i));
      column += x;
      row_sum[static_cast<std::size_t>(i)] += x;
      check.min_entry = std::min(check.min_entry, x);
    }
    check.max_column_error = std::max(check.max_column_error, std::abs(column - 1));
    if (std::abs(column - 1) > kStochasticTolerance)
      throw Error(ErrorKind::kInvalidArgument, str(what, ": P is not column-stochastic: column ", j, " sums to ",
                                                   column, ", expected 1 within ", kStochasticTolerance));
  }
  for (double s : row_sum) check.max_row_error = std::max(check.max_row_error, std::abs(s - 1));
  return check;
}

const std::vector<std::string>& directed_generator_names() {
  static const std::vector<std::string> names = {"directed-exponential", "one-peer-directed-exponential", "random-out",
                                                 "random-regular-out"};
  return names;
}

bool is_directed_generator(std::string_view generator) {
  const auto& names = directed_generator_names();
  return std::find(names.begin(), names.end(), generator) != names.end();
}

bool is_redrawn(std::string_view generator) { return generator == "random-out" || generator == "random-regular-out"; }

Digraph directed_exponential(int n) {
  std::vector<Arc> arcs;
  for (int i = 0; i < n; ++i)
    for (long long hop = 1; hop < n; hop *= 2) arcs.push_back({i, static_cast<int>((i + hop) % n)});
  return Digraph::from_arcs(n, std::move(arcs), "directed-exponential");
}

int default_fanout(int peers) { return std::clamp(one_peer_exponential_period(peers), 1, std::max(1, peers - 1)); }

Digraph one_peer_directed_exponential_step(int n, long long step) {
  std::vector<Arc> arcs;
  if (n > 1) {
    const long long hop = 1LL << (step % one_peer_exponential_period(n));
    for (int i = 0; i < n; ++i) arcs.push_back({i, static_cast<int>((i + hop) % n)});
  }
  return Digraph::from_arcs(n, std::move(arcs), "one-peer-directed-exponential");
}

Digraph random_out_step(int n, int fanout, std::uint64_t seed, long long step) {
  require_fanout("random-out", n, fanout);
  Rng rng = step_rng(seed, step, 0x6f7574);
  std::vector<Arc> arcs;
  arcs.reserve(static_cast<std::size_t>(n) * static_cast<std::size_t>(fanout));
  std::vector<int> others(static_cast<std::size_t>(n - 1));
  for (int i = 0; i < n; ++i) {
    // A partial Fisher–Yates shuffle of the others picks s distinct ones uniformly.
    for (int k = 0; k < n - 1; ++k) others[static_cast<std::size_t>(k)] = k < i ? k : k + 1;
    for (int k = 0; k < fanout; ++k) {
      const auto pick = static_cast<std::size_t>(k) + rng.uniform_below(static_cast<std::uint64_t>(n - 1 - k));
      std::swap(others[static_cast<std::size_t>(k)], others[pick]);
      arcs.push_back({i, others[static_cast<std::size_t>(k)]});
    }
  }
  return Digraph::from_arcs(n, std::move(arcs), "random-out");
}

Digraph random_regular_out_step(int n, int fanout, std::uint64_t seed, long long step) {
  require_fanout("random-regular-out", n, fanout);
  Rng rng = step_rng(seed, step, 0x726567);
  // s distinct offsets from 1..n−1, and a random relabelling π: π(k) → π(k + offset).
  std::vector<int> offsets(static_cast<std::size_t>(n - 1));
  std::iota(offsets.begin(), offsets.end(), 1);
  for (int k = 0; k < fanout; ++k)
    std::swap(offsets[static_cast<std::size_t>(k)],
              offsets[static_cast<std::size_t>(k) + rng.uniform_below(static_cast<std::uint64_t>(n - 1 - k))]);
  std::vector<int> label(static_cast<std::size_t>(n));
  std::iota(label.begin(), label.end(), 0);
  for (int k = n - 1; k > 0; --k)
    std::swap(label[static_cast<std::size_t>(k)], label[rng.uniform_below(static_cast<std::uint64_t>(k + 1))]);
  std::vector<Arc> arcs;
  for (int k = 0; k < n; ++k)
    for (int o = 0; o < fanout; ++o)
      arcs.push_back({label[static_cast<std::size_t>(k)],
                      label[static_cast<std::size_t>((k + offsets[static_cast<std::size_t>(o)]) % n)]});
  return Digraph::from_arcs(n, std::move(arcs), "random-regular-out");
}

double steps_per_e_fold(double c) {
  if (c <= 0) return 0;
  if (c >= 1) return std::numeric_limits<double>::infinity();
  return 1.0 / -std::log(c);
}

namespace {

// The second-largest eigenvalue modulus of a dense column-stochastic matrix (its largest is 1).
double dense_slem(const Eigen::MatrixXd& p) {
  if (p.rows() < 2) return 0;
  const Eigen::VectorXcd eigenvalues = Eigen::EigenSolver<Eigen::MatrixXd>(p, false).eigenvalues();
  std::vector<double> moduli(static_cast<std::size_t>(eigenvalues.size()));
  for (Eigen::Index k = 0; k < eigenvalues.size(); ++k) moduli[static_cast<std::size_t>(k)] = std::abs(eigenvalues[k]);
  std::sort(moduli.begin(), moduli.end(), std::greater<>());
  return moduli[1];
}

void require_dense_size(Eigen::Index n) {
  if (n > kDirectedSpectrumMaxPeers)
    throw Error(ErrorKind::kInvalidArgument, str("the spectrum of a directed graph is computed densely, up to ",
                                                 kDirectedSpectrumMaxPeers, " peers; this one has ", n));
}

}  // namespace

DirectedSpectrum analyze_directed(const SparseMatrix& p) {
  require_dense_size(p.rows());
  const auto begin = std::chrono::steady_clock::now();
  DirectedSpectrum s;
  s.peers = static_cast<int>(p.rows());
  s.slem = dense_slem(Eigen::MatrixXd(p));
  s.mixing_steps = steps_per_e_fold(s.slem);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  return s;
}

SequenceSpectrum analyze_sequence(const std::function<SparseMatrix(long long)>& p_at, int window, int draws) {
  PEERTRAIN_CHECK(window >= 1 && draws >= 1, "a sequence spectrum needs a window and a draw");
  const auto begin = std::chrono::steady_clock::now();
  std::vector<double> per_step;
  for (int d = 0; d < draws; ++d) {
    const long long first = static_cast<long long>(d) * window;
    Eigen::MatrixXd product = Eigen::MatrixXd(p_at(first));
    require_dense_size(product.rows());
    for (int t = 1; t < window; ++t) product = Eigen::MatrixXd(p_at(first + t)) * product;
    // Exact averaging (the one-peer graph's period for n a power of two) leaves eigenvalues
    // of rounding size, which the root would blow up.
    const double slem = dense_slem(product);
    per_step.push_back(slem < 1e-12 ? 0.0 : std::pow(slem, 1.0 / window));
  }
  std::sort(per_step.begin(), per_step.end());
  SequenceSpectrum s;
  s.window = window;
  s.draws = draws;
  s.slem = std::accumulate(per_step.begin(), per_step.end(), 0.0) / draws;
  auto quantile = [&](double q) {
    return per_step[static_cast<std::size_t>(std::lround(q * static_cast<double>(per_step.size() - 1)))];
  };
  s.low = quantile(0.025);
  s.high = quantile(0.975);
  s.mixing_steps = steps_per_e_fold(s.slem);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  return s;
}

}  // namespace peertrain::topology
