// The task-by-task replay on shared cores; see shared_cores.h.
#include "shared_cores.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <queue>
#include <vector>

#include "peertrain/core/error.h"

namespace peertrain::plan::detail {
namespace {

// A list schedule of CPU tasks with dependencies on `cores` cores. A task is ready when
// every task it waits for has ended (plus that edge's delay) and, on a thread, when the
// thread's previous task has ended; the ready tasks take cores in the order they became
// ready, each the first core to come free. A task on an event loop (a transport's I/O
// thread, which takes its sends and receives in the order they come, not in program
// order) also queues for its loop, first come first served. A thread's task that waited
// for another thread (it slept) and finds every core busy pays `busy_wake_s` first: the
// switch that takes a core from another thread (in a run, another peer's process).
class CoreSchedule {
 public:
  CoreSchedule(int threads, int loops, double busy_wake_s)
      : last_on_thread_(static_cast<std::size_t>(threads), -1),
        loops_(static_cast<std::size_t>(loops)),
        busy_wake_s_(busy_wake_s) {}

  // thread < 0: on event loop `loop` instead. Every task in `after` was added before, so
  // the tasks cannot wait in a cycle.
  int add(int thread, double cpu_s, std::initializer_list<std::pair<int, double>> after = {}, int loop = -1) {
    Task t{.cpu_s = cpu_s, .loop = loop, .after = {after.begin(), after.end()}};
    for (const auto& [before, delay] : t.after)
      PEERTRAIN_CHECK(before >= 0 && before < static_cast<int>(tasks_.size()) && delay >= 0,
                      "shared-core replay: a task waits for a later one, or a negative delay");
    if (thread >= 0) {
      int& last = last_on_thread_[static_cast<std::size_t>(thread)];
      t.previous = last;
      if (last >= 0) t.after.push_back({last, 0.0});
      last = static_cast<int>(tasks_.size());
    }
    tasks_.push_back(std::move(t));
    return static_cast<int>(tasks_.size()) - 1;
  }
  void wait_also(int task, int other, double delay_s = 0) {
    PEERTRAIN_CHECK(other >= 0 && other < task && delay_s >= 0,
                    "shared-core replay: a task waits for a later one, or a negative delay");
    tasks_[static_cast<std::size_t>(task)].after.push_back({other, delay_s});
  }

  void run(int cores) {
    const std::size_t n = tasks_.size();
    std::vector<std::vector<std::pair<int, double>>> waiting(n);  // task → (dependent, delay)
    std::vector<int> unmet(n, 0);
    ready_.assign(n, 0.0);
    end_.assign(n, 0.0);
    using Entry = std::pair<double, int>;  // ready time, task (ties: the earlier added)
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue;
    for (std::size_t i = 0; i < n; ++i) {
      for (const auto& [before, delay] : tasks_[i].after)
        waiting[static_cast<std::size_t>(before)].push_back({static_cast<int>(i), delay});
      unmet[i] = static_cast<int>(tasks_[i].after.size());
      if (unmet[i] == 0) queue.push({0.0, static_cast<int>(i)});
    }
    std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
    for (int c = 0; c < cores; ++c) free_at.push(0.0);
    double now = 0;  // the queue's pops never go back in time
    // A loop's turn goes to the first task in its line, queued at the later of its own
    // ready time and the loop's being free; the others wait in line.
    auto next_turn = [&](Loop& l) {
      if (l.turn >= 0 || l.line.empty()) return;
      l.turn = l.line.front();
      l.line.pop_front();
      queue.push({std::max({ready_[static_cast<std::size_t>(l.turn)], l.free, now}), l.turn});
    };
    std::size_t done = 0;
    while (!queue.empty()) {
      const auto [ready, task] = queue.top();
      queue.pop();
      now = ready;
      const auto i = static_cast<std::size_t>(task);
      if (const int loop = tasks_[i].loop; loop >= 0) {
        Loop& l = loops_[static_cast<std::size_t>(loop)];
        if (l.turn != task) {  // it joins the line
          l.line.push_back(task);
          next_turn(l);
          continue;
        }
        l.turn = -1;
      }
      double cpu = tasks_[i].cpu_s;
      if (const int previous = tasks_[i].previous; busy_wake_s_ > 0 && previous >= 0 &&
                                                   ready > end_[static_cast<std::size_t>(previous)] &&
                                                   free_at.top() > ready) {
        cpu += busy_wake_s_;
        if (task >= count_from_) ++busy_wakes_;
      }
      double start = ready;
      if (cpu > 0) {  // a pure wait takes no core
        start = std::max(ready, free_at.top());
        free_at.pop();
        free_at.push(start + cpu);
      }
      end_[i] = start + cpu;
      busy_s_ += cpu;
      if (const int loop = tasks_[i].loop; loop >= 0) {
        Loop& l = loops_[static_cast<std::size_t>(loop)];
        l.free = end_[i];
        next_turn(l);
      }
      ++done;
      for (const auto& [next, delay] : waiting[i]) {
        auto& r = ready_[static_cast<std::size_t>(next)];
        r = std::max(r, end_[i] + delay);
        if (--unmet[static_cast<std::size_t>(next)] == 0) queue.push({r, next});
      }
    }
    PEERTRAIN_CHECK(done == n, "shared-core replay: ", n - done, " of ", n, " tasks never ran");
  }
  double end(int task) const { return end_[static_cast<std::size_t>(task)]; }
  double busy_s() const { return busy_s_; }  // the CPU of every task, wake-ups included
  // The wake-ups of the tasks added from `task` on (the settled steps').
  void count_wakes_from(int task) { count_from_ = task; }
  long long busy_wakes() const { return busy_wakes_; }
  int size() const { return static_cast<int>(tasks_.size()); }
  double makespan_s() const { return end_.empty() ? 0.0 : *std::max_element(end_.begin(), end_.end()); }

 private:
  struct Task {
    double cpu_s = 0;
    int loop = -1;
    int previous = -1;  // the task before it on its thread
    std::vector<std::pair<int, double>> after;
  };
  struct Loop {
    double free = 0;       // when its last task ends
    int turn = -1;         // the task queued to run on it next
    std::deque<int> line;  // the ready tasks waiting for it, in the order they came
  };
  std::vector<Task> tasks_;
  std::vector<int> last_on_thread_;
  std::vector<Loop> loops_;
  double busy_wake_s_ = 0;
  long long busy_wakes_ = 0;
  int count_from_ = 0;
  double busy_s_ = 0;
  std::vector<double> ready_, end_;
};

// The peers' programs for one algorithm, step after step, on one CoreSchedule: peer p's
// training thread is thread p; its transport's sends and receives are on its event loop p.
class Programs {
 public:
  Programs(const topology::Topology& topo, double S, const StepCosts& c)
      : topo_(topo), S_(S), c_(c), s_(topo.num_peers(), topo.num_peers(), c.busy_wake_cpu_s) {}

  // The training thread's own CPU (compute, sums), after whatever it last did.
  int work(int peer, double cpu_s) { return s_.add(peer, cpu_s); }
  // A message of `bytes` from `from`'s training thread (posted after its last task) to
  // `to`: the sender's I/O thread sends it, the wire carries it, the receiver's I/O thread
  // reads it. Returns {send, receive}.
  std::pair<int, int> message(int from, int to, double bytes) {
    const int posted = s_.add(from, 0.0);
    const double half_cpu = interpolate(c_.small_message_cpu_s, c_.message_cpu_s, bytes) / 2;
    const int send = s_.add(-1, half_cpu, {{posted, 0.0}}, from);
    const int receive = s_.add(-1, half_cpu, {{send, wire(from, to, bytes)}}, to);
    return {send, receive};
  }
  // The training thread takes a received message in (summing or copying `bytes`).
  int take(int peer, int receive, double bytes) {
    const int t = s_.add(peer, bytes / c_.copy_bytes_per_s);
    s_.wait_also(t, receive);
    return t;
  }
  // The training thread waits for its send to finish (before the buffer may change).
  void wait_for(int peer, int send) { s_.wait_also(s_.add(peer, 0.0), send); }
  int step_end(int peer) { return s_.add(peer, 0.0); }

  double S() const { return S_; }
  double copy_bytes_per_s() const { return c_.copy_bytes_per_s; }
  CoreSchedule& schedule() { return s_; }

 private:
  double interpolate(double small, double full, double bytes) const {
    return small + (full - small) * std::clamp(bytes / S_, 0.0, 1.0);
  }
  // Beyond both ends' CPU: the loopback's own wait, or the emulated link's latency and cap.
  double wire(int from, int to, double bytes) const {
    const auto link = topo_.link(from, to);
    const double capped = link.bandwidth_mbps > 0 ? bytes / (link.bandwidth_mbps * 1e6 / 8) : 0.0;
    return link.latency_ms * 1e-3 + std::max(capped, interpolate(c_.small_wire_s, c_.wire_s, bytes));
  }

  const topology::Topology& topo_;
  double S_;
  StepCosts c_;
  CoreSchedule s_;
};

// One step of each algorithm, as algo/collectives.cpp and train/step_algorithm.cpp run it.
void ring_step(Programs& p, int n) {
  const double piece = p.S() / n;
  for (int round = 0; round < 2 * (n - 1); ++round) {
    std::vector<std::pair<int, int>> sent(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) sent[static_cast<std::size_t>(i)] = p.message(i, (i + 1) % n, piece);
    for (int i = 0; i < n; ++i) {
      p.take(i, sent[static_cast<std::size_t>((i + n - 1) % n)].second, piece);
      p.wait_for(i, sent[static_cast<std::size_t>(i)].first);
    }
  }
}

void blocking_send(Programs& p, int from, int to) {
  const auto [send, receive] = p.message(from, to, p.S());
  p.wait_for(from, send);
  p.take(to, receive, p.S());
}

void tree_step(Programs& p, int n) {
  int top = 1;
  for (; top < n; top <<= 1)
    for (int me = top; me < n; me += 2 * top) blocking_send(p, me, me - top);
  for (int mask = top >> 1; mask > 0; mask >>= 1)
    for (int me = 0; me + mask < n; me += 2 * mask) blocking_send(p, me, me + mask);
}

void rd_step(Programs& p, int n) {
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int extra = n - p2;
  auto real = [&](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  for (int e = 0; e < extra; ++e) blocking_send(p, 2 * e, 2 * e + 1);
  for (int mask = 1; mask < p2; mask <<= 1)
    for (int v = 0; v < p2; ++v) {
      if ((v ^ mask) < v) continue;
      const int a = real(v), b = real(v ^ mask);
      const auto ab = p.message(a, b, p.S()), ba = p.message(b, a, p.S());
      p.wait_for(b, ba.first);  // exchange_add: its own send done before the sum changes x
      p.take(b, ab.second, p.S());
      p.wait_for(a, ab.first);
      p.take(a, ba.second, p.S());
    }
  for (int e = 0; e < extra; ++e) blocking_send(p, 2 * e + 1, 2 * e);
}

// The server gathers the gradients in the workers' order, updates x (the workers do not)
// and sends it to each.
void ps_step(Programs& p, int n, double update_s) {
  std::vector<std::pair<int, int>> gradients(static_cast<std::size_t>(n));
  for (int w = 1; w < n; ++w) gradients[static_cast<std::size_t>(w)] = p.message(w, 0, p.S());
  for (int w = 1; w < n; ++w) p.take(0, gradients[static_cast<std::size_t>(w)].second, p.S());
  p.work(0, update_s);
  std::vector<int> sends;
  for (int w = 1; w < n; ++w) {
    const auto [send, receive] = p.message(0, w, p.S());
    sends.push_back(send);
    p.take(w, receive, p.S());  // the parameters copied in
    p.wait_for(w, gradients[static_cast<std::size_t>(w)].first);
  }
  for (int send : sends) p.wait_for(0, send);
}

// For each peer i and its k-th neighbour j, where i stands among j's neighbours: the
// message j sends to i in D-PSGD is j's sent[j][slot[i][k]].
std::vector<std::vector<std::size_t>> neighbour_slots(const topology::Topology& topo, int n) {
  std::vector<std::vector<std::size_t>> slot(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    for (int j : topo.graph.neighbors(i)) {
      const auto their = topo.graph.neighbors(j);
      slot[static_cast<std::size_t>(i)].push_back(
          static_cast<std::size_t>(std::find(their.begin(), their.end(), i) - their.begin()));
    }
  return slot;
}

// D-PSGD in its cta form (launch's default), as algo/gossip.cpp runs it: x goes to every
// neighbour while the gradient and the update are computed; then each neighbour's copy is
// received, the sends are waited for, and one pass mixes x with every copy.
void dpsgd_step(Programs& p, const topology::Topology& topo, const std::vector<std::vector<std::size_t>>& slot,
                double gradient_s, double update_s) {
  const int n = topo.num_peers();
  std::vector<std::vector<std::pair<int, int>>> sent(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    for (int j : topo.graph.neighbors(i)) sent[static_cast<std::size_t>(i)].push_back(p.message(i, j, p.S()));
  for (int i = 0; i < n; ++i) {
    p.work(i, gradient_s);
    p.work(i, update_s);
  }
  for (int i = 0; i < n; ++i) {
    const auto neighbours = topo.graph.neighbors(i);
    for (std::size_t k = 0; k < neighbours.size(); ++k)
      p.take(i, sent[static_cast<std::size_t>(neighbours[k])][slot[static_cast<std::size_t>(i)][k]].second, 0.0);
    for (const auto& [send, receive] : sent[static_cast<std::size_t>(i)]) p.wait_for(i, send);
    p.work(i, static_cast<double>(neighbours.size() + 1) * p.S() / p.copy_bytes_per_s());
  }
}

// SGP (cta) and EL (atc) over the step's digraph: x goes along each out-arc (while the
// gradient is computed, for SGP's cta; after the update, for EL's atc), each in-arc's copy
// is taken, the sends are waited for, and one pass mixes.
void directed_step(Programs& p, const topology::Digraph& g, bool overlapped, double gradient_s, double update_s) {
  const int n = g.num_peers();
  std::vector<std::vector<std::pair<int, std::pair<int, int>>>> sent(static_cast<std::size_t>(n));  // (to, message)
  auto send_all = [&](int i) {
    for (int j : g.out(i)) sent[static_cast<std::size_t>(i)].push_back({j, p.message(i, j, p.S())});
  };
  if (overlapped)
    for (int i = 0; i < n; ++i) send_all(i);
  for (int i = 0; i < n; ++i) {
    p.work(i, gradient_s);
    p.work(i, update_s);
    if (!overlapped) send_all(i);
  }
  for (int i = 0; i < n; ++i) {
    for (int j : g.in(i))
      for (const auto& [to, message] : sent[static_cast<std::size_t>(j)])
        if (to == i) p.take(i, message.second, 0.0);
    for (const auto& [to, message] : sent[static_cast<std::size_t>(i)]) p.wait_for(i, message.first);
    p.work(i, static_cast<double>(g.in_degree(i) + 1) * p.S() / p.copy_bytes_per_s());
  }
}

}  // namespace

Replayed replay_on_shared_cores(const topology::Topology& topo, PeerAlgorithm algorithm, double S,
                                const StepCosts& costs, int cores, int fanout) {
  const int n = topo.num_peers();
  PEERTRAIN_CHECK(cores > 0 && n > 0, "replay_on_shared_cores: ", cores, " cores, ", n, " peers");
  if (!(S > 0) || !(costs.copy_bytes_per_s > 0)) return {};
  // Steps enough for the pace to settle; the first starts with every peer at once.
  constexpr int kSteps = 6, kWarm = 2;
  // Five tasks a message (post, send, receive, take, wait) and a few a step, a microsecond
  // or two each: beyond half a million (hundreds of peers on one machine) the replay would
  // take longer than a plan should, and it is left out.
  double messages = 2.0 * (n - 1);  // the tree and the server
  if (algorithm == PeerAlgorithm::kAllReduce)
    messages = 2.0 * (n - 1) * n;
  else if (algorithm == PeerAlgorithm::kDpsgd)
    messages = 2.0 * static_cast<double>(topo.graph.num_edges());
  else if (algorithm == PeerAlgorithm::kRdAllReduce)
    messages = 2.0 * n + n * std::ceil(std::log2(static_cast<double>(n)));
  else if (algorithm == PeerAlgorithm::kSgp || algorithm == PeerAlgorithm::kEl)
    messages = static_cast<double>(step_arcs(topo, algorithm, 0, fanout).num_arcs());
  if ((5 * messages + 4.0 * n) * kSteps > 5e5) return {};
  Programs p(topo, S, costs);
  // A step's own CPU: the gradient, with the other peers' test passes spread over the peers
  // (network.h's Evaluation), and the optimizer's update.
  const double update_s = std::min(costs.update_s, costs.compute_s);
  const double gradient_s = costs.compute_s - update_s + costs.tests_s / n;
  const auto slot =
      algorithm == PeerAlgorithm::kDpsgd ? neighbour_slots(topo, n) : std::vector<std::vector<std::size_t>>{};
  int warm_end = -1, last_end = -1;  // peer 0's last step markers
  for (int step = 0; step < kSteps; ++step) {
    if (step == kWarm) p.schedule().count_wakes_from(p.schedule().size());
    if (algorithm == PeerAlgorithm::kDpsgd) {
      dpsgd_step(p, topo, slot, gradient_s, update_s);
    } else if (algorithm == PeerAlgorithm::kSgp || algorithm == PeerAlgorithm::kEl) {
      directed_step(p, step_arcs(topo, algorithm, step, fanout), algorithm == PeerAlgorithm::kSgp, gradient_s,
                    update_s);
    } else {
      for (int i = 0; i < n; ++i) p.work(i, gradient_s);
      switch (algorithm) {
        case PeerAlgorithm::kAllReduce:
          ring_step(p, n);
          break;
        case PeerAlgorithm::kTreeAllReduce:
          tree_step(p, n);
          break;
        case PeerAlgorithm::kRdAllReduce:
          rd_step(p, n);
          break;
        default:
          ps_step(p, n, update_s);
          break;
      }
      if (algorithm != PeerAlgorithm::kPs)  // each peer updates with the sum
        for (int i = 0; i < n; ++i) p.work(i, update_s);
    }
    (step + 1 == kWarm ? warm_end : last_end) = p.step_end(0);
  }
  p.schedule().run(cores);
  // Peer 0's pace over the settled steps (every peer keeps the same pace: each waits for the others).
  const CoreSchedule& s = p.schedule();
  return {.step_s = (s.end(last_end) - s.end(warm_end)) / (kSteps - kWarm),
          .busy = s.busy_s() / (cores * s.makespan_s()),
          .busy_wakes = static_cast<double>(s.busy_wakes()) / (kSteps - kWarm)};
}

}  // namespace peertrain::plan::detail
