#include "peertrain/sim/cluster.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <mutex>

#include <xbt/config.hpp>

#include "fabric.h"
#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"
#include "peertrain/core/log.h"
#include "platform.h"
#include "sim_transport.h"

namespace peertrain::sim {
namespace {

namespace s4u = simgrid::s4u;

Fabric* g_fabric = nullptr;

// RunClock inside a simulated cluster: a peer's reading first charges its compute.
double simulated_seconds() {
  if (const int peer = running_peer(); peer >= 0 && g_fabric) SimCall call(*g_fabric, peer);
  return s4u::Engine::get_clock();
}

void configure(s4u::Engine& engine, const ClusterOptions& options) {
  // SimGrid's LV08 multiplies each route's latency by 13.01, its fit of short transfers on
  // fresh TCP connections; the engine's links are long-lived connections, whose messages
  // pay the latency once (experiments/simulate measures both). --sim-cfg overrides it.
  engine.set_config("network/latency-factor:1");
  for (const std::string& setting : options.simgrid_config) {
    if (setting.find(':') == std::string::npos)
      throw Error(ErrorKind::kInvalidArgument, str("--sim-cfg '", setting, "': expected KEY:VALUE (SimGrid's --cfg)"));
    try {
      engine.set_config(setting);
    } catch (const std::exception& e) {
      throw Error(ErrorKind::kInvalidArgument, str("--sim-cfg '", setting, "': ", e.what()));
    }
  }
}

void check_supported(const topology::Topology& t, const train::TrainConfig& config, const ClusterOptions& options) {
  if (config.algorithm == train::Algorithm::kAdpsgd)
    throw Error(ErrorKind::kInvalidArgument,
                "--simulate: --algorithm adpsgd is not simulated (its protocol thread answers neighbours outside "
                "the peer's own calls); use dpsgd, choco, d2, gt, allreduce, ps or local");
  if (config.rejoin || config.resume)
    throw Error(ErrorKind::kInvalidArgument, "--simulate: --rejoin and --resume need real processes");
  if (config.device != model::Device::kCpu)
    throw Error(ErrorKind::kInvalidArgument,
                "--simulate: the peers compute on the CPU (a host's speed stands for "
                "its device: --host-speed)");
  const int n = t.num_peers();
  for (const FailureAt& f : options.failures)
    if (f.peer < 0 || f.peer >= n || (f.link() && (f.other >= n || f.other == f.peer)))
      throw Error(ErrorKind::kInvalidArgument, str("--fail: peer ", f.peer, f.link() ? str(" or ", f.other) : "",
                                                   " is not one of ", n, " peers (0..", n - 1, ")"));
  if (options.host_speed <= 0 || !std::isfinite(options.host_speed))
    throw Error(ErrorKind::kInvalidArgument, str("--host-speed ", options.host_speed, ": must be a positive FLOP/s"));
  if (options.measured_scale <= 0)
    throw Error(ErrorKind::kInvalidArgument, str("--compute-scale ", options.measured_scale, ": must be positive"));
}

}  // namespace

std::string_view to_string(ComputeModel model) { return model == ComputeModel::kFlops ? "flops" : "measured"; }

ComputeModel parse_compute_model(std::string_view name) {
  if (name == "flops") return ComputeModel::kFlops;
  if (name == "measured") return ComputeModel::kMeasured;
  throw Error(ErrorKind::kInvalidArgument, str("--sim-compute '", name, "' is not one of flops, measured"));
}

FailureAt parse_failure(const std::string& text, int peers) {
  auto whole = [](std::from_chars_result r, const char* stop) { return r.ec == std::errc() && r.ptr == stop; };
  const auto at = text.find('@');
  const auto dash = text.find('-');
  const bool link = dash != std::string::npos && dash > 0 && dash < at;
  FailureAt f;
  const char* begin = text.data();
  const char* end = begin + text.size();
  const char* who_end = begin + (at == std::string::npos ? 0 : at);
  bool ok = at != std::string::npos && whole(std::from_chars(begin + at + 1, end, f.at_s), end) && f.at_s >= 0;
  if (ok && link)
    ok = whole(std::from_chars(begin, begin + dash, f.peer), begin + dash) &&
         whole(std::from_chars(begin + dash + 1, who_end, f.other), who_end);
  else if (ok)
    ok = whole(std::from_chars(begin, who_end, f.peer), who_end);
  if (!ok)
    throw Error(ErrorKind::kInvalidArgument,
                str("--fail '", text, "': expected PEER@SECONDS (a host) or A-B@SECONDS (a link), e.g. 3@12.5"));
  for (const int p : link ? std::vector<int>{f.peer, f.other} : std::vector<int>{f.peer})
    if (p < 0 || p >= peers)
      throw Error(ErrorKind::kInvalidArgument, str("--fail '", text, "': no peer ", p, " (peers 0..", peers - 1, ")"));
  if (link && f.peer == f.other)
    throw Error(ErrorKind::kInvalidArgument, str("--fail '", text, "': a link joins two different peers"));
  return f;
}

ClusterReport run_cluster(const topology::Topology& t, const train::TrainConfig& config,
                          const ClusterOptions& options) {
  check_supported(t, config, options);
  const auto real_start = SteadyClock::now();
  // The peers take turns on one thread, on SimGrid's raw contexts (the cheapest to switch).
  // What a peer keeps between its turns lives in the Fabric, not in thread-local storage;
  // the model's thread-local workspaces are used only within a turn.
  std::string program = "peertrain", quiet = "--log=xbt_cfg.thres:warning";
  char* argv[] = {program.data(), quiet.data(), nullptr};
  int argc = 2;
  s4u::Engine engine(&argc, argv);
  configure(engine, options);

  Fabric fabric;
  fabric.peers = t.num_peers();
  fabric.failed_at.assign(static_cast<std::size_t>(fabric.peers), -1);
  fabric.peer_timeout_s = config.peer_timeout_s;
  fabric.compute = options.compute;
  fabric.base_speed = options.host_speed;
  fabric.measured_scale = options.measured_scale;
  fabric.cpu_mark.assign(static_cast<std::size_t>(fabric.peers), 0);
  fabric.carried_s.assign(static_cast<std::size_t>(fabric.peers), 0);
  for (int p = 0; p < fabric.peers; ++p) fabric.prefixes.push_back(str("peer ", p));
  ClusterReport report;
  report.platform = make_platform(engine, t, config, options, fabric);
  report.network_model = simgrid::config::get_value<std::string>("network/model");

  g_fabric = &fabric;
  RunClock::install(&simulated_seconds);
  const train::TransportFactory transport = [&fabric](int rank, const std::vector<int>& links) {
    return make_sim_transport(fabric, rank, links);
  };
  std::vector<PeerFailure> failures;
  double last_end = 0;
  for (int rank = 0; rank < fabric.peers; ++rank) {
    fabric.actors.push_back(
        s4u::Actor::create(str("peer-", rank), fabric.hosts[static_cast<std::size_t>(rank)], [&, rank] {
          start_peer(fabric, rank);
          try {
            train::run_peer(t, rank, config, transport);
          } catch (const HostFailed&) {
            failures.push_back(
                {rank, str("host peer-", rank, " failed at ", fabric.failed_at_s(rank), " s (simulated)"), true});
          } catch (const std::exception& e) {
            log::error(e.what());
            failures.push_back({rank, e.what(), false});
          }
          last_end = std::max(last_end, s4u::Engine::get_clock());
          end_peer();
        }));
  }
  if (!options.failures.empty()) {
    auto schedule = options.failures;
    std::sort(schedule.begin(), schedule.end(), [](const auto& a, const auto& b) { return a.at_s < b.at_s; });
    // A daemon: it does not keep the simulation going once every peer has ended.
    s4u::Actor::create("failures", fabric.hosts[0], [&fabric, schedule] {
      for (const FailureAt& f : schedule) {
        s4u::this_actor::sleep_until(f.at_s);
        if (f.link())
          fabric.cut(f.peer, f.other, f.at_s);
        else if (!fabric.failed(f.peer))
          fabric.fail(f.peer, f.at_s);
      }
    })->daemonize();
  }
  try {
    engine.run();
  } catch (...) {
    RunClock::install(nullptr);
    g_fabric = nullptr;
    throw;
  }
  RunClock::install(nullptr);
  g_fabric = nullptr;
  std::sort(failures.begin(), failures.end(), [](const auto& a, const auto& b) { return a.peer < b.peer; });
  report.failures = std::move(failures);
  report.simulated_s = last_end;
  report.real_s = seconds_since(real_start);
  return report;
}

}  // namespace peertrain::sim
