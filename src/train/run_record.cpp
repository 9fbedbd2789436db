// The run's files through nlohmann/json (summary.json, evals.jsonl) and one place that
// knows metrics.csv's columns. Readers find every value by its name and name the file, the
// line and the field when one is missing or of the wrong type.
#include "peertrain/train/run_record.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "peertrain/core/error.h"

namespace peertrain::train {
namespace {

using Json = nlohmann::ordered_json;
namespace fs = std::filesystem;

constexpr const char* kMetricsColumns[] = {
    "step",       "epoch",          "peer",   "train_loss", "test_accuracy", "avg_accuracy",       "consensus_distance",
    "bytes_sent", "bytes_received", "wall_s", "compute_s",  "comm_wait_s",   "test_bits_per_byte", "avg_bits_per_byte"};

// A value of `object` by name, converted to T; names `where` and the key when it is missing
// or of another type. A JSON null reads as NaN for a number (non-finite numbers are written
// as null).
template <typename T>
T field(const Json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end()) throw Error(ErrorKind::kParse, str(where, ": no field '", key, "'"));
  if constexpr (std::is_floating_point_v<T>) {
    if (it->is_null()) return std::numeric_limits<T>::quiet_NaN();
    if (!it->is_number())
      throw Error(ErrorKind::kParse, str(where, ": field '", key, "' is not a number: ", it->dump()));
  }
  try {
    return it->template get<T>();
  } catch (const Json::exception& e) {
    throw Error(ErrorKind::kParse, str(where, ": field '", key, "' is ", it->dump(), ", not of its type"));
  }
}

template <typename T>
std::optional<T> optional_field(const Json& object, const char* key, const std::string& where) {
  if (!object.contains(key)) return std::nullopt;
  return field<T>(object, key, where);
}

// A list of objects, each read by `one`.
template <typename T, typename Read>
std::vector<T> list_field(const Json& object, const char* key, const std::string& where, Read one) {
  const auto it = object.find(key);
  if (it == object.end()) throw Error(ErrorKind::kParse, str(where, ": no field '", key, "'"));
  if (!it->is_array()) throw Error(ErrorKind::kParse, str(where, ": field '", key, "' is not a list"));
  std::vector<T> out;
  for (std::size_t i = 0; i < it->size(); ++i) {
    const Json& item = (*it)[i];
    const std::string at = str(where, ": ", key, "[", i, "]");
    if (!item.is_object()) throw Error(ErrorKind::kParse, str(at, " is not an object"));
    out.push_back(one(item, at));
  }
  return out;
}

Json parse_json(const std::string& text, const std::string& where) {
  try {
    Json j = Json::parse(text);
    if (!j.is_object()) throw Error(ErrorKind::kParse, str(where, ": not a JSON object"));
    return j;
  } catch (const Json::parse_error& e) {
    throw Error(ErrorKind::kParse, str(where, ": not JSON (", e.what(), ")"));
  }
}

std::string read_text(const fs::path& path, const char* what) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::kIo, str(path.string(), ": cannot read ", what));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Inside <script>, "</script>" in a string would end the element: no '<' is left as is
// (outside strings, JSON has none).
std::string without_angle_brackets(const std::string& json) {
  std::string out;
  out.reserve(json.size());
  for (char c : json) out += c == '<' ? std::string("\\u003c") : std::string(1, c);
  return out;
}

Json eval_json(const EvalRecord& r) {
  Json peers = Json::array();
  for (const EvalPeer& p : r.peers)
    peers.push_back(Json{{"peer", p.peer},
                         {"step", p.step},
                         {"loss", p.loss},
                         {"acc", p.acc},
                         {"bpb", p.bpb},
                         {"sent", p.sent},
                         {"recv", p.recv},
                         {"wall", p.wall},
                         {"compute", p.compute},
                         {"wait", p.wait}});
  Json o;
  o["step"] = r.step;
  o["epoch"] = r.epoch;
  o["wall_s"] = r.wall_s;
  o["loss"] = r.loss;
  if (r.avg_bpb) o["avg_bpb"] = *r.avg_bpb;
  if (r.avg_acc) o["avg_acc"] = *r.avg_acc;
  o["consensus"] = r.consensus;
  o["coordinator"] = r.coordinator;
  o["lost"] = r.lost;
  o["rejoined"] = r.rejoined;
  o["peers"] = std::move(peers);
  o["links"] = r.links ? Json(*r.links) : Json(nullptr);
  return o;
}

}  // namespace

std::string metrics_header() {
  std::string line;
  for (const char* column : kMetricsColumns) {
    if (!line.empty()) line += ',';  // two appends: GCC 12 warns (-Wrestrict) on "," + a temporary
    line += column;
  }
  return line;
}

std::string metrics_line(const MetricsRow& r) {
  // Bits per byte only for a language model; the classifiers leave the columns empty.
  char bpb[64] = ",";
  if (r.test_bits_per_byte || r.avg_bits_per_byte)
    std::snprintf(bpb, sizeof bpb, "%.5f,%.5f", r.test_bits_per_byte.value_or(0), r.avg_bits_per_byte.value_or(0));
  char line[512];
  std::snprintf(line, sizeof line, "%lld,%.4f,%d,%.9g,%.4f,%.4f,%.6g,%.0f,%.0f,%.4f,%.4f,%.4f,%s", r.step, r.epoch,
                r.peer, r.train_loss, r.test_accuracy, r.avg_accuracy, r.consensus_distance, r.bytes_sent,
                r.bytes_received, r.wall_s, r.compute_s, r.comm_wait_s, bpb);
  return line;
}

std::vector<MetricsRow> read_metrics(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::kIo, str(path.string(), ": cannot read the metrics"));
  auto split = [](const std::string& line) {
    std::vector<std::string> cells;
    std::stringstream row(line);
    for (std::string cell; std::getline(row, cell, ',');) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.emplace_back();
    return cells;
  };
  std::string line;
  std::getline(in, line);
  const auto header = split(line);
  auto column = [&](const char* name, bool required) {
    for (std::size_t i = 0; i < header.size(); ++i)
      if (header[i] == name) return static_cast<int>(i);
    if (required)
      throw Error(ErrorKind::kParse,
                  str(path.string(), ":1: no column '", name, "' (is this peertrain's metrics.csv?)"));
    return -1;
  };
  // The last two columns, the language model's bits per byte, may be missing altogether.
  constexpr std::size_t kRequiredColumns = std::size(kMetricsColumns) - 2;
  int at[std::size(kMetricsColumns)];
  for (std::size_t c = 0; c < std::size(kMetricsColumns); ++c) at[c] = column(kMetricsColumns[c], c < kRequiredColumns);
  std::vector<MetricsRow> rows;
  for (int number = 2; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    const auto cells = split(line);
    if (cells.size() < header.size())
      throw Error(ErrorKind::kParse,
                  str(path.string(), ":", number, ": ", cells.size(), " columns, expected ", header.size()));
    auto number_at = [&](std::size_t c) -> std::optional<double> {
      if (at[c] < 0 || cells[static_cast<std::size_t>(at[c])].empty()) return std::nullopt;
      const std::string& text = cells[static_cast<std::size_t>(at[c])];
      char* end = nullptr;
      const double value = std::strtod(text.c_str(), &end);
      if (end != text.c_str() + text.size())
        throw Error(ErrorKind::kParse,
                    str(path.string(), ":", number, ": ", kMetricsColumns[c], " '", text, "' is not a number"));
      return value;
    };
    auto required = [&](std::size_t c) {
      const auto v = number_at(c);
      if (!v) throw Error(ErrorKind::kParse, str(path.string(), ":", number, ": ", kMetricsColumns[c], " is empty"));
      return *v;
    };
    MetricsRow r;
    r.step = static_cast<long long>(required(0));
    r.epoch = required(1);
    r.peer = static_cast<int>(required(2));
    r.train_loss = required(3);
    r.test_accuracy = required(4);
    r.avg_accuracy = required(5);
    r.consensus_distance = required(6);
    r.bytes_sent = required(7);
    r.bytes_received = required(8);
    r.wall_s = required(9);
    r.compute_s = required(10);
    r.comm_wait_s = required(11);
    r.test_bits_per_byte = number_at(12);
    r.avg_bits_per_byte = number_at(13);
    rows.push_back(r);
  }
  return rows;
}

std::string eval_line(const EvalRecord& record) { return eval_json(record).dump(); }

EvalRecord parse_eval_line(const std::string& line, const std::string& where) {
  const Json j = parse_json(line, where);
  EvalRecord r;
  r.step = field<long long>(j, "step", where);
  r.epoch = field<double>(j, "epoch", where);
  r.wall_s = field<double>(j, "wall_s", where);
  r.loss = field<double>(j, "loss", where);
  r.avg_acc = optional_field<double>(j, "avg_acc", where);
  r.avg_bpb = optional_field<double>(j, "avg_bpb", where);
  r.consensus = field<double>(j, "consensus", where);
  r.coordinator = field<int>(j, "coordinator", where);
  r.lost = field<std::vector<int>>(j, "lost", where);
  r.rejoined = field<std::vector<int>>(j, "rejoined", where);
  r.peers = list_field<EvalPeer>(j, "peers", where, [](const Json& p, const std::string& at) {
    return EvalPeer{field<int>(p, "peer", at),    field<double>(p, "step", at), field<double>(p, "loss", at),
                    field<double>(p, "acc", at),  field<double>(p, "bpb", at),  field<double>(p, "sent", at),
                    field<double>(p, "recv", at), field<double>(p, "wall", at), field<double>(p, "compute", at),
                    field<double>(p, "wait", at)};
  });
  if (j.contains("links") && !j["links"].is_null()) r.links = field<std::vector<double>>(j, "links", where);
  return r;
}

std::vector<EvalRecord> read_evals(const fs::path& path,
                                   const std::function<void(const std::string&, const std::string&)>& skipped) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::kIo, str(path.string(), ": cannot read the evaluations"));
  std::vector<EvalRecord> records;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    const std::string where = str(path.string(), ":", number);
    try {
      records.push_back(parse_eval_line(line, where));
    } catch (const Error& e) {
      skipped(where, e.what());
    }
  }
  return records;
}

std::string evals_script_array(const std::vector<EvalRecord>& records) {
  Json all = Json::array();
  for (const EvalRecord& r : records) all.push_back(eval_json(r));
  return without_angle_brackets(all.dump());
}

std::string script_safe_json(const std::string& text, const std::string& where) {
  try {
    return without_angle_brackets(Json::parse(text).dump());
  } catch (const Json::parse_error& e) {
    throw Error(ErrorKind::kParse, str(where, ": not JSON (", e.what(), ")"));
  }
}

std::string summary_text(const RunSummary& s) {
  Json o;
  o["topology"] = s.topology;
  o["algorithm"] = s.algorithm;
  if (!s.error) {
    o["model"] = s.model;
    o["peers"] = s.peers;
    o["steps"] = s.steps;
    o["epochs"] = s.epochs;
    o["batch_per_peer"] = s.batch_per_peer;
    o["test_accuracy"] = s.test_accuracy;
    o["mean_local_accuracy"] = s.mean_local_accuracy;
    o["consensus_distance"] = s.consensus_distance;
    o["final_train_loss"] = s.final_train_loss;
    o["wall_s"] = s.wall_s;
    o["mean_compute_s"] = s.mean_compute_s;
    o["mean_comm_wait_s"] = s.mean_comm_wait_s;
    o["bytes_sent_per_peer"] = s.bytes_sent_per_peer;
    o["survivors"] = s.survivors;
    o["items_per_s"] = s.items_per_s;
    o["spectral_gap"] = s.spectral_gap;
    if (s.val_bits_per_byte) o["val_bits_per_byte"] = *s.val_bits_per_byte;
    if (s.update) o["update"] = *s.update;
    if (s.momentum_form) o["momentum_form"] = *s.momentum_form;
    if (s.compression) o["compression"] = *s.compression;
    if (s.gossip_step) o["gossip_step"] = *s.gossip_step;
    if (s.allreduce_algo) o["allreduce_algo"] = *s.allreduce_algo;
    if (s.layout) {
      o["sp"] = s.layout->sp;
      o["tp"] = s.layout->tp;
      o["pp"] = s.layout->pp;
      o["stage_mesh"] = s.layout->stage_mesh;
      o["reshard"] = s.layout->reshard;
      o["microbatches"] = s.layout->microbatches;
    }
  }
  o["failed_peers"] = s.failed_peers;
  if (s.error) {
    o["error"] = *s.error;
  } else {
    Json failures = Json::array(), rejoins = Json::array(), takeovers = Json::array();
    for (const FailureRecord& f : s.failures)
      failures.push_back(Json{{"peer", f.peer}, {"step", f.step}, {"reason", f.reason}});
    for (const RejoinRecord& r : s.rejoined_peers)
      rejoins.push_back(Json{{"peer", r.peer}, {"step", r.step}, {"donor", r.donor}});
    for (const TakeoverRecord& t : s.takeovers)
      takeovers.push_back(Json{{"peer", t.peer}, {"step", t.step}, {"from", t.from}});
    o["failures"] = std::move(failures);
    o["rejoined_peers"] = std::move(rejoins);
    o["coordinator"] = s.coordinator;
    o["takeovers"] = std::move(takeovers);
  }
  if (s.diloco) {
    const DilocoRecord& d = *s.diloco;
    o["diloco"] = Json{{"inner_steps", d.inner_steps},
                       {"outer_lr", d.outer_lr},
                       {"outer_momentum", d.outer_momentum},
                       {"outer_optimizer", d.outer_optimizer},
                       {"exchange", d.exchange},
                       {"compression", d.compression},
                       {"fragments", d.fragments},
                       {"overlap", d.overlap},
                       {"mix_alpha", d.mix_alpha}};
  }
  if (s.simulation) {
    const SimulationRecord& r = *s.simulation;
    o["time"] = "simulated";
    o["simulation"] =
        Json{{"compute", r.compute},   {"host_speed", r.host_speed},       {"measured_scale", r.measured_scale},
             {"platform", r.platform}, {"network_model", r.network_model}, {"simulated_s", r.simulated_s},
             {"real_s", r.real_s}};
  }
  std::string text = "{\n";
  std::size_t i = 0;
  for (const auto& [key, value] : o.items())
    text += str("  ", Json(key).dump(), ": ", value.dump(), ++i < o.size() ? ",\n" : "\n");
  return text + "}\n";
}

void write_summary(const fs::path& dir, const RunSummary& summary) {
  const fs::path path = dir / "summary.json";
  std::ofstream out(path);
  out << summary_text(summary);
  if (!out) throw Error(ErrorKind::kIo, str(path.string(), ": cannot write"));
}

RunSummary read_summary(const fs::path& path) {
  const std::string where = path.string();
  const Json j = parse_json(read_text(path, "the run's summary"), where);
  RunSummary s;
  s.topology = field<std::string>(j, "topology", where);
  s.algorithm = field<std::string>(j, "algorithm", where);
  s.failed_peers = field<std::vector<int>>(j, "failed_peers", where);
  s.error = optional_field<std::string>(j, "error", where);
  if (s.error) return s;
  s.model = field<std::string>(j, "model", where);
  s.peers = field<int>(j, "peers", where);
  s.steps = field<long long>(j, "steps", where);
  s.epochs = field<double>(j, "epochs", where);
  s.batch_per_peer = field<int>(j, "batch_per_peer", where);
  s.test_accuracy = field<double>(j, "test_accuracy", where);
  s.mean_local_accuracy = field<double>(j, "mean_local_accuracy", where);
  s.consensus_distance = field<double>(j, "consensus_distance", where);
  s.final_train_loss = field<double>(j, "final_train_loss", where);
  s.wall_s = field<double>(j, "wall_s", where);
  s.mean_compute_s = field<double>(j, "mean_compute_s", where);
  s.mean_comm_wait_s = field<double>(j, "mean_comm_wait_s", where);
  s.bytes_sent_per_peer = field<double>(j, "bytes_sent_per_peer", where);
  s.survivors = field<long long>(j, "survivors", where);
  s.items_per_s = field<double>(j, "items_per_s", where);
  s.spectral_gap = field<double>(j, "spectral_gap", where);
  s.val_bits_per_byte = optional_field<double>(j, "val_bits_per_byte", where);
  s.update = optional_field<std::string>(j, "update", where);
  s.momentum_form = optional_field<std::string>(j, "momentum_form", where);
  s.compression = optional_field<std::string>(j, "compression", where);
  s.gossip_step = optional_field<double>(j, "gossip_step", where);
  s.allreduce_algo = optional_field<std::string>(j, "allreduce_algo", where);
  if (j.contains("pp"))
    s.layout = LayoutRecord{field<int>(j, "sp", where),
                            field<int>(j, "tp", where),
                            field<int>(j, "pp", where),
                            field<std::string>(j, "stage_mesh", where),
                            field<std::string>(j, "reshard", where),
                            field<int>(j, "microbatches", where)};
  s.failures = list_field<FailureRecord>(j, "failures", where, [](const Json& f, const std::string& at) {
    return FailureRecord{field<int>(f, "peer", at), field<long long>(f, "step", at),
                         field<std::string>(f, "reason", at)};
  });
  s.rejoined_peers = list_field<RejoinRecord>(j, "rejoined_peers", where, [](const Json& r, const std::string& at) {
    return RejoinRecord{field<int>(r, "peer", at), field<long long>(r, "step", at), field<int>(r, "donor", at)};
  });
  s.coordinator = field<int>(j, "coordinator", where);
  s.takeovers = list_field<TakeoverRecord>(j, "takeovers", where, [](const Json& t, const std::string& at) {
    return TakeoverRecord{field<int>(t, "peer", at), field<long long>(t, "step", at), field<int>(t, "from", at)};
  });
  if (j.contains("diloco")) {
    const Json& d = j["diloco"];
    const std::string at = where + ": diloco";
    s.diloco = DilocoRecord{field<int>(d, "inner_steps", at),       field<double>(d, "outer_lr", at),
                            field<double>(d, "outer_momentum", at), field<std::string>(d, "outer_optimizer", at),
                            field<std::string>(d, "exchange", at),  field<std::string>(d, "compression", at),
                            field<int>(d, "fragments", at),         field<int>(d, "overlap", at),
                            field<double>(d, "mix_alpha", at)};
  }
  if (j.contains("simulation")) {
    const Json& r = j["simulation"];
    const std::string at = where + ": simulation";
    s.simulation = SimulationRecord{field<std::string>(r, "compute", at),
                                    field<double>(r, "host_speed", at),
                                    field<double>(r, "measured_scale", at),
                                    field<std::string>(r, "platform", at),
                                    field<std::string>(r, "network_model", at),
                                    field<double>(r, "simulated_s", at),
                                    field<double>(r, "real_s", at)};
  }
  return s;
}

}  // namespace peertrain::train
