// peertrain launch: starts, as child processes, every peer of a topology file whose host is
// this machine; shows one live progress line from peer 0's reports; stops everything and
// names the peer when one fails; prints a summary table at the end.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <map>
#include <set>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "dashboard_server.h"
#include "launch_view.h"
#include "simulate_command.h"
#include "options.h"
#include "peertrain/core/error.h"
#include "peertrain/net/auth.h"
#include "peertrain/net/host.h"
#include "peertrain/train/run_record.h"
#include "../train/recorder.h"
#include "training_options.h"

namespace peertrain::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_interrupted = 0;
void on_interrupt(int) { g_interrupted = 1; }

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out_fd = -1;
  std::string buffer;
  bool exited = false;
  int status = 0;
  fs::path log;
};

std::string last_error_line(const fs::path& log) {
  std::ifstream in(log);
  std::string line, last, any;
  while (std::getline(in, line)) {
    if (line.find("error") != std::string::npos) last = line;
    if (!line.empty()) any = line;
  }
  return last.empty() ? any : last;
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) return str("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  return str("exited with code ", WEXITSTATUS(status));
}

// --dashboard: the server, the page's view of the configuration, and a token when the
// run is authenticated (a fresh random one: the key itself never leaves the key file; the
// server makes one of its own on an address other than loopback).
std::unique_ptr<DashboardServer> start_dashboard(const cxxopts::ParseResult& args, const train::TrainConfig& config,
                                                 const topology::Topology& topology, const fs::path& out) {
  DashboardOptions options = parse_dashboard_address(args["dashboard"].as<std::string>());
  if (args.count("secret-file")) options.token = net::Secret::generate().hex().substr(0, 32);
  options.graph_json = train::graph_json(topology);
  std::string flags;
  for (const auto& f : forwarded_training_flags(args)) flags += (flags.empty() ? "" : " ") + f;
  options.config_json = Json{
      {"topology", topology.name},
      {"peers", topology.num_peers()},
      {"algorithm", to_string(config.algorithm)},
      {"model", to_string(config.model)},
      {"epochs", config.epochs},
      {"batch_per_peer", config.batch},
      {"flags", flags},
      {"out", out.string()}}.dump();
  auto server = std::make_unique<DashboardServer>(std::move(options));
  std::fprintf(stderr, "dashboard: %s\n", server->url().c_str());
  return server;
}

// `launch ... -- PROGRAM ARGS`: the peers run a program of the user's (launch_program.cpp).
int run_launch_program(int argc, char** argv, int separator) {
  cxxopts::Options options("peertrain launch",
                           "Start PROGRAM once per local peer of a topology file, with RANK, LOCAL_RANK, "
                           "WORLD_SIZE, PEERTRAIN_TOPOLOGY and, with a key, PEERTRAIN_SECRET_FILE set (the "
                           "Python module reads them).");
  options.custom_help("--topology FILE [--secret-file KEY] -- PROGRAM [ARGS...]");
  options.add_options()("topology", "topology file (YAML)", cxxopts::value<std::string>())(
      "secret-file", "key file every peer shares (passed as PEERTRAIN_SECRET_FILE)", cxxopts::value<std::string>())(
      "h,help", "show this help");
  cxxopts::ParseResult args;
  if (auto code = parse_or_exit(options, separator, argv, &args)) return *code;
  if (!args.count("topology")) {
    std::fprintf(stderr, "error: --topology FILE is required before '--' (see 'peertrain launch --help')\n");
    return 2;
  }
  return launch_program(args["topology"].as<std::string>(),
                        args.count("secret-file") ? args["secret-file"].as<std::string>() : std::string(),
                        std::vector<std::string>(argv + separator + 1, argv + argc));
}

// The distinct hosts of a topology's peers, for an error message: "10.0.0.1, 10.0.0.2".
std::string hosts_of(const topology::Topology& topology) {
  std::vector<std::string> hosts;
  for (const auto& peer : topology.peers)
    if (std::find(hosts.begin(), hosts.end(), peer.host) == hosts.end()) hosts.push_back(peer.host);
  std::string text;
  for (const auto& h : hosts) text += (text.empty() ? "" : ", ") + h;
  return text;
}

}  // namespace

int run_launch(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--") == 0) return run_launch_program(argc, argv, i);
  cxxopts::Options options("peertrain launch",
                           "Start every peer of a topology file that lives on this machine and train them together, "
                           "or, with '-- PROGRAM ARGS', run a program of yours once per peer (the Python module).");
  options.add_options()("topology", "topology file (YAML)", cxxopts::value<std::string>())(
      "out", "output directory (default: runs/<topology>-<algorithm>)", cxxopts::value<std::string>())(
      "log-level", "peers' log level: debug | info | warn | error | off",
      cxxopts::value<std::string>()->default_value("info"))(
      "dashboard",
      "[HOST:]PORT: serve a live dashboard of the run at http://HOST:PORT/ (HOST 127.0.0.1 unless "
      "given; with --secret-file it asks for a token that launch prints)",
      cxxopts::value<std::string>())("h,help", "show this help");
  add_training_options(options);
  add_simulation_options(options);
  cxxopts::ParseResult args;
  if (auto code = parse_or_exit(options, argc, argv, &args)) return *code;
  if (!args.count("topology")) {
    std::fprintf(stderr, "error: --topology FILE is required (see 'peertrain launch --help')\n");
    return 2;
  }
  train::TrainConfig config;
  bool simulate = false;
  try {
    config = training_config(args);
    simulate = simulation_requested(args);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  const fs::path topology_path = fs::absolute(args["topology"].as<std::string>());
  const auto topology = topology::load_topology_file(topology_path.string());
  train::check_algorithm_topology(config, topology);  // before any peer starts
  const fs::path out = fs::absolute(args.count("out") ? fs::path(args["out"].as<std::string>())
                                                      : fs::path("runs") / (topology.name + "-" +
                                                                            std::string(to_string(config.algorithm))));
  fs::create_directories(out);
  fs::remove(out / "summary.json");

  if (simulate) {
    std::unique_ptr<DashboardServer> dashboard;
    if (args.count("dashboard")) dashboard = start_dashboard(args, config, topology, out);
    try {
      return run_simulated_launch(args, config, topology, out, dashboard.get());
    } catch (const UsageError& e) {
      std::fprintf(stderr, "error: %s (see 'peertrain launch --help')\n", e.what());
      return 2;
    }
  }
  std::vector<int> local, remote;
  for (const auto& peer : topology.peers) (net::names_this_machine(peer.host) ? local : remote).push_back(peer.id);
  if (local.empty())
    throw Error(ErrorKind::kInvalidArgument,
                str(topology_path.string(), ": none of its ", topology.num_peers(), " peers is on this machine (",
                    hosts_of(topology),
                    " name no address of its interfaces); run launch on each of those hosts, "
                    "or start each peer there with 'peertrain peer --rank R'"));
  std::fprintf(stderr, "launching %zu of %d peers of %s: %s, %d epochs, batch %d per peer → %s\n", local.size(),
               topology.num_peers(), topology.name.c_str(), std::string(to_string(config.algorithm)).c_str(),
               config.epochs, config.batch, out.c_str());
  if (!remote.empty())
    std::fprintf(stderr, "peers on other hosts (start them there with 'peertrain peer --rank R'): %zu of them\n",
                 remote.size());

  std::unique_ptr<DashboardServer> dashboard;
  if (args.count("dashboard")) dashboard = start_dashboard(args, config, topology, out);

  std::vector<std::string> common = {"peer", "--topology", topology_path.string(), "--out", out.string(),
                                     "--log-level", args["log-level"].as<std::string>()};
  for (auto& flag : forwarded_training_flags(args)) common.push_back(flag);

  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<Child> children;
  for (int rank : local) {
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) throw Error(ErrorKind::kIo, str("cannot create a pipe: ", std::strerror(errno)));
    Child child;
    child.rank = rank;
    child.log = out / str("peer-", rank, ".log");
    const int log_fd = open(child.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log_fd < 0) throw Error(ErrorKind::kIo, str(child.log.string(), ": cannot write: ", std::strerror(errno)));
    std::vector<std::string> args_text = common;
    args_text.insert(args_text.begin() + 1, {"--rank", std::to_string(rank)});
    args_text.push_back("--progress");  // printed by whichever peer coordinates
    // Built before fork: the child of a process with threads (the dashboard's) may only
    // call async-signal-safe functions, so no allocation between fork and exec.
    std::string exe = "peertrain";
    std::vector<char*> child_argv;
    child_argv.push_back(exe.data());
    for (auto& a : args_text) child_argv.push_back(a.data());
    child_argv.push_back(nullptr);
    const pid_t launcher = getpid();
    const pid_t pid = fork();
    if (pid < 0) throw Error(ErrorKind::kIo, str("cannot start peer ", rank, ": ", std::strerror(errno)));
    if (pid == 0) {
      // A peer must not outlive its launcher: if launch is killed (even with SIGKILL, which
      // it cannot catch), the kernel sends each peer SIGTERM, so no orphan keeps training
      // and holding its port for the next run. The second check closes the race with a
      // launcher that died before the first took effect.
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != launcher) _exit(1);
      dup2(pipe_fds[1], STDOUT_FILENO);
      dup2(log_fd, STDERR_FILENO);
      close(pipe_fds[0]);
      execv("/proc/self/exe", child_argv.data());
      const char message[] = "error: cannot run /proc/self/exe\n";
      [[maybe_unused]] const auto written = write(STDERR_FILENO, message, sizeof message - 1);
      _exit(127);
    }
    close(pipe_fds[1]);
    close(log_fd);
    fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK);
    child.pid = pid;
    child.out_fd = pipe_fds[0];
    children.push_back(std::move(child));
  }

  ProgressLine progress(isatty(STDERR_FILENO));
  const bool survivable = train::survives_lost_peers(config);
  std::vector<int> lost;
  std::optional<Clock::time_point> coordinator_done;
  long long last_eval_step = 0;
  std::string failure;
  int failed_peer = -1;
  std::size_t running = children.size();
  while (running > 0) {
    std::vector<pollfd> fds;
    for (auto& c : children)
      if (c.out_fd >= 0) fds.push_back({c.out_fd, POLLIN, 0});
    if (!fds.empty()) poll(fds.data(), fds.size(), 200);
    else usleep(200'000);
    for (auto& c : children) {
      if (c.out_fd < 0) continue;
      char buffer[4096];
      ssize_t got;
      while ((got = read(c.out_fd, buffer, sizeof buffer)) > 0) c.buffer.append(buffer, static_cast<std::size_t>(got));
      if (got == 0) {
        close(c.out_fd);
        c.out_fd = -1;
      }
      std::size_t newline;
      while ((newline = c.buffer.find('\n')) != std::string::npos) {
        const std::string line = c.buffer.substr(0, newline);
        c.buffer.erase(0, newline + 1);
        if (line.rfind("@progress ", 0) == 0) {
          progress.update(line.substr(10));
          if (dashboard) dashboard->progress(line.substr(10));
        } else if (line.rfind("@eval ", 0) == 0) {
          last_eval_step = static_cast<long long>(field(parse_line(line.substr(6)), "step", 0));
          if (dashboard) dashboard->eval(line.substr(6));
        } else if (!line.empty()) {
          std::printf("[peer %d] %s\n", c.rank, line.c_str());
        }
      }
    }
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& c : children)
        if (c.pid == pid) {
          c.exited = true;
          c.status = status;
          --running;
          if ((!WIFEXITED(status) || WEXITSTATUS(status) != 0) && failure.empty()) {
            const std::string what = str("peer ", c.rank, " ", describe_exit(status), ": ", last_error_line(c.log));
            if (dashboard)
              dashboard->event(Json{
                  {"kind", "lost"}, {"peer", c.rank}, {"reason", describe_exit(status)}, {"after_step", last_eval_step}}
                                   .dump());
            if (survivable) {
              // D-PSGD drops a lost peer and goes on; a lost coordinator is replaced.
              progress.end();
              std::fprintf(stderr, "%s; the others go on without it\n", what.c_str());
              // How to bring it back into this run (docs/faults.md, "Rejoining").
              std::string again = "peertrain peer --rank " + std::to_string(c.rank) + " --rejoin";
              for (std::size_t i = 1; i < common.size(); ++i) again += " " + common[i];
              std::fprintf(stderr, "  to bring it back: %s\n", again.c_str());
              lost.push_back(c.rank);
            } else {
              failed_peer = c.rank;
              failure = what;
            }
          }
        }
    }
    if (g_interrupted && failure.empty()) failure = "interrupted";
    if (!failure.empty()) break;
    // A peer finished the run; a peer still there long after was dropped by the others
    // (stalled, cut off) and has no one left to train with.
    bool one_finished = false;
    for (const auto& c : children)
      one_finished = one_finished || (c.exited && WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0);
    if (one_finished) {
      if (!coordinator_done) coordinator_done = Clock::now();
      if (Clock::now() - *coordinator_done > std::chrono::seconds(20)) {
        for (auto& c : children)
          if (!c.exited) {
            std::fprintf(stderr, "peer %d is still running 20 s after the others finished (stalled or cut off); "
                                 "stopping it\n", c.rank);
            kill(c.pid, SIGKILL);
            waitpid(c.pid, &c.status, 0);
            c.exited = true;
            --running;
            if (std::find(lost.begin(), lost.end(), c.rank) == lost.end()) lost.push_back(c.rank);
            if (dashboard)
              dashboard->event(Json{
                  {"kind", "lost"},
                  {"peer", c.rank},
                  {"reason", "stalled: stopped 20 s after the others finished"},
                  {"after_step",
                   last_eval_step}}.dump());
          }
      }
    }
    if (running == 0 && failure.empty() && !fs::exists(out / "summary.json") && remote.empty())
      failure = "every peer stopped and none wrote summary.json (see the peers' logs)";
  }
  progress.end();

  if (!failure.empty()) {
    for (auto& c : children)
      if (!c.exited) kill(c.pid, SIGTERM);
    const auto deadline = Clock::now() + std::chrono::seconds(3);
    for (auto& c : children) {
      while (!c.exited && Clock::now() < deadline) {
        if (waitpid(c.pid, &c.status, WNOHANG) == c.pid) c.exited = true;
        else usleep(50'000);
      }
      if (!c.exited) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &c.status, 0);
      }
    }
    if (!fs::exists(out / "summary.json")) {
      train::RunSummary summary;
      summary.topology = topology.name;
      summary.algorithm = to_string(config.algorithm);
      if (failed_peer >= 0) summary.failed_peers = {failed_peer};
      summary.error = failure;
      train::write_summary(out, summary);
    }
    std::fprintf(stderr, "error: %s\n", failure.c_str());
    std::fprintf(stderr, "stopped the other peers; logs are in %s/peer-*.log\n", out.c_str());
    if (dashboard) dashboard->finish(read_text(out / "summary.json", "{\"error\": \"no summary\"}"));
    return g_interrupted ? 130 : 1;
  }
  print_summary(out);
  if (dashboard) {
    dashboard->finish(read_text(out / "summary.json",
                                "{\"note\": \"the coordinator ran on another host: the summary is on its machine\"}"));
    std::printf("  dashboard: the run is over; 'peertrain report %s' writes the same view as one HTML file\n",
                out.c_str());
  }
  // Peers restarted by hand with --rejoin came back: summary.json's rejoined_peers.
  std::vector<int> back;
  if (fs::exists(out / "summary.json"))
    for (const train::RejoinRecord& r : train::read_summary(out / "summary.json").rejoined_peers)
      back.push_back(r.peer);
  if (!back.empty()) {
    std::string list;
    for (int r : back) list += (list.empty() ? "" : ", ") + std::to_string(r);
    std::printf("  rejoined peers: %s (see rejoined_peers in summary.json)\n", list.c_str());
  }
  std::erase_if(lost, [&](int r) { return std::find(back.begin(), back.end(), r) != back.end(); });
  if (!lost.empty()) {
    std::string list;
    for (int r : lost) list += (list.empty() ? "" : ", ") + std::to_string(r);
    std::printf("  lost peers: %s (the survivors finished; see failed_peers in summary.json)\n", list.c_str());
  }
  return 0;
}

}  // namespace peertrain::cli
