// A Transport decorator that injects faults, for tests (c10d's fault-injecting backends
// are the model): it drops, delays or corrupts chosen messages, or kills a link, from a
// chosen step on. Wrap any transport (TCP or loopback):
//
//   auto t = make_faulty_transport(std::move(inner), {{.action = Fault::kKill, .peer = 3, .from_step = 50}});
//
// A corrupted message is what the TCP transport makes of a frame whose checksum or tag
// fails: the link is closed and the receiver hears kPeerLost naming the bad frame. It is
// applied on the receiving side, where a real corruption is found.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "peertrain/net/transport.h"

namespace peertrain::net {

struct Fault {
  enum Action { kDrop, kDelay, kCorrupt, kKill } action = kDrop;
  int peer = -1;                          // the other end of the link; -1: any
  std::optional<MessageType> type = std::nullopt;  // empty: any type
  std::uint64_t from_step = 0;            // the fault applies to messages of steps in [from, to]
  std::uint64_t to_step = std::numeric_limits<std::uint64_t>::max();
  double delay_s = 0;                     // kDelay
};

// kDrop, kDelay and kKill act on sends; kCorrupt acts on receives. A killed link fails
// every later send and receive on it with kPeerLost ("injected fault").
std::unique_ptr<Transport> make_faulty_transport(std::unique_ptr<Transport> inner, std::vector<Fault> faults);

}  // namespace peertrain::net
