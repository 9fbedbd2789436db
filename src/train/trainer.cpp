#include "peertrain/train/trainer.h"

#include <cstdio>
#include <cstring>

#include "peer_run.h"
#include "peertrain/core/error.h"

namespace peertrain::train {

std::string_view to_string(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kDpsgd: return "dpsgd";
    case Algorithm::kAllreduce: return "allreduce";
    case Algorithm::kPs: return "ps";
    case Algorithm::kLocal: return "local";
    case Algorithm::kChoco:
      return "choco";
    case Algorithm::kD2:
      return "d2";
    case Algorithm::kAdpsgd:
      return "adpsgd";
    case Algorithm::kGt:
      return "gt";
    case Algorithm::kDiloco:
      return "diloco";
    case Algorithm::kSgp:
      return "sgp";
    case Algorithm::kEl:
      return "el";
  }
  return "?";
}

std::string_view to_string(OuterExchange exchange) {
  switch (exchange) {
    case OuterExchange::kAllreduce:
      return "allreduce";
    case OuterExchange::kPs:
      return "ps";
    case OuterExchange::kGossip:
      return "gossip";
  }
  return "?";
}

OuterExchange parse_outer_exchange(std::string_view name) {
  for (auto e : {OuterExchange::kAllreduce, OuterExchange::kPs, OuterExchange::kGossip})
    if (to_string(e) == name) return e;
  throw Error(ErrorKind::kInvalidArgument, str("--outer-exchange '", name, "' is not one of allreduce, ps, gossip"));
}

Algorithm parse_algorithm(std::string_view name) {
  for (auto a :
       {Algorithm::kDpsgd, Algorithm::kAllreduce, Algorithm::kPs, Algorithm::kLocal, Algorithm::kChoco, Algorithm::kD2,
        Algorithm::kAdpsgd, Algorithm::kGt, Algorithm::kDiloco, Algorithm::kSgp, Algorithm::kEl})
    if (to_string(a) == name) return a;
  throw Error(ErrorKind::kInvalidArgument,
              str("--algorithm '", name,
                  "' is not one of dpsgd, choco, d2, gt, adpsgd, diloco, sgp, el, allreduce, ps, local"));
}

bool gossips(Algorithm algorithm) {
  return algorithm == Algorithm::kDpsgd || algorithm == Algorithm::kChoco || algorithm == Algorithm::kD2 ||
         algorithm == Algorithm::kAdpsgd || algorithm == Algorithm::kGt || algorithm == Algorithm::kSgp ||
         algorithm == Algorithm::kEl;
}

void check_algorithm_topology(const TrainConfig& config, const topology::Topology& topology) {
  const int n = topology.num_peers();
  if (config.algorithm == Algorithm::kEl && (n < 2 || config.fanout > n - 1))
    throw Error(ErrorKind::kInvalidArgument,
                str("--fanout ", std::max(config.fanout, 1), " needs at least ", std::max(config.fanout, 1) + 1,
                    " peers; ", topology.path, " has ", n));
  if (!topology.directed) return;
  const bool mixes_with_w =
      gossips(config) && config.algorithm != Algorithm::kSgp && config.algorithm != Algorithm::kEl;
  if (mixes_with_w)
    throw Error(
        ErrorKind::kInvalidArgument,
        str(topology.path.empty() ? topology.name : topology.path, " is a directed graph, and --algorithm ",
            to_string(config.algorithm), config.algorithm == Algorithm::kDiloco ? " --outer-exchange gossip" : "",
            " mixes with a symmetric W; use --algorithm sgp (push-sum) on it"));
}

bool all_reduces(const TrainConfig& config) {
  return config.algorithm == Algorithm::kAllreduce ||
         (config.algorithm == Algorithm::kDiloco && config.outer.exchange == OuterExchange::kAllreduce);
}

bool survives_lost_peers(const TrainConfig& config) {
  return gossips(config) || (config.algorithm == Algorithm::kDiloco && config.outer.exchange != OuterExchange::kPs);
}

bool outer_all_gather(const TrainConfig& config) {
  return config.algorithm == Algorithm::kDiloco && config.outer.exchange == OuterExchange::kAllreduce &&
         config.outer.sparse > 0;
}

bool gossips(const TrainConfig& config) {
  return gossips(config.algorithm) ||
         (config.algorithm == Algorithm::kDiloco && config.outer.exchange == OuterExchange::kGossip);
}

std::uint64_t derive_run_id(const TrainConfig& c, const topology::Topology& t) {
  std::uint64_t h = t.fingerprint();
  auto mix = [&h](double v) {
    std::uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    h = (h ^ bits) * 0x100000001b3ULL;
  };
  mix(static_cast<double>(c.algorithm));
  for (int width : c.hidden) mix(width);
  mix(c.batch);
  mix(c.sgd.lr);
  mix(c.sgd.momentum);
  mix(c.sgd.weight_decay);
  // The model and optimizer shape the trajectory; --sp/--pp/--microbatches do not (the
  // engine's gradient equals the unsplit model's), so peers may even differ in them.
  if (c.model != ModelKind::kMlp) {
    const auto& m = c.transformer;
    for (double v : {double(c.model) + 10, double(m.d_model), double(m.layers), double(m.heads), double(m.seq),
                     double(m.patch), double(m.tied_head), double(c.optimizer), double(c.adam.lr),
                     double(c.adam.weight_decay)})
      mix(v);
  } else if (c.optimizer != OptimizerKind::kSgd) {
    mix(double(c.optimizer) + 20);
    mix(c.adam.lr);
  }
  mix(static_cast<double>(c.seed));
  mix(static_cast<double>(c.partition));
  mix(c.alpha);
  if (c.lr_schedule != LrSchedule::kConstant) {  // left out when constant: older run ids stay valid
    mix(double(c.lr_schedule) + 30);
    mix(static_cast<double>(c.warmup_steps));
  }
  if (c.max_staleness > 0) mix(c.max_staleness + 1000.0);  // left out at 0: older run ids stay valid
  // Left out at their defaults, likewise.
  if (c.update != UpdateForm::kCta) mix(2000.0 + static_cast<double>(c.update));
  if (c.momentum_form != MomentumForm::kLocal) mix(5000.0 + static_cast<double>(c.momentum_form));
  if (c.algorithm == Algorithm::kChoco) {
    mix(3000.0 + static_cast<double>(c.compression.kind));
    mix(c.compression.fraction);
    mix(c.compression.bits);
    mix(c.choco_gamma());
  }
  if (c.allreduce_algo != algo::AllreduceAlgo::kRing) mix(4000.0 + static_cast<double>(c.allreduce_algo));
  if (c.algorithm == Algorithm::kDiloco) {
    const OuterConfig& o = c.outer;
    for (double v : {6000.0 + o.inner_steps, double(o.lr), double(o.momentum), double(o.nesterov), double(o.exchange),
                     double(o.fragments), double(o.overlap), double(o.mix), double(o.compression), o.sparse})
      mix(v);
  }
  if (c.model == ModelKind::kGpt && c.tokenizer != TokenizerKind::kBytes) {  // left out for bytes, likewise
    mix(double(c.tokenizer) + 40);
    mix(static_cast<double>(c.transformer.vocab));
  }
  return h;
}

namespace {
ProgressSink& progress_sink() {
  static ProgressSink sink;
  return sink;
}
}  // namespace

void set_progress_sink(ProgressSink sink) { progress_sink() = std::move(sink); }

void emit_progress(std::string_view kind, const std::string& json) {
  if (progress_sink()) return progress_sink()(kind, json);
  std::printf("@%.*s %s\n", static_cast<int>(kind.size()), kind.data(), json.c_str());
  std::fflush(stdout);
}

void run_peer(const topology::Topology& t, int rank, const TrainConfig& config, const TransportFactory& transport) {
  PeerRun run(t, rank, config, transport);  // the task, the links, and a resume or a rejoin
  run.train();
}

}  // namespace peertrain::train
