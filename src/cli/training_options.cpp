#include "training_options.h"

#include <sstream>

#include "mesh_options.h"
#include "options.h"
#include "peertrain/core/error.h"
#include "peertrain/model/device_model.h"
#include "peertrain/parallel/partitioner.h"
#include "peertrain/parallel/ring_attention.h"

namespace peertrain::cli {
namespace {

// Flags forwarded from launch to its peers (everything that shapes the run).
const std::vector<std::string> kTrainingFlags = {"algorithm",
                                                 "model",
                                                 "hidden",
                                                 "epochs",
                                                 "max-steps",
                                                 "batch",
                                                 "lr",
                                                 "momentum",
                                                 "weight-decay",
                                                 "seed",
                                                 "eval-every",
                                                 "partition",
                                                 "alpha",
                                                 "data-dir",
                                                 "peer-timeout",
                                                 "connect-timeout",
                                                 "threads",
                                                 "run-id",
                                                 "on-split",
                                                 "secret-file",
                                                 "shared-memory",
                                                 "checkpoint-every",
                                                 "checkpoint-dir",
                                                 "max-staleness",
                                                 "optimizer",
                                                 "d-model",
                                                 "layers",
                                                 "heads",
                                                 "seq",
                                                 "patch",
                                                 "text-dir",
                                                 "tokenizer",
                                                 "vocab-size",
                                                 "eval-windows",
                                                 "sp",
                                                 "pp",
                                                 "microbatches",
                                                 "schedule",
                                                 "chunks",
                                                 "vocab-parallel",
                                                 "stages",
                                                 "sequence-split",
                                                 "ring-mode",
                                                 "worker-timeout",
                                                 "lr-schedule",
                                                 "warmup-steps",
                                                 "device",
                                                 "gemm-precision",
                                                 "tp",
                                                 "stage-mesh",
                                                 "workers",
                                                 "reshard",
                                                 "link-between-gbps",
                                                 "link-within-gbps",
                                                 "link-latency-us",
                                                 "update",
                                                 "compression",
                                                 "gossip-step",
                                                 "allreduce-algo",
                                                 "time-budget",
                                                 "momentum-form",
                                                 "inner-steps",
                                                 "fanout",
                                                 "el-variant",
                                                 "outer-lr",
                                                 "outer-momentum",
                                                 "outer-optimizer",
                                                 "outer-exchange",
                                                 "fragments",
                                                 "overlap",
                                                 "mix-alpha",
                                                 "outer-compression"};

// Where the gradient is computed. The default is the GPU when this build has CUDA and the
// run is one the device path runs (gpt; --sp ranks, a GPU for each, or --pp stages with
// --sp 1; no --tp or --stage-mesh); otherwise the CPU, so that a default run works on
// every machine.
void device_options(const cxxopts::ParseResult& args, train::TrainConfig& c) {
  c.gemm = model::parse_gemm_mode(args["gemm-precision"].as<std::string>());
  const auto& e = c.engine;
  const bool device_schedule = e.schedule == parallel::Schedule::kGpipe ||
                               e.schedule == parallel::Schedule::kOneFOneB ||
                               e.schedule == parallel::Schedule::kEager1F1B;
  const bool runs_on_device =
      c.model == train::ModelKind::kGpt && e.tp == 1 && e.stage_meshes.empty() &&
      (e.pp == 1 || (e.sp == 1 && device_schedule && e.vocab_parallel == parallel::VocabParallel::kNone));
  if (!args.count("device")) {
    c.device = runs_on_device && model::cuda_device_count() >= e.sp ? model::Device::kCuda : model::Device::kCpu;
    return;
  }
  c.device = model::parse_device(args["device"].as<std::string>());
  if (c.device == model::Device::kCpu) return;
  if (c.model != train::ModelKind::kGpt)
    throw UsageError("--device cuda runs --model gpt; mlp and vit run on --device cpu");
  if (!runs_on_device)
    throw UsageError(
        str("--device cuda runs --sp S (one GPU each) or --pp P with --sp 1, --schedule gpipe, 1f1b or "
            "eager-1f1b and no --vocab-parallel; not --tp or --stage-mesh (got --sp ",
            e.sp, " --tp ", e.tp, " --pp ", e.pp, " --schedule ", parallel::to_string(e.schedule),
            "): tensor parallelism and the other schedules are not built on the device yet"));
  const int devices = model::require_cuda_device();  // before any peer starts
  if (devices < e.sp)
    throw UsageError(
        str("--device cuda --sp ", e.sp, " needs ", e.sp, " GPUs (one per sequence rank), ", devices, " visible"));
}

// The transformer and its split over the workers of a peer; checked against each other
// here so that a bad combination is named before any peer starts.
void transformer_options(const cxxopts::ParseResult& args, train::TrainConfig& c) {
  // A flag the chosen model reads nowhere is refused, so that a run is never silently
  // something other than what its command line says.
  switch (c.model) {
    case train::ModelKind::kMlp:
      refuse_flags(
          args,
          {"d-model", "layers", "heads", "tied-head", "microbatches", "schedule", "chunks", "vocab-parallel",
           "sequence-split", "ring-mode", "reshard", "link-between-gbps", "link-within-gbps", "link-latency-us"},
          "--model gpt or vit");
      refuse_flags(args, {"seq", "text-dir", "tokenizer", "vocab-size", "eval-windows"}, "--model gpt");
      refuse_flags(args, {"patch"}, "--model vit");
      break;
    case train::ModelKind::kGpt:
      refuse_flags(args, {"hidden"}, "--model mlp");
      refuse_flags(args, {"patch"}, "--model vit");
      refuse_flags(args, {"data-dir"}, "--model mlp or vit (the GPT reads --text-dir)");
      break;
    case train::ModelKind::kVit:
      refuse_flags(args, {"hidden"}, "--model mlp");
      refuse_flags(args, {"seq", "text-dir", "vocab-size", "eval-windows", "tied-head"},
                   "--model gpt (a ViT's tokens are its image's patches)");
      break;
  }
  auto& m = c.transformer;
  m.kind = c.model == train::ModelKind::kVit ? model::TransformerKind::kVit : model::TransformerKind::kGpt;
  m.d_model = positive<int>(args, "d-model");
  m.layers = positive<int>(args, "layers");
  m.heads = positive<int>(args, "heads");
  m.seq = positive<int>(args, "seq");
  m.patch = positive<int>(args, "patch");
  m.tied_head = args.count("tied-head") > 0;
  c.text_dir = args["text-dir"].as<std::string>();
  try {
    c.tokenizer = train::parse_tokenizer(args["tokenizer"].as<std::string>());
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  if (c.tokenizer == train::TokenizerKind::kSentencePiece) {
    if (c.model != train::ModelKind::kGpt) throw UsageError("--tokenizer sentencepiece needs --model gpt");
    m.vocab = args.count("vocab-size") ? positive<int>(args, "vocab-size") : 8000;
    if (m.vocab < 300)
      throw UsageError(str("--vocab-size ", m.vocab,
                           ": sentencepiece needs at least 300 pieces (256 bytes, 3 control pieces, merges)"));
  } else if (args.count("vocab-size") && args["vocab-size"].as<std::string>() != "256") {
    throw UsageError("--vocab-size " + args["vocab-size"].as<std::string>() +
                     ": --tokenizer bytes has 256 tokens; use --tokenizer sentencepiece for a subword vocabulary");
  }
  c.eval_windows = positive<int>(args, "eval-windows");
  auto& e = c.engine;
  e.sp = positive<int>(args, "sp");
  e.pp = positive<int>(args, "pp");
  read_mesh_options(args, e);
  e.microbatches = positive<int>(args, "microbatches");
  e.timeout_s = positive<double>(args, "worker-timeout");
  try {
    e.schedule = parallel::parse_schedule(args["schedule"].as<std::string>());
    e.chunks = positive<int>(args, "chunks");
    e.vocab_parallel = parallel::parse_vocab_parallel(args["vocab-parallel"].as<std::string>());
    e.split = parallel::parse_sequence_split(args["sequence-split"].as<std::string>());
    e.ring = parallel::parse_ring_mode(args["ring-mode"].as<std::string>());
    device_options(args, c);
    if (c.model == train::ModelKind::kMlp) {
      if (e.workers() > 1 || args.count("stages"))
        throw UsageError("--sp, --tp, --pp, --stage-mesh and --stages need --model gpt or vit");
      return;
    }
    model::validate(m);
    parallel::check_vocab_parallel(e.vocab_parallel, m, e.pp);
    parallel::validate(parallel::ScheduleShape{.schedule = e.schedule,
                                               .stages = e.pp,
                                               .microbatches = e.microbatches,
                                               .interleave = e.chunks,
                                               .output_barriers = parallel::output_barriers(e.vocab_parallel)});
    if (args.count("stages")) {
      const parallel::ScheduleShape shape{.schedule = e.schedule, .stages = e.pp, .interleave = e.chunks};
      e.stage_first_units =
          parallel::parse_stage_sizes(args["stages"].as<std::string>(), m.layers + 2, shape.virtual_stages());
    }
    if (c.batch % e.microbatches != 0)
      throw UsageError(str("--microbatches ", e.microbatches, " must divide --batch ", c.batch));
    if (e.sp > 1) (void)parallel::sequence_positions(m.tokens(), e.sp, 0, e.split);  // throws if SP does not divide T
    {
      // The meshes against the model (heads, tokens, --workers), before any peer starts.
      model::Transformer probe_model(m);
      parallel::PipelineEngine probe(probe_model, e);
    }
  } catch (const Error& err) {
    throw UsageError(err.what());
  }
}

// The layers Streaming DiLoCo may group into fragments (Task::layer_ranges()).
int model_layers(const cxxopts::ParseResult& args, const train::TrainConfig& c) {
  if (c.model == train::ModelKind::kMlp) return static_cast<int>(c.hidden.size()) + 1;
  return positive<int>(args, "layers") + 2;  // the embedding, the blocks, the head
}

// --inner-steps, --outer-*, --fragments, --overlap, --mix-alpha: DiLoCo's.
void diloco_options(const cxxopts::ParseResult& args, train::TrainConfig& c) {
  train::OuterConfig& o = c.outer;
  o.inner_steps = positive<int>(args, "inner-steps");
  o.lr = positive<float>(args, "outer-lr");
  o.momentum = positive<float>(args, "outer-momentum", true);
  if (o.momentum >= 1) throw UsageError("--outer-momentum must be below 1");
  const std::string optimizer = args["outer-optimizer"].as<std::string>();
  if (optimizer != "nesterov" && optimizer != "sgd")
    throw UsageError("--outer-optimizer '" + optimizer + "' is not one of nesterov, sgd");
  o.nesterov = optimizer == "nesterov";
  o.fragments = positive<int>(args, "fragments");
  o.overlap = positive<int>(args, "overlap", true);
  o.mix = positive<float>(args, "mix-alpha", true);
  if (o.mix >= 1) throw UsageError("--mix-alpha must be below 1 (1 would never take the outer parameters in)");
  try {
    o.exchange = train::parse_outer_exchange(args["outer-exchange"].as<std::string>());
    const std::string compression = args["outer-compression"].as<std::string>();
    if (compression.starts_with("sparse:")) {
      const std::string fraction = compression.substr(7);
      char* end = nullptr;
      o.sparse = std::strtod(fraction.c_str(), &end);
      if (fraction.empty() || *end != '\0' || !(o.sparse > 0 && o.sparse <= 1))
        throw UsageError("--outer-compression '" + compression +
                         "': sparse:F keeps the fraction F of each chunk, F in (0, 1] (e.g. sparse:0.0156)");
    } else {
      o.compression = algo::parse_quant_format(compression, "--outer-compression");
    }
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  if (o.sparse > 0 && o.exchange == train::OuterExchange::kPs)
    throw UsageError("--outer-compression sparse runs over --outer-exchange allreduce (an all-gather)");
  if ((o.sparse > 0 || o.compression != algo::QuantFormat::kNone) && o.exchange == train::OuterExchange::kGossip)
    throw UsageError(
        "--outer-compression: --outer-exchange gossip mixes the local models in fp32; compress over "
        "allreduce or ps");
  if (o.sparse > 0 && args.count("allreduce-algo"))
    throw UsageError("--allreduce-algo: --outer-compression sparse averages by an all-gather, not an all-reduce");
  const int layers = model_layers(args, c);
  if (o.fragments > layers)
    throw UsageError(str("--fragments ", o.fragments, ": the model has ", layers,
                         " layers to group into fragments (a fragment is one or more whole layers)"));
  if (o.fragments > o.inner_steps)
    throw UsageError(str("--fragments ", o.fragments, " exceeds --inner-steps ", o.inner_steps,
                         " (one fragment is synchronised about every H/F steps)"));
  if (o.overlap >= o.inner_steps / o.fragments)
    throw UsageError(str("--overlap ", o.overlap, ": an exchange must land before the next begins, so τ < ⌊H/F⌋ = ",
                         o.inner_steps / o.fragments));
  if (args.count("mix-alpha") && o.overlap == 0)
    throw UsageError(
        "--mix-alpha applies with --overlap above 0 (without overlap the outer parameters replace the local ones)");
}

// --update, --compression, --gossip-step, --allreduce-algo: each only with the algorithms
// it belongs to, so a flag that would be ignored is an error instead.
void algorithm_options(const cxxopts::ParseResult& args, train::TrainConfig& c) {
  const std::string algorithm(train::to_string(c.algorithm));
  auto only_for = [&](const char* flag, bool applies, const char* which) {
    if (args.count(flag) && !applies)
      throw UsageError(str("--", flag, " applies to --algorithm ", which, ", not ", algorithm));
  };
  const bool choco = c.algorithm == train::Algorithm::kChoco;
  only_for("update",
           c.algorithm == train::Algorithm::kDpsgd || choco || c.algorithm == train::Algorithm::kSgp ||
               c.algorithm == train::Algorithm::kEl,
           "dpsgd, choco, sgp or el");
  only_for("fanout", c.algorithm == train::Algorithm::kEl, "el (Epidemic Learning)");
  only_for("el-variant", c.algorithm == train::Algorithm::kEl, "el (Epidemic Learning)");
  if (args.count("fanout")) c.fanout = positive<int>(args, "fanout");
  const std::string variant = args["el-variant"].as<std::string>();
  if (variant != "local" && variant != "oracle")
    throw UsageError("--el-variant '" + variant + "' is not one of local, oracle");
  c.el_variant = variant == "oracle" ? train::EpidemicVariant::kOracle : train::EpidemicVariant::kLocal;
  only_for("momentum-form", c.algorithm == train::Algorithm::kDpsgd || c.algorithm == train::Algorithm::kGt,
           "dpsgd or gt");
  const std::string momentum_form = args["momentum-form"].as<std::string>();
  if (momentum_form != "local" && momentum_form != "quasi-global")
    throw UsageError("--momentum-form '" + momentum_form + "' is not one of local, quasi-global");
  if (momentum_form == "quasi-global") {
    c.momentum_form = train::MomentumForm::kQuasiGlobal;
    if (c.optimizer != train::OptimizerKind::kSgd)
      throw UsageError("--momentum-form quasi-global is SGD's heavy ball; it does not apply to --optimizer adam");
    if (c.resume || args.count("rejoin") || c.checkpoint_every > 0)
      throw UsageError(
          "--momentum-form quasi-global: its buffer m̂ is not in the checkpoints; use local with --resume, "
          "--rejoin and --checkpoint-every");
  }
  only_for("compression", choco, "choco (compressed gossip)");
  only_for("gossip-step", choco, "choco");
  only_for("allreduce-algo",
           c.algorithm == train::Algorithm::kAllreduce ||
               (c.algorithm == train::Algorithm::kDiloco && args["outer-exchange"].as<std::string>() == "allreduce"),
           "allreduce, or diloco with --outer-exchange allreduce");
  for (const char* flag : {"inner-steps", "outer-lr", "outer-momentum", "outer-optimizer", "outer-exchange",
                           "fragments", "overlap", "mix-alpha", "outer-compression"})
    only_for(flag, c.algorithm == train::Algorithm::kDiloco, "diloco");
  if (c.algorithm == train::Algorithm::kDiloco) diloco_options(args, c);
  // DiLoCo's outer Nesterov momentum is its momentum: SGD inside with a heavy ball of its
  // own as well compounds the two and diverges (the MLP at H = 5, 0.9 inside and out), so
  // the inner SGD runs without one unless --momentum says otherwise.
  if (c.algorithm == train::Algorithm::kDiloco && c.optimizer == train::OptimizerKind::kSgd && !args.count("momentum"))
    c.sgd.momentum = 0;
  only_for("time-budget", c.algorithm == train::Algorithm::kAdpsgd, "adpsgd (the others end at a step)");
  if (args.count("time-budget")) c.time_budget_s = positive<double>(args, "time-budget");
  const std::string update = args["update"].as<std::string>();
  if (update != "cta" && update != "atc") throw UsageError("--update '" + update + "' is not one of cta, atc");
  c.update = update == "atc" ? train::UpdateForm::kAtc : train::UpdateForm::kCta;
  // Epidemic Learning sends the model after its local step (de Vos et al. 2023, Algorithm 1).
  if (c.algorithm == train::Algorithm::kEl && !args.count("update")) c.update = train::UpdateForm::kAtc;
  try {
    c.compression = algo::parse_compression(args["compression"].as<std::string>());
    c.allreduce_algo = algo::parse_allreduce_algo(args["allreduce-algo"].as<std::string>());
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  const train::OuterConfig& o = c.outer;
  if (c.algorithm == train::Algorithm::kDiloco && c.allreduce_algo != algo::AllreduceAlgo::kRing &&
      (o.overlap > 0 || o.compression != algo::QuantFormat::kNone))
    throw UsageError(str("--allreduce-algo ", algo::to_string(c.allreduce_algo),
                         ": --overlap and --outer-compression run over the ring (--allreduce-algo ring)"));
  if (args.count("gossip-step")) {
    c.gossip_step = positive<double>(args, "gossip-step");
    if (c.gossip_step > 1)
      throw UsageError(str("--gossip-step ", args["gossip-step"].as<std::string>(), " is outside (0, 1]"));
  }
  if (c.algorithm == train::Algorithm::kAdpsgd && (c.resume || args.count("rejoin") || c.checkpoint_every > 0))
    throw UsageError(str(c.resume               ? "--resume"
                         : args.count("rejoin") ? "--rejoin"
                                                : "--checkpoint-every",
                         ": --algorithm adpsgd has no global step to checkpoint at or rejoin at (it goes on without a "
                         "lost peer); use dpsgd"));
  if ((choco || c.algorithm == train::Algorithm::kD2 || c.algorithm == train::Algorithm::kGt ||
       c.algorithm == train::Algorithm::kSgp) &&
      (c.resume || args.count("rejoin")))
    throw UsageError(str("--", c.resume ? "resume" : "rejoin", ": --algorithm ", algorithm,
                         " keeps state that checkpoints and rejoins do not carry; use dpsgd"));
  // DiLoCo's outer state is not in the checkpoints; a rejoining peer takes it from the
  // survivors (the all-reduce's regroup) or starts it from its donor's parameters (gossip).
  if (c.algorithm == train::Algorithm::kDiloco && c.resume)
    throw UsageError(
        "--resume: --algorithm diloco keeps an outer state (θ_outer, its momentum) that checkpoints do "
        "not carry; use dpsgd");
  if (c.algorithm == train::Algorithm::kDiloco && args.count("rejoin") && c.outer.exchange == train::OuterExchange::kPs)
    throw UsageError("--rejoin: diloco over --outer-exchange ps stops when a peer is lost; use allreduce or gossip");
}

}  // namespace

std::vector<int> parse_widths(const std::string& text) {
  std::vector<int> widths;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    int w = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), w);
    if (ec != std::errc() || ptr != item.data() + item.size() || w < 1 || w > 1 << 16)
      throw UsageError("--hidden '" + text + "' must be a comma-separated list of layer widths, e.g. 512,512");
    widths.push_back(w);
  }
  return widths;
}

void add_training_options(cxxopts::Options& options) {
  options.add_options("training")(
      "algorithm",
      "dpsgd | choco (compressed gossip, CHOCO-SGD) | d2 (D², for non-iid shards) | gt "
      "(gradient tracking, for non-iid shards) | adpsgd (asynchronous pairwise gossip, "
      "AD-PSGD) | diloco (H local steps, then an outer step; DiLoCo) | sgp (push-sum, Stochastic "
      "Gradient Push: directed graphs) | el (Epidemic Learning: s random peers a round) | "
      "allreduce | ps | local",
      cxxopts::value<std::string>()->default_value("dpsgd"))(
      "update",
      "dpsgd, choco, sgp, el: cta (x ← Wx − u, the exchange overlaps the gradient) | atc (x ← W(x − u); el's "
      "default)",
      cxxopts::value<std::string>()->default_value("cta"))(
      "fanout", "el: s, the peers each peer sends to per round (default ⌈log₂ n⌉)", cxxopts::value<std::string>())(
      "el-variant",
      "el: local (each peer draws its s targets; in-degrees vary) | oracle (an s-regular digraph each round)",
      cxxopts::value<std::string>()->default_value("local"))(
      "momentum-form",
      "dpsgd, gt: local (each peer's heavy ball over its own gradients) | quasi-global (QG-DSGDm, Lin et al. 2021: the "
      "momentum follows the peer's whole move, mix included; for non-iid shards)",
      cxxopts::value<std::string>()->default_value("local"))("compression",
                                                             "choco: none | top-k:F | random-k:F | qsgd:BITS | sign",
                                                             cxxopts::value<std::string>()->default_value("none"))(
      "gossip-step", "choco: consensus step γ in (0, 1] (default: per compressor, 1 for none, 0.1 for top-k:0.01)",
      cxxopts::value<std::string>())(
      "time-budget", "adpsgd: end the run after this many seconds (default: at --epochs' samples, all peers together)",
      cxxopts::value<std::string>())("allreduce-algo",
                                     "allreduce, diloco's all-reduce: ring | tree (binomial) | rd (recursive doubling)",
                                     cxxopts::value<std::string>()->default_value("ring"))(
      "inner-steps", "diloco: H, the local steps between outer steps",
      cxxopts::value<std::string>()->default_value("50"))("outer-lr", "diloco: the outer learning rate",
                                                          cxxopts::value<std::string>()->default_value("0.7"))(
      "outer-momentum", "diloco: the outer momentum", cxxopts::value<std::string>()->default_value("0.9"))(
      "outer-optimizer", "diloco: nesterov | sgd (heavy ball with --outer-momentum; plain SGD at 0)",
      cxxopts::value<std::string>()->default_value("nesterov"))(
      "outer-exchange",
      "diloco: how the pseudo-gradients are averaged: allreduce (every peer) | ps (a server on peer 0) | gossip "
      "(one round with the topology's W; each peer keeps its own outer state)",
      cxxopts::value<std::string>()->default_value("allreduce"))(
      "fragments", "diloco: F, Streaming DiLoCo's fragments of whole layers, one synchronised about every H/F steps",
      cxxopts::value<std::string>()->default_value("1"))(
      "overlap", "diloco: τ, the inner steps an exchange overlaps before it lands (τ < ⌊H/F⌋)",
      cxxopts::value<std::string>()->default_value("0"))(
      "mix-alpha", "diloco with --overlap: α, the local share kept when an exchange lands (θ ← αθ + (1 − α)θ_outer)",
      cxxopts::value<std::string>()->default_value("0.5"))(
      "outer-compression",
      "diloco: the pseudo-gradients on the wire, with error feedback: none | int8 | fp8 | int4 | sparse:F (SparseLoCo: "
      "the top F of each chunk of 4096 at 2 bits, by an all-gather); not with --outer-exchange gossip",
      cxxopts::value<std::string>()->default_value("none"))(
      "model", "mlp (Fashion-MNIST) | vit (Fashion-MNIST patches) | gpt (bytes of the fortunes text)",
      cxxopts::value<std::string>()->default_value("mlp"))("hidden", "MLP hidden layer widths",
                                                           cxxopts::value<std::string>()->default_value("512,512"))(
      "epochs", "passes over the training set (all peers together)", cxxopts::value<std::string>()->default_value("5"))(
      "max-steps", "stop after this many steps (0: no cap)", cxxopts::value<std::string>()->default_value("0"))(
      "batch", "examples per peer per step (default: 32; gpt: 8 sequences)", cxxopts::value<std::string>())(
      "optimizer", "sgd | adam (default: sgd for mlp, adam for gpt and vit)", cxxopts::value<std::string>())(
      "lr", "learning rate (default: 0.05 for sgd, 0.001 for adam)", cxxopts::value<std::string>())(
      "lr-schedule",
      "constant | cosine (linear warm-up, then cosine decay to 10% at the last step); "
      "default: constant for mlp, cosine for gpt and vit",
      cxxopts::value<std::string>())("warmup-steps", "steps of linear warm-up for --lr-schedule cosine",
                                     cxxopts::value<std::string>()->default_value("20"))(
      "momentum", "SGD momentum (diloco: 0, its outer step has the momentum)",
      cxxopts::value<std::string>()->default_value("0.9"))(
      "weight-decay", "weight decay: L2 for sgd, decoupled for adam (default: 0.0001 for sgd, 0 for adam)",
      cxxopts::value<std::string>())("seed", "seed of the model, the shards and the batches",
                                     cxxopts::value<std::string>()->default_value("1"))(
      "eval-every", "steps between evaluations (0: once per epoch)", cxxopts::value<std::string>()->default_value("0"))(
      "partition", "iid | dirichlet", cxxopts::value<std::string>()->default_value("iid"))(
      "alpha", "Dirichlet concentration for --partition dirichlet",
      cxxopts::value<std::string>()->default_value("0.5"))(
      "data-dir", "Fashion-MNIST IDX files", cxxopts::value<std::string>()->default_value(train::kFashionMnistDir))(
      "peer-timeout",
      "seconds a wait for a peer may take: a silent gossip neighbour is dropped after at most half "
      "of it (docs/faults.md), an evaluation round may take up to 4 times it",
      cxxopts::value<std::string>()->default_value("60"))("connect-timeout",
                                                          "seconds to wait for every peer to come up",
                                                          cxxopts::value<std::string>()->default_value("60"))(
      "threads",
      "threads per peer: the mlp's Eigen GEMMs; gpt/vit with --sp 1 "
      "--pp 1: the batch's sequences split over them",
      cxxopts::value<std::string>()->default_value("1"))("run-id",
                                                         "run id all peers share; 0 derives it from the configuration",
                                                         cxxopts::value<std::string>()->default_value("0"))(
      "max-staleness",
      "D-PSGD: mix a neighbour's parameters up to K steps old, waiting only for one further behind; SGP: "
      "mix each message when it arrives, waiting only for those K steps late (overlap push-sum) "
      "(0: synchronous; at most 1000)",
      cxxopts::value<std::string>()->default_value("0"))(
      "on-split",
      "D-PSGD when lost peers split the graph or a partition may have: continue (each piece "
      "alone) | stop (everyone, unless one piece of more than half the peers is left)",
      cxxopts::value<std::string>()->default_value("continue"))(
      "checkpoint-every", "steps between checkpoints (0: none)", cxxopts::value<std::string>()->default_value("0"))(
      "checkpoint-dir", "where peers write checkpoints (default: OUT/checkpoints)", cxxopts::value<std::string>())(
      "resume", "restart every peer from the latest complete set of checkpoints")(
      "mixing-trace",
      "dpsgd, choco, d2, gt: every peer writes the mixing row it applied, whenever it changes, to "
      "OUT/mixing-peer-R.csv (step,self_weight,peer:weight ...)")(
      "text-dir", "gpt: the fortunes text", cxxopts::value<std::string>()->default_value(train::kFortunesDir))(
      "eval-windows", "gpt: validation windows of --seq tokens", cxxopts::value<std::string>()->default_value("256"))(
      "secret-file",
      "a key file every peer shares (32 random bytes as hex or base64); without it nobody can "
      "join or inject frames (make one: peertrain keygen run.key)",
      cxxopts::value<std::string>())(
      "shared-memory",
      "auto: peers on this host (both ends on loopback) move large payloads through shared "
      "memory, headers stay on TCP | off: every byte over TCP (tc/netem on lo sees it all)",
      cxxopts::value<std::string>()->default_value("auto"));
  options.add_options("transformer (gpt, vit)")("d-model", "width of the residual stream",
                                                cxxopts::value<std::string>()->default_value("128"))(
      "layers", "transformer blocks", cxxopts::value<std::string>()->default_value("4"))(
      "heads", "attention heads (must divide --d-model)", cxxopts::value<std::string>()->default_value("4"))(
      "seq", "gpt: context length in tokens (bytes with --tokenizer bytes)",
      cxxopts::value<std::string>()->default_value("256"))("patch", "vit: patch side, 7 (16 tokens) or 4 (49 tokens)",
                                                           cxxopts::value<std::string>()->default_value("7"))(
      "tied-head", "gpt: the LM head reuses the token embedding")(
      "tokenizer", "gpt: bytes | sentencepiece (a BPE vocabulary trained on the text, kept in OUT/tokenizer)",
      cxxopts::value<std::string>()->default_value("bytes"))(
      "vocab-size", "gpt --tokenizer sentencepiece: pieces (default 8000)", cxxopts::value<std::string>())(
      "sp", "sequence-parallel ranks per stage (ring self-attention)",
      cxxopts::value<std::string>()->default_value("1"))("pp", "pipeline stages",
                                                         cxxopts::value<std::string>()->default_value("1"))(
      "microbatches", "micro-batches per step (must divide --batch)",
      cxxopts::value<std::string>()->default_value("1"))(
      "schedule", "gpipe | 1f1b | eager-1f1b | interleaved | zb-h1 | zb-h2 | zb-v | v-half | pipedream",
      cxxopts::value<std::string>()->default_value("1f1b"))("chunks", "interleaved: model chunks per stage",
                                                            cxxopts::value<std::string>()->default_value("2"))(
      "vocab-parallel",
      "gpt: none (the vocabulary whole on the first and last stages) | vocab-1 | vocab-2 (split over the --pp "
      "stages, one or two barriers in the output layer)",
      cxxopts::value<std::string>()->default_value("none"))(
      "stages",
      "units per virtual stage by hand, pp x chunks of them, e.g. 3,3 (units: embedding, each block, head); "
      "default: profiled",
      cxxopts::value<std::string>())("sequence-split", "zigzag | contiguous",
                                     cxxopts::value<std::string>()->default_value("zigzag"))(
      "ring-mode", "ring (online softmax) | rsa (Li et al. 2021, full score strips)",
      cxxopts::value<std::string>()->default_value("ring"))("worker-timeout",
                                                            "seconds a worker thread waits for another",
                                                            cxxopts::value<std::string>()->default_value("60"))(
      "device",
      "cpu | cuda: where gpt computes its gradient (default: cuda when the build has CUDA, a GPU is "
      "there for each rank, and the run is gpt with --pp 1, or --pp P with --sp 1 and gpipe, 1f1b or "
      "eager-1f1b, without --tp, --stage-mesh or --vocab-parallel; else cpu)",
      cxxopts::value<std::string>())(
      "gemm-precision", "--device cuda: fp32 | tf32 | bf16 tensor-core GEMMs (tolerances: docs/kernels.md)",
      cxxopts::value<std::string>()->default_value("tf32"));
  add_mesh_options(options, "transformer (gpt, vit)");
}

train::TrainConfig training_config(const cxxopts::ParseResult& args) {
  train::TrainConfig c;
  try {
    c.algorithm = train::parse_algorithm(args["algorithm"].as<std::string>());
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  try {
    c.model = train::parse_model(args["model"].as<std::string>());
    c.optimizer = args.count("optimizer") ? train::parse_optimizer(args["optimizer"].as<std::string>())
                  : c.model == train::ModelKind::kMlp ? train::OptimizerKind::kSgd
                                                      : train::OptimizerKind::kAdam;
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  c.hidden = parse_widths(args["hidden"].as<std::string>());
  c.epochs = positive<int>(args, "epochs");
  c.max_steps = positive<long long>(args, "max-steps", true);
  c.batch = args.count("batch") ? positive<int>(args, "batch") : c.model == train::ModelKind::kGpt ? 8 : 32;
  if (args.count("lr")) c.sgd.lr = c.adam.lr = positive<float>(args, "lr");
  c.sgd.momentum = positive<float>(args, "momentum", true);
  if (args.count("weight-decay"))
    c.sgd.weight_decay = c.adam.weight_decay = positive<float>(args, "weight-decay", true);
  if (c.sgd.momentum >= 1) throw UsageError("--momentum must be below 1");
  c.seed = number_flag<std::uint64_t>(args, "seed");
  c.eval_every = positive<long long>(args, "eval-every", true);
  const std::string partition = args["partition"].as<std::string>();
  if (partition == "iid") {
    c.partition = train::Partition::kIid;
  } else if (partition == "dirichlet") {
    c.partition = train::Partition::kDirichlet;
  } else {
    throw UsageError("--partition '" + partition + "' is not one of iid, dirichlet");
  }
  c.alpha = positive<double>(args, "alpha");
  if (c.partition != train::Partition::kDirichlet) refuse_flags(args, {"alpha"}, "--partition dirichlet");
  if (c.optimizer != train::OptimizerKind::kSgd)
    refuse_flags(args, {"momentum"}, "--optimizer sgd (Adam keeps its own moments)");
  c.data_dir = args["data-dir"].as<std::string>();
  c.peer_timeout_s = positive<double>(args, "peer-timeout");
  c.connect_timeout_s = positive<double>(args, "connect-timeout");
  c.threads = positive<int>(args, "threads");
  c.run_id = number_flag<std::uint64_t>(args, "run-id");
  const std::string split = args["on-split"].as<std::string>();
  if (split != "continue" && split != "stop") throw UsageError("--on-split '" + split + "' is not one of continue, stop");
  c.stop_on_split = split == "stop";
  if (args.count("secret-file")) c.secret_file = args["secret-file"].as<std::string>();
  const std::string shared_memory = args["shared-memory"].as<std::string>();
  if (shared_memory != "auto" && shared_memory != "off")
    throw UsageError("--shared-memory '" + shared_memory + "' is not one of auto, off");
  c.shared_memory = shared_memory == "auto";
  c.checkpoint_every = positive<long long>(args, "checkpoint-every", true);
  if (args.count("checkpoint-dir")) c.checkpoint_dir = args["checkpoint-dir"].as<std::string>();
  c.resume = args.count("resume") > 0;
  c.mixing_trace = args.count("mixing-trace") > 0;
  try {
    c.lr_schedule = args.count("lr-schedule") ? train::parse_lr_schedule(args["lr-schedule"].as<std::string>())
                    : c.model == train::ModelKind::kMlp ? train::LrSchedule::kConstant
                                                        : train::LrSchedule::kCosine;
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  c.warmup_steps = positive<long long>(args, "warmup-steps", true);
  if (c.lr_schedule != train::LrSchedule::kCosine) refuse_flags(args, {"warmup-steps"}, "--lr-schedule cosine");
  c.max_staleness = positive<int>(args, "max-staleness", true);
  if (c.max_staleness > 1000) throw UsageError("--max-staleness must be at most 1000, got " + std::to_string(c.max_staleness));
  if (c.max_staleness > 0 && c.algorithm != train::Algorithm::kDpsgd && c.algorithm != train::Algorithm::kSgp)
    throw UsageError("--max-staleness applies to --algorithm dpsgd and sgp only");
  algorithm_options(args, c);
  transformer_options(args, c);
  return c;
}

std::vector<std::string> forwarded_training_flags(const cxxopts::ParseResult& args) {
  std::vector<std::string> out;
  if (args.count("resume")) out.push_back("--resume");
  if (args.count("mixing-trace")) out.push_back("--mixing-trace");
  if (args.count("tied-head")) out.push_back("--tied-head");
  for (const std::string& name : kTrainingFlags)
    if (args.count(name)) {
      out.push_back("--" + name);
      out.push_back(args[name].as<std::string>());
    }
  return out;
}

}  // namespace peertrain::cli
