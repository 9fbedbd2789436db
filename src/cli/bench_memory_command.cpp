// peertrain bench memory: sequence parallelism against tensor parallelism under one
// per-worker memory cap, the comparison of Li et al. 2021 ("Sequence Parallelism: Making
// 4D Parallelism Possible", which reports 3.0× longer sequences and 13.7× larger batches
// than Megatron's tensor parallelism). The same number of workers run one stage either as
// --sp N (every worker holds the whole model and 1/N of the tokens) or as --tp N (every
// worker holds 1/N of each block and every token).
//
// What a worker holds, measured by the pipeline engine on a real step (not a formula):
//   parameters  StageStats::parameter_bytes (a tensor rank: its shard of each block), times
//               4 for Adam training: the weights, their gradient, two moments;
//   activations StageStats::peak_activation_bytes, what forward keeps for backward. It is
//               linear in batch × tokens (attention keeps no T × T scores: ring attention
//               and the local kernel keep the log-sum-exp), which the bench checks on two
//               sizes before it extrapolates.
// The largest batch at --seq and the longest sequence at --batch then follow from the cap.
// The temporary workspace of one unit's pass is not counted (the same for both, small
// next to the saved activations at these sizes).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "options.h"
#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "peertrain/parallel/pipeline.h"
#include "peertrain/parallel/random_batch.h"

namespace peertrain::cli {

using Json = nlohmann::ordered_json;
namespace {

struct Footprint {
  double state_bytes = 0;           // parameters, gradient and Adam's two moments, per worker
  double activation_per_token = 0;  // bytes per token of the batch, per worker
};

// One step of one stage of `workers` ranks, sp or tp, at batch × seq; the largest worker's
// figures.
parallel::StageStats run_step(model::TransformerConfig config, bool sequence, int workers, int batch, int seq) {
  config.seq = seq;
  model::Transformer model(config);
  parallel::EngineConfig engine;
  (sequence ? engine.sp : engine.tp) = workers;
  engine.split = parallel::SequenceSplit::kContiguous;
  parallel::PipelineEngine pipeline(model, engine);
  std::vector<float> params(model.num_parameters()), grads(params.size());
  model.initialize(params, 1);
  Rng rng(2);
  const parallel::RandomBatch data = parallel::random_batch(model.config(), batch, rng);
  const parallel::GlobalBatch global = parallel::global_batch(data, model.config(), batch);
  pipeline.step(params, global, grads);
  return pipeline.last_stats().stages[0];
}

Footprint measure(const model::TransformerConfig& config, bool sequence, int workers, int seq) {
  const auto a = run_step(config, sequence, workers, 2, seq);
  const auto b = run_step(config, sequence, workers, 1, 2 * seq);  // the same tokens, arranged otherwise
  const auto c = run_step(config, sequence, workers, 4, seq);      // twice the tokens
  const double tokens = 2.0 * seq;
  const double per_token = static_cast<double>(a.peak_activation_bytes) / tokens;
  const double check_b = static_cast<double>(b.peak_activation_bytes) / tokens;
  const double check_c = static_cast<double>(c.peak_activation_bytes) / (2 * tokens);
  if (std::abs(check_b / per_token - 1) > 0.01 || std::abs(check_c / per_token - 1) > 0.01)
    throw Error(ErrorKind::kInternal, str("bench memory: activations are not linear in the tokens (", per_token, ", ",
                                          check_b, ", ", check_c, " bytes a token)"));
  return {4.0 * static_cast<double>(a.parameter_bytes), per_token};
}

}  // namespace

int bench_memory(int argc, char** argv) {
  cxxopts::Options options("peertrain bench memory",
                           "Sequence against tensor parallelism on the same workers under one per-worker memory cap "
                           "(Li et al. 2021): the largest batch and the longest sequence each can train");
  options.add_options()("workers", "workers of the stage: --sp N or --tp N",
                        cxxopts::value<std::string>()->default_value("4"))(
      "cap-gib", "memory per worker, GiB (16: the paper's P100)", cxxopts::value<std::string>()->default_value("16"))(
      "d-model", "residual width (768: BERT Base)", cxxopts::value<std::string>()->default_value("768"))(
      "layers", "blocks", cxxopts::value<std::string>()->default_value("12"))(
      "heads", "attention heads", cxxopts::value<std::string>()->default_value("12"))(
      "vocab-size", "vocabulary (30522: BERT's)", cxxopts::value<std::string>()->default_value("30522"))(
      "seq", "sequence length of the batch-size comparison", cxxopts::value<std::string>()->default_value("512"))(
      "batch", "batch of the sequence-length comparison", cxxopts::value<std::string>()->default_value("64"))(
      "probe-seq", "the measured steps' sequence length (then extrapolated)",
      cxxopts::value<std::string>()->default_value("64"))(
      "format", "table or json", cxxopts::value<std::string>()->default_value("table"))("h,help", "this help");
  cxxopts::ParseResult args;
  if (auto code = parse_or_exit(options, argc, argv, &args)) return *code;
  return exit_code_of("bench memory", [&] {
    model::TransformerConfig config;
    config.kind = model::TransformerKind::kGpt;
    config.d_model = number_flag<int>(args, "d-model");
    config.layers = number_flag<int>(args, "layers");
    config.heads = number_flag<int>(args, "heads");
    config.vocab = number_flag<int>(args, "vocab-size");
    const int workers = at_least_flag(args, "workers", 1);
    const double cap = positive<double>(args, "cap-gib") * (1ull << 30);
    const int seq = at_least_flag(args, "seq", 1), batch = at_least_flag(args, "batch", 1);
    const int probe = at_least_flag(args, "probe-seq", 1);
    const std::string format = args["format"].as<std::string>();
    if (format != "table" && format != "json") throw UsageError("--format '" + format + "': expected table or json");
    config.seq = probe;
    model::validate(config);
    struct Row {
      const char* name;
      Footprint f;
      long long max_batch = 0, max_seq = 0;
    };
    std::vector<Row> rows{{"sp", measure(config, true, workers, probe)},
                          {"tp", measure(config, false, workers, probe)}};
    for (Row& r : rows) {
      const double room = cap - r.f.state_bytes;
      r.max_batch = room > 0 ? static_cast<long long>(room / (r.f.activation_per_token * seq)) : 0;
      // A sequence the split divides: a multiple of the workers.
      r.max_seq = room > 0 ? static_cast<long long>(room / (r.f.activation_per_token * batch)) / workers * workers : 0;
    }
    auto ratio = [](long long a, long long b) {
      return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : INFINITY;
    };
    const double batch_ratio = ratio(rows[0].max_batch, rows[1].max_batch);
    const double seq_ratio = ratio(rows[0].max_seq, rows[1].max_seq);
    if (format == "json") {
      Json o;
      o["workers"] = workers;
      o["cap_gib"] = cap / (1ull << 30);
      o["d_model"] = config.d_model;
      o["layers"] = config.layers;
      o["heads"] = config.heads;
      o["vocab"] = config.vocab;
      o["seq"] = seq;
      o["batch"] = batch;
      for (const Row& r : rows) {
        o[str(r.name, "_state_bytes")] = r.f.state_bytes;
        o[str(r.name, "_activation_bytes_per_token")] = r.f.activation_per_token;
        o[str(r.name, "_max_batch")] = r.max_batch;
        o[str(r.name, "_max_seq")] = r.max_seq;
      }
      o["batch_ratio"] = batch_ratio;
      o["seq_ratio"] = seq_ratio;
      std::printf("%s\n", o.dump(2).c_str());
      return 0;
    }
    std::printf("gpt d %d, L %d, H %d, vocab %d; %d workers, %.3g GiB each, Adam (4 copies of the parameters)\n",
                config.d_model, config.layers, config.heads, config.vocab, workers, cap / (1ull << 30));
    std::printf("measured on steps at %d tokens a sequence, activations linear in the tokens (checked)\n\n", probe);
    std::printf("%-4s %18s %22s %16s %16s\n", "", "params+grad+Adam", "activations / token", "batch @ seq",
                "seq @ batch");
    std::printf("%-4s %18s %22s %16d %16d\n", "", "MiB per worker", "KiB per worker", seq, batch);
    for (const Row& r : rows)
      std::printf("%-4s %18.1f %22.2f %16lld %16lld\n", r.name, r.f.state_bytes / (1 << 20),
                  r.f.activation_per_token / 1024, r.max_batch, r.max_seq);
    std::printf("\nsp / tp: %.2fx the batch, %.2fx the sequence (Li et al. 2021 report 13.7x and 3.0x)\n", batch_ratio,
                seq_ratio);
    return 0;
  });
}

}  // namespace peertrain::cli
