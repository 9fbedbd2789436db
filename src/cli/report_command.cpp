// peertrain report runs/DIR [-o FILE]: one self-contained HTML file with the dashboard's
// view of a finished run (the graph, the curves, the time split, the events), built from
// the files the coordinator wrote: graph.json, evals.jsonl and summary.json. The page and
// Chart.js are inlined, so the file opens anywhere with no network.
//
// Runs written before evals.jsonl existed are read from metrics.csv instead (everything
// but each link's bytes), with the graph from the run's topology.yaml or --topology.
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
#include "peertrain/core/json.h"
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

// evals.jsonl as a JSON array; a line that is not an object (a run cut off mid-write) is
// named and skipped.
std::string evals_array(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::kIo, str(path.string(), ": cannot read the evaluations"));
  std::string out = "[", line;
  int number = 0, kept = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    if (line.front() != '{' || line.back() != '}') {
      std::fprintf(stderr, "warning: %s:%d is not a complete evaluation; left out\n", path.c_str(), number);
      continue;
    }
    out += (kept++ ? "," : "") + line;
  }
  return out + "]";
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream row(line);
  for (std::string cell; std::getline(row, cell, ',');) cells.push_back(cell);
  if (!line.empty() && line.back() == ',') cells.emplace_back();
  return cells;
}

// metrics.csv as the evaluations of evals.jsonl: one evaluation per block of rows (a block
// ends where a peer comes again), a peer seen before and missing from a block counted lost.
std::string evals_from_metrics(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::kIo, str(path.string(), ": cannot read (nor evals.jsonl beside it)"));
  std::string line;
  std::getline(in, line);
  const auto header = split_csv(line);
  auto column = [&](const char* name, bool required = true) {
    for (std::size_t i = 0; i < header.size(); ++i)
      if (header[i] == name) return static_cast<int>(i);
    if (!required) return -1;
    throw Error(ErrorKind::kParse, str(path.string(), ":1: no column '", name, "' (is this peertrain's metrics.csv?)"));
  };
  const int c_step = column("step"), c_epoch = column("epoch"), c_peer = column("peer"), c_loss = column("train_loss"),
            c_acc = column("test_accuracy"), c_avg = column("avg_accuracy"), c_cons = column("consensus_distance"),
            c_sent = column("bytes_sent"), c_recv = column("bytes_received"), c_wall = column("wall_s"),
            c_compute = column("compute_s"), c_wait = column("comm_wait_s"),
            c_bpb = column("test_bits_per_byte", false),
            c_avg_bpb = column("avg_bits_per_byte", false);  // the language model's, since the GPT
  auto cell = [](const std::vector<std::string>& r, int c) { return c >= 0 ? r[c] : std::string(); };
  std::vector<std::vector<std::string>> block;
  std::set<int> seen;
  std::string out = "[";
  int number = 1;
  auto flush = [&] {
    if (block.empty()) return;
    std::set<int> here;
    std::string peers = "[";
    double loss = 0, wall = 0;
    for (const auto& r : block) {
      here.insert(std::stoi(r[c_peer]));
      json::Object o;
      o.add("peer", std::stoi(r[c_peer]))
          .add("step", std::stod(r[c_step]))
          .add("loss", std::stod(r[c_loss]))
          .add("acc", std::stod(r[c_acc]))
          .add("bpb", cell(r, c_bpb).empty() ? 0.0 : std::stod(cell(r, c_bpb)))
          .add("sent", std::stod(r[c_sent]))
          .add("recv", std::stod(r[c_recv]))
          .add("wall", std::stod(r[c_wall]))
          .add("compute", std::stod(r[c_compute]))
          .add("wait", std::stod(r[c_wait]));
      peers += (peers.size() > 1 ? "," : "") + o.dump(0);
      loss += std::stod(r[c_loss]);
      wall = std::max(wall, std::stod(r[c_wall]));
    }
    std::vector<int> lost;
    for (int p : seen)
      if (!here.count(p)) lost.push_back(p);
    seen.insert(here.begin(), here.end());
    const auto& first = block.front();
    const bool text = !cell(first, c_avg_bpb).empty();
    json::Object e;
    e.add("step", static_cast<long long>(std::stod(first[c_step])))
        .add("epoch", std::stod(first[c_epoch]))
        .add("wall_s", wall)
        .add("loss", loss / static_cast<double>(block.size()))
        .add(text ? "avg_bpb" : "avg_acc", std::stod(text ? cell(first, c_avg_bpb) : first[c_avg]))
        .add("consensus", std::stod(first[c_cons]))
        .add("coordinator", 0)
        .add_raw("lost", json::array(lost))
        .add_raw("rejoined", "[]")
        .add_raw("peers", peers + "]")
        .add_null("links");
    out += (out.size() > 1 ? "," : "") + e.dump(0);
    block.clear();
  };
  std::set<int> in_block;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    auto cells = split_csv(line);
    if (cells.size() < header.size())
      throw Error(ErrorKind::kParse,
                  str(path.string(), ":", number, ": ", cells.size(), " columns, expected ", header.size()));
    try {
      const int peer = std::stoi(cells[c_peer]);
      if (in_block.count(peer)) {
        flush();
        in_block.clear();
      }
      in_block.insert(peer);
    } catch (const std::exception&) {
      throw Error(ErrorKind::kParse,
                  str(path.string(), ":", number, ": the peer '", cells[c_peer], "' is not a number"));
    }
    block.push_back(std::move(cells));
  }
  flush();
  return out + "]";
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
      throw Error(ErrorKind::kIo, str(dir.string(), ": no graph.json (a run of an older peertrain?) and no ",
                                      topology.string(), "; give the run's topology with --topology FILE"));
    graph = train::graph_json(topology::load_topology_file(topology.string()));
  } else {
    graph = read_file(dir / "graph.json", "the graph");
  }
  const std::string summary = read_file(dir / "summary.json", "the summary");
  const std::string evals =
      fs::exists(dir / "evals.jsonl") ? evals_array(dir / "evals.jsonl") : evals_from_metrics(dir / "metrics.csv");
  const std::string run = "{\"graph\":" + graph + ",\"config\":" + summary + ",\"evals\":" + evals +
                          ",\"events\":[],\"progress\":null,\"summary\":" + summary + "}";
  const fs::path output = args.count("output") ? fs::path(args["output"].as<std::string>()) : dir / "report.html";
  std::ofstream out(output);
  out << dashboard_page_report(run);
  if (!out) throw Error(ErrorKind::kIo, str(output.string(), ": cannot write"));
  std::size_t count = 0;
  for (auto at = evals.find("{\"step\":"); at != std::string::npos; at = evals.find("{\"step\":", at + 1)) ++count;
  std::printf("wrote %s (%zu evaluations; open it in a browser, no network needed)\n", output.c_str(), count);
  return 0;
}

}  // namespace peertrain::cli
