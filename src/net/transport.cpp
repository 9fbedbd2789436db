#include "peertrain/net/transport.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"

namespace peertrain::net {

Payload unshare(SharedPayload shared) {
  if (!shared) return {};
  if (shared.use_count() == 1) return std::move(*shared);
  return *shared;
}

Payload Transport::receive_while_alive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag,
                                       double cap_s) {
  const double silent_s = peer_timeout_s() / 2;
  const auto start = RunClock::now();
  for (;;) {
    const double waited = seconds_since(start);
    try {
      // Slices of a second: the silence is checked between them.
      return receive(peer, type, step, tag, std::clamp(cap_s - waited, 0.001, 1.0));
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kTimeout) throw;
      const double silence = silence_s(peer);
      const double total = seconds_since(start);
      if (silence >= silent_s)
        throw Error(ErrorKind::kTimeout, str(peer_name(peer), " has sent nothing, not even a heartbeat, for ",
                                             static_cast<int>(silence), " s while peer ", self(), " waited for ",
                                             to_string(type), " for step ", step, "; it gives up", link_report(peer)));
      if (total >= cap_s)
        throw Error(ErrorKind::kTimeout, str(peer_name(peer), " sent no ", to_string(type), " for step ", step,
                                             " within ", static_cast<int>(cap_s), " s, though it still sounds alive; peer ",
                                             self(), " gives up"));
    }
  }
}

std::optional<Transport::Arrival> Transport::receive_any(std::span<const Wanted> wanted, double timeout_s) {
  const auto start = SteadyClock::now();
  for (;;) {
    for (std::size_t i = 0; i < wanted.size(); ++i) {
      const Wanted& w = wanted[i];
      try {
        if (auto payload = try_receive(w.peer, w.type, w.step, w.tag))
          return Arrival{i, std::move(*payload), false, {}};
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kPeerLost) throw;
        return Arrival{i, {}, true, e.what()};
      }
    }
    if (seconds_since(start) >= timeout_s) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

}  // namespace peertrain::net
