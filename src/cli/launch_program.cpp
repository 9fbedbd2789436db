// `peertrain launch --topology FILE [--secret-file KEY] -- PROGRAM [ARGS...]`: one process
// per peer of the file on this machine, each running PROGRAM (a Python script using the
// peertrain module, say) with RANK, LOCAL_RANK, WORLD_SIZE, PEERTRAIN_TOPOLOGY and, with a
// key, PEERTRAIN_SECRET_FILE in its environment. Their output comes back line by line,
// prefixed "[peer R]". A process that fails is named with its exit status; the others go
// on (they decide, as peers do, whether they can do without it). Exit code 0 when every
// one exited 0, else 1.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "commands.h"
#include "options.h"
#include "peertrain/core/error.h"
#include "peertrain/net/host.h"
#include "peertrain/topology/topology.h"

namespace peertrain::cli {
namespace {

namespace fs = std::filesystem;

volatile std::sig_atomic_t g_stop = 0;
void on_stop(int) { g_stop = 1; }

struct Program {
  int rank = 0;
  pid_t pid = -1;
  int out_fd = -1;
  std::string pending;
};

std::string describe(int status) {
  if (WIFEXITED(status)) return str("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return str("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  return "stopped";
}

void flush_lines(Program& p, bool all) {
  std::size_t newline;
  while ((newline = p.pending.find('\n')) != std::string::npos) {
    std::printf("[peer %d] %s\n", p.rank, p.pending.substr(0, newline).c_str());
    p.pending.erase(0, newline + 1);
  }
  if (all && !p.pending.empty()) {
    std::printf("[peer %d] %s\n", p.rank, p.pending.c_str());
    p.pending.clear();
  }
  std::fflush(stdout);
}

}  // namespace

int launch_program(const std::string& topology_file, const std::string& secret_file,
                   const std::vector<std::string>& command) {
  if (command.empty()) {
    std::fprintf(stderr, "error: nothing to run after '--' (peertrain launch --topology FILE -- python3 train.py)\n");
    return 2;
  }
  const fs::path topology_path = fs::absolute(topology_file);
  const auto topology = topology::load_topology_file(topology_path.string());
  std::vector<int> local;
  for (const auto& peer : topology.peers)
    if (net::names_this_machine(peer.host)) local.push_back(peer.id);
  if (local.empty())
    throw Error(ErrorKind::kInvalidArgument,
                str(topology_path.string(), ": none of its ", topology.num_peers(), " peers is on this machine"));
  std::fprintf(stderr, "launching %zu of %d peers of %s: %s\n", local.size(), topology.num_peers(),
               topology.name.c_str(), command[0].c_str());
  std::signal(SIGINT, on_stop);
  std::signal(SIGTERM, on_stop);
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<Program> programs;
  for (std::size_t i = 0; i < local.size(); ++i) {
    int fds[2];
    if (pipe(fds) != 0) throw Error(ErrorKind::kIo, str("cannot create a pipe: ", std::strerror(errno)));
    const pid_t launcher = getpid();
    const pid_t pid = fork();
    if (pid < 0) throw Error(ErrorKind::kIo, str("cannot start peer ", local[i], ": ", std::strerror(errno)));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive the launcher (see launch_command.cpp)
      if (getppid() != launcher) _exit(1);
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      setenv("RANK", std::to_string(local[i]).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(i).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(topology.num_peers()).c_str(), 1);
      setenv("PEERTRAIN_TOPOLOGY", topology_path.c_str(), 1);
      if (!secret_file.empty()) setenv("PEERTRAIN_SECRET_FILE", fs::absolute(secret_file).c_str(), 1);
      setenv("PYTHONUNBUFFERED", "1", 1);  // lines as they are printed, not at exit
      std::vector<std::string> args = command;
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      std::fprintf(stderr, "error: cannot run '%s': %s\n", argv[0], std::strerror(errno));
      _exit(127);
    }
    close(fds[1]);
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    programs.push_back({local[i], pid, fds[0], {}});
  }

  std::size_t running = programs.size();
  int failures = 0;
  bool stopping = false;
  while (running > 0) {
    if (g_stop && !stopping) {
      stopping = true;
      for (auto& p : programs)
        if (p.pid > 0) kill(p.pid, SIGTERM);
    }
    std::vector<pollfd> fds;
    for (auto& p : programs)
      if (p.out_fd >= 0) fds.push_back({p.out_fd, POLLIN, 0});
    if (!fds.empty())
      poll(fds.data(), fds.size(), 200);
    else
      usleep(100'000);
    for (auto& p : programs) {
      if (p.out_fd < 0) continue;
      char buffer[4096];
      ssize_t got;
      while ((got = read(p.out_fd, buffer, sizeof buffer)) > 0) p.pending.append(buffer, static_cast<std::size_t>(got));
      if (got == 0) {
        close(p.out_fd);
        p.out_fd = -1;
      }
      flush_lines(p, p.out_fd < 0);
    }
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
      for (auto& p : programs)
        if (p.pid == pid) {
          p.pid = -1;
          --running;
          if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            ++failures;
            std::fprintf(stderr, "peer %d (%s) %s\n", p.rank, command[0].c_str(), describe(status).c_str());
          }
        }
  }
  for (auto& p : programs) {  // what was left in the pipes
    if (p.out_fd < 0) continue;
    char buffer[4096];
    ssize_t got;
    while ((got = read(p.out_fd, buffer, sizeof buffer)) > 0) p.pending.append(buffer, static_cast<std::size_t>(got));
    close(p.out_fd);
    flush_lines(p, true);
  }
  if (failures > 0) {
    std::fprintf(stderr, "error: %d of %zu peers failed\n", failures, programs.size());
    return 1;
  }
  return 0;
}

}  // namespace peertrain::cli
