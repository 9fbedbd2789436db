// n peers in one process, for tests: a Transport per peer over shared in-memory mailboxes.
// Sends complete at once (the receiver's mailbox holds a copy); a link's death, a goodbye,
// a drop and a rejoin behave as the TCP transport's do, so code written against Transport
// (gossip, collectives, membership, the trainer's loop) is tested here without sockets,
// and with make_faulty_transport (faulty.h) under injected faults.
#pragma once

#include <memory>
#include <vector>

#include "peertrain/net/transport.h"

namespace peertrain::net {

struct LoopbackOptions {
  int peers = 0;
  std::vector<std::vector<int>> links;  // links[i]: the peers i keeps a link with (symmetric)
  double peer_timeout_s = 10;
};

class LoopbackFabric {
 public:
  explicit LoopbackFabric(LoopbackOptions options);
  ~LoopbackFabric();
  LoopbackFabric(const LoopbackFabric&) = delete;
  LoopbackFabric& operator=(const LoopbackFabric&) = delete;

  // The transport of peer `rank` (made once; the fabric must outlive it).
  std::unique_ptr<Transport> transport(int rank);
  // A restarted process for `rank` (--rejoin): its links come back, each as soon as the
  // neighbour has dropped the old one, the way a rejoining TCP peer is accepted.
  std::unique_ptr<Transport> rejoin(int rank);
  // A stopped process (SIGSTOP): it falls silent (silence_s grows) until resume().
  void stall(int rank);
  void resume(int rank);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace peertrain::net
