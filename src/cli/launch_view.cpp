// What `launch` shows: the live progress line and the summary table.
#include "launch_view.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "peertrain/core/error.h"
#include "peertrain/train/run_record.h"

namespace peertrain::cli {

namespace fs = std::filesystem;

// The number under `key` in a one-line JSON object (the @progress and @eval lines), or
// `fallback` when the line has none.
double field(const Json& line, const char* key, double fallback) {
  const auto it = line.find(key);
  if (it == line.end()) return fallback;
  if (it->is_boolean()) return it->get<bool>() ? 1 : 0;
  return it->is_number() ? it->get<double>() : fallback;
}

Json parse_line(const std::string& text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : Json::object();
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.3g %s", bytes, units[u]);
  return buffer;
}

ProgressLine::ProgressLine(bool tty, bool simulated) : tty_(tty), simulated_(simulated) {}

void ProgressLine::update(const std::string& line_text) {
  const Json json = parse_line(line_text);
  const double step = field(json, "step"), total = field(json, "total_steps"), epoch = field(json, "epoch");
  const double loss = field(json, "loss"), speed = field(json, "items_per_s");
  const double acc = field(json, "avg_accuracy"), consensus = field(json, "consensus_distance");
  // A language model reports validation bits per byte of x̄ where a classifier reports accuracy.
  const double bpb = field(json, "avg_bits_per_byte");
  const bool text = json.value("metric", "") == "bits_per_byte";
  const double shown = text ? bpb : acc;
  char consensus_text[32] = "—";
  if (!std::isnan(consensus)) std::snprintf(consensus_text, sizeof consensus_text, "%.2e", consensus);
  // A simulated cluster's speed is in simulated time; the line says both clocks.
  char clocks[96] = "";
  if (simulated_)
    std::snprintf(clocks, sizeof clocks, " | simulated %.1f s, real %.1f s", field(json, "wall_s", 0),
                  seconds_since(start_));
  char line[320];
  std::snprintf(line, sizeof line, "epoch %.2f | step %.0f/%.0f | loss %.4f | %s %s | consensus %s | %.0f %s/s%s",
                epoch, step, total, loss, text ? "bits/byte(x̄)" : "acc(x̄)",
                std::isnan(shown) ? "—" : str(shown).substr(0, 6).c_str(), consensus_text, speed, text ? "seq" : "img",
                clocks);
  const bool evaluated = field(json, "evaluated", 0) > 0;
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", line);
    if (evaluated) std::fprintf(stderr, "\n");
  } else if (evaluated || SteadyClock::now() - last_ > std::chrono::seconds(10)) {
    std::fprintf(stderr, "%s\n", line);
    last_ = SteadyClock::now();
  }
  std::fflush(stderr);
}

void ProgressLine::end() {
  if (tty_) std::fprintf(stderr, "\n");
}

void print_summary(const fs::path& out) {
  if (!fs::exists(out / "summary.json")) {
    std::printf("(the coordinator ran elsewhere: the summary is on its machine)\n");
    return;
  }
  const train::RunSummary s = train::read_summary(out / "summary.json");
  const bool text = s.model == "gpt";
  std::printf("\n%s · %s · %s · %d peers · %lld steps · %.2f epochs · %.1f s%s\n", s.topology.c_str(),
              s.algorithm.c_str(), s.model.c_str(), s.peers, s.steps, s.epochs, s.wall_s,
              s.simulation ? " simulated" : "");
  if (s.simulation)
    std::printf("  simulated cluster      %s; compute by %s; SimGrid's %s network model; %.1f s real\n",
                s.simulation->platform.c_str(), s.simulation->compute.c_str(), s.simulation->network_model.c_str(),
                s.simulation->real_s);
  if (text) {
    std::printf("  validation bits/byte   %.4f (x̄)\n", s.val_bits_per_byte.value_or(NAN));
    std::printf("  next-byte accuracy     %.4f (x̄)\n", s.test_accuracy);
  } else {
    std::printf("  test accuracy of x̄    %.4f\n", s.test_accuracy);
  }
  std::printf("  mean local accuracy    %.4f\n", s.mean_local_accuracy);
  std::printf("  consensus distance     %.3e\n", s.consensus_distance);
  std::printf("  spectral gap           %.4g\n", s.spectral_gap);
  std::printf("  bytes sent per peer    %s\n", human_bytes(s.bytes_sent_per_peer).c_str());
  std::printf("  throughput             %.0f %s/s\n", s.items_per_s, text ? "sequences" : "images");
  std::printf("  time per peer          %.1f s compute, %.1f s waiting for peers\n", s.mean_compute_s,
              s.mean_comm_wait_s);
  // Who coordinated: peer 0, or the survivors that took over from a lost coordinator.
  for (const train::TakeoverRecord& t : s.takeovers)
    std::printf("  coordinator            peer %d took over from peer %d at step %lld\n", t.peer, t.from, t.step);
  std::map<int, train::MetricsRow> last;  // each peer's last row
  for (const train::MetricsRow& row : train::read_metrics(out / "metrics.csv")) last[row.peer] = row;
  long long final_step = 0;
  for (const auto& [peer, row] : last) final_step = std::max(final_step, row.step);
  // AD-PSGD's peers end at steps of their own: the lost ones are those the summary names.
  const bool async = s.algorithm == "adpsgd";
  const std::set<int> failed(s.failed_peers.begin(), s.failed_peers.end());
  std::printf("\n  peer  train_loss  test_acc  sent      compute_s  wait_s%s\n", async ? "  steps" : "");
  for (const auto& [peer, r] : last)
    if (async ? failed.count(peer) > 0 : r.step < final_step)
      std::printf("  %4d  lost: its last report was at step %lld\n", peer, r.step);
    else
      std::printf("  %4d  %10.9g  %8.4f  %-8s  %9.4f  %6.4f%s\n", peer, r.train_loss, r.test_accuracy,
                  human_bytes(r.bytes_sent).c_str(), r.compute_s, r.comm_wait_s,
                  async ? str("  ", r.step).c_str() : "");
  std::printf("\n  files: %s/metrics.csv, %s/summary.json, %s/%s\n", out.c_str(), out.c_str(), out.c_str(),
              s.simulation ? "simulation.log" : "peer-*.log");
}

std::string read_text(const fs::path& path, const std::string& fallback) {
  std::ifstream in(path);
  if (!in) return fallback;
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.empty() ? fallback : s;
}

}  // namespace peertrain::cli
