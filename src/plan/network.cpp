// The cost model of a decentralized run; see network.h.
#include "peertrain/plan/network.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>  // before Asio, whose awaitable.hpp uses std::exchange

#include <boost/asio.hpp>

#include "peertrain/core/error.h"
#include "peertrain/net/tcp.h"
#include "peertrain/plan/profile.h"
#include "shared_cores.h"

namespace peertrain::plan {
namespace {

using boost::asio::ip::tcp;

// Milliseconds to three significant figures (whole ones from a second up), for the explanations.
std::string ms_3g(double seconds) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, seconds < 1.0 ? "%.3g" : "%.0f", seconds * 1e3);
  return buffer;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A CPU clock (the process's, or the calling thread's) in seconds.
double cpu_clock_s(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// A link's time for `bytes`: its latency and its cap (0: no cap: loopback, as the probe
// measured it, whose one-way time holds the messages' software too).
double link_time(const topology::LinkProperties& link, double bytes, const NetworkProbe& probe) {
  const double capped = link.bandwidth_mbps > 0 ? bytes / (link.bandwidth_mbps * 1e6 / 8) : 0.0;
  return link.latency_ms * 1e-3 + std::max(capped, bytes / probe.bytes_per_s);
}

// A tree or recursive-doubling all-reduce of the whole vector, replayed message by message
// as algo/collectives.cpp runs it: each position works through its sends and receives in
// program order, a send blocks its sender for the message's time, a message that arrives
// early waits for its receiver, and an exchange (recursive doubling) ends for both sides
// when both messages have crossed. `cost(from, to)` is one message's time.
struct LogReplay {
  std::vector<double> done_s;  // when each position holds the sum
  std::vector<int> messages;   // messages each position sends or receives
  double slowest_s = 0;        // the slowest message, and its link
  std::string slowest_link;
};

template <typename Cost>
LogReplay replay_log_allreduce(PeerAlgorithm algorithm, int n, Cost cost) {
  LogReplay r;
  r.done_s.assign(static_cast<std::size_t>(n), 0.0);
  r.messages.assign(static_cast<std::size_t>(n), 0);
  auto& ready = r.done_s;
  auto timed = [&](int from, int to) {
    const double t = cost(from, to);
    ++r.messages[static_cast<std::size_t>(from)];
    ++r.messages[static_cast<std::size_t>(to)];
    if (t > r.slowest_s) {
      r.slowest_s = t;
      r.slowest_link = str(from, "-", to);
    }
    return t;
  };
  auto send = [&](int from, int to) {  // a blocking send; the receiver takes it when it gets there
    const double arrive = ready[static_cast<std::size_t>(from)] + timed(from, to);
    ready[static_cast<std::size_t>(from)] = arrive;
    ready[static_cast<std::size_t>(to)] = std::max(ready[static_cast<std::size_t>(to)], arrive);
  };
  if (algorithm == PeerAlgorithm::kTreeAllReduce) {
    int top = 1;
    for (; top < n; top <<= 1)  // reduce: a position with this bit set sends down and is done
      for (int me = top; me < n; me += 2 * top) send(me, me - top);
    for (int mask = top >> 1; mask > 0; mask >>= 1)  // broadcast: the same tree backwards
      for (int me = 0; me + mask < n; me += 2 * mask) send(me, me + mask);
    return r;
  }
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int extra = n - p2;
  auto real = [&](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  for (int e = 0; e < extra; ++e) send(2 * e, 2 * e + 1);  // the even one hands its vector over
  for (int mask = 1; mask < p2; mask <<= 1)
    for (int v = 0; v < p2; ++v) {
      if ((v ^ mask) < v) continue;  // each pair once: both send at once, both wait for both
      const int a = real(v), b = real(v ^ mask);
      const double end =
          std::max(ready[static_cast<std::size_t>(a)] + timed(a, b), ready[static_cast<std::size_t>(b)] + timed(b, a));
      ready[static_cast<std::size_t>(a)] = ready[static_cast<std::size_t>(b)] = end;
    }
  for (int e = 0; e < extra; ++e) send(2 * e + 1, 2 * e);  // and gets the sum back
  return r;
}

}  // namespace

PeerAlgorithm parse_peer_algorithm(const std::string& algorithm, const std::string& allreduce_algo) {
  if (allreduce_algo != "ring" && allreduce_algo != "tree" && allreduce_algo != "rd")
    throw Error(ErrorKind::kInvalidArgument, str("--allreduce-algo '", allreduce_algo, "': expected ring, tree or rd"));
  if (allreduce_algo != "ring" && algorithm != "allreduce")
    throw Error(ErrorKind::kInvalidArgument,
                str("--allreduce-algo ", allreduce_algo, " is for --algorithm allreduce, not '", algorithm, "'"));
  if (algorithm == "dpsgd") return PeerAlgorithm::kDpsgd;
  if (algorithm == "allreduce")
    return allreduce_algo == "tree" ? PeerAlgorithm::kTreeAllReduce
           : allreduce_algo == "rd" ? PeerAlgorithm::kRdAllReduce
                                    : PeerAlgorithm::kAllReduce;
  if (algorithm == "ps") return PeerAlgorithm::kPs;
  if (algorithm == "sgp") return PeerAlgorithm::kSgp;
  if (algorithm == "el") return PeerAlgorithm::kEl;
  throw Error(ErrorKind::kInvalidArgument,
              str("--algorithm '", algorithm, "': expected dpsgd, allreduce, ps, sgp or el"));
}

std::string to_string(PeerAlgorithm a) {
  switch (a) {
    case PeerAlgorithm::kDpsgd:
      return "dpsgd";
    case PeerAlgorithm::kAllReduce:
      return "allreduce";
    case PeerAlgorithm::kTreeAllReduce:
      return "allreduce-tree";
    case PeerAlgorithm::kRdAllReduce:
      return "allreduce-rd";
    case PeerAlgorithm::kSgp:
      return "sgp";
    case PeerAlgorithm::kEl:
      return "el";
    case PeerAlgorithm::kPs:
      break;
  }
  return "ps";
}

topology::Digraph step_arcs(const topology::Topology& topo, PeerAlgorithm algorithm, long long step, int fanout) {
  const int n = topo.num_peers();
  if (algorithm == PeerAlgorithm::kEl) {
    return topology::random_out_step(n, fanout > 0 ? fanout : topology::default_fanout(n), 1, step);
  }
  if (topo.directed) return topo.digraph_at(step);
  std::vector<topology::Arc> arcs;
  const topology::Graph graph = topo.graph_at(step);  // (a value: the loop must not outlive it)
  for (const topology::Edge& e : graph.edges()) {
    arcs.push_back({e.u, e.v});
    arcs.push_back({e.v, e.u});
  }
  return topology::Digraph::from_arcs(n, std::move(arcs), topo.name);
}

int arc_steps(const topology::Topology& topo, PeerAlgorithm algorithm) {
  if (algorithm == PeerAlgorithm::kEl || topo.redrawn()) return 8;
  return topo.period();
}

NetworkProbe probe_network(double message_bytes, bool shared_cores) {
  NetworkProbe p;
  // Two free ports on loopback.
  boost::asio::io_context io;
  tcp::acceptor a(io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0)),
      b(io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  const std::vector<net::Endpoint> endpoints{{"127.0.0.1", a.local_endpoint().port()},
                                             {"127.0.0.1", b.local_endpoint().port()}};
  a.close();
  b.close();
  std::unique_ptr<net::Transport> peers[2];
  for (int i = 0; i < 2; ++i) {
    net::TcpOptions o;
    o.self = i;
    o.endpoints = endpoints;
    o.links = {1 - i};
    o.fingerprint = 0x9e37;
    o.run_id = 0x1234;
    o.connect_timeout_s = 10;
    o.peer_timeout_s = 10;
    o.max_payload_bytes = static_cast<std::uint64_t>(message_bytes) + 4096;
    peers[i] = net::make_tcp_transport(o);
  }
  std::thread other([&] { peers[1]->connect(); });
  peers[0]->connect();
  other.join();
  // Ping-pong `trips` messages of `bytes`; returns the wall and the process's CPU seconds.
  std::uint64_t tag = 0;
  auto ping_pong = [&](double bytes, int trips) {
    const net::Payload payload(static_cast<std::size_t>(std::max(1.0, bytes)), std::byte{1});
    const std::uint64_t first = tag;
    tag += static_cast<std::uint64_t>(trips);
    const double cpu0 = cpu_clock_s(CLOCK_PROCESS_CPUTIME_ID);
    const double start = now_s();
    std::exception_ptr echo_failed;  // a time-out on either side reaches the caller, not terminate()
    std::thread echo([&] {
      try {
        for (std::uint64_t k = first; k < first + static_cast<std::uint64_t>(trips); ++k) {
          auto got = peers[1]->receive(0, net::MessageType::kParameters, k, 0, 10.0);
          peers[1]->send(0, net::MessageType::kParameters, k, 1, net::SendBuffer(std::move(got))).wait();
        }
      } catch (...) {
        echo_failed = std::current_exception();
      }
    });
    try {
      for (std::uint64_t k = first; k < first + static_cast<std::uint64_t>(trips); ++k) {
        peers[0]->send(1, net::MessageType::kParameters, k, 0, net::SendBuffer(payload)).wait();
        peers[0]->receive(1, net::MessageType::kParameters, k, 1, 10.0);
      }
    } catch (...) {
      echo.join();  // its receive times out in turn
      throw;
    }
    echo.join();
    if (echo_failed) std::rethrow_exception(echo_failed);
    const double wall = now_s() - start;
    const double cpu = cpu_clock_s(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    return std::pair{wall / (2.0 * trips), cpu / (2.0 * trips)};
  };
  // The median of 5 rounds of each: one round's CPU per message moved by up to 40 % from
  // one plan call to the next on this machine, and the fast networks' predictions with it.
  auto median_round = [&](double bytes, int trips) {
    std::vector<double> walls, cpus;
    for (int round = 0; round < 5; ++round) {
      const auto [w, c] = ping_pong(bytes, trips);
      walls.push_back(w);
      cpus.push_back(c);
    }
    return std::pair{median(walls), median(cpus)};
  };
  const int trips = std::clamp(static_cast<int>(2e8 / std::max(message_bytes, 1.0)), 10, 400);
  const auto [wall, cpu] = median_round(message_bytes, trips);
  // A small message: what a message costs whatever its size (system calls, framing, the
  // thread hand-offs), which the S/n pieces of a ring all-reduce pay 2(n − 1) times.
  const auto small = median_round(64, 400);
  // The small message again with every core this process may use kept busy by a spinning
  // thread, as peers that share the cores keep them: a thread woken for a message now
  // takes its core from another, and pays for the switch. The transport's CPU is the
  // process's less the spinners' own (each reads its clock as it stops; thread creation
  // and exit, a few microseconds a round, count as the transport's).
  cpu_set_t usable;
  const int cores = sched_getaffinity(0, sizeof usable, &usable) == 0 ? std::max(1, CPU_COUNT(&usable)) : 1;
  auto contended_cpu = [&](int trips) {
    std::atomic<bool> stop{false};
    std::vector<double> spun(static_cast<std::size_t>(cores), 0.0);
    std::vector<std::thread> threads;
    struct Stop {  // on every way out, a time-out's included: no spinner left running
      std::atomic<bool>& stop;
      std::vector<std::thread>& threads;
      ~Stop() {
        stop = true;
        for (auto& t : threads)
          if (t.joinable()) t.join();
      }
    } stopping{stop, threads};
    const double cpu0 = cpu_clock_s(CLOCK_PROCESS_CPUTIME_ID);
    for (std::size_t t = 0; t < spun.size(); ++t)
      threads.emplace_back([&stop, &spun, t] {
        while (!stop.load(std::memory_order_relaxed)) {
        }
        spun[t] = cpu_clock_s(CLOCK_THREAD_CPUTIME_ID);
      });
    ping_pong(64, trips);
    stop = true;
    for (auto& t : threads) t.join();
    double cpu = cpu_clock_s(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    for (double s : spun) cpu -= s;
    return cpu / (2.0 * trips);
  };
  // Measured on this VM, a round comes out either at 125-170 µs a message or below the
  // idle figure (35-50: the scheduler kept the threads of the ping-pong on one core, and
  // none was woken across cores), in any proportion from one plan call to the next. Peers
  // sharing cores wake each other across them, so the rounds that did are taken.
  // At most 7 rounds and 3 s: on a host whose cores are shared further (a cgroup quota),
  // a round can take far longer than the 80 ms it takes here.
  std::vector<double> contended;
  const double contended_start = now_s();
  if (shared_cores && cores > 1)
    for (int round = 0; round < 7 && now_s() - contended_start < 3.0; ++round) contended.push_back(contended_cpu(150));
  std::thread closing([&] { peers[1]->close(); });  // goodbyes both ways, so neither sees a reset
  peers[0]->close();
  closing.join();
  p.message_s = wall;
  p.message_cpu_s = cpu;
  p.small_message_cpu_s = std::min(small.second, cpu);
  p.small_message_s = std::min(small.first, wall);
  // A ping-pong message wakes four threads: the sender's event loop for the send, the
  // sending thread when it is done, the receiver's loop and the receiving thread.
  std::erase_if(contended, [&](double c) { return c <= small.second; });
  p.busy_wake_rounds = static_cast<int>(contended.size());
  if (!contended.empty()) p.busy_wake_cpu_s = (median(contended) - small.second) / 4;
  p.bytes_per_s = message_bytes / p.message_s;
  std::vector<char> x(64 << 20, 1), y(64 << 20);
  const double copy_start = now_s();
  std::memcpy(y.data(), x.data(), x.size());
  p.copy_bytes_per_s = static_cast<double>(x.size()) / (now_s() - copy_start);
  return p;
}

namespace {

// SGP and EL: peer i's step, averaged over the steps' digraphs.
PeerStep directed_peer_step(const topology::Topology& topo, PeerAlgorithm algorithm, int i, double S, double compute_s,
                            const NetworkProbe& probe, int fanout) {
  const int steps = arc_steps(topo, algorithm);
  const bool overlapped = algorithm == PeerAlgorithm::kSgp;  // cta; EL runs atc
  const double bytes = algorithm == PeerAlgorithm::kSgp ? S + sizeof(float) : S;
  PeerStep mean;
  mean.compute_s = compute_s;
  std::string why = "compute";
  double longest_wait = 0;
  for (int t = 0; t < steps; ++t) {
    const topology::Digraph g = step_arcs(topo, algorithm, t, fanout);
    double wait = 0;
    std::string what = "compute";
    for (int j : g.in(i)) {
      const auto link = topo.link(j, i);
      const double seconds = link_time(link, bytes, probe);
      if (seconds > wait) {
        wait = seconds;
        what = str("link ", j, "->", i, " (", link.latency_ms, " ms, ",
                   link.bandwidth_mbps > 0 ? str(link.bandwidth_mbps, " Mbit/s") : std::string("no cap"), ")");
      }
    }
    const double out = static_cast<double>(g.out_degree(i));
    if (topo.node_bandwidth_mbps > 0 && out * bytes / (topo.node_bandwidth_mbps * 1e6 / 8) > wait) {
      wait = out * bytes / (topo.node_bandwidth_mbps * 1e6 / 8);
      what = str("peer ", i, "'s card (", topo.node_bandwidth_mbps, " Mbit/s for ", g.out_degree(i), " sends)");
    }
    if (wait > longest_wait) {
      longest_wait = wait;
      why = what;
    }
    const double messages = out + g.in_degree(i);
    const double cpu = compute_s + messages / 2.0 * probe.message_cpu_s +
                       static_cast<double>(g.in_degree(i) + 1) * bytes / probe.copy_bytes_per_s;
    const double comm = overlapped ? std::max(0.0, wait - compute_s) : wait;
    mean.cpu_s += cpu / steps;
    mean.comm_s += comm / steps;
    mean.step_s += std::max(cpu, compute_s + comm) / steps;
  }
  mean.bottleneck =
      mean.cpu_s >= compute_s + mean.comm_s ? (mean.cpu_s > compute_s * 1.5 ? "messages' CPU" : "compute") : why;
  return mean;
}

}  // namespace

NetworkPrediction predict_network(const topology::Topology& topo, PeerAlgorithm algorithm, double S, double compute_s,
                                  const NetworkProbe& probe, int shared_cores, const Evaluation& evaluation,
                                  int fanout) {
  const int n = topo.num_peers();
  NetworkPrediction out;
  out.peers.resize(static_cast<std::size_t>(n));
  auto card = [&](double bytes) {  // a peer's outgoing bytes through its card, when capped
    return topo.node_bandwidth_mbps > 0 ? bytes / (topo.node_bandwidth_mbps * 1e6 / 8) : 0.0;
  };
  // Per message of S bytes: the CPU at both ends, as the probe measured it.
  const double message_cpu = probe.message_cpu_s;
  LogReplay log_replay;
  if (algorithm == PeerAlgorithm::kTreeAllReduce || algorithm == PeerAlgorithm::kRdAllReduce)
    log_replay = replay_log_allreduce(algorithm, n, [&](int from, int to) {
      // One message a time per sender, so a card is never shared.
      return std::max(link_time(topo.link(from, to), S, probe), card(S));
    });
  for (int i = 0; i < n; ++i) {
    PeerStep& p = out.peers[static_cast<std::size_t>(i)];
    if (algorithm == PeerAlgorithm::kSgp || algorithm == PeerAlgorithm::kEl) {
      p = directed_peer_step(topo, algorithm, i, S, compute_s, probe, fanout);
      continue;
    }
    p.compute_s = compute_s;
    double wait = 0;
    int messages = 0;
    std::string why = "compute";
    auto consider = [&](double seconds, std::string what) {
      if (seconds > wait) {
        wait = seconds;
        why = std::move(what);
      }
    };
    if (algorithm == PeerAlgorithm::kDpsgd) {
      const auto neighbours = topo.graph.neighbors(i);
      messages = 2 * static_cast<int>(neighbours.size());
      for (int j : neighbours) {
        const auto link = topo.link(i, j);
        consider(link_time(link, S, probe),
                 str("link ", i, "-", j, " (", link.latency_ms, " ms, ",
                     link.bandwidth_mbps > 0 ? str(link.bandwidth_mbps, " Mbit/s") : std::string("no cap"), ")"));
      }
      consider(card(S * static_cast<double>(neighbours.size())),
               str("peer ", i, "'s card (", topo.node_bandwidth_mbps, " Mbit/s for ", neighbours.size(), " sends)"));
      // Mixing: a pass over each neighbour's copy.
      // Each end pays half a message's CPU; mixing reads every neighbour's copy.
      p.cpu_s = compute_s + messages / 2.0 * message_cpu +
                static_cast<double>(neighbours.size() + 1) * S / probe.copy_bytes_per_s;
      p.comm_s = std::max(0.0, wait - compute_s);  // the gossip overlaps the gradient
      p.step_s = std::max(p.cpu_s, compute_s + p.comm_s);
    } else if (algorithm == PeerAlgorithm::kAllReduce) {
      double slowest = 0;
      std::string which;
      for (int k = 0; k < n; ++k) {
        const auto link = topo.link(k, (k + 1) % n);
        const double t = link_time(link, S / n, probe);
        if (t > slowest) {
          slowest = t;
          which = str("ring link ", k, "-", (k + 1) % n);
        }
      }
      consider(2.0 * (n - 1) * std::max(slowest, card(S / n)), str(2 * (n - 1), " ring steps, bound by ", which));
      messages = 4 * (n - 1);
      // Messages of S/n: each pays the fixed cost of a message and 1/n of S's per-byte
      // cost; each end pays half.
      // Each received piece is added in (reduce-scatter) or copied (all-gather).
      const double piece_cpu = probe.small_message_cpu_s + (message_cpu - probe.small_message_cpu_s) / n;
      p.cpu_s = compute_s + messages / 2.0 * piece_cpu + 2.0 * (n - 1) / n * S / probe.copy_bytes_per_s;
      p.comm_s = wait;
      p.step_s = std::max(p.cpu_s, compute_s + wait);
    } else if (algorithm == PeerAlgorithm::kTreeAllReduce || algorithm == PeerAlgorithm::kRdAllReduce) {
      messages = log_replay.messages[static_cast<std::size_t>(i)];
      consider(log_replay.done_s[static_cast<std::size_t>(i)],
               str(algorithm == PeerAlgorithm::kTreeAllReduce ? "the binomial tree" : "recursive doubling",
                   " of the whole vector, its slowest message on link ", log_replay.slowest_link));
      // Each message costs its ends CPU, and each one received is added (or copied) in.
      p.cpu_s = compute_s + messages / 2.0 * message_cpu + messages / 2.0 * S / probe.copy_bytes_per_s;
      p.comm_s = wait;
      p.step_s = std::max(p.cpu_s, compute_s + wait);
    } else {
      const int server = 0;
      if (i == server) {
        // The latencies add up (gradients in, then parameters out); the bytes overlap: the
        // workers first served push their next gradient while the card sends the others',
        // all but the last served one's, which crosses its link after the broadcast.
        double latency = 0, in = 0, outgoing = 0;
        for (int w = 1; w < n; ++w) {
          latency = std::max(latency, (topo.link(w, server).latency_ms + topo.link(server, w).latency_ms) * 1e-3);
          in = std::max(in, link_time({0, topo.link(w, server).bandwidth_mbps}, S, probe));
          outgoing = std::max(outgoing, link_time({0, topo.link(server, w).bandwidth_mbps}, S, probe));
        }
        consider(
            latency + std::max(outgoing, card(S * (n - 1))) + in,
            str("the server's ", n - 1, " gradients in and parameters out",
                topo.node_bandwidth_mbps > 0 ? str(" through its ", topo.node_bandwidth_mbps, " Mbit/s card") : ""));
        messages = 2 * (n - 1);
      } else {
        consider(link_time(topo.link(i, server), S, probe) + link_time(topo.link(server, i), S, probe),
                 str("link ", i, "-", server));
        messages = 2;
      }
      p.cpu_s = compute_s + messages / 2.0 * message_cpu;
      p.comm_s = wait;
      p.step_s = std::max(p.cpu_s, compute_s + wait);
    }
    p.bottleneck = p.cpu_s >= compute_s + p.comm_s ? (p.cpu_s > compute_s * 1.5 ? "messages' CPU" : "compute") : why;
  }
  // Synchronous: everyone moves at the slowest peer's pace (a parameter server's workers
  // wait for the server, D-PSGD's peers for their neighbours, and theirs for theirs).
  for (int i = 0; i < n; ++i)
    if (out.peers[static_cast<std::size_t>(i)].step_s > out.peers[static_cast<std::size_t>(out.slowest)].step_s)
      out.slowest = i;
  const PeerStep& slow = out.peers[static_cast<std::size_t>(out.slowest)];
  out.step_s = slow.step_s;
  out.where = str("peer ", out.slowest, ": ", slow.bottleneck);
  if (shared_cores > 0) {
    double cpu = 0;
    for (const auto& p : out.peers) cpu += p.cpu_s;
    const double tests =
        evaluation.every > 0 ? kTestsLanding * (n - 1) * evaluation.one_s / static_cast<double>(evaluation.every) : 0.0;
    cpu += tests;
    const std::string cpu_note =
        str(ms_3g(cpu), " ms of CPU a step",
            tests > 0 ? str(", ", ms_3g(tests), " of it the other peers' tests every ", evaluation.every, " steps")
                      : std::string());
    if (cpu / shared_cores > out.step_s) {
      out.step_s = cpu / shared_cores;
      out.where = str("the ", n, " peers sharing ", shared_cores, " cores (", cpu_note, ")");
    }
    const detail::StepCosts costs{.compute_s = compute_s,
                                  .update_s = optimizer_pass_s(S, probe.copy_bytes_per_s),
                                  .tests_s = tests,
                                  .copy_bytes_per_s = probe.copy_bytes_per_s,
                                  .small_message_cpu_s = probe.small_message_cpu_s,
                                  .message_cpu_s = probe.message_cpu_s,
                                  .busy_wake_cpu_s = probe.busy_wake_cpu_s,
                                  .small_wire_s = std::max(0.0, probe.small_message_s - probe.small_message_cpu_s),
                                  .wire_s = std::max(0.0, probe.message_s - probe.message_cpu_s)};
    const auto replayed = detail::replay_on_shared_cores(topo, algorithm, S, costs, shared_cores, fanout);
    if (replayed.step_s > out.step_s) {
      out.step_s = replayed.step_s;
      const std::string wakes = replayed.busy_wakes > 0
                                    ? str(" and ", std::lround(replayed.busy_wakes), " threads woken onto busy cores")
                                    : std::string();
      out.where =
          replayed.busy < 0.97
              ? str("the ", n, " peers sharing ", shared_cores, " cores, busy only ", std::lround(100 * replayed.busy),
                    " % of the time: peers wait for each other's messages (", cpu_note, wakes, ")")
              : str("the ", n, " peers sharing ", shared_cores, " cores (", cpu_note, wakes, ")");
    }
  }
  return out;
}

}  // namespace peertrain::plan
