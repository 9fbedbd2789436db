// peertrain bench reshard: the cross-mesh resharding planner (parallel/reshard.h) on the
// micro-benchmark cases of Zhuang et al. (MLSys 2023) — one worker to many, and n to m
// with several layout pairs — or on one case given by flags. For each strategy it prints
// the modelled time, the bytes on the busiest link, the lower bound and the ratio to it.
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "options.h"
#include "peertrain/core/error.h"
#include "peertrain/parallel/reshard.h"

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

}  // namespace

int bench_reshard(int argc, char** argv) {
  cxxopts::Options options("peertrain bench reshard",
                           "Plan cross-mesh resharding (Zhuang et al. 2023) and compare send-recv, broadcast and "
                           "local-allgather on a modelled link: time, busiest link, lower bound");
  options.add_options()("source", "source mesh, e.g. 2 or 2x2 (with the other case flags: one case)",
                        cxxopts::value<std::string>())("destination", "destination mesh",
                                                       cxxopts::value<std::string>())(
      "source-layout", "per tensor dimension R or S<axis>, e.g. S0,R", cxxopts::value<std::string>())(
      "destination-layout", "e.g. R,S0", cxxopts::value<std::string>())(
      "shape", "tensor shape", cxxopts::value<std::string>()->default_value("4096x4096"))(
      "between-gbps", "link bandwidth between the meshes, Gb/s", cxxopts::value<std::string>()->default_value("10"))(
      "within-gbps", "link bandwidth inside a mesh, Gb/s", cxxopts::value<std::string>()->default_value("100"))(
      "latency-us", "per message", cxxopts::value<std::string>()->default_value("20"))(
      "plan", "print each strategy's transfers and bytes per worker")("h,help", "this help");
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
    links.between_bytes_per_s = number_flag<double>(args, "between-gbps") * 1e9 / 8;
    links.within_bytes_per_s = number_flag<double>(args, "within-gbps") * 1e9 / 8;
    links.latency_s = number_flag<double>(args, "latency-us") * 1e-6;
    if (!(links.between_bytes_per_s > 0) || !(links.within_bytes_per_s > 0) || !(links.latency_s >= 0))
      throw UsageError("--between-gbps and --within-gbps must be positive, --latency-us not negative");
    // Every case planned once before anything is printed, so a bad one is only an error.
    for (const auto& c : cases)
      parallel::plan_reshard(c.source, parallel::parse_layout(c.source_layout, "--source-layout"), c.destination,
                             parallel::parse_layout(c.destination_layout, "--destination-layout"), shape);
    std::printf("float32 tensor");
    for (std::size_t d = 0; d < shape.size(); ++d)
      std::printf("%s%lld", d ? "x" : " ", static_cast<long long>(shape[d]));
    std::printf("; links %.3g Gb/s between the meshes, %.3g Gb/s inside, %.3g us a message (modelled)\n\n",
                links.between_bytes_per_s * 8 / 1e9, links.within_bytes_per_s * 8 / 1e9, links.latency_s * 1e6);
    std::printf("%-30s %-16s %10s %14s %10s %7s\n", "case", "strategy", "time ms", "busiest MiB", "bound ms", "ratio");
    for (const auto& c : cases) {
      const Layout from = parallel::parse_layout(c.source_layout, "--source-layout");
      const Layout to = parallel::parse_layout(c.destination_layout, "--destination-layout");
      const auto tasks = parallel::plan_reshard(c.source, from, c.destination, to, shape);
      for (ReshardStrategy strategy :
           {ReshardStrategy::kSendRecv, ReshardStrategy::kBroadcast, ReshardStrategy::kLocalAllGather}) {
        const auto plan = parallel::schedule_reshard(tasks, strategy, c.source.workers(), c.destination.workers());
        const auto cost = parallel::reshard_cost(tasks, plan, links);
        std::printf("%-30s %-16s %10.2f %14.2f %10.2f %7.2f\n", c.name.c_str(),
                    std::string(parallel::to_string(strategy)).c_str(), cost.seconds * 1e3,
                    static_cast<double>(cost.busiest_link_bytes) / (1 << 20), cost.bound_seconds * 1e3,
                    cost.seconds / cost.bound_seconds);
        if (args.count("plan")) std::printf("%s\n", parallel::describe(plan).c_str());
      }
    }
    return 0;
  });
}

}  // namespace peertrain::cli
