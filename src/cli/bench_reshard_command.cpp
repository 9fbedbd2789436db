// peertrain bench reshard: the cross-mesh resharding planner (parallel/reshard.h) on the
// micro-benchmark cases of Zhuang et al. (MLSys 2023) — one worker to many, and n to m
// with several layout pairs — or on one case given by flags. For each strategy it carries
// the plan out, a thread per worker, over emulated links (reshard_exchange.h: a NIC per
// worker between the meshes, a link per pair inside one), and prints the measured time,
// the bytes on the busiest link, the lower bound and the ratio to it, with the modelled
// time beside the measured one.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <latch>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "options.h"
#include "peertrain/comm/thread_group.h"
#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "peertrain/parallel/reshard.h"
#include "peertrain/parallel/reshard_exchange.h"

namespace peertrain::cli {
namespace {

using parallel::Layout;
using parallel::Mesh;
using parallel::ReshardStrategy;

struct ReshardCase {
  std::string name;
  Mesh source, destination;
  std::string source_layout, destination_layout;
};

std::vector<int> parse_ints(const std::string& text, const std::string& flag) {
  std::vector<int> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t x = std::min(text.find('x', start), text.size());
    const std::string item = text.substr(start, x - start);
    try {
      std::size_t used = 0;
      const int n = std::stoi(item, &used);
      if (used != item.size() || n < 1) throw std::invalid_argument(item);
      out.push_back(n);
    } catch (const std::exception&) {
      throw UsageError(str(flag, " '", text, "': expected positive counts separated by x, e.g. 2x2"));
    }
    start = x + 1;
  }
  return out;
}

std::vector<ReshardCase> paper_cases() {
  // One-to-many and many-to-many: the destination replicating (where broadcast and
  // local all-gather pay off), splitting a different dimension, or splitting over two axes.
  return {
      {"1 -> 4, replicate", {{1}}, {{4}}, "R,R", "R,R"},
      {"1 -> 4, split rows", {{1}}, {{4}}, "R,R", "S0,R"},
      {"1 -> 2x2, rows x columns", {{1}}, {{2, 2}}, "R,R", "S0,S1"},
      {"2 -> 4, rows to replicate", {{2}}, {{4}}, "S0,R", "R,R"},
      {"2 -> 4, rows to columns", {{2}}, {{4}}, "S0,R", "R,S0"},
      {"4 -> 4, rows to columns", {{4}}, {{4}}, "S0,R", "R,S0"},
      {"2x2 -> 2x2, replicate half", {{2, 2}}, {{2, 2}}, "S0,S1", "S0,R"},
      {"4 -> 2x4, rows to 2-way rows", {{4}}, {{2, 4}}, "S0,R", "S0,R"},
  };
}

// The plan carried out once: a thread per worker of both meshes, over emulated links, from
// a common start to the last destination's tile complete; checks every destination tile.
double measure(const Mesh& source, const Layout& from, const Mesh& destination, const Layout& to,
               const std::vector<std::int64_t>& shape, ReshardStrategy strategy, const parallel::LinkModel& links) {
  const int S = source.workers(), D = destination.workers();
  std::vector<int> source_ranks(S), destination_ranks(D), mesh_of(S + D, 1);
  std::iota(source_ranks.begin(), source_ranks.end(), 0);
  std::iota(destination_ranks.begin(), destination_ranks.end(), S);
  std::fill_n(mesh_of.begin(), S, 0);
  const auto x =
      parallel::plan_exchange(source, from, source_ranks, destination, to, destination_ranks, shape, strategy);
  // Each element's value is a hash of its index, so a misplaced one shows.
  auto value_at = [&](const std::vector<std::int64_t>& at) {
    std::uint64_t flat = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * static_cast<std::uint64_t>(shape[d]) + at[d];
    return static_cast<float>((flat * 0x9E3779B97F4A7C15ull) >> 40);
  };
  auto fill = [&](const Mesh& mesh, const Layout& layout, int worker, const parallel::PackedTile& tile) {
    std::vector<float> local(static_cast<std::size_t>(tile.elements()));
    for (const auto& box : parallel::tiles(mesh, layout, shape, worker)) {
      std::vector<float> values;
      std::vector<std::int64_t> at = box.lo;
      for (std::int64_t k = 0; k < box.elements(); ++k) {
        values.push_back(value_at(at));
        for (std::size_t d = at.size(); d-- > 0;) {
          if (++at[d] < box.hi[d]) break;
          at[d] = box.lo[d];
        }
      }
      tile.unpack(box, values, local);
    }
    return local;
  };
  std::vector<std::vector<float>> sources, received(static_cast<std::size_t>(D));
  for (int w = 0; w < S; ++w) sources.push_back(fill(source, from, w, x.source_tiles[static_cast<std::size_t>(w)]));
  comm::ThreadGroup group(S + D, "bench reshard");
  parallel::LinkEmulator emulator(links, mesh_of);
  std::latch start(S + D);
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> began(static_cast<std::size_t>(S + D)), ended(began.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < S + D; ++r)
    threads.emplace_back([&, r] {
      parallel::GroupLink link(group.member(r), 1, 120.0, &emulator);
      if (r >= S)
        received[static_cast<std::size_t>(r - S)].resize(
            static_cast<std::size_t>(x.destination_tiles[static_cast<std::size_t>(r - S)].elements()));
      start.arrive_and_wait();
      began[static_cast<std::size_t>(r)] = Clock::now();
      if (r < S)
        parallel::exchange_send(x, r, sources[static_cast<std::size_t>(r)], link);
      else
        parallel::exchange_receive(x, r - S, received[static_cast<std::size_t>(r - S)], link);
      ended[static_cast<std::size_t>(r)] = Clock::now();
      link.finish();
    });
  for (auto& t : threads) t.join();
  for (int w = 0; w < D; ++w)
    if (received[static_cast<std::size_t>(w)] !=
        fill(destination, to, w, x.destination_tiles[static_cast<std::size_t>(w)]))
      throw Error(ErrorKind::kInternal, str("bench reshard: destination ", w, " got a wrong tile"));
  const auto first = *std::min_element(began.begin(), began.end());
  const auto last = *std::max_element(ended.begin() + S, ended.end());
  return std::chrono::duration<double>(last - first).count();
}

}  // namespace

int bench_reshard(int argc, char** argv) {
  cxxopts::Options options("peertrain bench reshard",
                           "Plan cross-mesh resharding (Zhuang et al. 2023) and compare send-recv, broadcast and "
                           "local-allgather on a modelled link: time, busiest link, lower bound");
  options.add_options()("source",
                        "source mesh, e.g. 2 or 2x2; --source, --destination and both layouts together give one "
                        "case, without them the built-in cases run",
                        cxxopts::value<std::string>())("destination", "destination mesh",
                                                       cxxopts::value<std::string>())(
      "source-layout", "per tensor dimension R, S<axis> or Z<axis> (zigzag), e.g. S0,R", cxxopts::value<std::string>())(
      "destination-layout", "e.g. R,S0", cxxopts::value<std::string>())(
      "shape", "tensor shape", cxxopts::value<std::string>()->default_value("2048x2048"))(
      "between-gbps",
      "link bandwidth between the meshes, Gb/s (slow enough that this machine's memory copies "
      "stay small next to it)",
      cxxopts::value<std::string>()->default_value("1"))("within-gbps", "link bandwidth inside a mesh, Gb/s",
                                                         cxxopts::value<std::string>()->default_value("10"))(
      "latency-us", "latency per message, microseconds", cxxopts::value<std::string>()->default_value("20"))(
      "plan", "print each strategy's transfers and bytes per worker")(
      "model-only", "only the modelled times: plan, do not carry out")("h,help", "this help");
  cxxopts::ParseResult args;
  if (auto code = parse_or_exit(options, argc, argv, &args)) return *code;
  return exit_code_of("bench reshard", [&] {
    std::vector<ReshardCase> cases;
    const int given = static_cast<int>(args.count("source") + args.count("destination") + args.count("source-layout") +
                                       args.count("destination-layout"));
    if (given == 4) {
      cases.push_back({"given",
                       {parse_ints(args["source"].as<std::string>(), "--source")},
                       {parse_ints(args["destination"].as<std::string>(), "--destination")},
                       args["source-layout"].as<std::string>(),
                       args["destination-layout"].as<std::string>()});
    } else if (given != 0) {
      throw UsageError("--source, --destination, --source-layout and --destination-layout go together");
    } else {
      cases = paper_cases();
    }
    std::vector<std::int64_t> shape;
    for (int n : parse_ints(args["shape"].as<std::string>(), "--shape")) shape.push_back(n);
    parallel::LinkModel links;
    links.between_bytes_per_s = positive<double>(args, "between-gbps") * 1e9 / 8;
    links.within_bytes_per_s = positive<double>(args, "within-gbps") * 1e9 / 8;
    links.latency_s = positive<double>(args, "latency-us", true) * 1e-6;
    // Every case planned once before anything is printed, so a bad one is only an error.
    for (const auto& c : cases)
      parallel::plan_reshard(c.source, parallel::parse_layout(c.source_layout, "--source-layout"), c.destination,
                             parallel::parse_layout(c.destination_layout, "--destination-layout"), shape);
    std::printf("float32 tensor");
    for (std::size_t d = 0; d < shape.size(); ++d)
      std::printf("%s%lld", d ? "x" : " ", static_cast<long long>(shape[d]));
    const bool measured = !args.count("model-only");
    std::printf("; links %.3g Gb/s between the meshes, %.3g Gb/s inside, %.3g us a message (%s)\n\n",
                links.between_bytes_per_s * 8 / 1e9, links.within_bytes_per_s * 8 / 1e9, links.latency_s * 1e6,
                measured ? "emulated, a thread per worker; the model's time beside" : "modelled");
    std::printf("%-30s %-16s %10s %10s %14s %10s %7s\n", "case", "strategy", measured ? "time ms" : "", "model ms",
                "busiest MiB", "bound ms", "ratio");
    for (const auto& c : cases) {
      const Layout from = parallel::parse_layout(c.source_layout, "--source-layout");
      const Layout to = parallel::parse_layout(c.destination_layout, "--destination-layout");
      const auto tasks = parallel::plan_reshard(c.source, from, c.destination, to, shape);
      for (ReshardStrategy strategy :
           {ReshardStrategy::kSendRecv, ReshardStrategy::kBroadcast, ReshardStrategy::kLocalAllGather}) {
        const auto plan = parallel::schedule_reshard(tasks, strategy, c.source.workers(), c.destination.workers());
        const auto cost = parallel::reshard_cost(tasks, plan, links);
        const double seconds =
            measured ? measure(c.source, from, c.destination, to, shape, strategy, links) : cost.seconds;
        char time[32] = "";
        if (measured) std::snprintf(time, sizeof time, "%.2f", seconds * 1e3);
        std::printf("%-30s %-16s %10s %10.2f %14.2f %10.2f %7.2f\n", c.name.c_str(),
                    std::string(parallel::to_string(strategy)).c_str(), time, cost.seconds * 1e3,
                    static_cast<double>(cost.busiest_link_bytes) / (1 << 20), cost.bound_seconds * 1e3,
                    seconds / cost.bound_seconds);
        if (args.count("plan")) std::printf("%s\n", parallel::describe(plan).c_str());
      }
    }
    return 0;
  });
}

}  // namespace peertrain::cli
