// Ring attention benchmark: what sequence parallelism buys in memory, and what the causal
// split does to the balance of work. SP ranks are threads of one ThreadGroup; every number
// of memory comes from RingAttention's own accounting (peak_bytes, checked against
// planned_peak_bytes on every run) plus the attention tensors the rank holds for the call.
//
//   (a) peak attention memory per rank at fixed T for SP = 1, 2, 4, 8, online-softmax ring
//       and RSA: the ring's falls as ~1/SP, RSA's as ~1/SP of a T² term;
//   (b) the longest T that fits under a per-rank cap (the ring's SP = 1 peak at the base
//       T) for SP = 1 and SP = 4, found by bisection on the accounting formula, the SP = 4
//       answer then run once to check the formula against the measured peak; target ≥ 3.5×;
//   (c) RSA against the ring side by side: memory and time;
//   (d) the causal work per rank (score entries computed), max/mean, zigzag against
//       contiguous for SP = 4 and 8; 1.0 is perfect balance.
//
// Times: wall clock, and the largest per-rank thread CPU time (CLOCK_THREAD_CPUTIME_ID, not
// running while a thread is preempted): what the call would take with a core per rank on
// a machine with fewer cores than ranks. Eigen runs single-threaded inside each rank.
//
// Usage: ring_attention_bench [--tokens 4096] [--head-dim 32] [--heads 4] [--batch 1]
//                             [--cap-sp 4] [--no-validate] [--json FILE]
#include <time.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "peertrain/comm/thread_group.h"
#include "peertrain/core/error.h"
#include <nlohmann/json.hpp>
#include "peertrain/core/rng.h"
#include "peertrain/parallel/ring_attention.h"

namespace {

using namespace peertrain;
using namespace peertrain::parallel;
using Json = nlohmann::ordered_json;
using model::AttentionShape;

struct Options {
  int tokens = 4096, head_dim = 32, heads = 4, batch = 1, cap_sp = 4;
  bool validate = true;
  std::string json_path;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--no-validate") {
      o.validate = false;
      continue;
    }
    if (flag == "--help" || flag == "-h") {
      std::printf(
          "usage: ring_attention_bench [--tokens 4096] [--head-dim 32] [--heads 4] [--batch 1]\n"
          "                            [--cap-sp 4] [--no-validate] [--json FILE]\n"
          "ring attention: memory per rank at SP = 1, 2, 4, 8 (beside RSA's), the causal work balance,\n"
          "and the longest sequence SP = --cap-sp fits in SP = 1's memory\n");
      std::exit(0);
    }
    if (i + 1 >= argc) throw Error(ErrorKind::kInvalidArgument, str(flag, " needs a value"));
    const std::string value = argv[++i];
    if (flag == "--json") {
      o.json_path = value;
      continue;
    }
    const int number = std::stoi(value);
    if (number < 1) throw Error(ErrorKind::kInvalidArgument, str(flag, " ", value, ": expected a positive number"));
    if (flag == "--tokens") o.tokens = number;
    else if (flag == "--head-dim") o.head_dim = number;
    else if (flag == "--heads") o.heads = number;
    else if (flag == "--batch") o.batch = number;
    else if (flag == "--cap-sp") o.cap_sp = number;
    else throw Error(ErrorKind::kInvalidArgument, str("unknown flag ", flag));
  }
  return o;
}

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The attention tensors a rank holds for a call besides the core's own buffers: forward
// q, k, v, out and lse; backward also dout, dq, dk, dv.
std::size_t resident_bytes(const AttentionShape& local, bool backward) {
  const std::size_t e = static_cast<std::size_t>(local.elements()), rows = static_cast<std::size_t>(local.rows());
  return 4 * ((backward ? 8 : 4) * e + rows);
}

AttentionShape local_shape(const Options& o, int tokens, int sp) {
  return AttentionShape{o.batch, o.heads, o.head_dim, tokens / sp, true};
}

// Peak attention memory of a rank over a training call (forward, then backward), from the
// accounting formula.
std::size_t planned_total(const Options& o, int tokens, int sp, RingMode mode) {
  const AttentionShape s = local_shape(o, tokens, sp);
  return std::max(resident_bytes(s, false) + RingAttention::planned_peak_bytes(s, sp, mode, false),
                  resident_bytes(s, true) + RingAttention::planned_peak_bytes(s, sp, mode, true));
}

struct Run {
  int tokens = 0, sp = 0;
  RingMode mode = RingMode::kOnlineSoftmax;
  SequenceSplit split = SequenceSplit::kZigzag;
  std::size_t own_forward = 0, own_backward = 0, total = 0;
  bool accounting_matches = true;
  double wall_forward_s = 0, wall_backward_s = 0, cpu_forward_s = 0, cpu_backward_s = 0;
  std::vector<long long> work;  // forward, per rank
  double work_imbalance() const {
    double sum = 0;
    for (long long w : work) sum += static_cast<double>(w);
    return sum > 0 ? static_cast<double>(*std::max_element(work.begin(), work.end())) / (sum / work.size()) : 1.0;
  }
};

Run run(const Options& o, int tokens, int sp, RingMode mode, SequenceSplit split, bool backward) {
  Run result;
  result.tokens = tokens;
  result.sp = sp;
  result.mode = mode;
  result.split = split;
  result.work.assign(sp, 0);
  comm::ThreadGroup group(sp, "bench sequence group");
  std::mutex mutex;
  std::exception_ptr failure;
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0, t1, t2;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < sp; ++rank)
    threads.emplace_back([&, rank] {
      try {
        comm::Group& g = group.member(rank);
        const auto positions = sequence_positions(tokens, sp, rank, split);
        const AttentionShape shape = local_shape(o, tokens, sp);
        const std::size_t n = static_cast<std::size_t>(shape.elements());
        Rng rng(1000 + rank);
        auto random = [&] {
          std::vector<float> v(n);
          for (auto& x : v) x = static_cast<float>(rng.normal());
          return v;
        };
        const auto q = random(), k = random(), v = random(), dout = random();
        std::vector<float> out(n), lse(static_cast<std::size_t>(shape.rows())), dq(n), dk(n), dv(n);
        RingAttention ring(g, mode, 600.0);
        g.barrier();
        if (rank == 0) t0 = Clock::now();
        double cpu = thread_cpu_s();
        ring.forward(shape, positions, q.data(), k.data(), v.data(), out.data(), lse.data());
        const double cpu_forward = thread_cpu_s() - cpu;
        const std::size_t own_forward = ring.peak_bytes();
        const long long work = ring.work();
        g.barrier();
        if (rank == 0) t1 = Clock::now();
        double cpu_backward = 0;
        std::size_t own_backward = 0;
        if (backward) {
          cpu = thread_cpu_s();
          ring.backward(shape, positions, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                        dk.data(), dv.data());
          cpu_backward = thread_cpu_s() - cpu;
          own_backward = ring.peak_bytes();
        }
        g.barrier();
        if (rank == 0) t2 = Clock::now();
        std::lock_guard lock(mutex);
        result.own_forward = std::max(result.own_forward, own_forward);
        result.own_backward = std::max(result.own_backward, own_backward);
        result.accounting_matches =
            result.accounting_matches &&
            own_forward == RingAttention::planned_peak_bytes(shape, sp, mode, false) &&
            (!backward || own_backward == RingAttention::planned_peak_bytes(shape, sp, mode, true));
        result.cpu_forward_s = std::max(result.cpu_forward_s, cpu_forward);
        result.cpu_backward_s = std::max(result.cpu_backward_s, cpu_backward);
        result.work[rank] = work;
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!failure) failure = std::current_exception();
        group.member(rank).abort("benchmark rank failed");
      }
    });
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
  const AttentionShape shape = local_shape(o, tokens, sp);
  result.total = std::max(resident_bytes(shape, false) + result.own_forward,
                          backward ? resident_bytes(shape, true) + result.own_backward : 0);
  result.wall_forward_s = std::chrono::duration<double>(t1 - t0).count();
  result.wall_backward_s = std::chrono::duration<double>(t2 - t1).count();
  return result;
}

// The largest T (a multiple of 2·SP, as zigzag needs) whose planned peak fits the cap.
int longest_fitting(const Options& o, int sp, RingMode mode, std::size_t cap) {
  const int step = 2 * sp;
  long long lo = 0, hi = 1;  // in units of step: fits(lo), !fits(hi)
  auto fits = [&](long long units) { return planned_total(o, static_cast<int>(units * step), sp, mode) <= cap; };
  while (fits(hi)) {
    lo = hi;
    hi *= 2;
    if (hi * step > (1LL << 26)) break;
  }
  while (hi - lo > 1) {
    const long long mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return static_cast<int>(lo * step);
}

double mib(std::size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

Json json_runs(const std::vector<Run>& runs) {
  Json out = Json::array();
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const Run& r = runs[i];
    Json o;
    o["mode"] = to_string(r.mode);
    o["split"] = to_string(r.split);
    o["tokens"] = r.tokens;
    o["sp"] = r.sp;
    o["own_forward_bytes"] = r.own_forward;
    o["own_backward_bytes"] = r.own_backward;
    o["peak_attention_bytes_per_rank"] = r.total;
    o["accounting_matches"] = r.accounting_matches;
    o["wall_forward_s"] = r.wall_forward_s;
    o["wall_backward_s"] = r.wall_backward_s;
    o["cpu_forward_s_max_rank"] = r.cpu_forward_s;
    o["cpu_backward_s_max_rank"] = r.cpu_backward_s;
    std::vector<double> work(r.work.begin(), r.work.end());
    o["work_per_rank"] = work;
    o["work_max_over_mean"] = r.work_imbalance();
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    Eigen::setNbThreads(1);
    const int T = o.tokens;
    std::printf("ring attention: T=%d, head_dim %d, %d heads, batch %d, causal, zigzag; %u hardware threads\n\n", T,
                o.head_dim, o.heads, o.batch, std::thread::hardware_concurrency());

    // (a) and (c): memory and time at fixed T.
    std::vector<Run> fixed;
    std::printf("(a, c) peak attention memory per rank and time, forward + backward\n");
    std::printf("%-5s %3s %12s %12s %14s %8s %10s %10s %10s %10s\n", "mode", "SP", "own fwd MiB", "own bwd MiB",
                "per rank MiB", "vs SP=1", "wall fwd", "wall bwd", "cpu fwd", "cpu bwd");
    for (RingMode mode : {RingMode::kOnlineSoftmax, RingMode::kRsa})
      for (int sp : {1, 2, 4, 8}) {
        fixed.push_back(run(o, T, sp, mode, SequenceSplit::kZigzag, true));
        const Run& r = fixed.back();
        const Run& base = *std::find_if(fixed.begin(), fixed.end(), [&](const Run& x) { return x.mode == mode; });
        std::printf("%-5s %3d %12.3f %12.3f %14.3f %8.3f %9.3fs %9.3fs %9.3fs %9.3fs%s\n",
                    std::string(to_string(mode)).c_str(), sp, mib(r.own_forward), mib(r.own_backward), mib(r.total),
                    static_cast<double>(r.total) / static_cast<double>(base.total), r.wall_forward_s,
                    r.wall_backward_s, r.cpu_forward_s, r.cpu_backward_s,
                    r.accounting_matches ? "" : "  (accounting formula disagrees with the run!)");
      }
    std::printf("\n(c) RSA / ring at the same SP\n%3s %10s %10s %14s\n", "SP", "memory", "cpu time", "wall time");
    for (int i = 0; i < 4; ++i) {
      const Run &ring = fixed[i], &rsa = fixed[i + 4];
      std::printf("%3d %9.1fx %9.2fx %13.2fx\n", ring.sp, static_cast<double>(rsa.total) / ring.total,
                  (rsa.cpu_forward_s + rsa.cpu_backward_s) / (ring.cpu_forward_s + ring.cpu_backward_s),
                  (rsa.wall_forward_s + rsa.wall_backward_s) / (ring.wall_forward_s + ring.wall_backward_s));
    }

    // (b): the longest T under a fixed cap per rank.
    const std::size_t cap = fixed[0].total;
    std::printf("\n(b) longest T under a cap of %.3f MiB per rank (the ring's SP=1 peak at T=%d)\n", mib(cap), T);
    std::printf("%-5s %3s %10s %14s\n", "mode", "SP", "longest T", "vs ring SP=1");
    const int ring_one = longest_fitting(o, 1, RingMode::kOnlineSoftmax, cap);
    struct Fit {
      RingMode mode;
      int sp, tokens;
    };
    std::vector<Fit> fits;
    for (RingMode mode : {RingMode::kOnlineSoftmax, RingMode::kRsa})
      for (int sp : {1, o.cap_sp}) {
        fits.push_back({mode, sp, longest_fitting(o, sp, mode, cap)});
        std::printf("%-5s %3d %10d %13.2fx\n", std::string(to_string(mode)).c_str(), sp, fits.back().tokens,
                    static_cast<double>(fits.back().tokens) / ring_one);
      }
    const double ratio = static_cast<double>(fits[1].tokens) / ring_one;
    std::printf("ring SP=%d / SP=1: %.2fx (target >= 3.5)\n", o.cap_sp, ratio);
    Json validation;
    if (o.validate) {
      const Run check = run(o, fits[1].tokens, o.cap_sp, RingMode::kOnlineSoftmax, SequenceSplit::kZigzag, true);
      std::printf("run at T=%d, SP=%d: %.3f MiB per rank (cap %.3f), accounting formula %s, wall %.2f s\n",
                  check.tokens, check.sp, mib(check.total), mib(cap),
                  check.accounting_matches ? "matches the run" : "DISAGREES with the run",
                  check.wall_forward_s + check.wall_backward_s);
      validation["tokens"] = check.tokens;
      validation["sp"] = check.sp;
      validation["peak_attention_bytes_per_rank"] = check.total;
      validation["fits_cap"] = check.total <= cap;
      validation["accounting_matches"] = check.accounting_matches;
    }

    // (d): causal balance.
    std::printf("\n(d) causal work per rank (score entries computed in forward), max/mean; 1.00 is balanced\n");
    std::printf("%3s %10s %12s\n", "SP", "zigzag", "contiguous");
    std::vector<Run> balance;
    for (int sp : {4, 8}) {
      balance.push_back(run(o, T, sp, RingMode::kOnlineSoftmax, SequenceSplit::kZigzag, false));
      balance.push_back(run(o, T, sp, RingMode::kOnlineSoftmax, SequenceSplit::kContiguous, false));
      std::printf("%3d %10.3f %12.3f\n", sp, balance[balance.size() - 2].work_imbalance(),
                  balance.back().work_imbalance());
    }

    Json report;
    report["tokens"] = T;
    report["head_dim"] = o.head_dim;
    report["heads"] = o.heads;
    report["batch"] = o.batch;
    report["fixed_tokens"] = json_runs(fixed);
    Json capped;
    capped["cap_bytes"] = cap;
    capped["ring_sp1_tokens"] = ring_one;
    Json fit_array = Json::array();
    for (const auto& fit : fits)
      fit_array.push_back(Json{{"mode", to_string(fit.mode)}, {"sp", fit.sp}, {"longest_tokens", fit.tokens}});
    capped["fits"] = std::move(fit_array);
    capped["ring_ratio"] = ratio;
    capped["target_ratio"] = 3.5;
    if (o.validate) {
      capped["validation"] = validation;
    }
    report["capped_memory"] = capped;
    report["causal_balance"] = json_runs(balance);
    const std::string text = report.dump(2);
    std::printf("\n%s\n", text.c_str());
    if (!o.json_path.empty()) {
      std::ofstream file(o.json_path);
      if (!file) throw Error(ErrorKind::kIo, str("cannot write ", o.json_path));
      file << text << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
