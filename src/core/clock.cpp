#include "peertrain/core/clock.h"

#include <atomic>

namespace peertrain {
namespace {

std::atomic<double (*)()> g_clock{nullptr};
thread_local double t_flops = 0;

double steady_seconds() { return std::chrono::duration<double>(SteadyClock::now().time_since_epoch()).count(); }

}  // namespace

double RunClock::seconds() {
  auto* installed = g_clock.load(std::memory_order_acquire);
  return installed ? installed() : steady_seconds();
}

RunClock::time_point RunClock::now() { return time_point(duration(seconds())); }

void RunClock::install(double (*seconds_now)()) { g_clock.store(seconds_now, std::memory_order_release); }

bool RunClock::simulated() { return g_clock.load(std::memory_order_acquire) != nullptr; }

void count_flops(double flops) { t_flops += flops; }

double take_counted_flops() {
  const double flops = t_flops;
  t_flops = 0;
  return flops;
}

}  // namespace peertrain
