// Link emulation's bandwidth cap: a token bucket in bytes, refilled at the link's rate and
// holding at most one piece (so an idle link cannot save up a burst). A piece of a frame
// goes when every bucket it passes (the link's, and the network card's that all links
// share) holds enough tokens.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>

namespace peertrain::net {

// Bytes written per grant: at least 64 KiB, and at fast emulated rates what the link
// carries in 1 ms, so a fast link does not cost a timer wake-up every 64 KiB.
inline std::size_t shaped_piece(double bandwidth_mbps) {
  constexpr std::size_t kMinPiece = 64 * 1024;
  return std::max<std::size_t>(kMinPiece, static_cast<std::size_t>(bandwidth_mbps * 1e6 / 8 / 1000));
}

struct TokenBucket {
  using Clock = std::chrono::steady_clock;
  double tokens = 0;
  Clock::time_point refilled = Clock::now();

  // Refills to `now` at `mbps`; returns the seconds until `piece` bytes are available (0:
  // now).
  double refill(Clock::time_point now, double mbps, std::size_t piece) {
    const double rate = mbps * 1e6 / 8;  // bytes per second
    tokens = std::min<double>(static_cast<double>(shaped_piece(mbps)),
                              tokens + rate * std::chrono::duration<double>(now - refilled).count());
    refilled = now;
    return tokens < static_cast<double>(piece) ? (static_cast<double>(piece) - tokens) / rate : 0.0;
  }
  void spend(std::size_t piece) { tokens -= static_cast<double>(piece); }
};

}  // namespace peertrain::net
