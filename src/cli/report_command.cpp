// peertrain report runs/DIR [-o FILE]: one self-contained HTML file with the dashboard's
// view of a finished run (the graph, the curves, the time split, the events), built from
// the files the coordinator wrote: graph.json, evals.jsonl and summary.json. The page and
// Chart.js are inlined, so the file opens anywhere with no network.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "commands.h"
#include "options.h"
#include "peertrain/core/error.h"
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

}  // namespace

int run_report(int argc, char** argv) {
  cxxopts::Options options("peertrain report",
                           "Write one self-contained HTML file with the dashboard's view of a finished run.");
  options.add_options()("dir", "the run's --out directory (graph.json, evals.jsonl, summary.json)",
                        cxxopts::value<std::string>())("o,output", "the HTML file (default: DIR/report.html)",
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
  const std::string graph = read_file(dir / "graph.json", "the graph");
  const std::string summary = read_file(dir / "summary.json", "the summary");
  const std::string evals = evals_array(dir / "evals.jsonl");
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
