// The peertrain program: dispatches to subcommands and turns every error into one
// "error: ..." line and a non-zero exit code.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "commands.h"
#include "peertrain/config.h"
#include "peertrain/core/allocator.h"
#include "peertrain/core/error.h"
#if PEERTRAIN_HAVE_CUDA
#include "peertrain/device/device_transformer.h"
#include "peertrain/model/device_model.h"
#endif

namespace {

void print_usage() {
  std::printf(
      "peertrain %s: decentralized peer-to-peer training (D-PSGD)\n\n"
      "usage: peertrain <command> [options]\n\n"
      "commands:\n"
      "  launch              start every local peer of a topology and train (D-PSGD or a baseline)\n"
      "  peer                run one peer (launch, srun or mpirun start these)\n"
      "  topology generate   write a topology file from a generator\n"
      "  topology inspect    check a topology file and report W's spectral gap\n"
      "  bench step          time one training step (also: schedule, pipeline, reshard, memory)\n"
      "  plan                predict each split of a peer's workers and pick the fastest that fits\n"
      "  report runs/DIR     one self-contained HTML page of a finished run (the dashboard's view)\n"
      "  keygen FILE         write a new key file for --secret-file\n\n"
      "Run 'peertrain <command> --help' for a command's options, 'peertrain --version' for the version.\n"
      "build: cuda=%s nccl=%s\n",
      PEERTRAIN_VERSION, PEERTRAIN_HAVE_CUDA ? "yes" : "no", PEERTRAIN_HAVE_NCCL ? "yes" : "no");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::printf("peertrain %s\n", PEERTRAIN_VERSION);
    return 0;
  }
  const std::string command = argv[1];
  peertrain::keep_freed_memory();  // no page faults per step (core/allocator.h)
#if PEERTRAIN_HAVE_CUDA
  // This program links the CUDA library: make --device cuda reachable (model/device_model.h).
  peertrain::model::register_device_backend(peertrain::device::backend());
#endif
  try {
    if (command == "topology") return peertrain::cli::run_topology(argc - 1, argv + 1);
    if (command == "launch") return peertrain::cli::run_launch(argc - 1, argv + 1);
    if (command == "peer") return peertrain::cli::run_peer(argc - 1, argv + 1);
    if (command == "bench") return peertrain::cli::run_bench(argc - 1, argv + 1);
    if (command == "plan") return peertrain::cli::run_plan(argc - 1, argv + 1);
    if (command == "keygen") return peertrain::cli::run_keygen(argc - 1, argv + 1);
    if (command == "report") return peertrain::cli::run_report(argc - 1, argv + 1);
    std::fprintf(stderr, "error: unknown command '%s'; run 'peertrain --help' for the list\n", command.c_str());
    return 2;
  } catch (const peertrain::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
