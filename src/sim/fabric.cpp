#include "fabric.h"

#include <time.h>

#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"

namespace peertrain::sim {
namespace {

namespace s4u = simgrid::s4u;

// Per peer thread (each actor runs on its own thread: contexts/factory:thread).
thread_local int t_peer = -1;
thread_local double t_cpu_mark = 0;
// Compute under one simulated microsecond waits for the next call: a call per tiny step
// would cost the simulation more than it is worth.
thread_local double t_carried_s = 0;

// The whole process's CPU time: a peer's own worker threads (a split transformer) count,
// and while one peer runs every other is blocked, so nothing else does.
double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void charge(Fabric& fabric, int peer) {
  const double flops = take_counted_flops();
  const double cpu_now = process_cpu_s();
  double seconds = 0;
  if (fabric.compute == ComputeModel::kFlops) {
    seconds = flops / fabric.hosts[static_cast<std::size_t>(peer)]->get_speed();
  } else {
    seconds = (cpu_now - t_cpu_mark) * fabric.measured_scale * fabric.base_speed /
              fabric.hosts[static_cast<std::size_t>(peer)]->get_speed();
  }
  t_cpu_mark = cpu_now;
  t_carried_s += seconds;
  if (t_carried_s < 1e-6) return;
  const double speed = fabric.hosts[static_cast<std::size_t>(peer)]->get_speed();
  const double charged = t_carried_s;
  t_carried_s = 0;
  s4u::this_actor::execute(charged * speed);
}

}  // namespace

s4u::Mailbox* Fabric::mailbox(int from, int to) { return s4u::Mailbox::by_name(str(from, ">", to)); }

SimCall::SimCall(Fabric& fabric, int peer, bool check_failure) {
  if (check_failure && fabric.failed(peer)) throw HostFailed{};
  charge(fabric, peer);
  if (check_failure && fabric.failed(peer)) throw HostFailed{};
}

SimCall::~SimCall() { mark_cpu(); }

int current_peer() { return t_peer; }
void set_current_peer(int peer) { t_peer = peer; }
void mark_cpu() { t_cpu_mark = process_cpu_s(); }

}  // namespace peertrain::sim
