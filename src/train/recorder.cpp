#include "recorder.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "membership.h"
#include "peertrain/core/codec.h"
#include "peertrain/core/error.h"
#include "peertrain/core/json.h"
#include "peertrain/topology/layout.h"
#include "peertrain/topology/spectrum.h"

namespace peertrain::train {

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
  const auto spectrum = topology::analyze_spectrum(t.mixing, t.graph);
  std::string peers = "[", links = "[";
  for (int i = 0; i < t.num_peers(); ++i) {
    json::Object p;
    p.add("id", i)
        .add("x", places[static_cast<std::size_t>(i)][0])
        .add("y", places[static_cast<std::size_t>(i)][1])
        .add("host", t.peers[static_cast<std::size_t>(i)].host)
        .add("self_weight", t.mixing.coeff(i, i))
        .add("slowdown", t.compute_slowdown(i));
    peers += i ? "," : "";  // two appends: GCC 12 warns (-Wrestrict) on "," + a temporary
    peers += p.dump(0);
  }
  bool first = true;
  for (const auto& e : t.graph.edges()) {
    const topology::LinkProperties link = t.link(e.u, e.v);
    json::Object l;
    l.add("a", e.u)
        .add("b", e.v)
        .add("w", t.mixing.coeff(e.u, e.v))
        .add("latency_ms", link.latency_ms)
        .add("bandwidth_mbps", link.bandwidth_mbps);
    links += first ? "" : ",";
    links += l.dump(0);
    first = false;
  }
  json::Object o;
  o.add("name", t.name)
      .add("peers_count", t.num_peers())
      .add("time_varying", t.time_varying())
      .add("spectral_gap", spectrum.spectral_gap)
      .add("lambda2", spectrum.lambda2)
      .add("lambda_min", spectrum.lambda_min)
      .add("contraction_per_step", spectrum.contraction_per_step())
      .add("node_bandwidth_mbps", t.node_bandwidth_mbps)
      .add_raw("peers", peers + "]")
      .add_raw("links", links + "]");
  return o.dump(0);
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
  csv_ << "step,epoch,peer,train_loss,test_accuracy,avg_accuracy,consensus_distance,bytes_sent,bytes_received,"
          "wall_s,compute_s,comm_wait_s,test_bits_per_byte,avg_bits_per_byte\n"
       << kept;
}

void Recorder::record(const std::vector<Report>& reports, const std::vector<std::vector<double>>& sent_to,
                      double avg_accuracy, double avg_bits_per_byte, double consensus, const Membership& membership) {
  last_ = reports;
  avg_accuracy_ = avg_accuracy;
  avg_bits_per_byte_ = avg_bits_per_byte;
  consensus_ = consensus;
  if (csv_) {
    char line[512];
    for (std::size_t peer = 0; peer < reports.size(); ++peer) {
      const Report& r = reports[peer];
      if (r.step == 0) continue;  // lost: no row
      // Bits per byte only for a language model; the classifiers leave the columns empty.
      char bpb[64] = "";
      if (language_model_)
        std::snprintf(bpb, sizeof bpb, "%.5f,%.5f", r.test_bits_per_byte, avg_bits_per_byte);
      else
        std::snprintf(bpb, sizeof bpb, ",");
      std::snprintf(line, sizeof line, "%lld,%.4f,%zu,%.9g,%.4f,%.4f,%.6g,%.0f,%.0f,%.4f,%.4f,%.4f,%s\n",
                    static_cast<long long>(r.step), r.epoch, peer, r.train_loss, r.test_accuracy, avg_accuracy,
                    consensus, r.bytes_sent, r.bytes_received, r.wall_s, r.compute_s, r.comm_wait_s, bpb);
      csv_ << line;
    }
    csv_.flush();
  }
  if (evals_ || config_.progress) {
    const std::string line = eval_json(reports, sent_to, membership);
    if (evals_) evals_ << line << "\n" << std::flush;
    if (config_.progress) std::printf("@eval %s\n", line.c_str());
  }
  progress(reports[self_].step, reports[self_].epoch, mean_loss(), reports[self_].wall_s, true);
}

void Recorder::progress(double step, double epoch, double loss, double wall_s, bool evaluated) {
  if (!config_.progress) return;
  json::Object o;
  o.add("step", static_cast<long long>(step))
      .add("total_steps", total_steps_)
      .add("epoch", epoch)
      .add("loss", loss)
      .add("items_per_s", wall_s > 0 ? step * config_.batch * topology_.num_peers() / wall_s : 0.0)
      .add("evaluated", evaluated)
      .add("metric", language_model_ ? "bits_per_byte" : "accuracy");
  if (!last_.empty()) o.add("avg_accuracy", avg_accuracy_).add("consensus_distance", consensus_);
  if (!last_.empty() && language_model_) o.add("avg_bits_per_byte", avg_bits_per_byte_);
  std::printf("@progress %s\n", o.dump(0).c_str());
  std::fflush(stdout);
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
  const std::vector<int>& failed = membership.lost();
  std::string details = "[";
  std::string moved = "[";
  for (const Takeover& t : membership.takeovers()) {
    json::Object one;
    one.add("peer", t.peer).add("step", static_cast<long long>(t.step)).add("from", t.from);
    moved += (moved.size() > 1 ? ", " : "") + one.dump(0);
  }
  moved += "]";
  std::string back = "[";
  for (const Rejoin& r : rejoins) {
    json::Object one;
    one.add("peer", r.peer).add("step", static_cast<long long>(r.step)).add("donor", r.donor);
    back += (back.size() > 1 ? ", " : "") + one.dump(0);
  }
  back += "]";
  for (const Failure& f : failures) {
    json::Object one;
    one.add("peer", f.peer).add("step", static_cast<long long>(f.step)).add("reason", f.reason);
    details += (details.size() > 1 ? ", " : "") + one.dump(0);
  }
  details += "]";
  // AD-PSGD's peers end at steps of their own: count each one's.
  double items = last_[self_].step * config_.batch * n;
  if (config_.algorithm == Algorithm::kAdpsgd) {
    items = 0;
    for (const Report& r : last_) items += r.step * config_.batch;
  }
  json::Object o;
  o.add("topology", topology_.name)
      .add("algorithm", to_string(config_.algorithm))
      .add("model", to_string(config_.model))
      .add("peers", topology_.num_peers())
      .add("steps", static_cast<long long>(last_[self_].step))
      .add("epochs", last_[self_].epoch)
      .add("batch_per_peer", config_.batch)
      .add("test_accuracy", avg_accuracy_)
      .add("mean_local_accuracy", local / n)
      .add("consensus_distance", consensus_)
      .add("final_train_loss", mean_loss())
      .add("wall_s", wall)
      .add("mean_compute_s", compute / n)
      .add("mean_comm_wait_s", wait / n)
      .add("bytes_sent_per_peer", sent / n)
      .add("survivors", static_cast<long long>(alive))
      .add("items_per_s", wall > 0 ? items / wall : 0.0)
      .add("spectral_gap", spectral_gap_);
  if (language_model_) o.add("val_bits_per_byte", avg_bits_per_byte_);
  if (config_.algorithm == Algorithm::kDpsgd || config_.algorithm == Algorithm::kChoco)
    o.add("update", config_.update == UpdateForm::kAtc ? "atc" : "cta");
  if (config_.algorithm == Algorithm::kDpsgd || config_.algorithm == Algorithm::kGt)
    o.add("momentum_form", config_.momentum_form == MomentumForm::kQuasiGlobal ? "quasi-global" : "local");
  if (config_.algorithm == Algorithm::kChoco)
    o.add("compression", config_.compression.describe()).add("gossip_step", config_.choco_gamma());
  if (config_.algorithm == Algorithm::kAllreduce)
    o.add("allreduce_algo", std::string(algo::to_string(config_.allreduce_algo)));
  if (config_.model != ModelKind::kMlp)
    o.add("sp", config_.engine.sp)
        .add("tp", config_.engine.tp)
        .add("pp", config_.engine.pp)
        .add("stage_mesh", parallel::to_string(config_.engine.stage_meshes))
        .add("reshard", std::string(parallel::to_string(config_.engine.reshard)))
        .add("microbatches", config_.engine.microbatches);
  o.add_raw("failed_peers", json::array(failed))
      .add_raw("failures", details)
      .add_raw("rejoined_peers", back)
      .add("coordinator", coordinator)
      .add_raw("takeovers", moved);
  std::ofstream out(std::filesystem::path(config_.out_dir) / "summary.json");
  out << o.dump() << "\n";
  if (!out) throw Error(ErrorKind::kIo, str(config_.out_dir, "/summary.json: cannot write"));
}

// Keys are short: a long run keeps every evaluation in the page.
std::string Recorder::eval_json(const std::vector<Report>& reports, const std::vector<std::vector<double>>& sent_to,
                                const Membership& membership) const {
  std::string peers = "[";
  for (std::size_t p = 0; p < reports.size(); ++p) {
    const Report& r = reports[p];
    if (r.step == 0) continue;
    json::Object o;
    o.add("peer", p)
        .add("step", r.step)
        .add("loss", r.train_loss)
        .add("acc", r.test_accuracy)
        .add("bpb", r.test_bits_per_byte)
        .add("sent", r.bytes_sent)
        .add("recv", r.bytes_received)
        .add("wall", r.wall_s)
        .add("compute", r.compute_s)
        .add("wait", r.comm_wait_s);
    peers += peers.size() > 1 ? "," : "";
    peers += o.dump(0);
  }
  // Each graph edge's bytes so far, both directions summed (every frame on it, the
  // evaluation reports included).
  std::vector<double> links;
  for (const auto& e : topology_.graph.edges()) {
    double bytes = 0;
    const auto a = static_cast<std::size_t>(e.u), b = static_cast<std::size_t>(e.v);
    if (a < sent_to.size() && b < sent_to[a].size()) bytes += sent_to[a][b];
    if (b < sent_to.size() && a < sent_to[b].size()) bytes += sent_to[b][a];
    links.push_back(bytes);
  }
  std::vector<int> rejoined;
  for (const Rejoin& r : membership.rejoins()) rejoined.push_back(r.peer);
  json::Object o;
  o.add("step", static_cast<long long>(reports[self_].step))
      .add("epoch", reports[self_].epoch)
      .add("wall_s", reports[self_].wall_s)
      .add("loss", mean_loss())
      .add(language_model_ ? "avg_bpb" : "avg_acc", language_model_ ? avg_bits_per_byte_ : avg_accuracy_)
      .add("consensus", consensus_)
      .add("coordinator", static_cast<long long>(self_))
      .add_raw("lost", json::array(membership.lost()))
      .add_raw("rejoined", json::array(rejoined))
      .add_raw("peers", peers + "]")
      .add_raw("links", json::array(links));
  return o.dump(0);
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
