#include "recorder.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "membership.h"
#include "peertrain/core/codec.h"
#include "peertrain/core/error.h"
#include "peertrain/train/run_record.h"
#include "peertrain/topology/layout.h"
#include "peertrain/topology/spectrum.h"

namespace peertrain::train {

using Json = nlohmann::ordered_json;

std::vector<std::byte> encode_report(const Report& r, std::span<const double> sent_to, std::span<const float> x) {
  codec::Writer w;
  for (double v : {r.step, r.epoch, r.train_loss, r.test_accuracy, r.test_loss, r.test_bits_per_byte, r.bytes_sent,
                   r.bytes_received, r.wall_s, r.compute_s, r.comm_wait_s})
    w.f64(v);
  for (double v : sent_to) w.f64(v);
  w.bytes(std::as_bytes(x));
  return w.take();
}

std::size_t report_payload_bytes(int peers, std::size_t parameters) {
  return (kReportDoubles + static_cast<std::size_t>(peers)) * sizeof(double) + parameters * sizeof(float);
}

Report decode_report(std::span<const std::byte> bytes, int peers, std::size_t parameters, const std::string& from,
                     std::vector<double>& sent_to, std::span<const float>& x) {
  const std::size_t want = report_payload_bytes(peers, parameters);
  if (bytes.size() != want)
    throw Error(ErrorKind::kParse,
                str("report from ", from, ": ", bytes.size(), " bytes, expected ", want, " (", kReportDoubles,
                    " numbers, ", peers, " link counters and ", parameters, " parameters)"));
  codec::Reader in(bytes, str("report from ", from));
  Report r;
  for (double* v : {&r.step, &r.epoch, &r.train_loss, &r.test_accuracy, &r.test_loss, &r.test_bits_per_byte,
                    &r.bytes_sent, &r.bytes_received, &r.wall_s, &r.compute_s, &r.comm_wait_s})
    *v = in.f64();
  sent_to.resize(static_cast<std::size_t>(peers));
  for (double& v : sent_to) v = in.f64();
  const auto floats = in.bytes(parameters * sizeof(float));
  x = {reinterpret_cast<const float*>(floats.data()), parameters};
  return r;
}

double consensus_distance(const std::vector<std::span<const float>>& xs, std::vector<float>& average) {
  PEERTRAIN_CHECK(!xs.empty(), "consensus_distance of no vectors");
  const auto size = static_cast<Eigen::Index>(xs[0].size());
  auto vec = [&](std::span<const float> x) { return Eigen::Map<const Eigen::VectorXf>(x.data(), size); };
  Eigen::VectorXd mean = vec(xs[0]).cast<double>();
  for (std::size_t i = 1; i < xs.size(); ++i) mean += vec(xs[i]).cast<double>();
  const auto m = static_cast<double>(xs.size());
  mean /= m;
  double distance = 0;
  for (std::span<const float> x : xs) distance += (vec(x).cast<double>() - mean).squaredNorm();
  average.resize(static_cast<std::size_t>(size));
  for (Eigen::Index i = 0; i < size; ++i) average[static_cast<std::size_t>(i)] = static_cast<float>(mean[i]);
  return distance / m;
}

std::string graph_json(const topology::Topology& t) {
  const auto places = topology::spectral_layout(t);
  topology::Spectrum spectrum;
  if (t.directed) {  // push-sum's P: its second-largest eigenvalue modulus sets the rate
    spectrum.lambda2 = topology::analyze_directed(t.mixing).slem;
    spectrum.spectral_gap = 1 - spectrum.lambda2;
  } else {
    spectrum = topology::analyze_spectrum(t.mixing, t.graph);
  }
  Json peers = Json::array(), links = Json::array();
  for (int i = 0; i < t.num_peers(); ++i)
    peers.push_back(Json{{"id", i},
                         {"x", places[static_cast<std::size_t>(i)][0]},
                         {"y", places[static_cast<std::size_t>(i)][1]},
                         {"host", t.peers[static_cast<std::size_t>(i)].host},
                         {"self_weight", t.mixing.coeff(i, i)},
                         {"slowdown", t.compute_slowdown(i)}});
  for (const auto& e : t.graph.edges()) {
    const topology::LinkProperties link = t.link(e.u, e.v);
    links.push_back(Json{{"a", e.u},
                         {"b", e.v},
                         {"w", t.mixing.coeff(e.u, e.v)},
                         {"latency_ms", link.latency_ms},
                         {"bandwidth_mbps", link.bandwidth_mbps}});
  }
  Json o;
  o["name"] = t.name;
  o["peers_count"] = t.num_peers();
  o["time_varying"] = t.time_varying();
  o["spectral_gap"] = spectrum.spectral_gap;
  o["lambda2"] = spectrum.lambda2;
  o["lambda_min"] = spectrum.lambda_min;
  o["contraction_per_step"] = spectrum.contraction_per_step();
  o["node_bandwidth_mbps"] = t.node_bandwidth_mbps;
  o["peers"] = std::move(peers);
  o["links"] = std::move(links);
  return o.dump();
}

Recorder::Recorder(const TrainConfig& config, const topology::Topology& topology, double spectral_gap,
                   long long total_steps, long long kept_through, int self)
    : self_(static_cast<std::size_t>(self)),
      config_(config),
      topology_(topology),
      spectral_gap_(spectral_gap),
      total_steps_(total_steps),
      language_model_(config.model == ModelKind::kGpt) {
  if (config.out_dir.empty()) return;
  std::filesystem::create_directories(config.out_dir);
  const auto path = std::filesystem::path(config.out_dir) / "metrics.csv";
  std::string kept;
  if (kept_through > 0) {  // keep the rows up to the checkpoint (or the takeover), drop what came after it
    std::ifstream old(path);
    std::string line;
    while (std::getline(old, line))
      if (line.rfind("step,", 0) != 0 && std::atoll(line.c_str()) <= kept_through) kept += line + "\n";
  }
  csv_.open(path);
  if (!csv_) throw Error(ErrorKind::kIo, str(path.string(), ": cannot write"));
  // evals.jsonl: the lines up to the checkpoint (or the takeover) again, as metrics.csv.
  const auto evals_path = std::filesystem::path(config.out_dir) / "evals.jsonl";
  std::string kept_evals;
  if (kept_through > 0) {
    std::ifstream old(evals_path);
    std::string line;
    while (std::getline(old, line))
      if (line.rfind("{\"step\":", 0) == 0 && std::atoll(line.c_str() + 8) <= kept_through) kept_evals += line + "\n";
  }
  evals_.open(evals_path);
  if (!evals_) throw Error(ErrorKind::kIo, str(evals_path.string(), ": cannot write"));
  evals_ << kept_evals;
  std::ofstream(std::filesystem::path(config.out_dir) / "graph.json") << graph_json(topology) << "\n";
  csv_ << metrics_header() << "\n" << kept;
}

void Recorder::record(const std::vector<Report>& reports, const std::vector<std::vector<double>>& sent_to,
                      double avg_accuracy, double avg_bits_per_byte, double consensus, const Membership& membership) {
  last_ = reports;
  avg_accuracy_ = avg_accuracy;
  avg_bits_per_byte_ = avg_bits_per_byte;
  consensus_ = consensus;
  if (csv_) {
    for (std::size_t peer = 0; peer < reports.size(); ++peer) {
      const Report& r = reports[peer];
      if (r.step == 0) continue;  // lost: no row
      MetricsRow row{.step = static_cast<long long>(r.step),
                     .epoch = r.epoch,
                     .peer = static_cast<int>(peer),
                     .train_loss = r.train_loss,
                     .test_accuracy = r.test_accuracy,
                     .avg_accuracy = avg_accuracy,
                     .consensus_distance = consensus,
                     .bytes_sent = r.bytes_sent,
                     .bytes_received = r.bytes_received,
                     .wall_s = r.wall_s,
                     .compute_s = r.compute_s,
                     .comm_wait_s = r.comm_wait_s,
                     .test_bits_per_byte = std::nullopt,
                     .avg_bits_per_byte = std::nullopt};
      if (language_model_) {
        row.test_bits_per_byte = r.test_bits_per_byte;
        row.avg_bits_per_byte = avg_bits_per_byte;
      }
      csv_ << metrics_line(row) << "\n";
    }
    csv_.flush();
  }
  if (evals_ || config_.progress) {
    const std::string line = eval_json(reports, sent_to, membership);
    if (evals_) evals_ << line << "\n" << std::flush;
    if (config_.progress) emit_progress("eval", line);
  }
  progress(reports[self_].step, reports[self_].epoch, mean_loss(), reports[self_].wall_s, true);
}

void Recorder::progress(double step, double epoch, double loss, double wall_s, bool evaluated) {
  if (!config_.progress) return;
  Json o;
  o["step"] = static_cast<long long>(step);
  o["total_steps"] = total_steps_;
  o["epoch"] = epoch;
  o["loss"] = loss;
  o["items_per_s"] = wall_s > 0 ? step * config_.batch * topology_.num_peers() / wall_s : 0.0;
  o["evaluated"] = evaluated;
  o["metric"] = language_model_ ? "bits_per_byte" : "accuracy";
  if (!last_.empty()) {
    o["avg_accuracy"] = avg_accuracy_;
    o["consensus_distance"] = consensus_;
  }
  if (!last_.empty() && language_model_) o["avg_bits_per_byte"] = avg_bits_per_byte_;
  o["wall_s"] = wall_s;
  emit_progress("progress", o.dump());
}

void Recorder::finish(const Membership& membership, int coordinator) {
  const std::vector<Failure>& failures = membership.failures();
  const std::vector<Rejoin>& rejoins = membership.rejoins();
  if (config_.out_dir.empty() || last_.empty()) return;
  double local = 0, sent = 0, wall = 0, compute = 0, wait = 0;
  double alive = 0;
  for (const Report& r : last_) {
    if (r.step == 0) continue;  // a lost peer's row
    alive += 1;
    local += r.test_accuracy;
    sent += r.bytes_sent;
    wall = std::max(wall, r.wall_s);
    compute += r.compute_s;
    wait += r.comm_wait_s;
  }
  const double n = std::max(alive, 1.0);
  // AD-PSGD's peers end at steps of their own: count each one's.
  double items = last_[self_].step * config_.batch * n;
  if (config_.algorithm == Algorithm::kAdpsgd) {
    items = 0;
    for (const Report& r : last_) items += r.step * config_.batch;
  }
  RunSummary s;
  s.topology = topology_.name;
  s.algorithm = to_string(config_.algorithm);
  s.model = to_string(config_.model);
  s.peers = topology_.num_peers();
  s.steps = static_cast<long long>(last_[self_].step);
  s.epochs = last_[self_].epoch;
  s.batch_per_peer = config_.batch;
  s.test_accuracy = avg_accuracy_;
  s.mean_local_accuracy = local / n;
  s.consensus_distance = consensus_;
  s.final_train_loss = mean_loss();
  s.wall_s = wall;
  s.mean_compute_s = compute / n;
  s.mean_comm_wait_s = wait / n;
  s.bytes_sent_per_peer = sent / n;
  s.survivors = static_cast<long long>(alive);
  s.items_per_s = wall > 0 ? items / wall : 0.0;
  s.spectral_gap = spectral_gap_;
  if (language_model_) s.val_bits_per_byte = avg_bits_per_byte_;
  if (config_.algorithm == Algorithm::kDpsgd || config_.algorithm == Algorithm::kChoco)
    s.update = config_.update == UpdateForm::kAtc ? "atc" : "cta";
  if (config_.algorithm == Algorithm::kDpsgd || config_.algorithm == Algorithm::kGt)
    s.momentum_form = config_.momentum_form == MomentumForm::kQuasiGlobal ? "quasi-global" : "local";
  if (config_.algorithm == Algorithm::kChoco) {
    s.compression = config_.compression.describe();
    s.gossip_step = config_.choco_gamma();
  }
  if (all_reduces(config_)) s.allreduce_algo = std::string(algo::to_string(config_.allreduce_algo));
  if (config_.algorithm == Algorithm::kDiloco) {
    const OuterConfig& o = config_.outer;
    s.diloco = DilocoRecord{o.inner_steps,
                            o.lr,
                            o.momentum,
                            o.nesterov ? "nesterov" : "sgd",
                            std::string(to_string(o.exchange)),
                            o.sparse > 0 ? str("sparse:", o.sparse) : std::string(algo::to_string(o.compression)),
                            o.fragments,
                            o.overlap,
                            o.mix};
  }
  if (config_.model != ModelKind::kMlp)
    s.layout = LayoutRecord{config_.engine.sp,
                            config_.engine.tp,
                            config_.engine.pp,
                            parallel::to_string(config_.engine.stage_meshes),
                            std::string(parallel::to_string(config_.engine.reshard)),
                            config_.engine.microbatches};
  s.failed_peers = membership.lost();
  for (const Failure& f : failures) s.failures.push_back({f.peer, static_cast<long long>(f.step), f.reason});
  for (const Rejoin& r : rejoins) s.rejoined_peers.push_back({r.peer, static_cast<long long>(r.step), r.donor});
  s.coordinator = coordinator;
  for (const Takeover& t : membership.takeovers())
    s.takeovers.push_back({t.peer, static_cast<long long>(t.step), t.from});
  write_summary(config_.out_dir, s);
}

// Keys are short: a long run keeps every evaluation in the page.
std::string Recorder::eval_json(const std::vector<Report>& reports, const std::vector<std::vector<double>>& sent_to,
                                const Membership& membership) const {
  EvalRecord e;
  for (std::size_t p = 0; p < reports.size(); ++p) {
    const Report& r = reports[p];
    if (r.step == 0) continue;
    e.peers.push_back({static_cast<int>(p), r.step, r.train_loss, r.test_accuracy, r.test_bits_per_byte, r.bytes_sent,
                       r.bytes_received, r.wall_s, r.compute_s, r.comm_wait_s});
  }
  // Each graph edge's bytes so far, both directions summed (every frame on it, the
  // evaluation reports included).
  std::vector<double> links;
  for (const auto& edge : topology_.graph.edges()) {
    double bytes = 0;
    const auto a = static_cast<std::size_t>(edge.u), b = static_cast<std::size_t>(edge.v);
    if (a < sent_to.size() && b < sent_to[a].size()) bytes += sent_to[a][b];
    if (b < sent_to.size() && a < sent_to[b].size()) bytes += sent_to[b][a];
    links.push_back(bytes);
  }
  e.step = static_cast<long long>(reports[self_].step);
  e.epoch = reports[self_].epoch;
  e.wall_s = reports[self_].wall_s;
  e.loss = mean_loss();
  if (language_model_)
    e.avg_bpb = avg_bits_per_byte_;
  else
    e.avg_acc = avg_accuracy_;
  e.consensus = consensus_;
  e.coordinator = static_cast<int>(self_);
  e.lost = membership.lost();
  for (const Rejoin& r : membership.rejoins()) e.rejoined.push_back(r.peer);
  e.links = std::move(links);
  return eval_line(e);
}

double Recorder::mean_loss() const {
  double sum = 0, count = 0;
  for (const Report& r : last_)
    if (r.step > 0) {
      sum += r.train_loss;
      count += 1;
    }
  return count > 0 ? sum / count : 0;
}

}  // namespace peertrain::train
