// peertrain plan: which split of a peer's workers to use. Simulates every strategy the
// engine can build on --workers workers (plan/search.h) from profiles measured once on this
// machine (plan/profile.h), and prints the best --top K with predicted step time, memory
// and why each loses to the first; those that do not fit --memory-per-worker or cannot be
// built are listed with the reason. --strategy predicts one given strategy instead; --run
// trains with the winner (peertrain launch with its flags).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "mesh_options.h"
#include "options.h"
#include "peertrain/core/error.h"
#include "peertrain/core/json.h"
#include "peertrain/parallel/partitioner.h"
#include "peertrain/plan/search.h"

namespace peertrain::cli {
namespace {

double parse_bytes(const std::string& text, const std::string& flag) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  const double scale = unit == "" || unit == "B" ? 1
                       : unit == "KiB"           ? 1024.0
                       : unit == "MiB"           ? 1024.0 * 1024
                       : unit == "GiB"           ? 1024.0 * 1024 * 1024
                       : unit == "KB"            ? 1e3
                       : unit == "MB"            ? 1e6
                       : unit == "GB"            ? 1e9
                                                 : -1;
  if (used == 0 || scale < 0 || !(value >= 0))
    throw UsageError(str(flag, " '", text, "': expected a size such as 2GiB, 512MiB or 1e9"));
  return value * scale;
}

std::string mib(double bytes) { return str(static_cast<long long>(std::llround(bytes / (1 << 20))), " MiB"); }

}  // namespace

int run_plan(int argc, char** argv) {
  cxxopts::Options options("peertrain plan",
                           "Predict each way to split a peer's workers (SP x TP x PP, micro-batches, schedule) with "
                           "the step-time simulator and print the best; or predict one --strategy");
  options.add_options("model")("model", "gpt or vit", cxxopts::value<std::string>()->default_value("gpt"))(
      "d-model", "residual width", cxxopts::value<std::string>()->default_value("128"))(
      "layers", "blocks", cxxopts::value<std::string>()->default_value("4"))(
      "heads", "attention heads", cxxopts::value<std::string>()->default_value("4"))(
      "seq", "gpt: tokens per sequence", cxxopts::value<std::string>()->default_value("128"))(
      "vocab-size", "gpt: vocabulary", cxxopts::value<std::string>()->default_value("256"))(
      "batch", "sequences (images) per step of a peer", cxxopts::value<std::string>()->default_value("8"));
  options.add_options("search")(
      "memory-per-worker", "each worker's memory, e.g. 2GiB (parameters x4 for Adam, plus activations)",
      cxxopts::value<std::string>())("top", "strategies to print", cxxopts::value<std::string>()->default_value("5"))(
      "cores", "cores to simulate (default: this machine's; the workers share them)", cxxopts::value<std::string>())(
      "profile-cache", "the profile cache file (default: ~/.cache/peertrain/profile.tsv; 'none': measure anew)",
      cxxopts::value<std::string>())("format", "table or json", cxxopts::value<std::string>()->default_value("table"))(
      "run", "train with the winner: peertrain launch --topology FILE with its flags (and the model's)")(
      "topology", "with --run: the topology to launch", cxxopts::value<std::string>())(
      "max-steps", "with --run", cxxopts::value<std::string>()->default_value("50"))(
      "out", "with --run: the run's folder (launch's --out)", cxxopts::value<std::string>());
  options.add_options("one strategy")("strategy", "predict the strategy these flags give instead of searching")(
      "sp", "sequence ranks per stage", cxxopts::value<std::string>()->default_value("1"))(
      "pp", "pipeline stages", cxxopts::value<std::string>()->default_value("1"))(
      "microbatches", "micro-batches per step", cxxopts::value<std::string>()->default_value("1"))(
      "schedule", "gpipe | 1f1b | eager-1f1b | interleaved | zb-h1 | zb-h2 | zb-v | v-half | pipedream",
      cxxopts::value<std::string>()->default_value("1f1b"))("chunks", "interleaved: chunks per stage",
                                                            cxxopts::value<std::string>()->default_value("2"))(
      "stages", "units per virtual stage (default: balanced on the profile)", cxxopts::value<std::string>())(
      "sequence-split", "zigzag | contiguous", cxxopts::value<std::string>()->default_value("zigzag"))("h,help",
                                                                                                       "this help");
  add_mesh_options(options, "one strategy");
  cxxopts::ParseResult args;
  if (auto code = parse_or_exit(options, argc, argv, &args)) return *code;
  return exit_code_of("plan", [&] {
    model::TransformerConfig config;
    const std::string model_name = args["model"].as<std::string>();
    if (model_name != "gpt" && model_name != "vit")
      throw UsageError("--model '" + model_name + "': expected gpt or vit");
    config.kind = model_name == "gpt" ? model::TransformerKind::kGpt : model::TransformerKind::kVit;
    config.d_model = number_flag<int>(args, "d-model");
    config.layers = number_flag<int>(args, "layers");
    config.heads = number_flag<int>(args, "heads");
    config.seq = number_flag<int>(args, "seq");
    config.vocab = number_flag<int>(args, "vocab-size");
    model::validate(config);
    const int batch = number_flag<int>(args, "batch"), top = number_flag<int>(args, "top");
    if (batch < 1 || top < 1) throw UsageError("--batch and --top must be at least 1");
    const std::string format = args["format"].as<std::string>();
    if (format != "table" && format != "json") throw UsageError("--format '" + format + "': expected table or json");
    plan::SimulationOptions sim;
    if (args.count("cores")) sim.cores = number_flag<int>(args, "cores");
    if (args.count("memory-per-worker"))
      sim.memory_cap_bytes = parse_bytes(args["memory-per-worker"].as<std::string>(), "--memory-per-worker");
    std::string cache =
        args.count("profile-cache") ? args["profile-cache"].as<std::string>() : plan::Profiler::default_cache_path();
    if (cache == "none") cache.clear();
    plan::Profiler profiler(cache);

    std::vector<plan::Candidate> candidates;
    double simulate_s = 0;
    if (args.count("strategy")) {
      plan::Candidate one;
      auto& e = one.strategy.engine;
      e.sp = number_flag<int>(args, "sp");
      e.pp = number_flag<int>(args, "pp");
      e.microbatches = number_flag<int>(args, "microbatches");
      e.schedule = parallel::parse_schedule(args["schedule"].as<std::string>());
      e.chunks = number_flag<int>(args, "chunks");
      e.split = parallel::parse_sequence_split(args["sequence-split"].as<std::string>());
      read_mesh_options(args, e);
      e.max_workers = 0;  // --workers is the search's; a given strategy has its own
      if (args.count("stages")) {
        const parallel::ScheduleShape shape{.schedule = e.schedule, .stages = e.pp, .interleave = e.chunks};
        e.stage_first_units =
            parallel::parse_stage_sizes(args["stages"].as<std::string>(), config.layers + 2, shape.virtual_stages());
      }
      one.strategy.batch = batch;
      one.prediction = plan::simulate(config, one.strategy, profiler, sim);
      // Again, the profiles now at hand: what simulating one strategy costs (the mean of 100).
      constexpr int kTimes = 100;
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < kTimes; ++i) plan::simulate(config, one.strategy, profiler, sim);
      simulate_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kTimes;
      candidates.push_back(std::move(one));
    } else {
      plan::SearchSpace space;
      space.workers = number_flag<int>(args, "workers");
      if (space.workers < 1) throw UsageError("plan: --workers W, the peer's workers to split, is needed to search");
      space.batch = batch;
      space.split = parallel::parse_sequence_split(args["sequence-split"].as<std::string>());
      if (format == "table")
        std::fprintf(stderr, "planning %d workers: profiling what the cache (%s) lacks...\n", space.workers,
                     cache.empty() ? "none" : cache.c_str());
      candidates = plan::search(config, space, profiler, sim);
    }
    profiler.save();

    if (format == "json") {
      std::string rows = "[";
      for (std::size_t i = 0; i < candidates.size(); ++i) {
        const auto& c = candidates[i];
        json::Object o;
        o.add("strategy", c.strategy.describe()).add("feasible", c.prediction.feasible);
        if (!c.prediction.why_not.empty()) o.add("why_not", c.prediction.why_not);
        o.add("step_s", c.prediction.step_s)
            .add("passes_s", c.prediction.passes_s)
            .add("compute_s", c.prediction.compute_s)
            .add("bubble", c.prediction.bubble)
            .add("overhead_s", c.prediction.overhead_s)
            .add("reduce_s", c.prediction.reduce_s)
            .add("peak_worker_bytes", c.prediction.peak_bytes())
            .add("stages", parallel::format_stage_sizes(c.prediction.first_units, config.layers + 2));
        if (!c.loses_because.empty()) o.add("loses_because", c.loses_because);
        if (simulate_s > 0) o.add("simulate_s", simulate_s);
        std::string flags;
        for (const auto& f : c.strategy.flags()) flags += (flags.empty() ? "" : " ") + f;
        o.add("flags", flags);
        rows += (i ? ", " : "") + o.dump(0);
      }
      std::printf("%s]\n", rows.c_str());
    } else {
      std::printf("%s d %d, L %d, H %d, T %d, batch %d; %s cores simulated; profiles: %d measured now, cache %s\n\n",
                  model_name.c_str(), config.d_model, config.layers, config.heads, config.tokens(), batch,
                  sim.cores > 0 ? std::to_string(sim.cores).c_str() : "this machine's", profiler.measured(),
                  cache.empty() ? "none" : cache.c_str());
      std::printf("%4s %-34s %10s %8s %12s  %s\n", "rank", "strategy", "step ms", "bubble", "memory/wkr", "");
      int shown = 0;
      for (const auto& c : candidates) {
        if (!c.prediction.feasible) continue;
        if (shown++ >= top) break;
        std::printf("%4d %-34s %10.2f %8.3f %12s  %s\n", shown, c.strategy.describe().c_str(),
                    c.prediction.step_s * 1e3, c.prediction.bubble, mib(c.prediction.peak_bytes()).c_str(),
                    shown == 1 ? "the winner" : c.loses_because.c_str());
      }
      int refused = 0;
      for (const auto& c : candidates) refused += !c.prediction.feasible;
      if (refused > 0) {
        std::printf("\nnot chosen (%d):\n", refused);
        int listed = 0;
        for (const auto& c : candidates)
          if (!c.prediction.feasible && listed++ < 3 * top)
            std::printf("  %-34s %s\n", c.strategy.describe().c_str(), c.prediction.why_not.c_str());
      }
      if (shown == 0) std::printf("no strategy fits: see the reasons above\n");
    }
    if (!args.count("run")) return 0;
    const auto winner = std::find_if(candidates.begin(), candidates.end(),
                                     [](const plan::Candidate& c) { return c.prediction.feasible; });
    if (winner == candidates.end()) throw Error(ErrorKind::kInvalidArgument, "plan --run: no strategy fits");
    if (!args.count("topology")) throw UsageError("plan --run needs --topology FILE to launch");
    std::vector<std::string> command{
        "/proc/self/exe", "launch",           "--topology",  args["topology"].as<std::string>(),
        "--model",        model_name,         "--d-model",   str(config.d_model),
        "--layers",       str(config.layers), "--heads",     str(config.heads),
        "--batch",        str(batch),         "--max-steps", args["max-steps"].as<std::string>()};
    if (config.kind == model::TransformerKind::kGpt) command.insert(command.end(), {"--seq", str(config.seq)});
    if (args.count("out")) command.insert(command.end(), {"--out", args["out"].as<std::string>()});
    for (const auto& f : winner->strategy.flags()) command.push_back(f);
    command.push_back("--stages");
    command.push_back(parallel::format_stage_sizes(winner->prediction.first_units, config.layers + 2));
    std::string shown;
    for (std::size_t i = 1; i < command.size(); ++i) shown += " " + command[i];
    std::fprintf(stderr, "plan --run: peertrain%s\n", shown.c_str());
    std::vector<char*> exec_args;
    for (auto& a : command) exec_args.push_back(a.data());
    exec_args.push_back(nullptr);
    execv(exec_args[0], exec_args.data());
    throw Error(ErrorKind::kIo, "plan --run: cannot start peertrain launch");
  });
}

}  // namespace peertrain::cli
