// Link emulation's bandwidth cap: the wire as a clock. A piece of p bytes holds the wire
// for p / rate from when the wire is free, and is handed on (to the socket when sending, to
// the reader when receiving) once its last byte would have crossed it. An idle wire saves
// nothing up: a lone small message pays its serialization time as on a real link, where a
// token bucket with a burst would let it through free (the α-β cost model's β assumes
// this, and experiments/networks measured the difference).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>

namespace peertrain::net {

// Bytes per piece: 1 ms of the rate, at least 2 KiB. Small, because a piece is held until
// its last byte is through (store and forward): a receiver whose card is shaped too waits
// one more piece, 16 ms at 1 Mbit/s; and at fast rates 1 ms of bytes per timer wake-up.
inline std::size_t shaped_piece(double bandwidth_mbps) {
  constexpr std::size_t kMinPiece = 2 * 1024;
  return std::max<std::size_t>(kMinPiece, static_cast<std::size_t>(bandwidth_mbps * 1e6 / 8 / 1000));
}

struct WireClock {
  using Clock = std::chrono::steady_clock;
  Clock::time_point free_at{};  // when the last reserved byte is through

  // How long `piece` bytes hold a wire of `mbps`.
  static Clock::duration busy(double mbps, std::size_t piece) {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(static_cast<double>(piece) / (mbps * 1e6 / 8)));
  }

  // Reserves the wire for `piece` bytes at `mbps` from when it frees up, or from `now` if it
  // has been idle; returns when the piece's last byte is through. A wire freed less than
  // a piece's time (at least 1 ms) ago counts as busy until now: that gap is the timer
  // waking late, not idleness, and losing it on every piece would slow a stream down.
  // The receiving card uses it: it cannot tell when its bytes arrived.
  Clock::time_point reserve(Clock::time_point now, double mbps, std::size_t piece) {
    const auto held = busy(mbps, piece);
    const auto late = std::max<Clock::duration>(held, std::chrono::milliseconds(1));
    if (free_at < now - late) free_at = now;  // idle: nothing saved up
    free_at += held;
    return free_at;
  }

  // How far back a sender's wire may catch up: a bound on the burst after a stall.
  static constexpr std::chrono::milliseconds kCatchUp{10};

  // Reserves the wire for `piece` bytes that were ready to go at `ready`: they follow the
  // bytes before them without a gap, or start at `ready` if the wire was idle then. The
  // clock runs from when the bytes were ready, not from when the I/O thread got to them: a
  // network card sends what is queued while the CPU does something else, but our I/O
  // thread shares the cores with the gradient, and wakes up late when both are busy (the
  // 2 Gbit/s D-PSGD step lost 1.9 ms a step to it, bench/dpsgd_overlap.sh). At most
  // kCatchUp of wire time is recovered, so a sender stalled for longer (a receiver that
  // does not read) finds an idle wire, not a burst.
  Clock::time_point reserve_from(Clock::time_point ready, Clock::time_point now, double mbps, std::size_t piece) {
    free_at = std::max({free_at, ready, now - kCatchUp}) + busy(mbps, piece);
    return free_at;
  }
};

}  // namespace peertrain::net
