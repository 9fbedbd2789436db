#include "peer_run.h"

#include <sys/resource.h>
#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <thread>

#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"
#include "peertrain/core/log.h"
#include "peertrain/net/tcp.h"
#include "peertrain/topology/spectrum.h"
#include "peertrain/train/device_update.h"

namespace peertrain::train {
namespace {

// Links each peer keeps: the algorithm's, plus the coordinator's for the evaluation
// reports. Under D-PSGD any survivor may take over from a lost coordinator
// (membership.h), so every peer is linked to every other; an idle link costs one
// heartbeat a second.
std::vector<int> links_for(const TrainConfig& config, const topology::Topology& t, int rank) {
  const int n = t.num_peers();
  std::vector<int> links;
  if (rank == 0 || survives_lost_peers(config)) {
    for (int p = 0; p < n; ++p)
      if (p != rank) links.push_back(p);
    return links;
  }
  links.push_back(0);
  if (all_reduces(config))
    for (int p : algo::allreduce_partners(config.allreduce_algo, n, rank)) links.push_back(p);
  std::sort(links.begin(), links.end());
  links.erase(std::unique(links.begin(), links.end()), links.end());
  return links;
}

// How far a peer may run ahead of a neighbour: the gossip's staleness, or under DiLoCo the
// inner steps (and overlap) between the rounds that couple the peers. The membership puts
// its switches further ahead than that, so no peer has passed one when it hears of it.
int run_ahead_steps(const TrainConfig& config) {
  if (config.algorithm == Algorithm::kDiloco) return config.outer.inner_steps + config.outer.overlap;
  return config.max_staleness;
}

}  // namespace

PeerRun::PeerRun(const topology::Topology& t, int rank, const TrainConfig& config, const TransportFactory& transport)
    : t_(t),
      rank_(rank),
      n_(t.num_peers()),
      config_(config),
      tolerant_(survives_lost_peers(config)),
      make_transport_(transport) {
  if (rank < 0 || rank >= n_)
    throw Error(ErrorKind::kInvalidArgument,
                str("rank ", rank, " is not a peer of ", t.path, " (peers 0..", n_ - 1, ")"));
  log::set_prefix(str("peer ", rank));
  Eigen::setNbThreads(config.threads);

  task_ = make_task(config, n_, rank);
  size_ = task_->num_parameters();
  x_.resize(size_);
  grads_.resize(size_);
  task_->initialize(x_, config.seed);  // identical on every peer
  // With --device cuda the optimizer runs beside the model where that is exact
  // (train/device_update.h); elsewhere, and where it is not, on the host.
  optimizer_ = make_device_update(task_->device_model(), size_, config);
  if (optimizer_)
    log::info("the optimizer runs on the GPU beside the model; only its update crosses to the host");
  else
    optimizer_ = make_optimizer(config.optimizer, size_, config.sgd, config.adam);
  // An epoch is one pass over the training set by all peers together.
  steps_per_epoch_ = std::max<long long>(1, task_->examples_per_epoch() / (static_cast<long long>(n_) * config.batch));
  total_steps_ = steps_per_epoch_ * config.epochs;
  if (config.max_steps > 0) total_steps_ = std::min(total_steps_, config.max_steps);
  eval_every_ = config.eval_every > 0 ? config.eval_every : steps_per_epoch_;
  match_ = {t.fingerprint(), config.run_id ? config.run_id : derive_run_id(config, t), size_};
  if (!config.secret_file.empty()) match_.key = net::Secret::load(config.secret_file);
  report_bytes_ = net::kHeaderBytes + report_payload_bytes(n_, size_);

  const std::uint64_t resume_step = find_resume_step();
  connect(resume_step);
  // (SGP's --max-staleness is its own push-sum delay: this gossip then stays unused.)
  gossip_ = std::make_unique<algo::Gossip>(*network_, algo::mixing_rows(t, rank),
                                           config.algorithm == Algorithm::kDpsgd ? config.max_staleness : 0);
  // The transformer: one message per unit, see gossip_parts(). CHOCO's compressed message is one.
  // (Gradient tracking sends x and y as one message of 2N; DiLoCo a fragment's pseudo-gradient.)
  if (config.algorithm != Algorithm::kChoco && config.algorithm != Algorithm::kGt &&
      config.algorithm != Algorithm::kDiloco)
    gossip_->set_parts(task_->gossip_parts());
  membership_ =
      std::make_unique<Membership>(*network_, t, rank,
                                   MembershipOptions{config.stop_on_split ? SplitPolicy::kStop : SplitPolicy::kContinue,
                                                     run_ahead_steps(config), total_steps_, eval_every_});
  // (A restarted peer 0 coming back with --rejoin is not the coordinator: it must not touch the files.)
  if (rank == 0 && !config.rejoin) recorder_if_coordinator(static_cast<long long>(resume_step));
  open_mixing_trace();
  if (config.algorithm != Algorithm::kAdpsgd)
    algorithm_ = make_step_algorithm(config,
                                     {*network_, rank, n_, gossip_.get(), membership_.get(),
                                      [this](long long step, const algo::MixingRow& row) { trace_row(step, row); }, &t,
                                      total_steps_, task_->layer_ranges()},
                                     size_);
  if (config.resume) resume(resume_step);
  if (config.rejoin) rejoin();
}

// The step to resume from: every peer must find the same one, so it is folded into the
// run id and a peer that found another is refused at the handshake.
std::uint64_t PeerRun::find_resume_step() const {
  if (!config_.resume) return 0;
  const auto found = latest_complete_step(config_.checkpoint_dir, n_, match_);
  if (!found)
    throw Error(ErrorKind::kInvalidArgument,
                str("--resume: no complete set of checkpoints of this run (all ", n_,
                    " peers, same topology and training flags) in ", config_.checkpoint_dir));
  return *found;
}

void PeerRun::connect(std::uint64_t resume_step) {
  check_fault_options(config_, t_, rank_);  // --rejoin, --max-staleness: before waiting for anyone
  if (make_transport_) {
    network_ = make_transport_(rank_, links_for(config_, t_, rank_));
    network_->connect();
  } else {
    connect_tcp(resume_step);
  }
  log::info("connected; training ", total_steps_, " steps (", steps_per_epoch_, " per epoch), ",
            to_string(config_.algorithm), ", ", task_->describe(), ", ", size_, " parameters");
}

void PeerRun::connect_tcp(std::uint64_t resume_step) {
  net::TcpOptions options;
  options.secret = match_.key;
  options.self = rank_;
  for (const auto& p : t_.peers) options.endpoints.push_back({p.host, p.port});
  options.links = links_for(config_, t_, rank_);
  options.fingerprint = t_.fingerprint();
  options.run_id = match_.run_id ^ (resume_step * 0x9e3779b97f4a7c15ULL);
  options.rejoin = config_.rejoin;
  options.every_link_needed = !tolerant_;
  options.connect_timeout_s = config_.connect_timeout_s;
  options.peer_timeout_s = config_.peer_timeout_s;
  // Gradient tracking's message carries x and y.
  const std::size_t vectors = config_.algorithm == Algorithm::kGt ? 2 : 1;
  options.max_payload_bytes =
      vectors * size_ * sizeof(float) + (kReportDoubles + static_cast<std::size_t>(n_)) * sizeof(double);
  // A neighbour may run --max-staleness steps ahead, each step a message: room for those
  // on top of the transport's default cap.
  options.max_unread_bytes =
      (static_cast<std::size_t>(config_.max_staleness) + 16) * options.max_payload_bytes + (std::size_t{64} << 20);
  options.node_bandwidth_mbps = t_.node_bandwidth_mbps;
  options.node_ingress_mbps = t_.node_ingress_mbps;
  options.shared_memory = config_.shared_memory;
  options.shaping = [&t = t_, rank = rank_](int peer) {
    const auto link = t.link(rank, peer);
    return net::LinkShaping{link.latency_ms, link.bandwidth_mbps};
  };
  network_ = net::make_tcp_transport(options);
  log::info("listening on port ", t_.peers[rank_].port, "; connecting to ", options.links.size(), " peers");
  network_->connect();
  // AD-PSGD lowers it after starting its protocol thread, which must not inherit it.
  if (config_.algorithm != Algorithm::kAdpsgd) lower_compute_priority();
}

// The I/O thread must never wait behind the gradient for a core, or the exchange stops
// while the gradient is computed and nothing overlaps (seen on 2 cores: 17.6 ms steps for
// 3.1 ms of compute and 13.1 ms of exchange). Lowering this compute thread's priority,
// which needs no privileges, keeps the I/O thread (started at the normal priority) first
// in line. Threads started from here afterwards inherit it.
void PeerRun::lower_compute_priority() { setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 5); }

void PeerRun::open_mixing_trace() {
  if (!config_.mixing_trace || !gossips(config_) || config_.algorithm == Algorithm::kAdpsgd || config_.out_dir.empty())
    return;
  std::filesystem::create_directories(config_.out_dir);
  const auto path = std::filesystem::path(config_.out_dir) / str("mixing-peer-", rank_, ".csv");
  mixing_trace_.open(path, config_.rejoin ? std::ios::app : std::ios::trunc);
  if (!mixing_trace_) throw Error(ErrorKind::kIo, str(path.string(), ": cannot write"));
  if (!config_.rejoin) mixing_trace_ << "step,self_weight,neighbours\n";
}

void PeerRun::trace_row(long long step, const algo::MixingRow& row) {
  if (!mixing_trace_.is_open()) return;
  std::string text = str(row.self_weight, ",");
  for (std::size_t k = 0; k < row.peers.size(); ++k)
    if (row.weights[k] != 0) text += str(text.back() == ',' ? "" : " ", row.peers[k], ":", row.weights[k]);
  if (text == last_trace_row_) return;
  last_trace_row_ = text;
  mixing_trace_ << step << "," << text << "\n";
  mixing_trace_.flush();
}

// resume_step was found before connecting, so that it is part of the run id.
void PeerRun::resume(std::uint64_t resume_step) {
  const std::string path = checkpoint_path(config_.checkpoint_dir, rank_, resume_step);
  const CheckpointState saved = read_checkpoint(path, match_.key);
  if (saved.peer != static_cast<std::uint32_t>(rank_) || saved.params.size() != size_)
    throw Error(ErrorKind::kParse, str(path, ": belongs to another peer or model"));
  x_ = saved.params;
  optimizer_->restore_state(saved.optimizer_state);
  task_->restore_sampler(saved.sampler);
  loss_sum_ = saved.loss_sum;
  loss_count_ = saved.loss_count;
  wall_s_ = saved.wall_s;
  compute_s_ = saved.compute_s;
  wait_s_ = saved.comm_wait_s;
  sent_base_ = saved.bytes_sent;
  received_base_ = saved.bytes_received;
  first_step_ = static_cast<long long>(resume_step);
  log::info("resumed from step ", first_step_, " (", path, ")");
}

// The coordinator names the step and the neighbour we take the parameters of (membership.h).
void PeerRun::rejoin() {
  const RejoinTicket ticket = membership_->rejoin();
  membership_->take_parameters(ticket, x_);
  task_->restore_sampler(BatchSampler::after_batches(static_cast<long long>(ticket.step)));
  first_step_ = static_cast<long long>(ticket.step);
  log::info("rejoined at step ", first_step_, " with peer ", ticket.donor, "'s parameters");
}

Recorder* PeerRun::recorder_if_coordinator(long long kept_through) {
  if (!membership_->is_coordinator()) return nullptr;
  if (!recorder_) {
    const double gap = t_.time_varying() ? 0.0
                       : t_.directed     ? 1 - topology::analyze_directed(t_.mixing).slem
                                         : topology::analyze_spectrum(t_.mixing, t_.graph).spectral_gap;
    recorder_ = std::make_unique<Recorder>(config_, t_, gap, total_steps_, kept_through, rank_);
  }
  return recorder_.get();
}

// Written at the end of a step, after its evaluation; not part of the step timings.
void PeerRun::save(long long done) {
  const auto counters = network_->total_counters();
  CheckpointState state;
  state.peer = static_cast<std::uint32_t>(rank_);
  state.peers = static_cast<std::uint32_t>(n_);
  state.fingerprint = match_.fingerprint;
  state.run_id = match_.run_id;
  state.step = static_cast<std::uint64_t>(done);
  state.sampler = task_->sampler_state();
  state.loss_sum = loss_sum_;
  state.loss_count = loss_count_;
  state.wall_s = wall_s_;
  state.compute_s = compute_s_;
  state.comm_wait_s = wait_s_;
  state.bytes_sent = sent_base_ + counters.bytes_sent - eval_sent_;
  state.bytes_received = received_base_ + counters.bytes_received - eval_received_;
  state.params = x_;
  state.optimizer_state.assign(optimizer_->state().begin(), optimizer_->state().end());
  write_checkpoint(config_.checkpoint_dir, state, match_.key);
  if (membership_->is_coordinator()) prune_checkpoints(config_.checkpoint_dir, n_, 2, match_);
}

void PeerRun::emulate_straggler(double gradient_s) const {
  const double slowdown = t_.compute_slowdown(rank_);
  // A simulated cluster gives a straggler a slower host instead (sim/platform.cpp).
  if (slowdown > 1 && !RunClock::simulated())
    std::this_thread::sleep_for(std::chrono::duration<double>((slowdown - 1) * gradient_s));
}

void PeerRun::train() {
  if (config_.algorithm == Algorithm::kAdpsgd) return train_async();
  if (tolerant_) return train_steps();
  try {
    train_steps();
  } catch (const Error& e) {
    throw naming_every_lost_peer(e);
  }
}

// A ring all-reduce that loses peer 2 stops everyone, but peer 1, waiting on peer 0, may
// hear first that peer 0 stopped (of the same loss): its error would name only peer 0.
Error PeerRun::naming_every_lost_peer(const Error& e) const {
  if (e.kind() != ErrorKind::kPeerLost && e.kind() != ErrorKind::kTimeout) return e;
  const std::string said = e.what();
  std::string also;
  for (const std::string& why : network_->lost_links())
    if (said.find(why) == std::string::npos) also += str(also.empty() ? "" : "; ", why);
  if (also.empty()) return e;
  return Error(ErrorKind::kPeerLost, str(said, "; lost as well: ", also));
}

void PeerRun::train_steps() {
  const float base_lr = config_.optimizer == OptimizerKind::kAdam ? config_.adam.lr : config_.sgd.lr;
  auto last_progress = SteadyClock::now();  // progress lines: real time, on a simulated cluster too
  for (long long step = first_step_; step < total_steps_; ++step) {
    optimizer_->set_learning_rate(
        scheduled_learning_rate(config_.lr_schedule, base_lr, step, total_steps_, config_.warmup_steps));
    const auto step_start = Clock::now();
    algorithm_->start(step, x_);
    recorder_if_coordinator(step);  // taken over: keep the rows written so far
    const auto gradient_start = Clock::now();
    const float loss = task_->compute_gradient(x_, grads_);
    count_flops(task_->flops_per_step());
    emulate_straggler(seconds_since(gradient_start));
    const double gradient_s = seconds_since(gradient_start);
    const StepTiming timing = algorithm_->finish(step, x_, grads_, *optimizer_);
    if (!std::isfinite(loss))
      throw Error(ErrorKind::kNotConverged,
                  str("peer ", rank_, ": the training loss became ", loss, " at step ", step, "; lower --lr"));
    wall_s_ += seconds_since(step_start);
    compute_s_ += gradient_s + timing.compute_s;
    wait_s_ += timing.wait_s;
    loss_sum_ += loss;
    ++loss_count_;

    const long long done = step + 1;
    const double epoch = static_cast<double>(done) / static_cast<double>(steps_per_epoch_);
    if (membership_->is_coordinator() && recorder_ && seconds_since(last_progress) > 0.5) {
      recorder_->progress(static_cast<double>(done), epoch, loss_sum_ / static_cast<double>(loss_count_), wall_s_,
                          false);
      last_progress = SteadyClock::now();
    }
    if (done % eval_every_ == 0 || done == total_steps_) {
      // With stale gossip, parameters may still be on their way to a neighbour that is about
      // to finish; the last round waits for them, so no peer closes under another's sends.
      if (done == total_steps_ && gossips(config_)) gossip_->flush();
      evaluate(step, epoch);
      gossip_->expect_slow_round();
    }
    if (config_.checkpoint_every > 0 && (done % config_.checkpoint_every == 0 || done == total_steps_)) {
      save(done);
      gossip_->expect_slow_round();
    }
  }
  if (recorder_ && membership_->is_coordinator()) recorder_->finish(*membership_, rank_);
  network_->close();
  log::info("finished ", total_steps_, " steps in ", wall_s_, " s");
}

}  // namespace peertrain::train
