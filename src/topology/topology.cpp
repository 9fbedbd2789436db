#include "peertrain/topology/topology.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "peertrain/core/error.h"
#include "peertrain/topology/formats.h"

namespace peertrain::topology {
namespace {

constexpr long long kMaxEdges = 100'000'000;

// Names places in the YAML text for error messages.
class Reader {
 public:
  Reader(std::string origin, int max_peers) : origin_(std::move(origin)), max_peers_(max_peers) {}
  int max_peers() const { return max_peers_; }

  std::string at(const YAML::Node& node) const {
    const YAML::Mark mark = node.Mark();
    if (mark.is_null() || mark.line < 0) return origin_;
    return str(origin_, ":", mark.line + 1);
  }
  [[noreturn]] void fail(const YAML::Node& node, const std::string& message) const {
    throw Error(ErrorKind::kInvalidArgument, str(at(node), ": ", message));
  }

  void only_keys(const YAML::Node& map, const std::string& context, std::initializer_list<const char*> allowed) const {
    if (!map.IsMap()) fail(map, str(context, " must be a mapping"));
    for (const auto& entry : map) {
      const std::string key = entry.first.Scalar();
      if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return key == a; })) {
        std::string list;
        for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        fail(entry.first, str("unknown key '", key, "' in ", context, "; expected one of ", list));
      }
    }
  }

  std::string text(const YAML::Node& node, const std::string& key) const {
    if (!node.IsScalar()) fail(node, str(key, " must be a single value"));
    return node.Scalar();
  }
  long long integer(const YAML::Node& node, const std::string& key, long long lo, long long hi) const {
    const std::string s = text(node, key);
    long long value = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || ptr != s.data() + s.size()) fail(node, str(key, " must be an integer, got '", s, "'"));
    if (value < lo || value > hi) fail(node, str(key, " = ", value, " is out of range ", lo, "..", hi));
    return value;
  }
  double real(const YAML::Node& node, const std::string& key) const {
    const std::string s = text(node, key);
    double value = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || ptr != s.data() + s.size()) {
      if (s == ".nan" || s == ".NaN" || s == "nan" || s == "NaN") return std::nan("");
      fail(node, str(key, " must be a number, got '", s, "'"));
    }
    return value;
  }
  double nonnegative(const YAML::Node& node, const std::string& key) const {
    const double v = real(node, key);
    if (!std::isfinite(v) || v < 0) fail(node, str(key, " must be a finite number >= 0, got ", v));
    return v;
  }
  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
  int max_peers_;
};

long long expected_edges(const std::string& generator, const GeneratorParams& p) {
  const long long n = p.n;
  if (generator == "complete") return n * (n - 1) / 2;
  if (generator == "erdos-renyi") return static_cast<long long>(p.p * static_cast<double>(n) * (n - 1) / 2);
  if (generator == "random-regular") return n * p.degree / 2;
  if (generator == "small-world") return n * p.k / 2;
  return 0;
}

GraphSource read_directed_generator(const Reader& r, const YAML::Node& node, Digraph* digraph) {
  GraphSource source;
  source.generator = node["generator"].Scalar();
  GeneratorParams& p = source.params;
  for (const char* key : {"rows", "cols", "degree", "k", "p", "edges", "file"})
    if (node[key]) r.fail(node[key], str(key, " is not a parameter of generator '", source.generator, "'"));
  if (!node["n"]) r.fail(node, str("generator '", source.generator, "' needs n"));
  p.n = static_cast<int>(r.integer(node["n"], "graph.n", 1, r.max_peers()));
  if (is_redrawn(source.generator)) {
    if (!node["fanout"])
      r.fail(node, str("generator '", source.generator, "' needs fanout, the arcs out of each peer"));
    p.fanout = static_cast<int>(r.integer(node["fanout"], "graph.fanout", 1, r.max_peers()));
    if (node["seed"]) p.seed = static_cast<std::uint64_t>(r.integer(node["seed"], "graph.seed", 0, INT64_MAX));
    if (static_cast<long long>(p.n) * (p.n - 1) / 2 > std::min<long long>(kMaxEdges, 10LL * r.max_peers()))
      r.fail(node, str("generator '", source.generator, "' links every pair; n = ", p.n, " is too many"));
  } else if (node["fanout"] || node["seed"]) {
    r.fail(node[node["fanout"] ? "fanout" : "seed"], str("generator '", source.generator, "' takes only n"));
  } else if (static_cast<long long>(p.n) * one_peer_exponential_period(p.n) >
             std::min<long long>(kMaxEdges, 10LL * r.max_peers())) {
    // (Both exponential graphs have n·⌈log₂ n⌉ arcs, the one-peer one over its period.)
    r.fail(node, str("generator '", source.generator, "' with n = ", p.n, " would make ",
                     static_cast<long long>(p.n) * one_peer_exponential_period(p.n), " arcs, more than the ",
                     std::min<long long>(kMaxEdges, 10LL * r.max_peers()), " supported"));
  }
  try {
    *digraph = generate_directed(source.generator, p, 0);
  } catch (const Error& e) {
    r.fail(node, e.what());
  }
  return source;
}

// directed: true with an explicit arc list, or an edge-list file whose lines are arcs.
GraphSource read_directed_arcs(const Reader& r, const YAML::Node& node, Digraph* digraph, const std::string& base_dir) {
  GraphSource source;
  if (node["generator"])
    r.fail(node["generator"],
           str("generator '", node["generator"].Scalar(), "' is undirected; the directed ones are ",
               "directed-exponential, one-peer-directed-exponential, random-out, random-regular-out"));
  if (!node["n"]) r.fail(node, "a directed graph needs n, the number of peers");
  const int n = static_cast<int>(r.integer(node["n"], "graph.n", 1, r.max_peers()));
  source.params.n = n;
  std::vector<Arc> arcs;
  if (node["edges"]) {
    source.kind = GraphSource::Kind::kEdges;
    const YAML::Node& list = node["edges"];
    if (!list.IsSequence()) r.fail(list, "graph.edges must be a list of [from, to] pairs");
    std::vector<YAML::Node> places;
    for (const auto& pair : list) {
      if (!pair.IsSequence() || pair.size() != 2) r.fail(pair, "each arc must be a pair [from, to]");
      arcs.push_back({static_cast<int>(r.integer(pair[0], "arc tail", INT32_MIN, INT32_MAX)),
                      static_cast<int>(r.integer(pair[1], "arc head", INT32_MIN, INT32_MAX))});
      places.push_back(pair);
    }
    *digraph = Digraph::from_arcs(n, std::move(arcs), r.origin(),
                                  [&](std::size_t k) { return str("line ", places[k].Mark().line + 1); });
    return source;
  }
  source.kind = GraphSource::Kind::kFile;
  source.file = r.text(node["file"], "graph.file");
  std::filesystem::path file(source.file);
  if (file.is_relative()) file = std::filesystem::path(base_dir) / file;
  try {
    const EdgeListData data = read_graph_file(file.string());
    for (const Edge& e : data.edges) arcs.push_back({e.u, e.v});
    *digraph = Digraph::from_arcs(n, std::move(arcs), file.string(),
                                  [&](std::size_t k) { return str("line ", data.lines[k]); });
  } catch (const Error& e) {
    throw Error(e.kind(), str(e.what(), " (graph.file at ", r.at(node["file"]), ")"));
  }
  return source;
}

// The graph section: an undirected Graph, or, when directed (directed: true or a directed
// generator), a Digraph and *directed set.
GraphSource read_graph_source(const Reader& r, const YAML::Node& node, Graph* graph, Digraph* digraph, bool* directed,
                              const std::string& base_dir) {
  r.only_keys(node, "graph",
              {"generator", "n", "rows", "cols", "degree", "k", "p", "seed", "fanout", "directed", "edges", "file"});
  const long long max_edges = std::min<long long>(kMaxEdges, 10LL * r.max_peers());
  const int kinds = (node["generator"] ? 1 : 0) + (node["edges"] ? 1 : 0) + (node["file"] ? 1 : 0);
  if (kinds != 1)
    r.fail(node, "graph needs exactly one of 'generator', 'edges' or 'file'");
  GraphSource source;
  GeneratorParams& p = source.params;
  if (node["n"]) p.n = static_cast<int>(r.integer(node["n"], "graph.n", 1, r.max_peers()));
  const std::string directed_flag = node["directed"] ? r.text(node["directed"], "graph.directed") : "false";
  if (directed_flag != "true" && directed_flag != "false")
    r.fail(node["directed"], str("graph.directed must be true or false, got '", directed_flag, "'"));
  *directed = directed_flag == "true";
  if (node["generator"] && is_directed_generator(r.text(node["generator"], "graph.generator"))) {
    if (node["directed"] && !*directed)
      r.fail(node["directed"], str("generator '", node["generator"].Scalar(), "' makes a directed graph"));
    *directed = true;
    return read_directed_generator(r, node, digraph);
  }
  if (*directed) return read_directed_arcs(r, node, digraph, base_dir);

  if (node["generator"]) {
    source.kind = GraphSource::Kind::kGenerator;
    source.generator = r.text(node["generator"], "graph.generator");
    const auto& names = generator_names();
    if (std::find(names.begin(), names.end(), source.generator) == names.end()) {
      std::string list;
      for (const auto& name : names) list += (list.empty() ? "" : ", ") + name;
      for (const auto& name : directed_generator_names()) list += ", " + name;
      r.fail(node["generator"], str("unknown generator '", source.generator, "'; expected one of ", list));
    }
    if (node["fanout"])
      r.fail(node["fanout"], str("fanout is for random-out and random-regular-out, not '", source.generator, "'"));
    if (node["rows"]) p.rows = static_cast<int>(r.integer(node["rows"], "graph.rows", 1, r.max_peers()));
    if (node["cols"]) p.cols = static_cast<int>(r.integer(node["cols"], "graph.cols", 1, r.max_peers()));
    if (node["degree"]) p.degree = static_cast<int>(r.integer(node["degree"], "graph.degree", 1, r.max_peers()));
    if (node["k"]) p.k = static_cast<int>(r.integer(node["k"], "graph.k", 1, r.max_peers()));
    if (node["p"]) p.p = r.real(node["p"], "graph.p");
    if (node["seed"]) p.seed = static_cast<std::uint64_t>(r.integer(node["seed"], "graph.seed", 0, INT64_MAX));
    if (source.generator == "torus") {
      if (!node["rows"] || !node["cols"]) r.fail(node, "generator 'torus' needs rows and cols");
      if (static_cast<long long>(p.rows) * p.cols > r.max_peers())
        r.fail(node, str("torus rows*cols = ", static_cast<long long>(p.rows) * p.cols, " is more than the ",
                         r.max_peers(), " peers supported"));
    } else if (!node["n"]) {
      r.fail(node, str("generator '", source.generator, "' needs n"));
    }
    if (expected_edges(source.generator, p) > max_edges)
      r.fail(node, str("generator '", source.generator, "' with these parameters would make about ",
                       expected_edges(source.generator, p), " edges, more than the ", max_edges, " supported"));
    try {
      *graph = generate(source.generator, p);
    } catch (const Error& e) {
      r.fail(node, e.what());
    }
    if (source.generator == "torus") source.params.n = graph->num_peers();
  } else if (node["edges"]) {
    source.kind = GraphSource::Kind::kEdges;
    if (!node["n"]) r.fail(node, "an explicit edge list needs n, the number of peers");
    const YAML::Node& list = node["edges"];
    if (!list.IsSequence()) r.fail(list, "graph.edges must be a list of [u, v] pairs");
    std::vector<Edge> edges;
    std::vector<YAML::Node> places;
    for (const auto& pair : list) {
      if (!pair.IsSequence() || pair.size() != 2) r.fail(pair, "each edge must be a pair [u, v]");
      edges.push_back({static_cast<int>(r.integer(pair[0], "edge endpoint", INT32_MIN, INT32_MAX)),
                       static_cast<int>(r.integer(pair[1], "edge endpoint", INT32_MIN, INT32_MAX))});
      places.push_back(pair);
    }
    *graph = Graph::from_edges(p.n, std::move(edges), r.origin(),
                               [&](std::size_t k) { return str("line ", places[k].Mark().line + 1); });
  } else {
    source.kind = GraphSource::Kind::kFile;
    source.file = r.text(node["file"], "graph.file");
    std::filesystem::path file(source.file);
    if (file.is_relative()) file = std::filesystem::path(base_dir) / file;
    try {
      *graph = read_graph_file(file.string()).to_graph(file.string(), p.n);
    } catch (const Error& e) {
      throw Error(e.kind(), str(e.what(), " (graph.file at ", r.at(node["file"]), ")"));
    }
  }
  return source;
}

std::vector<MatrixEntry> read_explicit_matrix(const Reader& r, const YAML::Node& node, int n,
                                             const std::string& base_dir) {
  std::vector<MatrixEntry> entries;
  if (node.IsMap()) {
    r.only_keys(node, "matrix", {"file"});
    if (!node["file"]) r.fail(node, "matrix needs a list of rows or {file: W.mtx}");
    std::filesystem::path file(r.text(node["file"], "matrix.file"));
    if (file.is_relative()) file = std::filesystem::path(base_dir) / file;
    const EdgeListData data = parse_matrix_market(read_text_file(file.string(), "matrix file"), file.string());
    if (data.n != n)
      r.fail(node, str("matrix file ", file.string(), " is ", data.n, "x", data.n, " but the graph has ", n, " peers"));
    for (std::size_t k = 0; k < data.edges.size(); ++k) {
      const std::string where = str(file.string(), ":", data.lines[k]);
      entries.push_back({data.edges[k].u, data.edges[k].v, data.values[k], where});
      entries.push_back({data.edges[k].v, data.edges[k].u, data.values[k], where});
    }
    for (std::size_t i = 0; i < data.diagonal.size(); ++i)
      entries.push_back({static_cast<int>(i), static_cast<int>(i), data.diagonal[i], file.string()});
    return entries;
  }
  if (!node.IsSequence()) r.fail(node, "matrix must be a list of rows, or {file: W.mtx}");
  if (static_cast<int>(node.size()) != n)
    r.fail(node, str("matrix has ", node.size(), " rows but the graph has ", n, " peers; expected ", n, "x", n));
  for (int i = 0; i < n; ++i) {
    const YAML::Node& row = node[i];
    if (!row.IsSequence() || static_cast<int>(row.size()) != n)
      r.fail(row, str("matrix row ", i, " has ", row.IsSequence() ? row.size() : 1, " entries; expected ", n));
    for (int j = 0; j < n; ++j) {
      const double value = r.real(row[j], str("matrix[", i, "][", j, "]"));
      if (value != 0.0 || !std::isfinite(value)) entries.push_back({i, j, value, r.at(row[j])});
    }
  }
  return entries;
}

std::vector<PeerAddress> read_peers(const Reader& r, const YAML::Node& node, int n) {
  if (!node.IsSequence()) r.fail(node, "peers must be a list of {id, host, port}");
  std::vector<PeerAddress> peers(n);
  std::vector<bool> seen(n, false);
  for (const auto& entry : node) {
    r.only_keys(entry, "a peer", {"id", "host", "port"});
    if (!entry["id"] || !entry["host"] || !entry["port"]) r.fail(entry, "each peer needs id, host and port");
    const int id = static_cast<int>(r.integer(entry["id"], "peer id", 0, n - 1));
    if (seen[id]) r.fail(entry, str("peer ", id, " is listed twice"));
    seen[id] = true;
    peers[id] = {id, r.text(entry["host"], "host"), static_cast<int>(r.integer(entry["port"], "port", 1, 65535))};
    if (peers[id].host.empty()) r.fail(entry["host"], "host is empty");
  }
  for (int i = 0; i < n; ++i)
    if (!seen[i]) r.fail(node, str("peer ", i, " has no address; list every peer 0..", n - 1, " or none"));
  return peers;
}

LinkProperties read_link(const Reader& r, const YAML::Node& node, const std::string& context) {
  LinkProperties link;
  if (node["latency_ms"]) link.latency_ms = r.nonnegative(node["latency_ms"], context + ".latency_ms");
  if (node["bandwidth_mbps"]) link.bandwidth_mbps = r.nonnegative(node["bandwidth_mbps"], context + ".bandwidth_mbps");
  return link;
}

std::string describe_components(const Graph& g) {
  int count = 0;
  const auto label = g.components(&count);
  int other = 0;
  while (label[other] == 0) ++other;
  return str("the graph is disconnected: ", count, " components; for example peer ", other,
             " cannot reach peer 0");
}

template <typename T>
void hash_bytes(std::uint64_t& h, const T& value) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(&value);
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    h ^= bytes[i];
    h *= 0x100000001b3ULL;
  }
}

}  // namespace

bool Topology::time_varying() const {
  return source.kind == GraphSource::Kind::kGenerator && is_time_varying(source.generator);
}

bool Topology::redrawn() const { return source.kind == GraphSource::Kind::kGenerator && is_redrawn(source.generator); }

int Topology::period() const {
  if (!time_varying() || redrawn()) return 1;
  return one_peer_exponential_period(num_peers());
}

Graph Topology::graph_at(long long step) const {
  if (!time_varying()) return graph;
  if (directed) return redrawn() ? graph : digraph_at(step).support();
  return one_peer_exponential_step(num_peers(), step);
}

Digraph Topology::digraph_at(long long step) const {
  PEERTRAIN_CHECK(directed, "digraph_at() of an undirected topology");
  return time_varying() ? generate_directed(source.generator, source.params, step) : digraph;
}

SparseMatrix Topology::mixing_at(long long step) const {
  if (!time_varying()) return mixing;
  if (directed) return column_stochastic_weights(digraph_at(step));
  return build_mixing_matrix(graph_at(step), weights);
}

double Topology::compute_slowdown(int peer) const {
  for (const auto& [p, slowdown] : stragglers)
    if (p == peer) return slowdown;
  return 1.0;
}

LinkProperties Topology::link(int a, int b) const {
  for (const auto& o : link_overrides)
    if ((o.a == a && o.b == b) || (o.a == b && o.b == a)) return o.properties;
  return default_link;
}

std::uint64_t Topology::fingerprint() const {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  hash_bytes(h, num_peers());
  hash_bytes(h, period());
  if (directed) {
    // Redrawn graphs are functions of these; a static or periodic one's arcs are in P.
    hash_bytes(h, source.params.fanout);
    hash_bytes(h, source.params.seed);
    for (char c : source.generator) hash_bytes(h, c);
  }
  for (const Edge& e : graph.edges()) {
    hash_bytes(h, e.u);
    hash_bytes(h, e.v);
  }
  for (int t = 0; t < period(); ++t) {
    const SparseMatrix w = mixing_at(t);
    for (int j = 0; j < w.outerSize(); ++j)
      for (SparseMatrix::InnerIterator it(w, j); it; ++it) {
        hash_bytes(h, static_cast<int>(it.row()));
        hash_bytes(h, j);
        hash_bytes(h, it.value());
      }
  }
  return h;
}

Topology make_topology(std::string name, GraphSource source, Graph graph, WeightScheme weights,
                       const std::optional<SparseMatrix>& explicit_w) {
  Topology t;
  t.name = std::move(name);
  t.source = std::move(source);
  t.graph = std::move(graph);
  t.weights = weights;
  const std::string what = t.name.empty() ? "topology" : "topology '" + t.name + "'";
  if (!t.graph.is_connected()) throw Error(ErrorKind::kInvalidArgument, str(what, ": ", describe_components(t.graph)));
  if (weights == WeightScheme::kExplicit) {
    if (t.time_varying())
      throw Error(ErrorKind::kInvalidArgument, str(what, ": a time-varying topology cannot take an explicit W"));
    if (!explicit_w) throw Error(ErrorKind::kInvalidArgument, str(what, ": weights 'explicit' need a matrix"));
    t.mixing = *explicit_w;
  } else {
    if (explicit_w) throw Error(ErrorKind::kInvalidArgument, str(what, ": a matrix is given but weights are '",
                                                                to_string(weights), "', not 'explicit'"));
    t.mixing = build_mixing_matrix(t.graph_at(0), weights);
  }
  if (t.time_varying()) {
    for (int step = t.period() - 1; step >= 0; --step)
      t.check = validate_mixing_matrix(t.graph_at(step), t.mixing_at(step), str(what, ", W at step ", step));
  } else {
    t.check = validate_mixing_matrix(t.graph, t.mixing, what);
  }
  for (int i = 0; i < t.num_peers(); ++i) t.peers.push_back({i, "127.0.0.1", kDefaultBasePort + i});
  return t;
}

Topology make_directed_topology(std::string name, GraphSource source, Digraph digraph) {
  Topology t;
  t.name = std::move(name);
  t.source = std::move(source);
  t.directed = true;
  t.weights = WeightScheme::kColumnStochastic;
  const std::string what = t.name.empty() ? "topology" : "topology '" + t.name + "'";
  const int n = digraph.num_peers();
  t.digraph = std::move(digraph);
  if (t.redrawn()) {
    // Any peer may draw any other: every pair is linked. Each draw is checked as it is made.
    std::vector<Edge> all;
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b) all.push_back({a, b});
    t.graph = Graph::from_edges(n, std::move(all), what);
    t.mixing = column_stochastic_weights(t.digraph);
    t.check = validate_column_stochastic(t.digraph, t.mixing, str(what, ", P at step 0"));
  } else {
    // (period() reads n from the graph, which is not set yet.)
    const int period = t.time_varying() ? one_peer_exponential_period(n) : 1;
    std::vector<Digraph> steps;
    for (int step = 0; step < period; ++step) steps.push_back(t.digraph_at(step));
    const Digraph all = union_of(steps);
    if (n > 1 && !all.strongly_connected())
      throw Error(ErrorKind::kInvalidArgument,
                  str(what, ": ", all.describe_unreachable(), t.time_varying() ? " (over one period)" : "",
                      "; push-sum reaches the average only over a strongly connected graph"));
    t.graph = all.support();
    for (int step = period - 1; step >= 0; --step) {
      const Digraph& g = steps[static_cast<std::size_t>(step)];
      t.mixing = column_stochastic_weights(g);
      t.check = validate_column_stochastic(g, t.mixing, t.time_varying() ? str(what, ", P at step ", step) : what);
    }
  }
  for (int i = 0; i < n; ++i) t.peers.push_back({i, "127.0.0.1", kDefaultBasePort + i});
  return t;
}

Topology parse_topology(const std::string& text, const std::string& origin, const std::string& base_dir,
                        int max_peers) {
  Reader r(origin, max_peers);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(ErrorKind::kParse, str(origin, ":", e.mark.line + 1, ":", e.mark.column + 1, ": malformed YAML: ", e.msg));
  }
  if (!root.IsMap())
    throw Error(ErrorKind::kParse, str(origin, ": expected a YAML mapping with at least a 'graph' key"));
  try {
    r.only_keys(root, "the topology file", {"name", "graph", "weights", "matrix", "peers", "links", "stragglers"});
    if (!root["graph"]) throw Error(ErrorKind::kInvalidArgument, str(origin, ": missing the 'graph' section"));
    Graph graph;
    Digraph digraph;
    bool directed = false;
    GraphSource source = read_graph_source(r, root["graph"], &graph, &digraph, &directed, base_dir);

    WeightScheme weights = directed ? WeightScheme::kColumnStochastic : WeightScheme::kMetropolis;
    if (root["weights"]) {
      try {
        weights = parse_weight_scheme(r.text(root["weights"], "weights"));
      } catch (const Error& e) {
        r.fail(root["weights"], e.what());
      }
    }
    if (directed && weights != WeightScheme::kColumnStochastic)
      r.fail(root["weights"],
             str("a directed graph takes weights: column-stochastic (push-sum), not '", to_string(weights), "'"));
    if (directed && root["matrix"])
      r.fail(root["matrix"], "a directed graph takes no matrix: its P has uniform out-weights");
    std::optional<SparseMatrix> explicit_w;
    if (root["matrix"]) {
      if (weights != WeightScheme::kExplicit)
        r.fail(root["matrix"], str("a matrix is given but weights are '", to_string(weights), "'; set weights: explicit"));
      explicit_w = mixing_from_entries(graph, read_explicit_matrix(r, root["matrix"], graph.num_peers(), base_dir),
                                       r.at(root["matrix"]));
    } else if (weights == WeightScheme::kExplicit) {
      r.fail(root["weights"], "weights 'explicit' need a 'matrix' section");
    }
    std::string name = root["name"] ? r.text(root["name"], "name") : std::filesystem::path(origin).stem().string();
    Topology t;
    try {
      t = directed ? make_directed_topology(name, std::move(source), std::move(digraph))
                   : make_topology(name, std::move(source), std::move(graph), weights, explicit_w);
    } catch (const Error& e) {
      throw Error(e.kind(), str(origin, ": ", e.what()));
    }
    t.path = origin;
    const int n = t.num_peers();
    if (root["peers"]) t.peers = read_peers(r, root["peers"], n);
    if (root["links"]) {
      const YAML::Node& links = root["links"];
      r.only_keys(links, "links", {"default", "overrides", "node_bandwidth_mbps", "node_ingress_mbps"});
      if (links["node_bandwidth_mbps"])
        t.node_bandwidth_mbps = r.nonnegative(links["node_bandwidth_mbps"], "links.node_bandwidth_mbps");
      if (links["node_ingress_mbps"])
        t.node_ingress_mbps = r.nonnegative(links["node_ingress_mbps"], "links.node_ingress_mbps");
      if (links["default"]) {
        r.only_keys(links["default"], "links.default", {"latency_ms", "bandwidth_mbps"});
        t.default_link = read_link(r, links["default"], "links.default");
      }
      if (links["overrides"]) {
        if (!links["overrides"].IsSequence()) r.fail(links["overrides"], "links.overrides must be a list");
        for (const auto& o : links["overrides"]) {
          r.only_keys(o, "a link override", {"between", "latency_ms", "bandwidth_mbps"});
          const YAML::Node& between = o["between"];
          if (!between || !between.IsSequence() || between.size() != 2)
            r.fail(o, "a link override needs between: [a, b]");
          LinkOverride lo;
          lo.a = static_cast<int>(r.integer(between[0], "link endpoint", 0, n - 1));
          lo.b = static_cast<int>(r.integer(between[1], "link endpoint", 0, n - 1));
          if (lo.a == lo.b) r.fail(between, "a link joins two different peers");
          lo.properties = read_link(r, o, "link override");
          t.link_overrides.push_back(lo);
        }
      }
    }
    if (root["stragglers"]) {
      if (!root["stragglers"].IsSequence()) r.fail(root["stragglers"], "stragglers must be a list of {peer, slowdown}");
      for (const auto& s : root["stragglers"]) {
        r.only_keys(s, "a straggler", {"peer", "slowdown"});
        if (!s["peer"] || !s["slowdown"]) r.fail(s, "a straggler needs peer and slowdown");
        const int peer = static_cast<int>(r.integer(s["peer"], "straggler peer", 0, n - 1));
        const double slowdown = r.nonnegative(s["slowdown"], "straggler slowdown");
        if (slowdown < 1)
          r.fail(s["slowdown"], str("straggler slowdown must be at least 1 (1: full speed), got ", slowdown));
        if (t.compute_slowdown(peer) != 1) r.fail(s, str("peer ", peer, " is named twice in stragglers"));
        t.stragglers.emplace_back(peer, slowdown);
      }
    }
    return t;
  } catch (const YAML::Exception& e) {
    throw Error(ErrorKind::kParse, str(origin, ":", e.mark.line + 1, ": ", e.msg));
  }
}

Topology load_topology_file(const std::string& path) {
  const std::string text = read_text_file(path, "topology file");
  return parse_topology(text, path, std::filesystem::path(path).parent_path().string());
}

std::string to_yaml(const Topology& t, const WriteOptions& options) {
  std::ostringstream out;
  out.precision(17);
  out << "name: " << t.name << "\n";
  out << "graph:\n";
  const bool as_generator = t.source.kind == GraphSource::Kind::kGenerator && !options.explicit_edges;
  if (as_generator) {
    const GeneratorParams& p = t.source.params;
    out << "  generator: " << t.source.generator << "\n";
    if (t.source.generator == "torus") {
      out << "  rows: " << p.rows << "\n  cols: " << p.cols << "\n";
    } else {
      out << "  n: " << t.num_peers() << "\n";
    }
    if (p.degree) out << "  degree: " << p.degree << "\n";
    if (p.k) out << "  k: " << p.k << "\n";
    if (p.p >= 0) out << "  p: " << p.p << "\n";
    if (p.fanout) out << "  fanout: " << p.fanout << "\n";
    if (t.source.generator == "random-regular" || t.source.generator == "erdos-renyi" ||
        t.source.generator == "small-world" || is_redrawn(t.source.generator))
      out << "  seed: " << p.seed << "\n";
  } else if (t.source.kind == GraphSource::Kind::kFile && !options.explicit_edges) {
    out << "  n: " << t.num_peers() << (t.directed ? "\n  directed: true" : "") << "\n  file: " << t.source.file
        << "\n";
  } else if (t.directed) {
    if (t.time_varying())
      throw Error(ErrorKind::kInvalidArgument, "a time-varying topology is written as its generator, not as arcs");
    out << "  n: " << t.num_peers() << "\n  directed: true\n  edges: [";
    for (std::size_t k = 0; k < t.digraph.num_arcs(); ++k)
      out << (k ? ", " : "") << "[" << t.digraph.arcs()[k].from << ", " << t.digraph.arcs()[k].to << "]";
    out << "]\n";
  } else {
    if (t.time_varying())
      throw Error(ErrorKind::kInvalidArgument, "a time-varying topology is written as its generator, not as edges");
    out << "  n: " << t.num_peers() << "\n  edges: [";
    for (std::size_t k = 0; k < t.graph.num_edges(); ++k)
      out << (k ? ", " : "") << "[" << t.graph.edges()[k].u << ", " << t.graph.edges()[k].v << "]";
    out << "]\n";
  }
  out << "weights: " << to_string(t.weights) << "\n";
  if (t.weights == WeightScheme::kExplicit) {
    out << "matrix:\n";
    const Eigen::MatrixXd dense(t.mixing);
    for (int i = 0; i < dense.rows(); ++i) {
      out << "  - [";
      for (int j = 0; j < dense.cols(); ++j) out << (j ? ", " : "") << dense(i, j);
      out << "]\n";
    }
  }
  bool default_peers = true;
  for (const auto& p : t.peers)
    default_peers = default_peers && p.host == "127.0.0.1" && p.port == kDefaultBasePort + p.id;
  if (!default_peers) {
    out << "peers:\n";
    for (const auto& p : t.peers) out << "  - {id: " << p.id << ", host: " << p.host << ", port: " << p.port << "}\n";
  }
  if (!(t.default_link == LinkProperties{}) || !t.link_overrides.empty() || t.node_bandwidth_mbps > 0 ||
      t.node_ingress_mbps > 0) {
    out << "links:\n  default: {latency_ms: " << t.default_link.latency_ms
        << ", bandwidth_mbps: " << t.default_link.bandwidth_mbps << "}\n";
    if (t.node_bandwidth_mbps > 0) out << "  node_bandwidth_mbps: " << t.node_bandwidth_mbps << "\n";
    if (t.node_ingress_mbps > 0) out << "  node_ingress_mbps: " << t.node_ingress_mbps << "\n";
    if (!t.link_overrides.empty()) {
      out << "  overrides:\n";
      for (const auto& o : t.link_overrides)
        out << "    - {between: [" << o.a << ", " << o.b << "], latency_ms: " << o.properties.latency_ms
            << ", bandwidth_mbps: " << o.properties.bandwidth_mbps << "}\n";
    }
  }
  if (!t.stragglers.empty()) {
    out << "stragglers:\n";
    for (const auto& [peer, slowdown] : t.stragglers)
      out << "  - {peer: " << peer << ", slowdown: " << slowdown << "}\n";
  }
  return out.str();
}

}  // namespace peertrain::topology
