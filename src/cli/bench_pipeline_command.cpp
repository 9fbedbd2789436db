// peertrain bench pipeline: the pipeline engine on random data, stage by stage: what each
// stage holds (parameter bytes, peak activations), what it computes, and the step's
// bubble and throughput — the numbers to read when a stage (the embedding and the LM head
// of a large vocabulary) outweighs the others.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "mesh_options.h"
#include "model_flags.h"
#include "options.h"
#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "peertrain/model/transformer.h"
#include "peertrain/parallel/partitioner.h"
#include "peertrain/parallel/pipeline.h"
#include "peertrain/parallel/random_batch.h"

namespace peertrain::cli {

using Json = nlohmann::ordered_json;
namespace {

double max_over_mean(const std::vector<double>& values) {
  const double mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  return mean > 0 ? *std::max_element(values.begin(), values.end()) / mean : 0.0;
}

}  // namespace

int bench_pipeline(int argc, char** argv) {
  cxxopts::Options options("peertrain bench pipeline",
                           "Run the pipeline engine on random data and report each stage's parameters, compute and "
                           "activation memory, and the step's bubble and throughput");
  options.add_options()("model", "gpt or vit", cxxopts::value<std::string>()->default_value("gpt"))(
      "vocab-size", "gpt: vocabulary (256 for bytes; 8000, 32000, 64000 for subwords)",
      cxxopts::value<std::string>()->default_value("256"))("d-model", "residual width",
                                                           cxxopts::value<std::string>()->default_value("128"))(
      "layers", "blocks", cxxopts::value<std::string>()->default_value("4"))(
      "heads", "attention heads", cxxopts::value<std::string>()->default_value("4"))(
      "seq", "tokens per sequence", cxxopts::value<std::string>()->default_value("128"))(
      "batch", "sequences per step", cxxopts::value<std::string>()->default_value("8"))(
      "sp", "sequence ranks per stage", cxxopts::value<std::string>()->default_value("1"))(
      "pp", "pipeline stages", cxxopts::value<std::string>()->default_value("4"))(
      "microbatches", "micro-batches per step", cxxopts::value<std::string>()->default_value("8"))(
      "schedule", "gpipe | 1f1b | eager-1f1b | interleaved | zb-h1 | zb-h2 | zb-v | v-half | pipedream",
      cxxopts::value<std::string>()->default_value("1f1b"))("chunks", "interleaved: chunks per stage",
                                                            cxxopts::value<std::string>()->default_value("2"))(
      "vocab-parallel", "gpt: none | vocab-1 | vocab-2 (the vocabulary split over the stages)",
      cxxopts::value<std::string>()->default_value("none"))(
      "stages", "units per virtual stage, e.g. 2,1,1,2 (default: profiled)", cxxopts::value<std::string>())(
      "steps", "timed steps (the stats are the last one's)", cxxopts::value<std::string>()->default_value("3"))(
      "plan", "print the resharding plan of each boundary between different stage meshes")(
      "format", "table or json", cxxopts::value<std::string>()->default_value("table"))("h,help", "this help");
  add_mesh_options(options, "");
  cxxopts::ParseResult args;
  if (auto code = parse_or_exit(options, argc, argv, &args)) return *code;
  return exit_code_of("bench pipeline", [&] {
    model::TransformerConfig config;
    const std::string model_name = args["model"].as<std::string>();
    if (model_name != "gpt" && model_name != "vit")
      throw UsageError("--model '" + model_name + "': expected gpt or vit");
    config = transformer_shape(args, model_name == "gpt" ? model::TransformerKind::kGpt : model::TransformerKind::kVit,
                               true);
    const int batch = at_least_flag(args, "batch", 1);
    const int steps = at_least_flag(args, "steps", 1);
    const std::string format = args["format"].as<std::string>();
    if (format != "table" && format != "json") throw UsageError("--format '" + format + "': expected table or json");
    parallel::EngineConfig engine;
    engine.sp = number_flag<int>(args, "sp");
    engine.pp = number_flag<int>(args, "pp");
    read_mesh_options(args, engine);
    engine.microbatches = number_flag<int>(args, "microbatches");
    engine.schedule = parallel::parse_schedule(args["schedule"].as<std::string>());
    engine.chunks = number_flag<int>(args, "chunks");
    engine.vocab_parallel = parallel::parse_vocab_parallel(args["vocab-parallel"].as<std::string>());
    model::validate(config);
    model::Transformer model(config);
    if (args.count("stages")) {
      const parallel::ScheduleShape shape{
          .schedule = engine.schedule, .stages = engine.pp, .interleave = engine.chunks};
      engine.stage_first_units =
          parallel::parse_stage_sizes(args["stages"].as<std::string>(), model.num_units(), shape.virtual_stages());
    }
    parallel::PipelineEngine pipeline(model, engine);
    std::vector<float> params(model.num_parameters()), grads(params.size());
    model.initialize(params, 1);
    Rng rng(2);
    const int tokens = model.config().tokens();
    const parallel::RandomBatch data = parallel::random_batch(model.config(), batch, rng);
    const parallel::GlobalBatch global = parallel::global_batch(data, model.config(), batch);
    pipeline.step(params, global, grads);  // warm-up, and the profile when --stages is not given
    std::vector<double> step_times;
    for (int s = 0; s < steps; ++s) {
      const auto start = std::chrono::steady_clock::now();
      pipeline.step(params, global, grads);
      step_times.push_back(seconds_since(start));
    }
    std::sort(step_times.begin(), step_times.end());
    const double step_s = step_times[step_times.size() / 2];
    const parallel::StepStats& stats = pipeline.last_stats();
    const double step_tokens = static_cast<double>(batch) * tokens;
    std::vector<double> param_bytes, compute;
    for (const auto& st : stats.stages) {
      param_bytes.push_back(static_cast<double>(st.parameter_bytes));
      compute.push_back(st.busy_cpu_s);
    }
    const std::string split = parallel::format_stage_sizes(pipeline.stage_first_units(), model.num_units());
    // peak_in_flight counts (micro-batch, chunk) pairs; a chunk holds 1/chunks of a stage.
    const double chunks = pipeline.schedule_shape().chunks();
    if (format == "json") {
      Json stages = Json::array();
      for (std::size_t p = 0; p < stats.stages.size(); ++p) {
        const auto& st = stats.stages[p];
        Json o;
        const auto& mesh = pipeline.meshes()[p];
        o["stage"] = static_cast<int>(p);
        o["sp"] = mesh.sp;
        o["tp"] = mesh.tp;
        o["units"] = st.units;
        o["parameter_bytes"] = st.parameter_bytes;
        o["compute_s"] = st.busy_cpu_s;
        o["wait_s"] = st.wait_s;
        o["reduce_s"] = st.reduce_s;
        o["peak_microbatches"] = static_cast<double>(st.peak_in_flight) / chunks;
        o["peak_activation_bytes"] = st.peak_activation_bytes;
        o["peak_output_states"] = st.peak_output_states;
        stages.push_back(std::move(o));
      }
      Json out;
      out["model"] = model_name;
      out["vocab"] = config.vocab;
      out["pp"] = engine.pp;
      out["microbatches"] = engine.microbatches;
      out["schedule"] = parallel::to_string(engine.schedule);
      out["vocab_parallel"] = parallel::to_string(engine.vocab_parallel);
      out["stage_mesh"] = parallel::to_string(pipeline.meshes());
      out["reshard"] = parallel::to_string(engine.reshard);
      out["link_between_gbps"] = engine.links ? engine.links->between_bytes_per_s * 8 / 1e9 : 0.0;
      out["split"] = split;
      out["stages"] = std::move(stages);
      out["parameter_bytes_max_over_mean"] = max_over_mean(param_bytes);
      out["compute_max_over_mean"] = max_over_mean(compute);
      out["replayed_bubble"] = stats.replayed_bubble;
      out["theoretical_bubble"] = stats.theoretical_bubble;
      out["step_s"] = step_s;
      out["tokens_per_s"] = step_tokens / step_s;
      out["replayed_step_s"] = stats.replayed_step_s;
      out["replayed_tokens_per_s"] = step_tokens / stats.replayed_step_s;
      std::printf("%s\n", out.dump(2).c_str());
      return 0;
    }
    std::printf(
        "%s vocab %d, d %d, L %d, seq %d, batch %d; --pp %d --microbatches %d --schedule %s --vocab-parallel %s; "
        "units per virtual stage %s\n\n",
        model_name.c_str(), config.vocab, config.d_model, config.layers, config.seq, batch, engine.pp,
        engine.microbatches, std::string(parallel::to_string(engine.schedule)).c_str(),
        std::string(parallel::to_string(engine.vocab_parallel)).c_str(), split.c_str());
    std::printf("stage meshes %s, --reshard %s, links %s\n\n", parallel::to_string(pipeline.meshes()).c_str(),
                std::string(parallel::to_string(engine.reshard)).c_str(),
                engine.links
                    ? str("emulated: ", engine.links->between_bytes_per_s * 8 / 1e9, " Gbit/s between meshes, ",
                          engine.links->within_bytes_per_s * 8 / 1e9, " within, ", engine.links->latency_s * 1e6, " us")
                          .c_str()
                    : "free (not emulated)");
    if (args.count("plan")) std::printf("%s\n", pipeline.describe_boundaries().c_str());
    std::printf("%5s %9s %5s %12s %12s %10s %16s %14s %14s\n", "stage", "mesh", "units", "params MiB", "compute ms",
                "wait ms", "peak micro-b.", "output states", "peak act. MiB");
    for (std::size_t p = 0; p < stats.stages.size(); ++p) {
      const auto& st = stats.stages[p];
      const auto& mesh = pipeline.meshes()[p];
      std::printf("%5zu %9s %5d %12.2f %12.2f %10.2f %16.1f %14d %14.2f\n", p,
                  str("sp", mesh.sp, "·tp", mesh.tp).c_str(), st.units,
                  static_cast<double>(st.parameter_bytes) / (1 << 20), st.busy_cpu_s * 1e3, st.wait_s * 1e3,
                  static_cast<double>(st.peak_in_flight) / chunks, st.peak_output_states,
                  static_cast<double>(st.peak_activation_bytes) / (1 << 20));
    }
    std::printf("\nmax/mean over stages: parameters %.2f, compute %.2f\n", max_over_mean(param_bytes),
                max_over_mean(compute));
    std::printf("bubble: replayed %.4f (a core per worker, measured pass times), theory %.4f\n", stats.replayed_bubble,
                stats.theoretical_bubble);
    std::printf(
        "throughput: %.0f tokens/s on this machine (%.1f ms a step, median of %d), %.0f tokens/s replayed with "
        "a core per worker\n",
        step_tokens / step_s, step_s * 1e3, steps, step_tokens / stats.replayed_step_s);
    return 0;
  });
}

}  // namespace peertrain::cli
