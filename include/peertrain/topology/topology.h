// A topology: the graph of peers, its mixing matrix W (per step, for time-varying graphs),
// where each peer listens, and the emulated properties of each link. Loaded from and
// written to the YAML topology file described in docs/topology-file.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "peertrain/topology/digraph.h"
#include "peertrain/topology/generators.h"
#include "peertrain/topology/graph.h"
#include "peertrain/topology/mixing.h"

namespace peertrain::topology {

struct PeerAddress {
  int id = 0;
  std::string host;
  int port = 0;
};

struct LinkProperties {
  double latency_ms = 0;      // one way; 0 means none added
  double bandwidth_mbps = 0;  // cap enforced by the sender; 0 means unlimited
  friend bool operator==(const LinkProperties&, const LinkProperties&) = default;
};

struct LinkOverride {
  int a = 0;
  int b = 0;
  LinkProperties properties;
};

struct GraphSource {
  enum class Kind { kGenerator, kEdges, kFile };
  Kind kind = Kind::kGenerator;
  std::string generator;  // kGenerator
  GeneratorParams params; // kGenerator
  std::string file;       // kFile, as written in the topology file (relative to it)
};

inline constexpr int kDefaultBasePort = 29500;

class Topology {
 public:
  std::string name;
  std::string path;  // the file it was read from, or empty
  GraphSource source;
  Graph graph;       // static graph; for a time-varying one, the union over one period
  // A directed topology (graph: {directed: true, ...} or a directed generator): `digraph`
  // holds its arcs (a time-varying one's at step 0), `graph` the links they need (an edge
  // wherever an arc runs either way; every pair for a redrawn one), `mixing` the
  // column-stochastic P of push-sum, and `weights` is kColumnStochastic.
  bool directed = false;
  Digraph digraph;
  WeightScheme weights = WeightScheme::kMetropolis;
  SparseMatrix mixing;  // W (P when directed); for a time-varying topology, at step 0
  MixingCheck check;    // how close W (at step 0) is to the rules it was validated against
  std::vector<PeerAddress> peers;
  LinkProperties default_link;
  std::vector<LinkOverride> link_overrides;
  // Cap on each peer's total outgoing traffic, shared by its links like one network card
  // (0 = none). A parameter server's links then share one card, as in Lian et al. 2017.
  double node_bandwidth_mbps = 0;
  double node_ingress_mbps = 0;  // the card's incoming capacity (links.node_ingress_mbps); 0: none
  // Emulated slow machines: (peer, slowdown) takes slowdown times as long for each
  // gradient (the trainer sleeps the difference), to study stragglers.
  std::vector<std::pair<int, double>> stragglers;
  double compute_slowdown(int peer) const;  // 1 unless named in stragglers

  int num_peers() const { return graph.num_peers(); }
  bool time_varying() const;
  // Whether W(t) is drawn anew every step from the file's seed (random-out,
  // random-regular-out): it has no period, and period() is 1.
  bool redrawn() const;
  int period() const;  // steps after which W(t) repeats; 1 when static or redrawn
  Graph graph_at(long long step) const;
  Digraph digraph_at(long long step) const;  // directed topologies only
  SparseMatrix mixing_at(long long step) const;
  LinkProperties link(int a, int b) const;
  // FNV-1a over the graph, the weights of every step in one period and the period: two peers
  // agree to train together only when their fingerprints match.
  std::uint64_t fingerprint() const;
};

// Builds and validates a topology from parts (graph, scheme, explicit W when the scheme
// is explicit). Peers default to 127.0.0.1:29500+i.
Topology make_topology(std::string name, GraphSource source, Graph graph, WeightScheme weights,
                       const std::optional<SparseMatrix>& explicit_w = std::nullopt);

// A directed topology (push-sum's column-stochastic P with uniform out-weights) from its
// arcs, or its generator's step-0 draw. Throws Error naming the topology when the digraph
// (a periodic one's union over a period) is not strongly connected.
Topology make_directed_topology(std::string name, GraphSource source, Digraph digraph);

// Reads, parses and validates a topology file. Every error names the file and, where it
// can, the line: "error: topology/bad.yaml:7: ...".
Topology load_topology_file(const std::string& path);
// Parses YAML text; `origin` names it in errors and `base_dir` resolves relative files.
// `max_peers` bounds what a file may ask for (the fuzzer lowers it to stay fast).
inline constexpr int kMaxPeers = 10'000'000;
Topology parse_topology(const std::string& text, const std::string& origin, const std::string& base_dir,
                        int max_peers = kMaxPeers);

struct WriteOptions {
  bool explicit_edges = false;   // write the edge list even for a generated graph
};
std::string to_yaml(const Topology& topology, const WriteOptions& options = {});

}  // namespace peertrain::topology
