#include "peertrain/topology/topology.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "peertrain/topology/formats.h"
#include "peertrain/topology/spectrum.h"
#include "test_util.h"

namespace peertrain::topology {
namespace {

namespace fs = std::filesystem;

Topology parse(const std::string& yaml) { return parse_topology(yaml, "t.yaml", "."); }

TEST(TopologyFile, EveryShippedExampleParsesAndValidates) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(PEERTRAIN_SOURCE_DIR) / "topology")) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    const Topology t = load_topology_file(entry.path().string());
    EXPECT_TRUE(t.graph.is_connected());
    for (int step = 0; step < t.period(); ++step) {
      if (t.directed)
        validate_column_stochastic(t.digraph_at(step), t.mixing_at(step), entry.path().string());
      else
        validate_mixing_matrix(t.graph_at(step), t.mixing_at(step), entry.path().string());
    }
    EXPECT_EQ(static_cast<int>(t.peers.size()), t.num_peers());
    ++count;
  }
  EXPECT_GE(count, 9);
}

TEST(TopologyFile, Ring16HasTheDocumentedGap) {
  const Topology t = load_topology_file(std::string(PEERTRAIN_SOURCE_DIR) + "/topology/ring16.yaml");
  EXPECT_NEAR(analyze_spectrum(t.mixing, t.graph).spectral_gap, 0.0507, 5e-5);
}

TEST(TopologyFile, DefaultsAndExplicitPeersAndLinks) {
  const Topology t = parse(R"(
name: demo
graph: {generator: ring, n: 4}
peers:
  - {id: 1, host: hostb, port: 7001}
  - {id: 0, host: hosta, port: 7000}
  - {id: 2, host: hosta, port: 7002}
  - {id: 3, host: hostb, port: 7003}
links:
  default: {latency_ms: 5, bandwidth_mbps: 100}
  overrides: [{between: [0, 1], latency_ms: 20, bandwidth_mbps: 10}]
)");
  EXPECT_EQ(t.name, "demo");
  EXPECT_EQ(t.weights, WeightScheme::kMetropolis);
  EXPECT_EQ(t.peers[1].host, "hostb");
  EXPECT_EQ(t.peers[1].port, 7001);
  EXPECT_EQ(t.link(1, 0).latency_ms, 20);
  EXPECT_EQ(t.link(2, 3).bandwidth_mbps, 100);
  EXPECT_EQ(t.node_bandwidth_mbps, 0);
  EXPECT_EQ(parse("graph: {generator: ring, n: 3}\nlinks: {node_bandwidth_mbps: 250}").node_bandwidth_mbps, 250);
  const Topology slow = parse("graph: {generator: ring, n: 3}\nstragglers: [{peer: 2, slowdown: 5}]");
  EXPECT_EQ(slow.compute_slowdown(2), 5);
  EXPECT_EQ(slow.compute_slowdown(1), 1);
  const Topology d = parse("graph: {generator: ring, n: 3}");
  EXPECT_EQ(d.name, "t");
  EXPECT_EQ(d.peers[2].host, "127.0.0.1");
  EXPECT_EQ(d.peers[2].port, kDefaultBasePort + 2);
}

TEST(TopologyFile, WritesWhatItReads) {
  for (const char* yaml :
       {"graph: {generator: torus, rows: 3, cols: 4}\nweights: max-degree",
        "graph: {generator: random-regular, n: 20, degree: 3, seed: 5}",
        "graph: {generator: one-peer-exponential, n: 8}",
        "graph: {n: 4, edges: [[0, 1], [1, 2], [2, 3]]}\nweights: explicit\n"
        "matrix: [[0.5, 0.5, 0, 0], [0.5, 0, 0.5, 0], [0, 0.5, 0, 0.5], [0, 0, 0.5, 0.5]]",
        "graph: {generator: ring, n: 4}\npeers: [{id: 0, host: a, port: 1}, {id: 1, host: a, port: 2}, "
        "{id: 2, host: b, port: 1}, {id: 3, host: b, port: 2}]\nlinks: {overrides: [{between: [0, 3], latency_ms: 2}]}",
        "graph: {generator: star, n: 5}\nlinks: {node_bandwidth_mbps: 100}",
        "graph: {generator: ring, n: 4}\nstragglers: [{peer: 2, slowdown: 5}, {peer: 0, slowdown: 1.5}]"}) {
    SCOPED_TRACE(yaml);
    const Topology a = parse(yaml);
    const Topology b = parse(to_yaml(a));
    EXPECT_EQ(a.fingerprint(), b.fingerprint());
    EXPECT_EQ(to_yaml(a), to_yaml(b));
    if (!a.time_varying()) {
      WriteOptions edges;
      edges.explicit_edges = true;
      EXPECT_EQ(parse(to_yaml(a, edges)).fingerprint(), a.fingerprint());
    }
  }
}

TEST(TopologyFile, FingerprintSeparatesGraphsAndWeights) {
  const auto ring = parse("graph: {generator: ring, n: 8}").fingerprint();
  EXPECT_NE(ring, parse("graph: {generator: ring, n: 8}\nweights: best-constant").fingerprint());
  // On a regular graph max-degree and Metropolis give the same W, hence the same print.
  EXPECT_EQ(ring, parse("graph: {generator: ring, n: 8}\nweights: max-degree").fingerprint());
  EXPECT_NE(ring, parse("graph: {generator: ring, n: 9}").fingerprint());
  EXPECT_NE(ring, parse("graph: {generator: exponential, n: 8}").fingerprint());
  EXPECT_EQ(ring, parse("name: other\ngraph: {generator: ring, n: 8}").fingerprint());
}

TEST(TopologyFile, TimeVaryingGraphChangesEveryStep) {
  const Topology t = parse("graph: {generator: one-peer-exponential, n: 8}");
  EXPECT_TRUE(t.time_varying());
  EXPECT_EQ(t.period(), 3);
  EXPECT_DOUBLE_EQ(t.mixing_at(0).coeff(0, 1), 0.5);
  EXPECT_DOUBLE_EQ(t.mixing_at(1).coeff(0, 2), 0.5);
  EXPECT_DOUBLE_EQ(t.mixing_at(5).coeff(0, 4), 0.5);
  EXPECT_DOUBLE_EQ(t.mixing_at(1).coeff(0, 1), 0.0);
}

TEST(TopologyFile, RelativeGraphAndMatrixFilesResolveAgainstTheTopologyFile) {
  const fs::path dir = fs::temp_directory_path() / "peertrain_topology_file_test";
  fs::create_directories(dir / "sub");
  write_text_file((dir / "sub" / "peers.txt").string(), "0 1\n1 2\n2 0\n");
  write_text_file((dir / "sub" / "w.mtx").string(),
                  "%%MatrixMarket matrix coordinate real symmetric\n3 3 6\n1 1 0.5\n2 2 0.5\n3 3 0.5\n"
                  "2 1 0.25\n3 1 0.25\n3 2 0.25\n");
  write_text_file((dir / "sub" / "t.yaml").string(), "graph: {file: peers.txt}\nweights: explicit\nmatrix: {file: w.mtx}\n");
  const Topology t = load_topology_file((dir / "sub" / "t.yaml").string());
  EXPECT_EQ(t.num_peers(), 3);
  EXPECT_DOUBLE_EQ(t.mixing.coeff(2, 0), 0.25);
  write_text_file((dir / "t2.yaml").string(), "graph: {file: sub/missing.txt}\n");
  EXPECT_ERROR_MENTIONS(load_topology_file((dir / "t2.yaml").string()), "sub/missing.txt", "cannot read", "t2.yaml:1");
  fs::remove_all(dir);
}

struct BadCase {
  const char* name;
  const char* yaml;
  std::vector<const char*> mentions;
};

TEST(TopologyFile, BadInputIsRejectedWithFileLineAndReason) {
  const std::vector<BadCase> cases = {
      {"malformed", "graph: {generator: ring, n: 4\nweights: metropolis\n", {"t.yaml:", "malformed YAML"}},
      {"not a mapping", "just some words", {"t.yaml", "mapping"}},
      {"no graph", "name: x\n", {"t.yaml", "missing the 'graph'"}},
      {"unknown key", "graph: {generator: ring, n: 4}\nweight: metropolis\n", {"t.yaml:2", "unknown key 'weight'"}},
      {"unknown generator", "graph:\n  generator: mesh\n  n: 4\n", {"t.yaml:2", "unknown generator 'mesh'"}},
      {"unknown weights",
       "graph: {generator: ring, n: 4}\nweights: fancy\n",
       {"t.yaml:2", "unknown weight scheme 'fancy'"}},
      {"n < 1", "graph:\n  generator: ring\n  n: 0\n", {"t.yaml:3", "graph.n = 0", "out of range"}},
      {"n not a number", "graph: {generator: ring, n: four}\n", {"t.yaml:1", "integer", "'four'"}},
      {"two sources", "graph: {generator: ring, n: 4, edges: [[0, 1]]}\n", {"exactly one"}},
      {"edge out of range",
       "graph:\n  n: 3\n  edges:\n    - [0, 1]\n    - [1, 3]\n",
       {"t.yaml", "line 5", "out of range"}},
      {"self-loop", "graph:\n  n: 3\n  edges:\n    - [0, 1]\n    - [2, 2]\n", {"line 5", "self-loop"}},
      {"duplicate",
       "graph:\n  n: 3\n  edges:\n    - [0, 1]\n    - [1, 2]\n    - [1, 0]\n",
       {"line 6", "duplicate", "line 4"}},
      {"disconnected", "graph: {n: 4, edges: [[0, 1], [2, 3]]}\n", {"t.yaml", "disconnected", "peer 2"}},
      {"matrix wrong shape",
       "graph: {n: 2, edges: [[0, 1]]}\nweights: explicit\nmatrix: [[0.5, 0.5]]\n",
       {"t.yaml:3", "1 rows", "2x2"}},
      {"matrix row wrong length",
       "graph: {n: 2, edges: [[0, 1]]}\nweights: explicit\nmatrix:\n  - [0.5, 0.5]\n  - [0.5]\n",
       {"t.yaml:5", "row 1", "expected 2"}},
      {"matrix not stochastic",
       "graph: {n: 2, edges: [[0, 1]]}\nweights: explicit\nmatrix: [[0.6, 0.5], [0.5, 0.5]]\n",
       {"t.yaml", "not doubly stochastic", "row 0"}},
      {"matrix NaN",
       "graph: {n: 2, edges: [[0, 1]]}\nweights: explicit\nmatrix:\n  - [.nan, 0.5]\n  - [0.5, 0.5]\n",
       {"t.yaml:4", "not finite"}},
      {"matrix off edge",
       "graph: {n: 3, edges: [[0, 1], [1, 2]]}\nweights: explicit\n"
       "matrix:\n  - [0.4, 0.5, 0.1]\n  - [0.5, 0, 0.5]\n  - [0.1, 0.5, 0.4]\n",
       {"t.yaml:4", "W[0][2]", "not linked"}},
      {"matrix without explicit",
       "graph: {n: 2, edges: [[0, 1]]}\nmatrix: [[0.5, 0.5], [0.5, 0.5]]\n",
       {"weights: explicit"}},
      {"explicit without matrix", "graph: {n: 2, edges: [[0, 1]]}\nweights: explicit\n", {"t.yaml:2", "'matrix'"}},
      {"peer listed twice",
       "graph: {generator: ring, n: 2}\npeers:\n  - {id: 0, host: a, port: 1}\n  - {id: 0, host: a, port: 2}\n",
       {"t.yaml:4", "listed twice"}},
      {"peer missing",
       "graph: {generator: ring, n: 2}\npeers: [{id: 0, host: a, port: 1}]\n",
       {"peer 1 has no address"}},
      {"bad port", "graph: {generator: ring, n: 1}\npeers: [{id: 0, host: a, port: 70000}]\n", {"port = 70000"}},
      {"negative latency",
       "graph: {generator: ring, n: 2}\nlinks: {default: {latency_ms: -1}}\n",
       {"latency_ms", ">= 0"}},
      {"link to nobody",
       "graph: {generator: ring, n: 2}\nlinks: {overrides: [{between: [0, 5]}]}\n",
       {"link endpoint = 5"}},
      {"huge complete", "graph: {generator: complete, n: 9000000}\n", {"edges", "supported"}},
      {"uniform on irregular", "graph: {generator: star, n: 4}\nweights: uniform-neighbors\n", {"regular"}},
      {"time-varying explicit",
       "graph: {generator: one-peer-exponential, n: 2}\nweights: explicit\nmatrix: [[0, 1], [1, 0]]\n",
       {"time-varying"}},
      {"torus without rows", "graph: {generator: torus, n: 4}\n", {"rows and cols"}},
      {"straggler too fast",
       "graph: {generator: ring, n: 3}\nstragglers:\n  - {peer: 1, slowdown: 0.5}\n",
       {"t.yaml:3", "slowdown must be at least 1"}},
      {"straggler nobody",
       "graph: {generator: ring, n: 3}\nstragglers: [{peer: 3, slowdown: 2}]\n",
       {"t.yaml:2", "straggler peer = 3", "out of range"}},
      {"straggler twice",
       "graph: {generator: ring, n: 3}\nstragglers: [{peer: 1, slowdown: 2}, {peer: 1, slowdown: 3}]\n",
       {"peer 1 is named twice"}},
      {"straggler not a list",
       "graph: {generator: ring, n: 3}\nstragglers: {peer: 1}\n",
       {"stragglers must be a list"}},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    try {
      parse(c.yaml);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string message = e.what();
      for (const char* part : c.mentions) EXPECT_NE(message.find(part), std::string::npos) << message;
    }
  }
}

TEST(TopologyFile, UnreadableEmptyAndBinaryFiles) {
  const fs::path dir = fs::temp_directory_path() / "peertrain_topology_bad_files";
  fs::create_directories(dir);
  write_text_file((dir / "empty.yaml").string(), "");
  write_text_file((dir / "binary.yaml").string(), std::string("\x7f" "ELF\0\0\0", 7));
  EXPECT_ERROR_MENTIONS(load_topology_file((dir / "empty.yaml").string()), "empty.yaml", "empty");
  EXPECT_ERROR_MENTIONS(load_topology_file((dir / "binary.yaml").string()), "binary.yaml", "binary");
  EXPECT_ERROR_MENTIONS(load_topology_file((dir / "absent.yaml").string()), "absent.yaml", "cannot read");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace peertrain::topology
