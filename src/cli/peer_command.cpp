// peertrain peer: runs one peer of a topology. The rank comes from --rank, or from the
// launcher's environment (SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK), so srun or mpirun
// can start peers across machines.
#include <cstdio>
#include <cstdlib>

#include "commands.h"
#include "options.h"
#include "peertrain/core/log.h"
#include "training_options.h"

namespace peertrain::cli {

int run_peer(int argc, char** argv) {
  cxxopts::Options options("peertrain peer", "Run one peer of a topology (launch starts these for you).");
  // clang-format off
  options.add_options()
      ("topology", "topology file (YAML)", cxxopts::value<std::string>())
      ("rank", "this peer's id (default: $SLURM_PROCID, $OMPI_COMM_WORLD_RANK or $PMI_RANK)", cxxopts::value<std::string>())
      ("out", "directory for metrics.csv and summary.json (written by the coordinator)", cxxopts::value<std::string>())
      ("progress", "print machine-readable @progress lines (while this peer coordinates)")
      ("rejoin", "restart a peer the others dropped: it takes a neighbour's current parameters and trains on "
                 "(give the run's other flags unchanged; docs/faults.md)")
      ("log-level", "debug | info | warn | error | off", cxxopts::value<std::string>()->default_value("info"))
      ("h,help", "show this help");
  // clang-format on
  add_training_options(options);
  cxxopts::ParseResult args;
  if (auto code = parse_or_exit(options, argc, argv, &args)) return *code;
  if (!args.count("topology")) {
    std::fprintf(stderr, "error: --topology FILE is required (see 'peertrain peer --help')\n");
    return 2;
  }
  train::TrainConfig config;
  int rank = -1;
  try {
    config = training_config(args);
    std::string rank_text;
    if (args.count("rank")) {
      rank_text = args["rank"].as<std::string>();
    } else {
      for (const char* variable : {"SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"})
        if (const char* value = std::getenv(variable)) {
          rank_text = value;
          break;
        }
    }
    if (rank_text.empty()) throw UsageError("no --rank, and none of SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK is set");
    auto [ptr, ec] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (ec != std::errc() || ptr != rank_text.data() + rank_text.size() || rank < 0)
      throw UsageError("rank '" + rank_text + "' is not a peer id");
    log::set_level(log::parse_level(args["log-level"].as<std::string>()));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  if (args.count("out")) config.out_dir = args["out"].as<std::string>();
  if ((config.checkpoint_every > 0 || config.resume) && config.checkpoint_dir.empty()) {
    if (config.out_dir.empty()) {
      std::fprintf(stderr, "error: --checkpoint-every and --resume need --checkpoint-dir or --out\n");
      return 2;
    }
    config.checkpoint_dir = config.out_dir + "/checkpoints";
  }
  config.progress = args.count("progress") > 0;
  config.rejoin = args.count("rejoin") > 0;
  if (config.rejoin) {
    std::string conflict;
    if (config.resume) conflict = "--rejoin and --resume exclude each other";
    else if (config.algorithm != train::Algorithm::kDpsgd && config.algorithm != train::Algorithm::kDiloco)
      conflict =
          "--rejoin needs --algorithm dpsgd or diloco (the others stop when a peer is lost, or cannot take "
          "one back)";
    if (!conflict.empty()) {
      std::fprintf(stderr, "error: --rejoin: %s\n", conflict.c_str());
      return 2;
    }
  }
  const auto topology = topology::load_topology_file(args["topology"].as<std::string>());
  train::run_peer(topology, rank, config);
  return 0;
}

}  // namespace peertrain::cli
