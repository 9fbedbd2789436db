// The simulated platform: built from a topology file, or read from a SimGrid platform
// file and checked against the topology. Private to sim/.
#pragma once

#include <string>

#include "fabric.h"

namespace peertrain::sim {

// Makes (or loads) the platform into the engine, fills fabric.hosts and fabric.link_rate,
// and returns a one-line description of it. Throws Error naming the file for a platform
// that does not parse, lacks a host "peer-i" for a peer, or has no route between two
// peers that exchange messages.
std::string make_platform(simgrid::s4u::Engine& engine, const topology::Topology& topology,
                          const train::TrainConfig& config, const ClusterOptions& options, Fabric& fabric);

}  // namespace peertrain::sim
