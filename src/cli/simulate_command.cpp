#include "simulate_command.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <memory>

#include "launch_view.h"
#include "options.h"
#include "peertrain/core/log.h"
#include "peertrain/sim/cluster.h"
#include "peertrain/train/run_record.h"

namespace peertrain::cli {
namespace {

namespace fs = std::filesystem;

// "1e10", "10G", "2.5Tf": FLOP/s, with an optional k, M, G or T and an optional f.
double parse_speed(const std::string& text) {
  std::string number = text;
  if (!number.empty() && number.back() == 'f') number.pop_back();
  double scale = 1;
  if (!number.empty()) switch (number.back()) {
      case 'k':
        scale = 1e3;
        break;
      case 'M':
        scale = 1e6;
        break;
      case 'G':
        scale = 1e9;
        break;
      case 'T':
        scale = 1e12;
        break;
      default:
        break;
    }
  if (scale != 1) number.pop_back();
  double value = 0;
  auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (number.empty() || ec != std::errc() || ptr != number.data() + number.size() || !(value > 0) ||
      !std::isfinite(value))
    throw UsageError("--host-speed '" + text + "' is not a positive FLOP/s (e.g. 1e10, 10G, 2.5Tf)");
  return value * scale;
}

sim::ClusterOptions cluster_options(const cxxopts::ParseResult& args, int peers) {
  sim::ClusterOptions o;
  o.compute = sim::parse_compute_model(args["sim-compute"].as<std::string>());
  o.host_speed = parse_speed(args["host-speed"].as<std::string>());
  if (args.count("compute-scale")) {
    if (o.compute != sim::ComputeModel::kMeasured) throw UsageError("--compute-scale is for --sim-compute measured");
    o.measured_scale = positive<double>(args, "compute-scale");
  }
  if (args.count("platform")) {
    o.platform_file = args["platform"].as<std::string>();
    if (!fs::is_regular_file(o.platform_file))
      throw Error(ErrorKind::kInvalidArgument, str("--platform ", o.platform_file, ": no such file"));
  }
  if (args.count("fail"))
    for (const std::string& f : args["fail"].as<std::vector<std::string>>())
      o.failures.push_back(sim::parse_failure(f, peers));
  if (args.count("sim-cfg")) o.simgrid_config = args["sim-cfg"].as<std::vector<std::string>>();
  return o;
}

// The coordinator's summary, told how the cluster was timed.
void record_simulation(const fs::path& out, const sim::ClusterOptions& options, const sim::ClusterReport& report) {
  if (!fs::exists(out / "summary.json")) return;
  train::RunSummary summary = train::read_summary(out / "summary.json");
  summary.simulation =
      train::SimulationRecord{std::string(sim::to_string(options.compute)),
                              options.host_speed,
                              options.compute == sim::ComputeModel::kMeasured ? options.measured_scale : 0,
                              report.platform,
                              report.network_model,
                              report.simulated_s,
                              report.real_s};
  train::write_summary(out, summary);
}

}  // namespace

void add_simulation_options(cxxopts::Options& options) {
  options.add_options("simulated cluster")(
      "simulate", "run every peer in this process on a simulated cluster (SimGrid): real training, simulated time")(
      "platform",
      "SimGrid platform file (XML) to run on; peer i runs on its host 'peer-i' (default: built from the "
      "topology file's links)",
      cxxopts::value<std::string>())("host-speed", "FLOP/s of each host built from the topology (1e10, 10G, 2.5Tf)",
                                     cxxopts::value<std::string>()->default_value("1e10"))(
      "sim-compute",
      "how compute is charged: flops (the gradient's FLOPs over the host's speed, deterministic) | "
      "measured (the CPU time measured, times --compute-scale)",
      cxxopts::value<std::string>()->default_value("flops"))(
      "compute-scale", "--sim-compute measured: simulated seconds per measured CPU second (default 1)",
      cxxopts::value<std::string>())(
      "fail",
      "PEER@SECONDS: that peer's host fails at that simulated time; A-B@SECONDS: the link between "
      "peers A and B is cut then (repeatable)",
      cxxopts::value<std::vector<std::string>>())(
      "sim-cfg", "KEY:VALUE: a SimGrid setting, as its --cfg (e.g. network/model:CM02; repeatable)",
      cxxopts::value<std::vector<std::string>>());
}

bool simulation_requested(const cxxopts::ParseResult& args) {
  if (args.count("simulate")) return true;
  refuse_flags(args, {"platform", "host-speed", "sim-compute", "compute-scale", "fail", "sim-cfg"}, "--simulate");
  return false;
}

int run_simulated_launch(const cxxopts::ParseResult& args, const train::TrainConfig& base,
                         const topology::Topology& topology, const fs::path& out, DashboardServer* dashboard) {
  const sim::ClusterOptions options = cluster_options(args, topology.num_peers());
  train::TrainConfig config = base;
  config.out_dir = out.string();
  config.progress = true;
  std::fprintf(stderr, "simulating %d peers of %s: %s, %d epochs, batch %d per peer → %s\n", topology.num_peers(),
               topology.name.c_str(), std::string(to_string(config.algorithm)).c_str(), config.epochs, config.batch,
               out.c_str());

  const fs::path log_path = out / "simulation.log";
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> log_file(std::fopen(log_path.c_str(), "w"), &std::fclose);
  if (!log_file) throw Error(ErrorKind::kIo, str(log_path.string(), ": cannot write"));
  std::setvbuf(log_file.get(), nullptr, _IOLBF, 0);  // whole lines, readable while the run goes on
  log::set_output(log_file.get());
  log::set_level(log::parse_level(args["log-level"].as<std::string>()));

  ProgressLine progress(isatty(STDERR_FILENO), true);
  train::set_progress_sink([&](std::string_view kind, const std::string& json) {
    if (kind == "progress") {
      progress.update(json);
      if (dashboard) dashboard->progress(json);
    } else if (kind == "eval" && dashboard) {
      dashboard->eval(json);
    }
  });
  sim::ClusterReport report;
  try {
    report = sim::run_cluster(topology, config, options);
  } catch (...) {
    log::set_output(nullptr);
    train::set_progress_sink({});
    throw;
  }
  log::set_output(nullptr);
  train::set_progress_sink({});
  progress.end();
  record_simulation(out, options, report);

  for (const sim::PeerFailure& f : report.failures)
    std::fprintf(stderr, "peer %d %s: %s\n", f.peer, f.host_failed ? "was lost" : "failed", f.reason.c_str());
  if (!fs::exists(out / "summary.json")) {
    std::string why = report.failures.empty() ? "no peer wrote summary.json" : report.failures.front().reason;
    train::RunSummary summary;
    summary.topology = topology.name;
    summary.algorithm = to_string(config.algorithm);
    for (const sim::PeerFailure& f : report.failures) summary.failed_peers.push_back(f.peer);
    summary.error = why;
    train::write_summary(out, summary);
    std::fprintf(stderr, "error: the simulated run failed: %s (log: %s)\n", why.c_str(), log_path.c_str());
    if (dashboard) dashboard->finish(read_text(out / "summary.json", "{\"error\": \"no summary\"}"));
    return 1;
  }
  print_summary(out);
  if (dashboard) dashboard->finish(read_text(out / "summary.json", "{}"));
  return 0;
}

}  // namespace peertrain::cli
