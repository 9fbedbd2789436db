#include "peertrain/train/trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "peertrain/algo/collectives.h"
#include "peertrain/algo/gossip.h"
#include "peertrain/core/error.h"
#include "peertrain/core/json.h"
#include "peertrain/core/log.h"
#include "peertrain/net/tcp.h"
#include "peertrain/topology/spectrum.h"
#include "membership.h"
#include "recorder.h"
#include "step_algorithm.h"
#include "peertrain/train/checkpoint.h"
#include "peertrain/train/task.h"

namespace peertrain::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Links each peer keeps: the algorithm's, plus the coordinator's for the evaluation
// reports. Under D-PSGD any survivor may take over from a lost coordinator
// (membership.h), so every peer is linked to every other; an idle link costs one
// heartbeat a second.
std::vector<int> links_for(Algorithm algorithm, const topology::Topology& t, int rank) {
  const int n = t.num_peers();
  std::vector<int> links;
  if (rank == 0 || algorithm == Algorithm::kDpsgd) {
    for (int p = 0; p < n; ++p)
      if (p != rank) links.push_back(p);
    return links;
  }
  links.push_back(0);
  if (algorithm == Algorithm::kAllreduce && n > 1) {
    links.push_back((rank + 1) % n);
    links.push_back((rank + n - 1) % n);
  }
  std::sort(links.begin(), links.end());
  links.erase(std::unique(links.begin(), links.end()), links.end());
  return links;
}

}  // namespace

std::string_view to_string(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kDpsgd: return "dpsgd";
    case Algorithm::kAllreduce: return "allreduce";
    case Algorithm::kPs: return "ps";
    case Algorithm::kLocal: return "local";
  }
  return "?";
}

Algorithm parse_algorithm(std::string_view name) {
  for (auto a : {Algorithm::kDpsgd, Algorithm::kAllreduce, Algorithm::kPs, Algorithm::kLocal})
    if (to_string(a) == name) return a;
  throw Error(ErrorKind::kInvalidArgument, str("--algorithm '", name, "' is not one of dpsgd, allreduce, ps, local"));
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
  return h;
}

void run_peer(const topology::Topology& t, int rank, const TrainConfig& config) {
  const int n = t.num_peers();
  if (rank < 0 || rank >= n)
    throw Error(ErrorKind::kInvalidArgument, str("rank ", rank, " is not a peer of ", t.path, " (peers 0..", n - 1, ")"));
  log::set_prefix(str("peer ", rank));
  Eigen::setNbThreads(config.threads);

  const std::unique_ptr<Task> task = make_task(config, n, rank);
  const std::size_t size = task->num_parameters();
  std::vector<float> x(size), grads(size);
  task->initialize(x, config.seed);  // identical on every peer
  const std::unique_ptr<Optimizer> optimizer = make_optimizer(config.optimizer, size, config.sgd, config.adam);

  // An epoch is one pass over the training set by all peers together.
  const long long steps_per_epoch =
      std::max<long long>(1, task->examples_per_epoch() / (static_cast<long long>(n) * config.batch));
  long long total_steps = steps_per_epoch * config.epochs;
  if (config.max_steps > 0) total_steps = std::min(total_steps, config.max_steps);
  const long long eval_every = config.eval_every > 0 ? config.eval_every : steps_per_epoch;

  // The step to resume from: every peer must find the same one, so it is folded into the
  // run id and a peer that found another is refused at the handshake.
  std::uint64_t resume_step = 0;
  const std::uint64_t base_run_id = config.run_id ? config.run_id : derive_run_id(config, t);
  if (config.resume) {
    const auto found = latest_complete_step(config.checkpoint_dir, n, {t.fingerprint(), base_run_id, size});
    if (!found)
      throw Error(ErrorKind::kInvalidArgument, str("--resume: no complete set of checkpoints of this run (all ", n,
                                                   " peers, same topology and training flags) in ", config.checkpoint_dir));
    resume_step = *found;
  }
  net::TcpOptions options;
  if (!config.secret_file.empty()) options.secret = net::Secret::load(config.secret_file);
  options.self = rank;
  for (const auto& p : t.peers) options.endpoints.push_back({p.host, p.port});
  options.links = links_for(config.algorithm, t, rank);
  options.fingerprint = t.fingerprint();
  options.run_id = base_run_id ^ (resume_step * 0x9e3779b97f4a7c15ULL);
  check_fault_options(config, t, rank);  // --rejoin, --max-staleness: before waiting for anyone
  options.rejoin = config.rejoin;
  options.connect_timeout_s = config.connect_timeout_s;
  options.peer_timeout_s = config.peer_timeout_s;
  options.max_payload_bytes = size * sizeof(float) + kReportDoubles * sizeof(double);
  options.node_bandwidth_mbps = t.node_bandwidth_mbps;
  options.shaping = [&t, rank](int peer) {
    const auto link = t.link(rank, peer);
    return net::LinkShaping{link.latency_ms, link.bandwidth_mbps};
  };
  const std::unique_ptr<net::Transport> transport = net::make_tcp_transport(options);
  net::Transport& network = *transport;
  log::info("listening on port ", t.peers[rank].port, "; connecting to ", options.links.size(), " peers");
  network.connect();
  // The I/O thread must never wait behind the gradient for a core, or the exchange stops
  // while the gradient is computed and nothing overlaps (seen on 2 cores: 17.6 ms steps
  // for 3.1 ms of compute and 13.1 ms of exchange). Lowering this compute thread's
  // priority, which needs no privileges, keeps the I/O thread (started above at the normal
  // priority) first in line.
  setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 5);
  log::info("connected; training ", total_steps, " steps (", steps_per_epoch, " per epoch), ", to_string(config.algorithm),
            ", ", task->describe(), ", ", size, " parameters");

  algo::Gossip gossip(network, algo::mixing_rows(t, rank), config.max_staleness);
  gossip.set_parts(task->gossip_parts());  // the transformer: one message per unit, see gossip_parts()
  Membership membership(network, t, rank,
                        {config.stop_on_split ? SplitPolicy::kStop : SplitPolicy::kContinue, config.max_staleness,
                         total_steps, eval_every});

  // The coordinator's files and progress lines: peer 0's from the start, or a survivor's
  // from the step it takes over (membership.h).
  std::unique_ptr<Recorder> recorder;
  auto recorder_if_coordinator = [&](long long kept_through) -> Recorder* {
    if (!membership.is_coordinator()) return nullptr;
    if (!recorder) {
      const double gap = t.time_varying() ? 0.0 : topology::analyze_spectrum(t.mixing, t.graph).spectral_gap;
      recorder = std::make_unique<Recorder>(config, t, gap, total_steps, kept_through, rank);
    }
    return recorder.get();
  };
  // (A restarted peer 0 coming back with --rejoin is not the coordinator: it must not touch the files.)
  if (rank == 0 && !config.rejoin) recorder_if_coordinator(static_cast<long long>(resume_step));
  // --mixing-trace: the row this peer applied, each time it changes.
  std::ofstream mixing_trace;
  std::string last_trace_row;
  if (config.mixing_trace && config.algorithm == Algorithm::kDpsgd && !config.out_dir.empty()) {
    std::filesystem::create_directories(config.out_dir);
    const auto path = std::filesystem::path(config.out_dir) / str("mixing-peer-", rank, ".csv");
    mixing_trace.open(path, config.rejoin ? std::ios::app : std::ios::trunc);
    if (!mixing_trace) throw Error(ErrorKind::kIo, str(path.string(), ": cannot write"));
    if (!config.rejoin) mixing_trace << "step,self_weight,neighbours\n";
  }
  auto trace_row = [&](long long step, const algo::MixingRow& row) {
    if (!mixing_trace.is_open()) return;
    std::string text = str(row.self_weight, ",");
    for (std::size_t k = 0; k < row.peers.size(); ++k)
      if (row.weights[k] != 0) text += str(text.back() == ',' ? "" : " ", row.peers[k], ":", row.weights[k]);
    if (text == last_trace_row) return;
    last_trace_row = text;
    mixing_trace << step << "," << text << "\n";
    mixing_trace.flush();
  };

  const std::unique_ptr<StepAlgorithm> algorithm =
      make_step_algorithm(config.algorithm, {network, rank, n, &gossip, &membership, trace_row}, size);

  double wall_s = 0, compute_s = 0, wait_s = 0, loss_sum = 0;
  long long loss_count = 0;
  long long first_step = 0;
  std::uint64_t sent_base = 0, received_base = 0;  // bytes of the run before a resume
  const CheckpointMatch match{t.fingerprint(), base_run_id, size};
  if (config.resume) {
    // resume_step was found before connecting, so that it is part of the run id.
    const CheckpointState saved = read_checkpoint(checkpoint_path(config.checkpoint_dir, rank, resume_step));
    if (saved.peer != static_cast<std::uint32_t>(rank) || saved.params.size() != size)
      throw Error(ErrorKind::kParse, str(checkpoint_path(config.checkpoint_dir, rank, resume_step),
                                         ": belongs to another peer or model"));
    x = saved.params;
    optimizer->restore_state(saved.momentum);
    task->restore_sampler(saved.sampler);
    loss_sum = saved.loss_sum;
    loss_count = saved.loss_count;
    wall_s = saved.wall_s;
    compute_s = saved.compute_s;
    wait_s = saved.comm_wait_s;
    sent_base = saved.bytes_sent;
    received_base = saved.bytes_received;
    first_step = static_cast<long long>(resume_step);
    log::info("resumed from step ", first_step, " (", checkpoint_path(config.checkpoint_dir, rank, resume_step), ")");
  }
  if (config.rejoin) {  // peer 0 names the step and the neighbour we take the parameters of (membership.h)
    const RejoinTicket ticket = membership.rejoin();
    membership.take_parameters(ticket, x);
    task->restore_sampler(BatchSampler::after_batches(static_cast<long long>(ticket.step)));
    first_step = static_cast<long long>(ticket.step);
    log::info("rejoined at step ", first_step, " with peer ", ticket.donor, "'s parameters");
  }
  // Evaluation traffic is left out of the byte counts, so they show training traffic only.
  std::uint64_t eval_sent = 0, eval_received = 0;
  const std::uint64_t report_bytes = net::kHeaderBytes + kReportDoubles * sizeof(double) + size * sizeof(float);
  // Written at the end of a step, after its evaluation; not part of the step timings.
  auto save = [&](long long done) {
    const auto counters = network.total_counters();
    CheckpointState state;
    state.peer = static_cast<std::uint32_t>(rank);
    state.peers = static_cast<std::uint32_t>(n);
    state.fingerprint = match.fingerprint;
    state.run_id = match.run_id;
    state.step = static_cast<std::uint64_t>(done);
    state.sampler = task->sampler_state();
    state.loss_sum = loss_sum;
    state.loss_count = loss_count;
    state.wall_s = wall_s;
    state.compute_s = compute_s;
    state.comm_wait_s = wait_s;
    state.bytes_sent = sent_base + counters.bytes_sent - eval_sent;
    state.bytes_received = received_base + counters.bytes_received - eval_received;
    state.params = x;
    state.momentum.assign(optimizer->state().begin(), optimizer->state().end());
    write_checkpoint(config.checkpoint_dir, state);
    if (membership.is_coordinator()) prune_checkpoints(config.checkpoint_dir, n, 2, match);
  };
  auto last_progress = Clock::now();

  // Evaluation: each peer tests its model and reports to the coordinator, which tests x̄
  // and writes the metrics. Not part of the step timings.
  const bool tolerant = config.algorithm == Algorithm::kDpsgd;  // the baselines stop on any loss
  auto send_report = [&](int to, long long done, const Report& report) {
    std::vector<std::byte> payload(kReportDoubles * sizeof(double) + size * sizeof(float));
    std::memcpy(payload.data(), &report, sizeof report);
    std::memcpy(payload.data() + sizeof report, x.data(), size * sizeof(float));
    network.send(to, net::MessageType::kReport, static_cast<std::uint64_t>(done), 0, std::move(payload), false).wait();
    eval_sent += report_bytes;
    // Wait until the coordinator has evaluated x̄, so that its evaluation does not land in
    // the timing of our next exchange. It may itself wait up to three times --peer-timeout
    // on a report (below), so we wait longer, while it sounds alive.
    if (tolerant)
      network.receive_while_alive(to, net::MessageType::kReport, static_cast<std::uint64_t>(done), 1,
                                  4 * network.peer_timeout_s());
    else
      network.receive(to, net::MessageType::kReport, static_cast<std::uint64_t>(done), 1);
    eval_received += net::kHeaderBytes;
  };
  // A report is waited for while its sender sounds alive, up to three times --peer-timeout:
  // just after a takeover, a peer may first have waited that long on the old coordinator
  // before turning to us. A silent sender (stopped, cut off, on the far side of a
  // partition) is given up after half of --peer-timeout, before the peers waiting on
  // this coordinator's release give up on it.
  auto receive_report = [&](int p, long long done) {
    if (!tolerant) return network.receive(p, net::MessageType::kReport, static_cast<std::uint64_t>(done), 0);
    return network.receive_while_alive(p, net::MessageType::kReport, static_cast<std::uint64_t>(done), 0,
                                       3 * network.peer_timeout_s());
  };
  auto coordinate_round = [&](long long step, long long done, const Report& report) {
    std::vector<Report> reports(n);  // step 0 marks a lost peer
    reports[rank] = report;
    std::vector<net::Payload> others(n);
    for (int p = 0; p < n; ++p) {
      if (p == rank || membership.is_lost(p) || std::count(gossip.lost().begin(), gossip.lost().end(), p)) continue;
      try {
        others[p] = receive_report(p, done);
        if (others[p].size() != kReportDoubles * sizeof(double) + size * sizeof(float))
          throw Error(ErrorKind::kPeerLost, str(network.peer_name(p), " sent a report of ", others[p].size(), " bytes"));
      } catch (const Error& e) {
        if (!tolerant || (e.kind() != ErrorKind::kPeerLost && e.kind() != ErrorKind::kTimeout)) throw;
        others[p].clear();
        membership.report_lost(static_cast<std::uint64_t>(step), p, e.what());
        continue;
      }
      std::memcpy(&reports[p], others[p].data(), sizeof(Report));
    }
    // Alone: we were cut off rather than everyone else failing (membership.h); write nothing.
    membership.stop_if_cut_off(static_cast<std::uint64_t>(step));
    std::vector<std::span<const float>> xs{x};
    for (int p = 0; p < n; ++p)
      if (!others[p].empty()) xs.emplace_back(reinterpret_cast<const float*>(others[p].data() + sizeof(Report)), size);
    std::vector<float> average_f;
    const double consensus = consensus_distance(xs, average_f);
    const TaskEvaluation avg = task->evaluate(average_f);
    recorder_if_coordinator(step)->record(reports, avg.accuracy, avg.bits_per_byte, consensus);
    std::vector<Work> released;
    for (int p = 0; p < n; ++p)
      if (!others[p].empty()) {
        eval_received += report_bytes;
        released.push_back(network.send(p, net::MessageType::kReport, static_cast<std::uint64_t>(done), 1, {}, false));
        eval_sent += net::kHeaderBytes;
      }
    for (auto& r : released) {
      try {
        r.wait();
      } catch (const Error& e) {
        if (!tolerant) throw;
      }
    }
  };
  auto evaluate_round = [&](long long step, double epoch) {
    const long long done = step + 1;
    const TaskEvaluation local = task->evaluate(x);
    const auto counters = network.total_counters();
    Report report{static_cast<double>(done), epoch, loss_sum / static_cast<double>(loss_count), local.accuracy,
                  local.loss, local.bits_per_byte, static_cast<double>(sent_base + counters.bytes_sent - eval_sent),
                  static_cast<double>(received_base + counters.bytes_received - eval_received),
                  wall_s, compute_s, wait_s};
    loss_sum = 0;
    loss_count = 0;
    // Until someone takes the report: a coordinator we cannot reach is counted lost, and
    // the next one (maybe this peer) gets it.
    while (!membership.is_coordinator()) {
      const int to = membership.coordinator();
      try {
        return send_report(to, done, report);
      } catch (const Error& e) {
        if (!tolerant) throw;
        membership.report_lost(static_cast<std::uint64_t>(step), to, e.what());
      }
    }
    coordinate_round(step, done, report);
  };

  const float base_lr = config.optimizer == OptimizerKind::kAdam ? config.adam.lr : config.sgd.lr;
  for (long long step = first_step; step < total_steps; ++step) {
    optimizer->set_learning_rate(
        scheduled_learning_rate(config.lr_schedule, base_lr, step, total_steps, config.warmup_steps));
    const auto step_start = Clock::now();
    float loss = 0;
    auto compute = [&] {
      const auto begin = Clock::now();
      loss = task->compute_gradient(x, grads);
      return seconds_since(begin);
    };
    algorithm->start(step, x);
    recorder_if_coordinator(step);  // taken over: keep the rows written so far
    double step_compute = compute();
    const StepTiming timing = algorithm->finish(step, x, grads, *optimizer);
    step_compute += timing.compute_s;
    const double step_wait = timing.wait_s;
    if (!std::isfinite(loss))
      throw Error(ErrorKind::kNotConverged, str("peer ", rank, ": the training loss became ", loss, " at step ", step,
                                                "; lower --lr"));
    wall_s += seconds_since(step_start);
    compute_s += step_compute;
    wait_s += step_wait;
    loss_sum += loss;
    ++loss_count;

    const long long done = step + 1;
    const double epoch = static_cast<double>(done) / static_cast<double>(steps_per_epoch);
    if (membership.is_coordinator() && recorder && seconds_since(last_progress) > 0.5) {
      recorder->progress(static_cast<double>(done), epoch, loss_sum / static_cast<double>(loss_count), wall_s, false);
      last_progress = Clock::now();
    }
    if (done % eval_every == 0 || done == total_steps) {
      // With stale gossip, parameters may still be on their way to a neighbour that is about
      // to finish; the last round waits for them, so no peer closes under another's sends.
      if (done == total_steps && config.algorithm == Algorithm::kDpsgd) gossip.flush();
      evaluate_round(step, epoch);
      gossip.expect_slow_round();
    }
    if (config.checkpoint_every > 0 && (done % config.checkpoint_every == 0 || done == total_steps)) {
      save(done);
      gossip.expect_slow_round();
    }
  }
  if (recorder && membership.is_coordinator()) recorder->finish(membership, rank);
  network.close();
  log::info("finished ", total_steps, " steps in ", wall_s, " s");
}

}  // namespace peertrain::train
