// What the peers of one simulated cluster share: their hosts and actors, which hosts have
// failed, how compute is charged, and the mailbox of each directed link. Private to sim/.
#pragma once

#include <simgrid/s4u.hpp>
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "peertrain/net/transport.h"
#include "peertrain/sim/cluster.h"

namespace peertrain::sim {

// Thrown inside the peer whose host failed, at its next call into the simulation; no
// handler of the training code catches it (it is no Error), so the peer unwinds silently,
// as a machine that lost power.
struct HostFailed {};

struct Fabric {
  int peers = 0;
  std::vector<simgrid::s4u::Host*> hosts;      // peer i's
  std::vector<simgrid::s4u::ActorPtr> actors;  // peer i's, made before the simulation starts
  // When each host failed, in simulated seconds; < 0: it is up.
  std::vector<double> failed_at;
  // Bytes per second that each message between two peers may use at most (the topology's
  // per-link cap on a platform built as a star; 0 where the platform itself holds the caps).
  std::vector<double> link_rate;  // [from * peers + to]
  double peer_timeout_s = 60;
  ComputeModel compute = ComputeModel::kFlops;
  double base_speed = 1e10;  // FLOP/s that one measured CPU second stands for (kMeasured)
  double measured_scale = 1;
  // Each peer's compute not yet charged: where its CPU clock stood when it last resumed
  // (kMeasured), and the seconds carried over to its next call.
  std::vector<double> cpu_mark, carried_s;
  std::vector<std::string> prefixes;  // "peer 3": its log lines'

  // Payload buffers that receivers handed back (Transport::recycle), for the next sends:
  // memory already mapped, so a message costs a copy and no page faults.
  net::Payload take_buffer();
  void give_buffer(net::Payload buffer);

  bool failed(int peer) const { return failed_at_s(peer) >= 0; }
  // When the link between two peers was cut, in simulated seconds; < 0: it is whole.
  double cut_at_s(int a, int b) const {
    if (cut_at_.empty()) return -1;
    const auto it = cut_at_.find(std::minmax(a, b));
    return it == cut_at_.end() ? -1 : it->second;
  }
  bool cut(int a, int b) const { return cut_at_s(a, b) >= 0; }
  void cut(int a, int b, double at_s) { cut_at_.emplace(std::minmax(a, b), at_s); }
  double failed_at_s(int peer) const { return failed_at[static_cast<std::size_t>(peer)]; }
  void fail(int peer, double at_s) { failed_at[static_cast<std::size_t>(peer)] = at_s; }
  double rate(int from, int to) const {
    return link_rate.empty() ? 0 : link_rate[static_cast<std::size_t>(from) * peers + static_cast<std::size_t>(to)];
  }
  static simgrid::s4u::Mailbox* mailbox(int from, int to);

 private:
  std::map<std::pair<int, int>, double> cut_at_;
  std::mutex pool_mutex_;
  std::vector<net::Payload> pool_;
};

// Every call of a peer into the simulation opens one: it first charges, as a computation
// on the peer's host, the compute done since its last call (ComputeModel), and throws
// HostFailed once the host has failed (unless told not to: a destructor, a send's wait).
// On leaving, the peer has its turn again: it is the running peer, its log prefix is set,
// and its CPU clock starts anew.
class SimCall {
 public:
  SimCall(Fabric& fabric, int peer, bool check_failure = true);
  ~SimCall();
  SimCall(const SimCall&) = delete;
  SimCall& operator=(const SimCall&) = delete;

 private:
  Fabric& fabric_;
  const int peer_;
};

// The peer whose code runs now (-1: none, or SimGrid's own code).
int running_peer();
// A peer's actor begins (its turn, as after a SimCall) and ends.
void start_peer(Fabric& fabric, int peer);
void end_peer();

}  // namespace peertrain::sim
