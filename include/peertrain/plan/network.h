// The cost model of a decentralized run over a topology (across peers): from each
// peer's compute time, the message sizes and every link's latency and bandwidth (the
// topology file's link emulation), it predicts each peer's time per step under D-PSGD,
// an all-reduce (ring, tree, recursive doubling) or a parameter server, and where the time goes.
//
// Per step and peer, the algorithms' traffic (S = the parameters' bytes):
//   dpsgd      S to and from each neighbour; the gossip overlaps the gradient, so a peer
//              waits max(compute, the slowest neighbour's S over its link), the sends
//              sharing the peer's card when node_bandwidth_mbps caps it;
//   allreduce  ring: 2(n − 1) ring steps of S/n, each bound by the ring's slowest link;
//              tree (binomial) and rd (recursive doubling): messages of the whole S,
//              replayed one by one in each peer's program order as algo/collectives.cpp
//              sends them (a send blocks its sender; an exchange ends when both messages
//              have crossed), so independent chains overlap: the tree at n = 6 takes 5
//              message times, not 2⌈log₂ n⌉ = 6;
//   ps         peer 0 receives n − 1 gradients and sends n − 1 parameter vectors through
//              its card; the others send one and receive one;
//   sgp        S + 4 bytes (x and the push-sum weight) along each out-arc of the step's
//              digraph (an undirected graph: both ways along each edge), overlapping the
//              gradient as D-PSGD does; a peer waits for its in-arcs' messages. A
//              time-varying graph is averaged over its period, a redrawn one over 8 draws;
//   el         S along each of the s arcs out of each peer of the round's random digraph
//              (s = fanout), after the local step (atc, the paper's), so nothing overlaps
//              it; averaged over 8 draws.
// Each message also costs its two ends software time (the probe's loopback round trip),
// and peers on one machine share its cores: the step takes at least Σ CPU / cores, and at
// least the step replayed task by task on those cores (shared_cores.h), where a
// synchronous algorithm's peers leave cores idle while they wait for each other. The
// synchronous algorithms move at the pace of the slowest peer, which the prediction names
// with its bottleneck (compute, shared cores, a link's latency or bandwidth, its card).
#pragma once

#include <string>
#include <vector>

#include "peertrain/topology/topology.h"

namespace peertrain::plan {

enum class PeerAlgorithm { kDpsgd, kAllReduce, kTreeAllReduce, kRdAllReduce, kPs, kSgp, kEl };
// --algorithm dpsgd|allreduce|ps|sgp|el with --allreduce-algo ring|tree|rd (tree and rd
// only with allreduce); throws naming the flag.
PeerAlgorithm parse_peer_algorithm(const std::string& algorithm, const std::string& allreduce_algo = "ring");
std::string to_string(PeerAlgorithm algorithm);  // dpsgd, allreduce, allreduce-tree, allreduce-rd, ps, sgp, el

// The arcs a step of SGP or EL sends along: the topology's digraph at that step (both
// directions of each edge of an undirected one), or for EL the random s-out draw of the
// step (topology/digraph.h; the plan draws from seed 1). fanout 0: ⌈log₂ n⌉.
topology::Digraph step_arcs(const topology::Topology& topology, PeerAlgorithm algorithm, long long step, int fanout);
// The steps a prediction for SGP or EL averages over: the period, or 8 draws.
int arc_steps(const topology::Topology& topology, PeerAlgorithm algorithm);

// A quick probe of this machine: two of peertrain's own TCP transports in one process,
// over loopback, passing a message of the parameters' size back and forth, then a small
// one (so a message's CPU splits into a fixed part and a part per byte).
struct NetworkProbe {
  double message_s = 0;         // one message of that size, one way (half a round trip)
  double message_cpu_s = 0;     // the CPU it costs both ends together (framing, checksum, copies, threads)
  double small_message_cpu_s = 0;  // the same for a 64-byte message: a message's fixed cost
  double small_message_s = 0;      // a 64-byte message one way (its wake-ups beyond that CPU)
  // A thread woken while every core is busy: the CPU of taking a core from another. The
  // small message's CPU beside a spinning thread on every core (in the rounds where the
  // woken threads crossed cores), less its CPU on idle cores, over the four threads each
  // message wakes (the sender's event loop, the sending thread when the send is done, the
  // receiver's loop, the receiving thread). Measured only with shared_cores, on a
  // machine of 2 cores or more; 0 when no round crossed cores (busy_wake_rounds).
  double busy_wake_cpu_s = 0;
  int busy_wake_rounds = 0;
  double bytes_per_s = 0;       // loopback's rate for such messages
  double copy_bytes_per_s = 0;  // memcpy, for mixing
};
// shared_cores: also time the small message beside a spinning thread on every core
// (busy_wake_cpu_s), for peers that will share this machine's cores.
NetworkProbe probe_network(double message_bytes, bool shared_cores = false);

struct PeerStep {
  double step_s = 0;     // this peer's time per step on its own (before the others hold it up)
  double compute_s = 0;  // the gradient and the update
  double cpu_s = 0;      // compute plus its messages' and mixing's CPU
  double comm_s = 0;     // waiting on the network beyond compute
  std::string bottleneck;
};

struct NetworkPrediction {
  double step_s = 0;  // the run's time per step: the slowest peer, or the shared cores
  std::vector<PeerStep> peers;
  int slowest = 0;
  std::string where;  // what holds the run back
};

// The evaluation rounds of launch --eval-every: every `every` steps each peer tests its
// model (one_s of CPU). They are outside the step timings, but on shared cores the peers
// are not in lockstep: those that end the step before a round first test while the others
// still train, and their tests land in those steps (the lian2017 run at 16 peers,
// --eval-every 5: 6.5 ms a step against 2.6 without the rounds). Peer 0, the coordinator
// whose steps are timed, starts each period last (it first sends every peer its release)
// and so ends it last. Not all of the early peers' tests land in its step, though: a test
// (7 ms) outlasts what is left of that step, and runs on after it. Measured on the
// lian2017 runs, 0.34–0.50 of the other n − 1 peers' tests landed (docs/plan.md).
inline constexpr double kTestsLanding = 0.4;
struct Evaluation {
  double one_s = 0;     // one peer's test pass
  long long every = 0;  // steps between rounds (0: none counted)
};

// The optimizer's pass over S parameter bytes at a copy rate: x, its gradient and its
// state read, x and the state written (a step's update, which plan charges beside the
// gradient's measured time).
inline double optimizer_pass_s(double parameter_bytes, double copy_bytes_per_s) {
  return 5 * parameter_bytes / copy_bytes_per_s;
}

// compute_s: one peer's gradient and optimizer step; parameter_bytes: S. shared_cores: the
// cores all peers share (0: every peer has a machine of its own).
// fanout: EL's s (0: ⌈log₂ n⌉).
NetworkPrediction predict_network(const topology::Topology& topology, PeerAlgorithm algorithm, double parameter_bytes,
                                  double compute_s, const NetworkProbe& probe, int shared_cores,
                                  const Evaluation& evaluation = {}, int fanout = 0);

}  // namespace peertrain::plan
