// The one clock the timings use (steady: never jumps with the wall clock), and the
// interval helper every module was writing for itself.
#pragma once

#include <chrono>

namespace peertrain {

using SteadyClock = std::chrono::steady_clock;

inline double seconds_since(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

}  // namespace peertrain
