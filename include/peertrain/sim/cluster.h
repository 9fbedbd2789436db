// Simulated clusters: every peer of a topology file in one process, each a SimGrid actor
// (the s4u API) on its own simulated host. The training is real (each peer computes its
// real gradient on its real shard, and each message carries its real payload); only time
// is simulated. A message takes what SimGrid's flow-level network model says it takes on
// the platform's links and routes, shared with the other flows on them; a computation
// takes its FLOPs over the host's speed, or its measured CPU time times a factor.
//
// The platform is built from the topology file (docs/simulate.md: a star of hosts, each
// with its network card, and each link's own cap and latency), or read from a SimGrid
// platform file in which peer i runs on the host named "peer-i".
#pragma once

#include <string>
#include <vector>

#include "peertrain/topology/topology.h"
#include "peertrain/train/trainer.h"

namespace peertrain::sim {

enum class ComputeModel {
  kFlops,     // the gradient's FLOPs (train::Task::flops_per_step) over the host's speed: deterministic
  kMeasured,  // the CPU time the peer measured, times measured_scale
};
std::string_view to_string(ComputeModel model);
ComputeModel parse_compute_model(std::string_view name);  // throws Error naming the choices

// A failure at a simulated time: a host stops, silently, as a machine that loses power
// (other < 0); or the link between two peers is cut, as a pulled cable: what either sends
// the other from then on never arrives.
struct FailureAt {
  int peer = 0;
  int other = -1;
  double at_s = 0;
  bool link() const { return other >= 0; }
};
// Parses "PEER@SECONDS" (a host, e.g. "3@12.5") or "A-B@SECONDS" (a link, e.g. "0-1@12.5");
// throws Error naming the text.
FailureAt parse_failure(const std::string& text, int peers);

struct ClusterOptions {
  ComputeModel compute = ComputeModel::kFlops;
  double host_speed = 1e10;                 // FLOP/s of each host built from the topology
  double measured_scale = 1;                // kMeasured: simulated seconds per measured CPU second
  std::string platform_file;                // SimGrid platform (XML); empty: built from the topology
  std::vector<std::string> simgrid_config;  // "key:value" settings for SimGrid, as its --cfg
  std::vector<FailureAt> failures;
};

struct PeerFailure {
  int peer = 0;
  std::string reason;
  bool host_failed = false;  // one of options.failures, rather than an error
};

struct ClusterReport {
  double simulated_s = 0;  // when the last peer ended
  double real_s = 0;       // what the simulation took
  std::vector<PeerFailure> failures;
  std::string platform;       // what the platform was made from
  std::string network_model;  // SimGrid's network/model
};

// Runs every peer of the topology to the end in this process; the coordinator writes the
// run's files as a real run does, with every time in simulated seconds. One simulation per
// process (SimGrid's engine is a singleton). Throws Error for a platform that does not
// parse, lacks a host for a peer or a route between two peers that exchange messages.
ClusterReport run_cluster(const topology::Topology& topology, const train::TrainConfig& config,
                          const ClusterOptions& options);

}  // namespace peertrain::sim
