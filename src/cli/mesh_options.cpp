#include "mesh_options.h"

#include "options.h"
#include "peertrain/core/error.h"
#include "peertrain/parallel/reshard.h"

namespace peertrain::cli {

void add_mesh_options(cxxopts::Options& options, const std::string& group) {
  options.add_options(group)("tp", "tensor-parallel ranks per stage (Megatron: heads and MLP width split)",
                             cxxopts::value<std::string>()->default_value("1"))(
      "stage-mesh",
      "each stage's own workers instead of --sp/--tp, e.g. \"sp=2,tp=1;sp=1,tp=4\" (a stage's activations "
      "are resharded where its neighbour's mesh differs)",
      cxxopts::value<std::string>())("workers", "the workers this peer has; the meshes must fit (0: no limit)",
                                     cxxopts::value<std::string>()->default_value("0"))(
      "reshard", "send-recv | broadcast | local-allgather: how a boundary tensor crosses between stage meshes",
      cxxopts::value<std::string>()->default_value("send-recv"))(
      "link-between-gbps",
      "emulate the links inside a peer: Gbit/s of each worker's link to another stage's mesh (off by default)",
      cxxopts::value<std::string>())("link-within-gbps",
                                     "with --link-between-gbps: Gbit/s between two workers of a mesh",
                                     cxxopts::value<std::string>()->default_value("100"))(
      "link-latency-us", "with --link-between-gbps: microseconds per message",
      cxxopts::value<std::string>()->default_value("20"));
}

void read_mesh_options(const cxxopts::ParseResult& args, parallel::EngineConfig& e) {
  e.tp = number_flag<int>(args, "tp");
  if (e.tp < 1) throw UsageError("--tp must be at least 1, got " + args["tp"].as<std::string>());
  e.max_workers = number_flag<int>(args, "workers");
  if (e.max_workers < 0) throw UsageError("--workers must be 0 or more, got " + args["workers"].as<std::string>());
  try {
    if (args.count("stage-mesh")) e.stage_meshes = parallel::parse_stage_meshes(args["stage-mesh"].as<std::string>());
    e.reshard = parallel::parse_reshard_strategy(args["reshard"].as<std::string>());
  } catch (const Error& err) {
    throw UsageError(err.what());
  }
  for (const char* flag : {"link-within-gbps", "link-latency-us"})
    if (args.count(flag) && !args.count("link-between-gbps"))
      throw UsageError(std::string("--") + flag + " needs --link-between-gbps (the links are emulated only with it)");
  if (args.count("link-between-gbps")) {
    parallel::LinkModel links;
    const double between = positive<double>(args, "link-between-gbps");
    const double within = positive<double>(args, "link-within-gbps");
    const double latency = positive<double>(args, "link-latency-us", true);
    links.between_bytes_per_s = between * 1e9 / 8;
    links.within_bytes_per_s = within * 1e9 / 8;
    links.latency_s = latency * 1e-6;
    e.links = links;
  }
}

}  // namespace peertrain::cli
