// peertrain topology generate | inspect
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "options.h"
#include "peertrain/core/error.h"
#include "peertrain/topology/digraph.h"
#include "peertrain/topology/formats.h"
#include "peertrain/topology/spectrum.h"
#include "peertrain/topology/topology.h"

namespace peertrain::cli {

using Json = nlohmann::ordered_json;
namespace {

using namespace peertrain::topology;

std::string hex(std::uint64_t value) {
  char buffer[24];
  std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(value));
  return buffer;
}

SpectrumSolver parse_solver(const std::string& name) {
  if (name == "auto") return SpectrumSolver::kAuto;
  if (name == "dense") return SpectrumSolver::kDense;
  if (name == "lanczos") return SpectrumSolver::kLanczos;
  if (name == "spectra") return SpectrumSolver::kSpectra;
  throw Error(ErrorKind::kInvalidArgument, str("--solver '", name, "' is not one of auto, dense, lanczos, spectra"));
}

// Steps for gossip alone to shrink the consensus distance by `factor`.
double steps_to_shrink(double contraction, double factor) {
  if (contraction <= 0) return 1;
  if (contraction >= 1) return INFINITY;
  return std::ceil(std::log(factor) / std::log(contraction));
}

int write_generated(const Topology& t, const cxxopts::ParseResult& args);

int generate(int argc, char** argv) {
  cxxopts::Options options("peertrain topology generate",
                           "Write a topology file from a generator; the file is validated before it is written.");
  options.positional_help("KIND").show_positional_help();
  options.add_options()("kind",
                        "ring | torus | hypercube | exponential | one-peer-exponential | complete | star | "
                        "random-regular | erdos-renyi | small-world; directed: directed-exponential | "
                        "one-peer-directed-exponential | random-out | random-regular-out",
                        cxxopts::value<std::string>())("peers", "number of peers n",
                                                       cxxopts::value<std::string>()->default_value("0"))(
      "rows", "torus rows", cxxopts::value<std::string>()->default_value("0"))(
      "cols", "torus columns", cxxopts::value<std::string>()->default_value("0"))(
      "degree", "random-regular degree", cxxopts::value<std::string>()->default_value("0"))(
      "k", "small-world lattice neighbours (even)", cxxopts::value<std::string>()->default_value("0"))(
      "p", "erdos-renyi edge probability, small-world rewiring probability", cxxopts::value<std::string>())(
      "fanout", "random-out, random-regular-out: arcs out of each peer per step",
      cxxopts::value<std::string>()->default_value("0"))("seed", "seed of the random generators",
                                                         cxxopts::value<std::string>()->default_value("1"))(
      "weights", "metropolis | max-degree | best-constant | uniform-neighbors (directed graphs: column-stochastic)",
      cxxopts::value<std::string>())("name", "topology name (default: KIND and n)", cxxopts::value<std::string>())(
      "edges", "write the explicit edge list instead of the generator")(
      "o,output", "output file (default: standard output)", cxxopts::value<std::string>())("h,help", "show this help");
  options.parse_positional({"kind"});
  cxxopts::ParseResult args;
  if (auto code = parse_or_exit(options, argc, argv, &args)) return *code;
  if (!args.count("kind")) {
    std::fprintf(stderr, "error: missing KIND (see 'peertrain topology generate --help')\n");
    return 2;
  }
  GraphSource source;
  source.generator = args["kind"].as<std::string>();
  GeneratorParams& p = source.params;
  try {
    p.n = number_flag<int>(args, "peers");
    p.rows = number_flag<int>(args, "rows");
    p.cols = number_flag<int>(args, "cols");
    p.degree = number_flag<int>(args, "degree");
    p.k = number_flag<int>(args, "k");
    if (args.count("p")) p.p = number_flag<double>(args, "p");
    p.seed = number_flag<std::uint64_t>(args, "seed");
    p.fanout = number_flag<int>(args, "fanout");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  if (p.n == 0 && source.generator != "torus") {
    std::fprintf(stderr, "error: --peers N is required for generator '%s'\n", source.generator.c_str());
    return 2;
  }
  const bool directed = is_directed_generator(source.generator);
  const WeightScheme weights = args.count("weights")
                                   ? parse_weight_scheme(args["weights"].as<std::string>())
                                   : (directed ? WeightScheme::kColumnStochastic : WeightScheme::kMetropolis);
  if (directed != (weights == WeightScheme::kColumnStochastic))
    throw Error(ErrorKind::kInvalidArgument,
                directed ? str("--weights ", to_string(weights), ": a directed graph takes column-stochastic weights")
                         : str("--weights column-stochastic needs a directed generator, not '", source.generator, "'"));
  if (p.fanout != 0 && !is_redrawn(source.generator))
    throw Error(ErrorKind::kInvalidArgument,
                str("--fanout applies to random-out and random-regular-out, not '", source.generator, "'"));
  if (directed) {
    Topology t = make_directed_topology(
        args.count("name") ? args["name"].as<std::string>() : source.generator + std::to_string(p.n), source,
        generate_directed(source.generator, p, 0));
    return write_generated(t, args);
  }
  if (weights == WeightScheme::kExplicit)
    throw Error(ErrorKind::kInvalidArgument, "--weights explicit cannot be generated; write the matrix by hand");
  Graph graph = generate(source.generator, p);
  if (source.generator == "torus") p.n = graph.num_peers();
  const std::string name = args.count("name") ? args["name"].as<std::string>()
                                              : source.generator + std::to_string(graph.num_peers());
  Topology t = make_topology(name, source, std::move(graph), weights);
  return write_generated(t, args);
}

int write_generated(const Topology& t, const cxxopts::ParseResult& args) {
  WriteOptions write;
  write.explicit_edges = args.count("edges") > 0;
  const std::string yaml = to_yaml(t, write);
  if (args.count("output")) {
    write_text_file(args["output"].as<std::string>(), yaml);
    std::fprintf(stderr, "wrote %s: %d peers, %zu edges, weights %s\n", args["output"].as<std::string>().c_str(),
                 t.num_peers(), t.graph.num_edges(), std::string(to_string(t.weights)).c_str());
  } else {
    std::printf("%s", yaml.c_str());
  }
  return 0;
}

// A directed topology: push-sum's P is column-stochastic, not symmetric; what governs its
// consensus is P's second-largest eigenvalue modulus, or for a time-varying sequence that
// of the product over a period (or over `draws` random windows, with an interval).
int inspect_directed(const Topology& t, const std::string& format, int draws, double load_seconds) {
  const DirectedSpectrum s = analyze_directed(t.mixing);
  std::optional<SequenceSpectrum> sequence;
  if (t.time_varying()) {
    const int window = t.redrawn() ? one_peer_exponential_period(t.num_peers()) : t.period();
    sequence = analyze_sequence([&t](long long step) { return t.mixing_at(step); }, window, t.redrawn() ? draws : 1);
  }
  const double slem = sequence ? sequence->slem : s.slem;
  const double seconds = s.seconds + (sequence ? sequence->seconds : 0);
  int min_out = t.num_peers(), max_out = 0;
  for (int i = 0; i < t.num_peers(); ++i) {
    min_out = std::min(min_out, t.digraph.out_degree(i));
    max_out = std::max(max_out, t.digraph.out_degree(i));
  }
  if (format == "json") {
    Json out;
    out["name"] = t.name;
    out["file"] = t.path;
    out["peers"] = t.num_peers();
    out["directed"] = true;
    out["arcs"] = t.digraph.num_arcs();
    out["links"] = t.graph.num_edges();
    out["min_out_degree"] = min_out;
    out["max_out_degree"] = max_out;
    out["weights"] = to_string(t.weights);
    out["column_stochastic"] = true;
    out["max_column_sum_error"] = t.check.max_column_error;
    out["max_row_sum_error"] = t.check.max_row_error;
    out["slem"] = slem;
    out["mixing_steps"] = steps_per_e_fold(slem);
    out["consensus"] = slem < 1 - kNoConsensusGap;
    out["step0_slem"] = s.slem;
    out["time_varying"] = t.time_varying();
    out["redrawn"] = t.redrawn();
    if (sequence) {
      Json q;
      q["window"] = sequence->window;
      q["draws"] = sequence->draws;
      q["slem_per_step"] = sequence->slem;
      q["low"] = sequence->low;
      q["high"] = sequence->high;
      out["sequence"] = q;
    }
    out["solver_seconds"] = seconds;
    out["load_seconds"] = load_seconds;
    out["fingerprint"] = hex(t.fingerprint());
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("topology        %s  (%s)\n", t.name.c_str(), t.path.c_str());
  std::printf("peers           %d\n", t.num_peers());
  std::printf("arcs            %zu%s  (%zu links)\n", t.digraph.num_arcs(), t.time_varying() ? " at step 0" : "",
              t.graph.num_edges());
  std::printf("out-degree      min %d, max %d%s\n", min_out, max_out, t.time_varying() ? "  (step 0)" : "");
  std::printf("strongly conn.  %s\n", t.redrawn() ? "not required of each draw" : "yes");
  std::printf("weights         %s (push-sum: each peer keeps and sends equal shares)\n",
              std::string(to_string(t.weights)).c_str());
  std::printf(
      "P               column-stochastic: yes  (max |col sum - 1| = %.1e; rows off 1 by up to %.2g, which "
      "the push-sum weight corrects)\n",
      t.check.max_column_error, t.check.max_row_error);
  std::printf("SLEM            %.6g%s\n", s.slem, t.time_varying() ? "  (P at step 0 alone)" : "");
  if (sequence && sequence->draws == 1)
    std::printf("period product  SLEM %.6g per step over %d steps%s\n", sequence->slem, sequence->window,
                sequence->slem == 0 ? "  (exact averaging)" : "");
  else if (sequence)
    std::printf("window product  SLEM %.6g per step over windows of %d steps; 95%% of %d draws in [%.4g, %.4g]\n",
                sequence->slem, sequence->window, sequence->draws, sequence->low, sequence->high);
  if (slem < 1 - kNoConsensusGap)
    std::printf("mixing time     %.3g steps per e-fold of the consensus error; %.0f steps to shrink it 1000x\n",
                steps_per_e_fold(slem), steps_to_shrink(slem, 1e-3));
  else
    std::printf("mixing time     infinite  (no consensus: push-sum alone never makes the peers agree)\n");
  std::printf("solver          dense (Eigen EigenSolver), %.3f s\n", seconds);
  std::printf("fingerprint     %s\n", hex(t.fingerprint()).c_str());
  return 0;
}

int inspect(int argc, char** argv) {
  cxxopts::Options options("peertrain topology inspect",
                           "Validate a topology file and report its graph, its mixing matrix W and W's spectrum.");
  options.positional_help("FILE").show_positional_help();
  options.add_options()("file", "topology file (YAML)", cxxopts::value<std::string>())(
      "format", "text | json", cxxopts::value<std::string>()->default_value("text"))(
      "dot", "also write the graph as Graphviz DOT (draw it with: dot -Tpng OUT.dot -o OUT.png)",
      cxxopts::value<std::string>())("mtx", "also write W as Matrix Market", cxxopts::value<std::string>())(
      "solver", "auto | dense | lanczos | spectra (auto: dense up to 1,024 peers, then lanczos)",
      cxxopts::value<std::string>()->default_value("auto"))(
      "draws", "a graph redrawn every step: the random windows its spectrum is averaged over",
      cxxopts::value<std::string>()->default_value("20"))("h,help", "show this help");
  options.parse_positional({"file"});
  cxxopts::ParseResult args;
  if (auto code = parse_or_exit(options, argc, argv, &args)) return *code;
  if (!args.count("file")) {
    std::fprintf(stderr, "error: missing FILE (see 'peertrain topology inspect --help')\n");
    return 2;
  }
  const std::string format = args["format"].as<std::string>();
  if (format != "text" && format != "json") {
    std::fprintf(stderr, "error: --format '%s' is not one of text, json\n", format.c_str());
    return 2;
  }
  SpectrumOptions spectrum_options;
  spectrum_options.solver = parse_solver(args["solver"].as<std::string>());

  const auto load_start = std::chrono::steady_clock::now();
  const Topology t = load_topology_file(args["file"].as<std::string>());
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  if (t.directed) {
    int draws = 0;
    try {
      draws = number_flag<int>(args, "draws");
    } catch (const UsageError& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 2;
    }
    if (draws < 1) {
      std::fprintf(stderr, "error: --draws must be at least 1, got %d\n", draws);
      return 2;
    }
    if (args.count("dot")) write_text_file(args["dot"].as<std::string>(), to_dot(t.name, t.graph, nullptr));
    if (args.count("mtx"))
      write_text_file(args["mtx"].as<std::string>(),
                      to_matrix_market(t.mixing, str("P of topology ", t.name, " (column-stochastic)"), false));
    return inspect_directed(t, format, draws, load_seconds);
  }
  const MixingCheck& check = t.check;
  const Graph step0 = t.time_varying() ? t.graph_at(0) : Graph();
  const Spectrum s = analyze_spectrum(t.mixing, t.time_varying() ? step0 : t.graph, spectrum_options);
  std::optional<PeriodSpectrum> period;
  if (t.time_varying()) {
    std::vector<SparseMatrix> steps;
    for (int step = 0; step < t.period(); ++step) steps.push_back(t.mixing_at(step));
    period = analyze_period(steps, spectrum_options);
  }
  // For a time-varying topology the gap that governs consensus is the period's.
  const double gap = period ? period->spectral_gap : s.spectral_gap;
  const double contraction = (1 - gap) * (1 - gap);

  if (args.count("dot")) write_text_file(args["dot"].as<std::string>(), to_dot(t.name, t.graph, t.time_varying() ? nullptr : &t.mixing));
  if (args.count("mtx"))
    write_text_file(args["mtx"].as<std::string>(),
                    to_matrix_market(t.mixing, str("W of topology ", t.name, " (", to_string(t.weights), ")")));

  if (format == "json") {
    Json out;
    out["name"] = t.name;
    out["file"] = t.path;
    out["peers"] = t.num_peers();
    out["edges"] = t.graph.num_edges();
    out["min_degree"] = t.graph.min_degree();
    out["max_degree"] = t.graph.max_degree();
    out["weights"] = to_string(t.weights);
    out["connected"] = t.graph.is_connected();
    out["doubly_stochastic"] = true;
    out["max_row_sum_error"] = std::max(check.max_row_error, check.max_column_error);
    out["max_asymmetry"] = check.max_asymmetry;
    out["lambda2"] = s.lambda2;
    out["lambda_min"] = s.lambda_min;
    out["spectral_gap"] = gap;
    out["consensus"] = gap > kNoConsensusGap;
    out["contraction_per_step"] = contraction;
    out["solver"] = s.solver;
    out["solver_seconds"] = s.seconds;
    out["load_seconds"] = load_seconds;
    out["time_varying"] = t.time_varying();
    out["fingerprint"] = hex(t.fingerprint());
    if (period) {
      Json p;
      p["period"] = period->period;
      p["contraction"] = period->contraction;
      p["spectral_gap"] = period->spectral_gap;
      p["solver"] = period->solver;
      p["step0_spectral_gap"] = s.spectral_gap;
      out["period"] = p;
    }
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }

  std::printf("topology        %s  (%s)\n", t.name.c_str(), t.path.c_str());
  std::printf("peers           %d\n", t.num_peers());
  std::printf("edges           %zu%s\n", t.graph.num_edges(), t.time_varying() ? "  (union over one period)" : "");
  std::printf("degree          min %d, max %d\n", t.graph.min_degree(), t.graph.max_degree());
  std::printf("connected       yes\n");
  std::printf("weights         %s\n", std::string(to_string(t.weights)).c_str());
  std::printf("W               symmetric, doubly stochastic: yes  (max |row/col sum - 1| = %.1e, max |W - W^T| = %.1e)\n",
              std::max(check.max_row_error, check.max_column_error), check.max_asymmetry);
  if (t.time_varying())
    std::printf("time-varying    period %d steps; the lines below marked 'step 0' describe W(0) alone\n", t.period());
  const char* tag = t.time_varying() ? "  (step 0)" : "";
  std::printf("lambda2         %.10g%s\n", s.lambda2, tag);
  std::printf("lambda_min      %.10g%s\n", s.lambda_min, tag);
  if (period) {
    std::printf("step 0 gap      %.6g%s\n", s.spectral_gap, s.consensus() ? "" : "  (no consensus from one step alone)");
    std::printf("period product  ||W(%d)...W(0) - J|| = %.6g%s  [%s]\n", period->period - 1, period->contraction,
                period->contraction == 0 ? "  (exact averaging)" : "", period->solver.c_str());
  }
  if (gap > kNoConsensusGap)
    std::printf("spectral gap    %.6g%s\n", gap, period ? "  (per-step equivalent of the period product)" : "");
  else
    std::printf("spectral gap    0  (no consensus: gossip alone never makes the peers agree)\n");
  std::printf("contraction     %.6g per step of the consensus distance; %.0f steps to shrink it 1000x\n", contraction,
              steps_to_shrink(contraction, 1e-3));
  std::printf("solver          %s, %.3f s\n", s.solver.c_str(), s.seconds + (period ? period->seconds : 0));
  std::printf("fingerprint     %s\n", hex(t.fingerprint()).c_str());
  return 0;
}

}  // namespace

int run_topology(int argc, char** argv) {
  auto usage = [] {
    std::printf(
        "usage: peertrain topology <generate|inspect> [options]\n\n"
        "  generate KIND --peers N [...] -o FILE   write a topology file\n"
        "  inspect FILE [--format text|json]       validate it and report the spectral gap\n");
  };
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string sub = argv[1];
  if (sub == "generate") return generate(argc - 1, argv + 1);
  if (sub == "inspect") return inspect(argc - 1, argv + 1);
  std::fprintf(stderr, "error: unknown topology command '%s'; expected generate or inspect\n", sub.c_str());
  return 2;
}

}  // namespace peertrain::cli
