// The clocks the timings use.
//  - SteadyClock: real time that never jumps with the wall clock; deadlines of sockets
//    and threads, benchmarks.
//  - RunClock: the time a training run's timings read (its step, compute and wait times,
//    wall_s). It is the steady clock, unless a simulated cluster (sim/cluster.h) installs
//    its own for the whole process: then it reads simulated seconds, and reading it first
//    charges the compute the calling peer has done since it last talked to the simulation.
// A run also counts the FLOPs of its computations (count_flops); a simulated cluster that
// charges compute by FLOPs rather than by measured CPU time reads them back.
#pragma once

#include <chrono>

namespace peertrain {

using SteadyClock = std::chrono::steady_clock;

inline double seconds_since(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

struct RunClock {
  using rep = double;
  using period = std::ratio<1>;
  using duration = std::chrono::duration<double>;
  using time_point = std::chrono::time_point<RunClock>;
  static constexpr bool is_steady = true;

  static time_point now();
  // Seconds from the process's clock source: the steady clock, or the installed one.
  static double seconds();
  // Replaces the clock for the whole process (nullptr restores the steady clock). Only a
  // simulation installs one, before any peer starts.
  static void install(double (*seconds_now)());
  static bool simulated();
};

inline double seconds_since(RunClock::time_point start) { return (RunClock::now() - start).count(); }

// FLOPs the calling thread has computed and not yet handed over: a peer adds those of each
// gradient; a simulated cluster in FLOP mode takes them and charges them as compute time.
void count_flops(double flops);
double take_counted_flops();

}  // namespace peertrain
