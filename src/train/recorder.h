// The coordinator's view of the whole run: the evaluation reports every peer sends it, and
// the files and progress lines it writes from them (metrics.csv, summary.json, @progress).
#pragma once

#include <cstddef>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "peertrain/topology/topology.h"
#include "peertrain/train/trainer.h"

namespace peertrain::train {

class Membership;

// What every peer tells the coordinator at an evaluation, ahead of its parameters (sent as
// raw doubles: both ends are this program).
struct Report {
  double step = 0, epoch = 0, train_loss = 0, test_accuracy = 0, test_loss = 0, test_bits_per_byte = 0;
  double bytes_sent = 0, bytes_received = 0, wall_s = 0, compute_s = 0, comm_wait_s = 0;
};
constexpr std::size_t kReportDoubles = sizeof(Report) / sizeof(double);

// The evaluation report on the wire: the Report's fields as little-endian doubles, the
// bytes this peer has sent to each peer so far (one double per peer of the run, 0 where it
// has no link: the dashboard draws each link's throughput from them), then the peer's
// parameters as floats.
std::vector<std::byte> encode_report(const Report& report, std::span<const double> sent_to, std::span<const float> x);
// Reads one from a run of `peers` peers carrying `parameters` floats; `x` is set to a view
// of them inside `bytes`. A message of another size throws Error(kParse) naming `from`
// ("report from peer 3 …").
Report decode_report(std::span<const std::byte> bytes, int peers, std::size_t parameters, const std::string& from,
                     std::vector<double>& sent_to, std::span<const float>& x);
// The report's size on the wire, without the frame header.
std::size_t report_payload_bytes(int peers, std::size_t parameters);

// What the dashboard and `peertrain report` draw the graph from (graph.json): each peer's
// place in the spectral layout and host, each edge with its weight W_ij and link
// properties, and the spectrum.
std::string graph_json(const topology::Topology& topology);

// The consensus distance (1/m) Σ_i ‖x_i − x̄‖² of m parameter vectors, and their average x̄
// (summed in double, in the order given).
double consensus_distance(const std::vector<std::span<const float>>& xs, std::vector<float>& average);

// A peer that takes over coordinating keeps the rows written before (kept_through). Files
// in --out: metrics.csv (a row per peer and evaluation), evals.jsonl (one JSON object per
// evaluation, the dashboard's form: every peer's numbers, the bytes on each link, who is
// lost, who coordinates), graph.json, summary.json. With --progress the same objects go to
// stdout as "@eval {json}" lines, beside "@progress {json}", for launch's dashboard.
class Recorder {
 public:
  Recorder(const TrainConfig& config, const topology::Topology& topology, double spectral_gap, long long total_steps,
           long long kept_through, int self);
  // One evaluation: every peer's report (step 0: a lost peer) and bytes sent to each peer,
  // and x̄'s numbers.
  void record(const std::vector<Report>& reports, const std::vector<std::vector<double>>& sent_to, double avg_accuracy,
              double avg_bits_per_byte, double consensus, const Membership& membership);
  void progress(double step, double epoch, double loss, double wall_s, bool evaluated);
  // summary.json. failed_peers: lost and not back at the end; failures: every loss, in
  // order; rejoined_peers: every comeback; takeovers: every change of coordinator.
  void finish(const Membership& membership, int coordinator);

 private:
  double mean_loss() const;
  std::string eval_json(const std::vector<Report>& reports, const std::vector<std::vector<double>>& sent_to,
                        const Membership& membership) const;

  std::size_t self_;  // the coordinator's own row
  const TrainConfig& config_;
  const topology::Topology& topology_;
  double spectral_gap_;
  long long total_steps_;
  std::ofstream csv_, evals_;
  std::vector<Report> last_;
  double avg_accuracy_ = 0, avg_bits_per_byte_ = 0, consensus_ = 0;
  bool language_model_ = false;
};

}  // namespace peertrain::train
