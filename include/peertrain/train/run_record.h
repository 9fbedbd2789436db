// The files a run writes into its --out directory, as types: summary.json, the rows of
// metrics.csv and the lines of evals.jsonl. The coordinator writes them through these, and
// `launch`, `report` and the tests read them back by field name, so that no reader depends
// on a column's position or on how the text is laid out. Every field is described in
// docs/outputs.md.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace peertrain::train {

// One peer's row of metrics.csv at one evaluation.
struct MetricsRow {
  long long step = 0;
  double epoch = 0;
  int peer = 0;
  double train_loss = 0, test_accuracy = 0, avg_accuracy = 0, consensus_distance = 0;
  double bytes_sent = 0, bytes_received = 0, wall_s = 0, compute_s = 0, comm_wait_s = 0;
  std::optional<double> test_bits_per_byte, avg_bits_per_byte;  // the language model's

  bool operator==(const MetricsRow&) const = default;
};

// metrics.csv's first line: its columns by name, in order (no newline).
std::string metrics_header();
// One row as metrics.csv holds it (no newline).
std::string metrics_line(const MetricsRow& row);
// Every row of a metrics.csv, each column found by its name in the header. Throws Error
// (kIo when the file cannot be read, kParse naming path:line and the column otherwise).
std::vector<MetricsRow> read_metrics(const std::filesystem::path& path);

// One peer in an evaluation of evals.jsonl (short keys: a long run keeps every evaluation
// in the dashboard's page).
struct EvalPeer {
  int peer = 0;
  double step = 0, loss = 0, acc = 0, bpb = 0, sent = 0, recv = 0, wall = 0, compute = 0, wait = 0;

  bool operator==(const EvalPeer&) const = default;
};

// One line of evals.jsonl: an evaluation as the dashboard draws it.
struct EvalRecord {
  long long step = 0;
  double epoch = 0, wall_s = 0, loss = 0;
  std::optional<double> avg_acc, avg_bpb;  // x̄'s accuracy, or its bits per byte for a language model
  double consensus = 0;
  int coordinator = 0;
  std::vector<int> lost, rejoined;
  std::vector<EvalPeer> peers;
  std::optional<std::vector<double>> links;  // bytes on each graph edge so far; absent when not known

  bool operator==(const EvalRecord&) const = default;
};

// One line of evals.jsonl (no newline).
std::string eval_line(const EvalRecord& record);
// Reads one line of evals.jsonl; throws Error(kParse) naming `where` and the field.
EvalRecord parse_eval_line(const std::string& line, const std::string& where);
// Every evaluation of an evals.jsonl; a line that does not parse (a run cut off mid-write)
// is passed to `skipped` with its path:line and the reason, and left out.
std::vector<EvalRecord> read_evals(
    const std::filesystem::path& path,
    const std::function<void(const std::string& where, const std::string& why)>& skipped);
// The evaluations as one JSON array, safe to place inside an HTML <script> element (every
// '<' escaped), for the report's page.
std::string evals_script_array(const std::vector<EvalRecord>& records);
// Any JSON document re-serialised so that it can sit inside an HTML <script> element:
// parsed (throws Error(kParse) naming `where` when it is not JSON), written again, every '<'
// escaped. A crafted file can then neither end the element nor run script.
std::string script_safe_json(const std::string& text, const std::string& where);

struct FailureRecord {
  int peer = 0;
  long long step = 0;
  std::string reason;
  bool operator==(const FailureRecord&) const = default;
};
struct RejoinRecord {
  int peer = 0;
  long long step = 0;
  int donor = 0;
  bool operator==(const RejoinRecord&) const = default;
};
struct TakeoverRecord {
  int peer = 0;
  long long step = 0;
  int from = 0;
  bool operator==(const TakeoverRecord&) const = default;
};
// How a transformer's peer split its workers.
struct LayoutRecord {
  int sp = 1, tp = 1, pp = 1;
  std::string stage_mesh, reshard;
  int microbatches = 1;
  bool operator==(const LayoutRecord&) const = default;
};

// How a simulated cluster (sim/cluster.h) timed the run: every time in the summary and in
// metrics.csv is then in simulated seconds.
struct SimulationRecord {
  std::string compute;        // "flops" or "measured"
  double host_speed = 0;      // FLOP/s of a host built from the topology
  double measured_scale = 0;  // simulated seconds per measured CPU second (measured)
  std::string platform, network_model;
  double simulated_s = 0, real_s = 0;  // when the last peer ended; what the simulation took
  bool operator==(const SimulationRecord&) const = default;
};
// A DiLoCo run's outer loop (TrainConfig::outer), as summary.json's "diloco" object.
struct DilocoRecord {
  int inner_steps = 0;
  double outer_lr = 0, outer_momentum = 0;
  std::string outer_optimizer, exchange, compression;
  int fragments = 1, overlap = 0;
  double mix_alpha = 0;
  bool operator==(const DilocoRecord&) const = default;
};

// summary.json. A run that `launch` stopped writes only topology, algorithm, failed_peers
// and error.
struct RunSummary {
  std::string topology, algorithm, model;
  int peers = 0;
  long long steps = 0;
  double epochs = 0;
  int batch_per_peer = 0;
  double test_accuracy = 0, mean_local_accuracy = 0, consensus_distance = 0, final_train_loss = 0;
  double wall_s = 0, mean_compute_s = 0, mean_comm_wait_s = 0, bytes_sent_per_peer = 0;
  long long survivors = 0;
  double items_per_s = 0, spectral_gap = 0;
  std::optional<double> val_bits_per_byte;    // gpt
  std::optional<std::string> update;          // dpsgd, choco
  std::optional<std::string> momentum_form;   // dpsgd, gt
  std::optional<std::string> compression;     // choco
  std::optional<double> gossip_step;          // choco
  std::optional<std::string> allreduce_algo;  // allreduce, diloco over the all-reduce
  std::optional<DilocoRecord> diloco;         // diloco
  std::optional<LayoutRecord> layout;         // gpt, vit
  std::vector<int> failed_peers;
  std::vector<FailureRecord> failures;
  std::vector<RejoinRecord> rejoined_peers;
  int coordinator = 0;
  std::vector<TakeoverRecord> takeovers;
  std::optional<SimulationRecord> simulation;  // a simulated cluster's run
  std::optional<std::string> error;  // set only in the summary of a run that failed

  bool operator==(const RunSummary&) const = default;
};

// summary.json's text: one field a line, so that it reads (and greps) well.
std::string summary_text(const RunSummary& summary);
// Writes DIR/summary.json; throws Error(kIo) naming it when it cannot.
void write_summary(const std::filesystem::path& dir, const RunSummary& summary);
// Reads a summary.json; throws Error (kIo when it cannot be read, kParse naming the file
// and the field that is missing or of the wrong type).
RunSummary read_summary(const std::filesystem::path& path);

}  // namespace peertrain::train
