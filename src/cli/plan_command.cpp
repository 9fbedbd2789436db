// peertrain plan: which split of a peer's workers to use. Simulates every strategy the
// engine can build on --workers workers (plan/search.h) from profiles measured once on this
// machine (plan/profile.h), and prints the best --top K with predicted step time, memory
// and why each loses to the first; those that do not fit --memory-per-worker or cannot be
// built are listed with the reason. --strategy predicts one given strategy instead; --run
// trains with the winner (peertrain launch with its flags).
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "mesh_options.h"
#include "model_flags.h"
#include "options.h"
#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "peertrain/parallel/partitioner.h"
#include "peertrain/model/mlp.h"
#include "peertrain/algo/quantize.h"
#include "peertrain/plan/low_communication.h"
#include "peertrain/plan/network.h"
#include "peertrain/plan/profile.h"
#include "peertrain/plan/search.h"
#include "peertrain/topology/generators.h"

namespace peertrain::cli {

using Json = nlohmann::ordered_json;
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

// Fashion-MNIST, which launch trains the mlp on: its training and test images.
constexpr long long kMlpTrainImages = 60000;
constexpr int kMlpTestImages = 10000;
constexpr int kMlpPixels = 784;  // Fashion-MNIST's 28 × 28

struct PeerCompute {
  double gradient_s = 0;  // one peer's gradient on this machine (its optimizer pass: optimizer_s)
  double bytes = 0;       // the parameters'
  double test_s = 0;      // mlp: one evaluation round's test pass (the test set in launch's chunks of 1,000)
  double optimizer_s(double copy_bytes_per_s) const { return plan::optimizer_pass_s(bytes, copy_bytes_per_s); }
};

// On one thread, as launch runs a peer by default (--threads 1): Eigen would otherwise
// spread the GEMMs over every core, and a peer's CPU would come out too small.
// with_test: also time the mlp's test pass.
PeerCompute peer_compute(const std::string& model_name, const std::vector<int>& hidden,
                         const model::TransformerConfig& config, int batch, bool with_test) {
  const int eigen_threads = Eigen::nbThreads();
  Eigen::setNbThreads(1);
  struct Restore {
    int threads;
    ~Restore() { Eigen::setNbThreads(threads); }
  } restore{eigen_threads};
  Rng rng(3);
  std::vector<double> times;
  double floats = 0, test_s = 0;
  if (model_name == "mlp") {
    model::Mlp mlp(model::MlpConfig{.inputs = kMlpPixels, .hidden = hidden, .classes = 10});
    std::vector<float> params(mlp.num_parameters()), grads(params.size()),
        x(kMlpPixels * static_cast<std::size_t>(batch));
    mlp.initialize(params, 1);
    for (auto& v : x) v = static_cast<float>(rng.normal());
    std::vector<std::int32_t> labels(static_cast<std::size_t>(batch), 3);
    for (int r = 0; r < 21; ++r) {
      const auto start = std::chrono::steady_clock::now();
      mlp.forward_backward(params, x.data(), labels.data(), batch, grads);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    floats = static_cast<double>(mlp.num_parameters());
    if (with_test) {
      // As MlpTask::evaluate: chunks of 1,000 through the whole test set, 31 MB of
      // distinct images streamed from memory (a single chunk again and again stays in
      // the cache and measured 0.75 of a real test pass).
      constexpr int kChunk = 1000;
      std::vector<float> test(kMlpPixels * static_cast<std::size_t>(kMlpTestImages));
      for (auto& v : test) v = static_cast<float>(rng.normal());
      std::vector<std::int32_t> test_labels(kMlpTestImages, 3);
      std::vector<double> passes;  // 7 of about 7 ms: the median of 3 read 6.9-9.8 ms across runs
      for (int r = 0; r < 7; ++r) {
        const auto start = std::chrono::steady_clock::now();
        for (int done = 0; done < kMlpTestImages; done += kChunk)
          mlp.evaluate(params, test.data() + static_cast<std::size_t>(done) * kMlpPixels, test_labels.data() + done,
                       kChunk);
        passes.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      test_s = plan::median(passes);
    }
  } else {
    model::Transformer t(config);
    std::vector<float> params(t.num_parameters()), grads(params.size());
    t.initialize(params, 1);
    std::vector<int> positions(static_cast<std::size_t>(t.config().tokens()));
    std::iota(positions.begin(), positions.end(), 0);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(batch) * t.config().tokens(), 1);
    std::vector<float> pixels(static_cast<std::size_t>(batch) * config.image * config.image, 0.1f);
    std::vector<std::int32_t> labels(static_cast<std::size_t>(batch), 1);
    const bool gpt = config.kind == model::TransformerKind::kGpt;
    model::TokenBatch b{.batch = batch,
                        .tokens = t.config().tokens(),
                        .positions = positions,
                        .bytes = gpt ? std::span<const std::int32_t>(ids) : std::span<const std::int32_t>(),
                        .pixels = gpt ? std::span<const float>() : std::span<const float>(pixels),
                        .targets = gpt ? std::span<const std::int32_t>(ids) : std::span<const std::int32_t>(labels),
                        .loss_divisor = static_cast<double>(ids.size())};
    for (int r = 0; r < 5; ++r) {
      const auto start = std::chrono::steady_clock::now();
      t.forward_backward(params, b, grads);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    floats = static_cast<double>(t.num_parameters());
  }
  return {plan::median(times), 4 * floats, test_s};
}

// The low-communication methods of plan --compare: data-parallel, DiLoCo and Streaming
// DiLoCo (fp32 and int8) over the ring all-reduce, in the compute-utilisation model of
// plan/low_communication.h.
constexpr std::array<double, 3> kUtilisationTargets = {0.5, 0.9, 0.99};
struct LowCommunicationRow {
  plan::LowCommunication method;
  double utilisation = 0;
  std::array<std::optional<double>, 3> bandwidth_mbps;  // for each of kUtilisationTargets
};

std::vector<LowCommunicationRow> low_communication_rows(const cxxopts::ParseResult& args,
                                                        const topology::Topology& topo, double bytes, double compute_s,
                                                        double exchange_s) {
  const int h = at_least_flag(args, "inner-steps", 1), f = at_least_flag(args, "fragments", 1);
  const int tau = number_flag<int>(args, "overlap");
  if (tau < 0 || tau >= h / f)
    throw UsageError(
        str("--overlap ", tau, ": an exchange must land before the next begins, so 0 ≤ τ < ⌊H/F⌋ = ", h / f));
  const double int8 = 1 + 4.0 / algo::kQuantBlock;
  const std::vector<plan::LowCommunication> methods = {
      {"data-parallel (all-reduce)", 1, 1, 0, 4},
      {str("DiLoCo H=", h), h, 1, 0, 4},
      {str("Streaming DiLoCo H=", h, " F=", f, " tau=", tau), h, f, tau, 4},
      {str("Streaming DiLoCo int8 H=", h, " F=", f, " tau=", tau), h, f, tau, int8}};
  std::vector<LowCommunicationRow> out;
  for (const auto& m : methods) {
    LowCommunicationRow r{m, plan::compute_utilisation(m, compute_s, std::max(0.0, exchange_s)), {}};
    for (std::size_t k = 0; k < kUtilisationTargets.size(); ++k)
      if (auto b = plan::bandwidth_for_utilisation(m, kUtilisationTargets[k], compute_s, bytes, topo.num_peers(),
                                                   topo.default_link.latency_ms / 1e3))
        r.bandwidth_mbps[k] = *b * 8 / 1e6;
    out.push_back(r);
  }
  return out;
}

void print_low_communication(const std::vector<LowCommunicationRow>& rows, const topology::Topology& topo) {
  std::printf(
      "\nlow communication over the ring all-reduce (Charles et al. 2025's utilisation model; latency %g ms):\n",
      topo.default_link.latency_ms);
  std::printf("%-44s %12s  %s\n", "method", "utilisation", "Mbit/s for 50 % / 90 % / 99 %");
  for (const auto& r : rows) {
    std::string need;
    for (const auto& b : r.bandwidth_mbps) {
      char mbps[32];
      std::snprintf(mbps, sizeof mbps, "%.3g", b.value_or(0));
      need += str(need.empty() ? "" : " / ", b ? mbps : "unreachable");
    }
    std::printf("%-44s %11.1f%%  %s\n", r.method.name.c_str(), 100 * r.utilisation, need.c_str());
  }
}

// Across peers: each algorithm's time per step on the topology's links (and, with
// --compare, D-PSGD on other graphs of as many peers with the same links).
int plan_network(const cxxopts::ParseResult& args, const std::string& model_name,
                 const model::TransformerConfig& config, int batch, const std::string& format) {
  const auto topo = topology::load_topology_file(args["topology"].as<std::string>());
  // The flags first, before the compute is measured and the loopback probed.
  if (args.count("compare") && (args.count("algorithm") || args.count("allreduce-algo")))
    throw UsageError("--compare ranks every algorithm; leave out --algorithm and --allreduce-algo");
  if (args.count("allreduce-algo") && args["algorithm"].as<std::string>() != "allreduce")
    throw UsageError("--allreduce-algo is for --algorithm allreduce");
  const auto chosen =
      plan::parse_peer_algorithm(args["algorithm"].as<std::string>(), args["allreduce-algo"].as<std::string>());
  std::vector<int> hidden;
  {
    std::stringstream in(args["hidden"].as<std::string>());
    for (std::string item; std::getline(in, item, ',');) {
      try {
        hidden.push_back(std::stoi(item));
      } catch (const std::exception&) {
        throw UsageError("--hidden '" + args["hidden"].as<std::string>() + "': expected widths such as 512,512");
      }
    }
  }
  // --cores C: every peer on one machine of C cores (as the experiments run them); else a
  // machine each.
  const int shared = args.count("cores") ? number_flag<int>(args, "cores") : 0;
  if (args.count("cores") && shared < 1) throw UsageError("--cores must be at least 1 (or left out: a machine each)");
  // --eval-every as launch takes it (0: once per epoch); the test pass is modelled for the
  // mlp, whose data plan knows.
  long long eval_every = number_flag<long long>(args, "eval-every");
  if (eval_every < 0) throw UsageError("--eval-every must be 0 (once per epoch) or more");
  if (model_name != "mlp" && args.count("eval-every"))
    throw UsageError("--eval-every: the evaluation rounds are modelled for --model mlp only (for " + model_name +
                     " they are not counted)");
  if (model_name == "mlp" && eval_every == 0)
    eval_every = std::max<long long>(1, kMlpTrainImages / (static_cast<long long>(topo.num_peers()) * batch));
  // The test pass counts only where the peers share cores (network.h's Evaluation).
  const bool tests_count = model_name == "mlp" && shared > 0;
  const PeerCompute peer = peer_compute(model_name, hidden, config, batch, tests_count);
  const double bytes = peer.bytes, test_s = peer.test_s;
  const auto probe = plan::probe_network(bytes, shared > 0);
  const double compute_s = peer.gradient_s + peer.optimizer_s(probe.copy_bytes_per_s);
  const plan::Evaluation evaluation{.one_s = test_s, .every = tests_count ? eval_every : 0};
  struct Row {
    std::string name;
    plan::NetworkPrediction p;
  };
  std::vector<Row> rows;
  const auto start = std::chrono::steady_clock::now();
  std::vector<plan::PeerAlgorithm> algorithms;
  if (args.count("compare")) {
    algorithms = {plan::PeerAlgorithm::kAllReduce,   plan::PeerAlgorithm::kTreeAllReduce,
                  plan::PeerAlgorithm::kRdAllReduce, plan::PeerAlgorithm::kPs,
                  plan::PeerAlgorithm::kSgp,         plan::PeerAlgorithm::kEl};
    if (!topo.directed) algorithms.insert(algorithms.begin(), plan::PeerAlgorithm::kDpsgd);
  } else {
    algorithms = {chosen};
  }
  if (topo.directed && chosen == plan::PeerAlgorithm::kDpsgd && !args.count("compare") && args.count("algorithm"))
    throw UsageError(str(topo.path, " is a directed graph: D-PSGD mixes with a symmetric W; plan --algorithm sgp"));
  if (topo.directed && !args.count("algorithm") && !args.count("compare")) algorithms = {plan::PeerAlgorithm::kSgp};
  const int fanout = args.count("fanout") ? number_flag<int>(args, "fanout") : 0;
  if (args.count("fanout") && (fanout < 1 || fanout >= topo.num_peers()))
    throw UsageError(
        str("--fanout must be 1..", topo.num_peers() - 1, " for ", topo.num_peers(), " peers, got ", fanout));
  for (auto a : algorithms)
    rows.push_back(
        {a == plan::PeerAlgorithm::kEl
             ? str("el (fanout ", plan::step_arcs(topo, a, 0, fanout).out_degree(0), ") over ", topo.name, "'s links")
             : str(plan::to_string(a), " on ", topo.name),
         plan::predict_network(topo, a, bytes, compute_s, probe, shared, evaluation, fanout)});
  if (args.count("compare"))
    for (const std::string g : {"ring", "exponential", "complete"}) {
      if (topo.source.kind == topology::GraphSource::Kind::kGenerator && topo.source.generator == g) continue;
      if (g == "complete" && topo.num_peers() > 512) continue;  // n² links: not a graph anyone would gossip on
      topology::Topology other = topo;
      other.graph = topology::generate(g, {.n = topo.num_peers()});
      rows.push_back(
          {str("dpsgd on ", g == "exponential" ? "an " : "a ", g, " graph"),
           plan::predict_network(other, plan::PeerAlgorithm::kDpsgd, bytes, compute_s, probe, shared, evaluation)});
    }
  std::vector<LowCommunicationRow> low;
  if (args.count("compare")) {
    const plan::NetworkPrediction ring =
        plan::predict_network(topo, plan::PeerAlgorithm::kAllReduce, bytes, compute_s, probe, shared, evaluation);
    low = low_communication_rows(args, topo, bytes, compute_s, ring.step_s - compute_s);
  }
  const double plan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.p.step_s < b.p.step_s; });
  if (format == "json") {
    std::string out = "[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      Json o;
      o["plan"] = rows[i].name;
      o["step_s"] = rows[i].p.step_s;
      o["slowest_peer"] = rows[i].p.slowest;
      o["where"] = rows[i].p.where;
      o["compute_s"] = compute_s;
      o["test_s"] = test_s;
      o["eval_every"] = static_cast<double>(evaluation.every);
      o["parameter_bytes"] = bytes;
      out += (i ? ", " : "") + o.dump();
    }
    for (const LowCommunicationRow& r : low) {
      Json o;
      o["plan"] = r.method.name;
      o["compute_utilisation"] = r.utilisation;
      for (std::size_t k = 0; k < kUtilisationTargets.size(); ++k)
        o[str("bandwidth_mbps_for_", std::lround(100 * kUtilisationTargets[k]))] =
            r.bandwidth_mbps[k] ? Json(*r.bandwidth_mbps[k]) : Json(nullptr);
      out += ", " + o.dump();
    }
    std::printf("%s]\n", out.c_str());
    return 0;
  }
  std::string tests_note;
  if (evaluation.every > 0) {
    char buffer[96];
    std::snprintf(buffer, sizeof buffer, ", a test pass of %.3g ms every %lld steps", test_s * 1e3, evaluation.every);
    tests_note = buffer;
  }
  std::printf(
      "%s: %d peers%s; %s, %.0f parameter bytes, %.3f ms of compute a step%s; loopback probe %.1f us a message, "
      "%.1f us of CPU (%.1f us for 64 bytes%s)\n\n",
      topo.name.c_str(), topo.num_peers(),
      shared > 0 ? str(", sharing ", shared, " cores").c_str() : ", a machine each", model_name.c_str(), bytes,
      compute_s * 1e3, tests_note.c_str(), probe.message_s * 1e6, probe.message_cpu_s * 1e6,
      probe.small_message_cpu_s * 1e6,
      shared == 0 ? ""
      : probe.busy_wake_rounds > 0
          ? str("; a thread woken onto busy cores ", std::lround(probe.busy_wake_cpu_s * 1e6), " us more").c_str()
          : "; no wake-up across busy cores measured");
  std::printf("%-36s %12s  %s\n", "plan", "ms / step", "what holds it back");
  for (const auto& r : rows) std::printf("%-36s %12.3f  %s\n", r.name.c_str(), r.p.step_s * 1e3, r.p.where.c_str());
  if (!low.empty()) print_low_communication(low, topo);
  std::printf("\npredicted in %.3f s\n", plan_s);
  return 0;
}

}  // namespace

int run_plan(int argc, char** argv) {
  cxxopts::Options options("peertrain plan",
                           "Predict each way to split a peer's workers (SP x TP x PP, micro-batches, schedule) with "
                           "the step-time simulator and print the best; or predict one --strategy");
  options.add_options("model")("model", "gpt or vit (across peers also mlp)",
                               cxxopts::value<std::string>()->default_value("gpt"))(
      "d-model", "residual width", cxxopts::value<std::string>()->default_value("128"))(
      "layers", "blocks", cxxopts::value<std::string>()->default_value("4"))(
      "heads", "attention heads", cxxopts::value<std::string>()->default_value("4"))(
      "seq", "gpt: tokens per sequence", cxxopts::value<std::string>()->default_value("128"))(
      "vocab-size", "gpt: vocabulary", cxxopts::value<std::string>()->default_value("256"))(
      "batch", "sequences (images) per step of a peer", cxxopts::value<std::string>()->default_value("8"));
  options.add_options("search")(
      "memory-per-worker", "each worker's memory, e.g. 2GiB (parameters x4 for Adam, plus activations)",
      cxxopts::value<std::string>())("top", "strategies to print", cxxopts::value<std::string>()->default_value("5"))(
      "cores",
      "cores to simulate (default: this machine's; the workers share them); across peers: every peer on "
      "one machine of that many cores (default: a machine each)",
      cxxopts::value<std::string>())(
      "no-contention",
      "with more workers than cores, do not add the hand-off costs measured on a calibration model to the passes "
      "(added by default; see docs/plan.md)")("contention", "add the hand-off costs (the default)")(
      "profile-cache",
      "the profile cache file (default: $XDG_CACHE_HOME/peertrain/profile.tsv, else ~/.cache/peertrain/profile.tsv; "
      "'none': measure anew)",
      cxxopts::value<std::string>())(
      "profile-rounds",
      "rounds over the unit shapes the cache lacks, each measured once a round (their median kept): more rounds "
      "average more of a shared host's drift",
      cxxopts::value<std::string>()->default_value(std::to_string(plan::Profiler::kDefaultRounds)))(
      "format", "table or json", cxxopts::value<std::string>()->default_value("table"))(
      "measure",
      "then run K of the best predicted on the engine here, in rotated rounds, and pick the fastest measured: the "
      "best of each kind of split first (sp, tp, pp, stage meshes and resharding, vocabulary), then of each "
      "micro-batch count; the "
      "simulator's near-ties lie within its error (0: the simulator alone)",
      cxxopts::value<std::string>()->default_value("0"))("measure-rounds", "with --measure: rounds over the K",
                                                         cxxopts::value<std::string>()->default_value("3"))(
      "measure-steps", "with --measure: timed steps a run (their median; after one warm-up step)",
      cxxopts::value<std::string>()->default_value("5"))(
      "run", "train with the winner: peertrain launch --topology FILE with its flags (and the model's)")(
      "topology",
      "a topology file: without --run, predict a whole run across its peers (see the group below); "
      "with --run, the topology to launch",
      cxxopts::value<std::string>())("max-steps", "with --run", cxxopts::value<std::string>()->default_value("50"))(
      "out", "with --run: the run's folder (launch's --out)", cxxopts::value<std::string>());
  options.add_options("across peers (with --topology and without --run)")(
      "algorithm", "dpsgd | allreduce | ps | sgp | el (a directed topology: sgp)",
      cxxopts::value<std::string>()->default_value("dpsgd"))(
      "fanout", "el: the peers each sends to per round (default ⌈log₂ n⌉)", cxxopts::value<std::string>())(
      "allreduce-algo", "allreduce: ring | tree (binomial) | rd (recursive doubling)",
      cxxopts::value<std::string>()->default_value("ring"))(
      "compare",
      "rank the algorithms (the three all-reduces among them), and D-PSGD on other graphs, for the "
      "topology's network; then DiLoCo's and Streaming DiLoCo's compute utilisation and the bandwidth each needs")(
      "inner-steps", "--compare: DiLoCo's H", cxxopts::value<std::string>()->default_value("50"))(
      "fragments", "--compare: Streaming DiLoCo's F", cxxopts::value<std::string>()->default_value("4"))(
      "overlap", "--compare: Streaming DiLoCo's τ", cxxopts::value<std::string>()->default_value("1"))(
      "hidden", "mlp: hidden widths", cxxopts::value<std::string>()->default_value("512,512"))(
      "eval-every",
      str("mlp: steps between evaluation rounds, as launch takes it (0: once per epoch); on shared --cores ",
          std::lround(100 * plan::kTestsLanding), " % of the other peers' test passes land in the step time"),
      cxxopts::value<std::string>()->default_value("0"));
  options.add_options("one strategy")("strategy", "predict the strategy these flags give instead of searching")(
      "sp", "sequence ranks per stage", cxxopts::value<std::string>()->default_value("1"))(
      "pp", "pipeline stages", cxxopts::value<std::string>()->default_value("1"))(
      "microbatches", "micro-batches per step", cxxopts::value<std::string>()->default_value("1"))(
      "schedule", "gpipe | 1f1b | eager-1f1b | interleaved | zb-h1 | zb-h2 | zb-v | v-half | pipedream",
      cxxopts::value<std::string>()->default_value("1f1b"))("chunks", "interleaved: chunks per stage",
                                                            cxxopts::value<std::string>()->default_value("2"))(
      "stages", "units per virtual stage (default: balanced on the profile)", cxxopts::value<std::string>())(
      "vocab-parallel", "gpt: none | vocab-1 | vocab-2 (the vocabulary split over the stages)",
      cxxopts::value<std::string>()->default_value("none"))(
      "sequence-split", "zigzag | contiguous", cxxopts::value<std::string>()->default_value("zigzag"))("h,help",
                                                                                                       "this help");
  add_mesh_options(options, "one strategy");
  cxxopts::ParseResult args;
  if (auto code = parse_or_exit(options, argc, argv, &args)) return *code;
  return exit_code_of("plan", [&] {
    model::TransformerConfig config;
    const std::string model_name = args["model"].as<std::string>();
    const bool across = args.count("topology") && !args.count("run");
    if (model_name != "gpt" && model_name != "vit" && !(across && model_name == "mlp"))
      throw UsageError("--model '" + model_name + "': expected gpt or vit (or mlp, across peers)");
    config = transformer_shape(args, model_name == "gpt" ? model::TransformerKind::kGpt : model::TransformerKind::kVit,
                               true);
    model::validate(config);
    const int batch = at_least_flag(args, "batch", 1), top = at_least_flag(args, "top", 1);
    const std::string format = args["format"].as<std::string>();
    if (format != "table" && format != "json") throw UsageError("--format '" + format + "': expected table or json");
    if (args.count("contention") && args.count("no-contention"))
      throw UsageError("--contention and --no-contention: choose one");
    if (!across)
      refuse_flags(args,
                   {"eval-every", "algorithm", "allreduce-algo", "compare", "hidden", "inner-steps", "fragments",
                    "overlap", "fanout"},
                   "plan --topology FILE without --run (across peers)");
    if (!args.count("strategy"))
      for (const char* flag : {"sp", "tp", "pp", "microbatches", "schedule", "chunks", "stages", "vocab-parallel",
                               "stage-mesh", "reshard", "link-between-gbps", "link-within-gbps", "link-latency-us"})
        if (args.count(flag))
          throw UsageError(str("--", flag, " sets one strategy: add --strategy to predict it",
                               across ? "" : ", or leave it out to search over --workers"));
    if (across) {
      if (args.count("measure")) throw UsageError("--measure is for one peer's strategies, not with --topology");
      if (args.count("profile-rounds"))
        throw UsageError("--profile-rounds is for one peer's strategies, not with --topology");
      refuse_flags(args,
                   {"top", "memory-per-worker", "no-contention", "contention", "sequence-split", "workers",
                    "measure-rounds", "measure-steps"},
                   "one peer's strategies, not with --topology (without --run)");
      refuse_flags(args, {"max-steps", "out"}, "plan --run");
      return plan_network(args, model_name, config, batch, format);
    }
    if (!args.count("run")) refuse_flags(args, {"max-steps", "out"}, "plan --run");
    const int measure = number_flag<int>(args, "measure");
    const plan::MeasureOptions mo{.best = measure,
                                  .rounds = at_least_flag(args, "measure-rounds", 1),
                                  .steps = at_least_flag(args, "measure-steps", 1)};
    if (measure < 0) throw UsageError("--measure must be 0 (the simulator alone) or more");
    plan::SimulationOptions sim;
    if (args.count("cores")) sim.cores = number_flag<int>(args, "cores");
    sim.contention = args.count("no-contention") == 0;
    if (args.count("memory-per-worker"))
      sim.memory_cap_bytes = parse_bytes(args["memory-per-worker"].as<std::string>(), "--memory-per-worker");
    std::string cache =
        args.count("profile-cache") ? args["profile-cache"].as<std::string>() : plan::Profiler::default_cache_path();
    if (cache == "none") cache.clear();
    const int profile_rounds = number_flag<int>(args, "profile-rounds");
    if (profile_rounds < 1) throw UsageError("--profile-rounds must be at least 1");
    plan::Profiler profiler(cache, profile_rounds);

    // What to predict: one --strategy, or the search over --workers.
    std::optional<plan::Candidate> one;
    plan::SearchSpace space;
    if (args.count("strategy")) {
      one.emplace();
      auto& e = one->strategy.engine;
      e.sp = number_flag<int>(args, "sp");
      e.pp = number_flag<int>(args, "pp");
      e.microbatches = number_flag<int>(args, "microbatches");
      e.schedule = parallel::parse_schedule(args["schedule"].as<std::string>());
      e.chunks = number_flag<int>(args, "chunks");
      e.split = parallel::parse_sequence_split(args["sequence-split"].as<std::string>());
      try {
        e.vocab_parallel = parallel::parse_vocab_parallel(args["vocab-parallel"].as<std::string>());
      } catch (const Error& err) {
        throw UsageError(err.what());
      }
      read_mesh_options(args, e);
      e.max_workers = 0;  // --workers is the search's; a given strategy has its own
      if (args.count("stages")) {
        const parallel::ScheduleShape shape{.schedule = e.schedule, .stages = e.pp, .interleave = e.chunks};
        e.stage_first_units =
            parallel::parse_stage_sizes(args["stages"].as<std::string>(), config.layers + 2, shape.virtual_stages());
      }
      one->strategy.batch = batch;
    } else {
      space.workers = number_flag<int>(args, "workers");
      if (args.count("workers") && space.workers < 1)
        throw UsageError("plan: --workers must be at least 1, got " + std::to_string(space.workers));
      if (space.workers < 1) throw UsageError("plan: --workers W, the peer's workers to split, is needed to search");
      space.batch = batch;
      space.split = parallel::parse_sequence_split(args["sequence-split"].as<std::string>());
    }
    auto predict = [&](const plan::SimulationOptions& options) {
      if (!one) return plan::search(config, space, profiler, options);
      plan::Candidate c = *one;
      c.prediction = plan::simulate(config, c.strategy, profiler, options);
      return std::vector<plan::Candidate>{std::move(c)};
    };
    // First on stand-ins, to learn which unit shapes it needs (without the contention
    // calibration, which would fit itself to them); then those the cache lacks are measured
    // together, in rounds (Profiler::profile_together); then the prediction on them.
    if (format == "table")
      std::fprintf(stderr, "planning %s: profiling what the cache (%s) lacks...\n",
                   one ? "one strategy" : str(space.workers, " workers").c_str(),
                   cache.empty() ? "none" : cache.c_str());
    plan::SimulationOptions learn = sim;
    learn.contention = false;
    profiler.profile_together([&] { predict(learn); },
                              [&](int round, int rounds, int shapes) {
                                if (format == "table" && round == 0 && shapes > 0)
                                  std::fprintf(stderr, "profiling %d unit shapes in %d rounds\n", shapes, rounds);
                              });
    std::vector<plan::Candidate> candidates = predict(sim);
    double simulate_s = 0;
    if (one) {  // again, the profiles now at hand: what simulating one strategy costs (the mean of 100)
      constexpr int kTimes = 100;
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < kTimes; ++i) plan::simulate(config, one->strategy, profiler, sim);
      simulate_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kTimes;
    }
    profiler.save();
    if (measure > 0) {
      // Progress on stderr: a line rewritten in place on a terminal, else a line a round.
      const bool tty = isatty(STDERR_FILENO) != 0;
      int last_round = -1;
      plan::MeasureProgress progress;
      if (format == "table")
        progress = [&](int round, int index, int count) {
          if (tty)
            std::fprintf(stderr, "\r\033[Kmeasuring %d candidates on the engine: round %d of %d, candidate %d", count,
                         round + 1, mo.rounds, index + 1);
          else if (round != last_round)
            std::fprintf(stderr, "measuring %d candidates on the engine: round %d of %d\n", count, round + 1,
                         mo.rounds);
          last_round = round;
        };
      plan::measure_best(config, candidates, mo, progress);
      if (tty && last_round >= 0) std::fprintf(stderr, "\n");
    }

    if (format == "json") {
      std::string rows = "[";
      for (std::size_t i = 0; i < candidates.size(); ++i) {
        const auto& c = candidates[i];
        Json o;
        o["strategy"] = c.strategy.describe();
        o["feasible"] = c.prediction.feasible;
        if (!c.prediction.why_not.empty()) {
          o["why_not"] = c.prediction.why_not;
        }
        o["step_s"] = c.prediction.step_s;
        o["passes_s"] = c.prediction.passes_s;
        o["compute_s"] = c.prediction.compute_s;
        o["bubble"] = c.prediction.bubble;
        o["overhead_s"] = c.prediction.overhead_s;
        o["reduce_s"] = c.prediction.reduce_s;
        o["peak_worker_bytes"] = c.prediction.peak_bytes();
        o["stages"] = parallel::format_stage_sizes(c.prediction.first_units, config.layers + 2);
        if (!c.loses_because.empty()) {
          o["loses_because"] = c.loses_because;
        }
        if (c.measured_s > 0) {
          o["measured_s"] = c.measured_s;
          o["measured_rounds_s"] = c.measured_rounds_s;
        }
        if (simulate_s > 0) {
          o["simulate_s"] = simulate_s;
        }
        std::string flags;
        for (const auto& f : c.strategy.flags()) flags += (flags.empty() ? "" : " ") + f;
        o["flags"] = flags;
        rows += (i ? ", " : "") + o.dump();
      }
      std::printf("%s]\n", rows.c_str());
    } else {
      std::printf("%s d %d, L %d, H %d, T %d, batch %d; %s cores simulated; profiles: %d measured now, cache %s\n\n",
                  model_name.c_str(), config.d_model, config.layers, config.heads, config.tokens(), batch,
                  sim.cores > 0 ? std::to_string(sim.cores).c_str() : "this machine's", profiler.measured(),
                  cache.empty() ? "none" : cache.c_str());
      const bool measured = measure > 0;
      // The strategy column as wide as its longest shown name (stage meshes name both
      // meshes and the resharding), so that the figures stay in their columns.
      int name_width = 34, counted = 0;
      for (const auto& c : candidates)
        if (c.prediction.feasible && counted++ < top)
          name_width = std::max(name_width, static_cast<int>(c.strategy.describe().size()));
      std::printf("%4s %-*s %10s %s%8s %12s  %s\n", "rank", name_width, "strategy", "step ms",
                  measured ? "measured ms " : "", "bubble", "memory/wkr", "");
      int shown = 0;
      for (const auto& c : candidates) {
        if (!c.prediction.feasible) continue;
        if (shown++ >= top) break;
        char measured_ms[32] = "";  // the column, when --measure ran
        if (measured) {
          if (c.measured_s > 0)
            std::snprintf(measured_ms, sizeof measured_ms, "%11.2f ", c.measured_s * 1e3);
          else
            std::snprintf(measured_ms, sizeof measured_ms, "%11s ", "-");
        }
        std::printf(
            "%4d %-*s %10.2f %s%8.3f %12s  %s\n", shown, name_width, c.strategy.describe().c_str(),
            c.prediction.step_s * 1e3, measured_ms, c.prediction.bubble, mib(c.prediction.peak_bytes()).c_str(),
            shown == 1 ? (c.measured_s > 0 ? "the winner: fastest measured" : "the winner") : c.loses_because.c_str());
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
