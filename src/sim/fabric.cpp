#include "fabric.h"

#include <time.h>

#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"
#include "peertrain/core/log.h"

namespace peertrain::sim {
namespace {

namespace s4u = simgrid::s4u;

// The peer whose code runs now. Peers take turns on SimGrid's contexts: each SimCall sets
// it again when its peer resumes.
int g_running = -1;

// The whole process's CPU time: a peer's own worker threads (a split transformer) count,
// and while one peer runs every other waits for its turn, so nothing else does.
double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void charge(Fabric& fabric, int peer) {
  const auto p = static_cast<std::size_t>(peer);
  const double speed = fabric.hosts[p]->get_speed();
  const double flops = take_counted_flops();
  double seconds = 0;
  if (fabric.compute == ComputeModel::kFlops) {
    seconds = flops / speed;
  } else {
    const double cpu_now = process_cpu_s();
    seconds = (cpu_now - fabric.cpu_mark[p]) * fabric.measured_scale * fabric.base_speed / speed;
    fabric.cpu_mark[p] = cpu_now;
  }
  // Compute under one simulated microsecond waits for the next call: a call per tiny step
  // would cost the simulation more than it is worth.
  fabric.carried_s[p] += seconds;
  if (fabric.carried_s[p] < 1e-6) return;
  const double charged = fabric.carried_s[p];
  fabric.carried_s[p] = 0;
  s4u::this_actor::execute(charged * speed);
}

void resume(Fabric& fabric, int peer) {
  g_running = peer;
  log::set_thread_prefix(fabric.prefixes[static_cast<std::size_t>(peer)]);
  if (fabric.compute == ComputeModel::kMeasured) fabric.cpu_mark[static_cast<std::size_t>(peer)] = process_cpu_s();
}

}  // namespace

s4u::Mailbox* Fabric::mailbox(int from, int to) { return s4u::Mailbox::by_name(str(from, ">", to)); }

net::Payload Fabric::take_buffer() {
  std::lock_guard lock(pool_mutex_);
  if (pool_.empty()) return {};
  net::Payload buffer = std::move(pool_.back());
  pool_.pop_back();
  return buffer;
}

void Fabric::give_buffer(net::Payload buffer) {
  // A few per peer: what one step of a well-connected peer hands back.
  const std::size_t kept = 4 * static_cast<std::size_t>(peers) + 64;
  std::lock_guard lock(pool_mutex_);
  if (pool_.size() < kept && buffer.capacity() > 0) pool_.push_back(std::move(buffer));
}

SimCall::SimCall(Fabric& fabric, int peer, bool check_failure) : fabric_(fabric), peer_(peer) {
  if (check_failure && fabric.failed(peer)) throw HostFailed{};
  charge(fabric, peer);
  if (check_failure && fabric.failed(peer)) throw HostFailed{};
}

SimCall::~SimCall() { resume(fabric_, peer_); }

int running_peer() { return g_running; }
void start_peer(Fabric& fabric, int peer) { resume(fabric, peer); }
void end_peer() { g_running = -1; }

}  // namespace peertrain::sim
