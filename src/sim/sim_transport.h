// The transport of a peer inside a simulated cluster: net::Transport over SimGrid
// mailboxes, one per directed link. A message carries its real payload; SimGrid times it
// on the platform's route, and the messages of one link go in order, one after another,
// as over one TCP connection. A peer that finishes says goodbye on every link; one that
// fails with an error tells every link at once, as a closed socket would; one whose host
// failed falls silent: its neighbours hear nothing more, and their time-outs find it lost.
#pragma once

#include <memory>
#include <vector>

#include "fabric.h"
#include "peertrain/net/transport.h"

namespace peertrain::sim {

std::unique_ptr<net::Transport> make_sim_transport(Fabric& fabric, int rank, const std::vector<int>& links);

}  // namespace peertrain::sim
