// One step of a decentralized run replayed task by task on the cores its peers share
// (network.h, when every peer runs on this machine). The CPU bound Σ CPU / cores holds
// only when the cores never idle; a synchronous algorithm's peers do idle, each waiting
// for a message whose sender waits for its turn. On the lian2017 fast network the CPU
// bound put the 4-peer server and tree 28-34 % under their measured steps (docs/plan.md).
// So each peer runs its algorithm's program in the order algo/collectives.cpp runs it:
// its training thread's tasks one after another, each message's send and receive on the
// sender's and the receiver's transport I/O thread (one task at a time, first come first
// served), the message's wire time between them, and a greedy scheduler hands each task
// that becomes ready the first core to come free, as the OS hands a woken thread a core.
#pragma once

#include "peertrain/plan/network.h"

namespace peertrain::plan::detail {

// What one message and one step cost, from the probe and the profiles.
struct StepCosts {
  double compute_s = 0;            // a peer's gradient and update ...
  double update_s = 0;             // ... of which the update (optimizer_pass_s in network.h)
  double tests_s = 0;              // other peers' test passes landing in a step, all peers together
  double copy_bytes_per_s = 0;     // summing or copying a received vector
  double small_message_cpu_s = 0;  // both ends' CPU for a 64-byte message ...
  double message_cpu_s = 0;        // ... and for one of S bytes (linear between)
  double busy_wake_cpu_s = 0;      // a training thread woken while every core is busy
  double small_wire_s = 0;         // a message's time beyond its CPU (wake-ups, loopback), 64 bytes ...
  double wire_s = 0;               // ... and S bytes
};

// The settled time per step of `algorithm` with `cores` cores shared by all peers, and how
// busy they were. Each message also waits on the wire: the loopback's own time beyond its
// CPU, or the topology's emulated latency and cap. {0, 0} where the step has too many
// messages to replay in a plan's time (hundreds of peers on one machine).
struct Replayed {
  double step_s = 0;  // the settled time per step
  double busy = 0;    // the cores' busy fraction
  double busy_wakes = 0;  // threads woken onto busy cores, a step
};
Replayed replay_on_shared_cores(const topology::Topology& topology, PeerAlgorithm algorithm, double parameter_bytes,
                                const StepCosts& costs, int cores, int fanout = 0);

}  // namespace peertrain::plan::detail
