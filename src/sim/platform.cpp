#include "platform.h"

#include <cmath>

#include "peertrain/algo/collectives.h"
#include "peertrain/core/error.h"

namespace peertrain::sim {
namespace {

namespace s4u = simgrid::s4u;
using Direction = s4u::LinkInRoute::Direction;

// "Unlimited" in a topology file: far above any card, so that only latency counts.
constexpr double kUnlimitedBytesPerS = 1e13;
constexpr int kMaxFullPeers = 256;

double bytes_per_s(double mbps) { return mbps > 0 ? mbps * 1e6 / 8 : kUnlimitedBytesPerS; }

std::string host_name(int peer) { return str("peer-", peer); }

// The pairs of peers that exchange messages: every graph edge, every peer with the
// coordinator (evaluation reports), and the all-reduce's partners.
std::vector<std::pair<int, int>> talking_pairs(const topology::Topology& t, const train::TrainConfig& config) {
  std::vector<std::pair<int, int>> pairs;
  for (const auto& [a, b] : t.graph.edges()) pairs.emplace_back(a, b);
  for (int p = 1; p < t.num_peers(); ++p) pairs.emplace_back(0, p);
  if (train::outer_all_gather(config))
    for (int p = 0; p < t.num_peers(); ++p)
      for (int q = p + 1; q < t.num_peers(); ++q) pairs.emplace_back(p, q);
  if (train::all_reduces(config))
    for (int p = 0; p < t.num_peers(); ++p)
      for (int q : algo::allreduce_partners(config.allreduce_algo, t.num_peers(), p)) pairs.emplace_back(p, q);
  return pairs;
}

bool latencies_differ(const topology::Topology& t) {
  for (const auto& o : t.link_overrides)
    if (o.properties.latency_ms != t.default_link.latency_ms) return true;
  return false;
}

// Each peer a host with its network card (a split-duplex link to a central switch, at
// the topology's node bandwidths; half the link latency on each side). The per-link caps
// are each message's rate; a link's messages go one after another (sim_transport.cpp), so
// a cap holds for the link as a whole.
std::string make_star(const topology::Topology& t, const ClusterOptions& options, Fabric& fabric) {
  auto* zone = s4u::create_star_zone("cluster");
  const int n = t.num_peers();
  const double half_latency_s = t.default_link.latency_ms / 2e3;
  for (int p = 0; p < n; ++p) {
    s4u::Host* host = zone->create_host(host_name(p), options.host_speed / t.compute_slowdown(p));
    s4u::Link* up =
        zone->create_link(str("peer-", p, "-out"), bytes_per_s(t.node_bandwidth_mbps))->set_latency(half_latency_s);
    s4u::Link* down =
        zone->create_link(str("peer-", p, "-in"), bytes_per_s(t.node_ingress_mbps))->set_latency(half_latency_s);
    zone->add_route(host->get_netpoint(), nullptr, nullptr, nullptr, {{up, Direction::NONE}}, false);
    zone->add_route(nullptr, host->get_netpoint(), nullptr, nullptr, {{down, Direction::NONE}}, false);
    fabric.hosts.push_back(host);
  }
  zone->seal();
  fabric.link_rate.assign(static_cast<std::size_t>(n) * static_cast<std::size_t>(n), 0);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b) {
        const double mbps = t.link(a, b).bandwidth_mbps;
        fabric.link_rate[static_cast<std::size_t>(a) * n + b] = mbps > 0 ? mbps * 1e6 / 8 : 0;
      }
  return str("built from ", t.path.empty() ? t.name : t.path, ": ", n, " hosts of ", options.host_speed / 1e9,
             " GFLOP/s on a switch, cards ",
             t.node_bandwidth_mbps > 0 ? str(t.node_bandwidth_mbps, " Mbit/s") : "unlimited", ", links ",
             t.default_link.bandwidth_mbps > 0 ? str(t.default_link.bandwidth_mbps, " Mbit/s") : "unlimited", " with ",
             t.default_link.latency_ms, " ms");
}

// A topology whose links differ in latency: a route of its own for every pair of peers
// (card out, the pair's link, card in). Any two peers may talk: a coordinator that takes
// over, the membership's reports.
std::string make_full(const topology::Topology& t, const ClusterOptions& options, Fabric& fabric) {
  auto* zone = s4u::create_full_zone("cluster");
  const int n = t.num_peers();
  std::vector<s4u::Link*> out, in;
  for (int p = 0; p < n; ++p) {
    fabric.hosts.push_back(zone->create_host(host_name(p), options.host_speed / t.compute_slowdown(p)));
    out.push_back(zone->create_link(str("peer-", p, "-out"), bytes_per_s(t.node_bandwidth_mbps)));
    in.push_back(zone->create_link(str("peer-", p, "-in"), bytes_per_s(t.node_ingress_mbps)));
  }
  if (n > kMaxFullPeers)
    throw Error(ErrorKind::kInvalidArgument,
                str(t.path.empty() ? t.name : t.path, ": links of different latencies are simulated for up to ",
                    kMaxFullPeers, " peers (a route per pair); give a SimGrid platform with --platform"));
  std::vector<std::pair<int, int>> pairs;
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) pairs.emplace_back(a, b);
  for (const auto& [a, b] : pairs) {
    const auto link = t.link(a, b);
    auto* pair = zone->create_split_duplex_link(str("link-", a, "-", b), bytes_per_s(link.bandwidth_mbps))
                     ->set_latency(link.latency_ms / 1e3);
    zone->add_route(fabric.hosts[static_cast<std::size_t>(a)]->get_netpoint(),
                    fabric.hosts[static_cast<std::size_t>(b)]->get_netpoint(), nullptr, nullptr,
                    {{out[static_cast<std::size_t>(a)], Direction::NONE},
                     {pair, Direction::UP},
                     {in[static_cast<std::size_t>(b)], Direction::NONE}},
                    false);
    zone->add_route(fabric.hosts[static_cast<std::size_t>(b)]->get_netpoint(),
                    fabric.hosts[static_cast<std::size_t>(a)]->get_netpoint(), nullptr, nullptr,
                    {{out[static_cast<std::size_t>(b)], Direction::NONE},
                     {pair, Direction::DOWN},
                     {in[static_cast<std::size_t>(a)], Direction::NONE}},
                    false);
  }
  zone->seal();
  return str("built from ", t.path.empty() ? t.name : t.path, ": ", n, " hosts of ", options.host_speed / 1e9,
             " GFLOP/s, a route per pair of peers (", pairs.size(), ")");
}

std::string load_file(s4u::Engine& engine, const topology::Topology& t, const train::TrainConfig& config,
                      const ClusterOptions& options, Fabric& fabric) {
  const std::string& file = options.platform_file;
  try {
    engine.load_platform(file);
  } catch (const std::exception& e) {
    throw Error(ErrorKind::kParse, str(file, ": not a SimGrid platform: ", e.what()));
  }
  for (int p = 0; p < t.num_peers(); ++p) {
    s4u::Host* host = engine.host_by_name_or_null(host_name(p));
    if (!host)
      throw Error(ErrorKind::kInvalidArgument, str(file, ": no host named ", host_name(p), " for peer ", p, " of ",
                                                   t.path.empty() ? t.name : t.path, " (peer i runs on host peer-i)"));
    fabric.hosts.push_back(host);
  }
  for (const auto& [a, b] : talking_pairs(t, config))
    for (const auto& [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
      std::vector<s4u::Link*> links;
      double latency = 0;
      fabric.hosts[static_cast<std::size_t>(from)]->route_to(fabric.hosts[static_cast<std::size_t>(to)], links,
                                                             &latency);
      if (links.empty())
        throw Error(ErrorKind::kInvalidArgument, str(file, ": no route from ", host_name(from), " to ", host_name(to),
                                                     " (peers ", from, " and ", to, " exchange messages)"));
    }
  return str("read from ", file, ": ", engine.get_host_count(), " hosts, ", engine.get_link_count(), " links");
}

}  // namespace

std::string make_platform(s4u::Engine& engine, const topology::Topology& t, const train::TrainConfig& config,
                          const ClusterOptions& options, Fabric& fabric) {
  if (!options.platform_file.empty()) return load_file(engine, t, config, options, fabric);
  return latencies_differ(t) ? make_full(t, options, fabric) : make_star(t, options, fabric);
}

}  // namespace peertrain::sim
