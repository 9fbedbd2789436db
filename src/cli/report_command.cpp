// peertrain report runs/DIR [-o FILE]: one self-contained HTML file with the dashboard's
// view of a finished run (the graph, the curves, the time split, the events), built from
// the files the coordinator wrote: graph.json, evals.jsonl and summary.json, each parsed
// and written again (train/run_record.h) so that nothing in them reaches the page as
// markup. The page and Chart.js are inlined, so the file opens anywhere with no network.
//
// A run folder without evals.jsonl is read from metrics.csv instead (everything but each
// link's bytes), with the graph from the run's topology.yaml or --topology.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "commands.h"
#include "options.h"
#include "../train/recorder.h"
#include "peertrain/core/error.h"
#include "peertrain/train/run_record.h"
#include "peertrain/topology/topology.h"
#include "web_assets.h"

namespace peertrain::cli {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path, const char* what) {
  std::ifstream in(path);
  if (!in)
    throw Error(ErrorKind::kIo, str(path.string(), ": cannot read ", what,
                                    " (is this a run's --out directory, written by a peertrain of this version?)"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// metrics.csv as the evaluations of evals.jsonl: one evaluation per block of rows (a block
// ends where a peer comes again), a peer seen before and missing from a block counted lost.
std::vector<train::EvalRecord> evals_from_metrics(const fs::path& path) {
  std::vector<train::EvalRecord> evals;
  std::vector<train::MetricsRow> block;
  std::set<int> seen, in_block;
  auto flush = [&] {
    if (block.empty()) return;
    train::EvalRecord e;
    std::set<int> here;
    double loss = 0;
    for (const train::MetricsRow& r : block) {
      here.insert(r.peer);
      e.peers.push_back({r.peer, static_cast<double>(r.step), r.train_loss, r.test_accuracy,
                         r.test_bits_per_byte.value_or(0), r.bytes_sent, r.bytes_received, r.wall_s, r.compute_s,
                         r.comm_wait_s});
      loss += r.train_loss;
      e.wall_s = std::max(e.wall_s, r.wall_s);
    }
    for (int p : seen)
      if (!here.count(p)) e.lost.push_back(p);
    seen.insert(here.begin(), here.end());
    const train::MetricsRow& first = block.front();
    e.step = first.step;
    e.epoch = first.epoch;
    e.loss = loss / static_cast<double>(block.size());
    if (first.avg_bits_per_byte)
      e.avg_bpb = first.avg_bits_per_byte;
    else
      e.avg_acc = first.avg_accuracy;
    e.consensus = first.consensus_distance;
    evals.push_back(std::move(e));
    block.clear();
  };
  for (const train::MetricsRow& row : train::read_metrics(path)) {
    if (in_block.count(row.peer)) {
      flush();
      in_block.clear();
    }
    in_block.insert(row.peer);
    block.push_back(row);
  }
  flush();
  return evals;
}

}  // namespace

int run_report(int argc, char** argv) {
  cxxopts::Options options("peertrain report",
                           "Write one self-contained HTML file with the dashboard's view of a finished run.");
  options.add_options()("dir", "the run's --out directory (graph.json, evals.jsonl, summary.json)",
                        cxxopts::value<std::string>())("o,output", "the HTML file (default: DIR/report.html)",
                                                       cxxopts::value<std::string>())(
      "topology",
      "the run's topology file, drawn in place of DIR/graph.json (default: DIR/graph.json, else DIR/topology.yaml)",
      cxxopts::value<std::string>())("h,help", "show this help");
  options.parse_positional({"dir"});
  options.positional_help("runs/DIR");
  cxxopts::ParseResult args;
  if (auto code = parse_or_exit(options, argc, argv, &args)) return *code;
  if (!args.count("dir")) {
    std::fprintf(stderr, "error: report needs a run directory (see 'peertrain report --help')\n");
    return 2;
  }
  const fs::path dir = args["dir"].as<std::string>();
  if (!fs::is_directory(dir)) throw Error(ErrorKind::kIo, str(dir.string(), ": not a directory"));
  std::string graph;
  if (args.count("topology") || !fs::exists(dir / "graph.json")) {
    const fs::path topology =
        args.count("topology") ? fs::path(args["topology"].as<std::string>()) : dir / "topology.yaml";
    if (!fs::exists(topology))
      throw Error(ErrorKind::kIo, str(dir.string(), ": no graph.json and no ", topology.string(),
                                      "; give the run's topology with --topology FILE"));
    graph = train::graph_json(topology::load_topology_file(topology.string()));
  } else {
    graph = read_file(dir / "graph.json", "the graph");
  }
  // Every file is parsed and written again before it goes into the page's <script>.
  graph = train::script_safe_json(graph, (dir / "graph.json").string());
  const fs::path summary_path = dir / "summary.json";
  const std::string summary = train::script_safe_json(read_file(summary_path, "the summary"), summary_path.string());
  const std::vector<train::EvalRecord> records =
      fs::exists(dir / "evals.jsonl")
          ? train::read_evals(dir / "evals.jsonl",
                              [](const std::string& where, const std::string& why) {
                                std::fprintf(stderr, "warning: %s is not a complete evaluation (%s); left out\n",
                                             where.c_str(), why.c_str());
                              })
          : evals_from_metrics(dir / "metrics.csv");
  const std::string evals = train::evals_script_array(records);
  const std::string run = "{\"graph\":" + graph + ",\"config\":" + summary + ",\"evals\":" + evals +
                          ",\"events\":[],\"progress\":null,\"summary\":" + summary + "}";
  const fs::path output = args.count("output") ? fs::path(args["output"].as<std::string>()) : dir / "report.html";
  std::ofstream out(output);
  out << dashboard_page_report(run);
  if (!out) throw Error(ErrorKind::kIo, str(output.string(), ": cannot write"));
  std::printf("wrote %s (%zu evaluations; open it in a browser, no network needed)\n", output.c_str(), records.size());
  return 0;
}

}  // namespace peertrain::cli
