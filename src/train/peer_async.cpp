// AD-PSGD's loop for PeerRun (Lian et al., ICML 2018; the protocol is in
// algo/async_gossip.h). Each peer steps at its own pace: it copies x, computes the
// gradient on the copy, and applies it to x, which the averagings may have moved
// meanwhile (the gradient is then stale by those averagings, as in the paper). After each
// step it asks a random neighbour for an averaging, unless one is still under way.
//
// Without a global step there is no common step to evaluate x̄ at. The run ends when the
// peers' sample counts, gossiped with every message, reach --epochs' worth of samples (or
// at --time-budget); then every peer reports its final model to the coordinator in one
// round, and x̄ is the average of those final models: every averaging has finished by
// then (stop() waits for the answers), so it is the x̄ the run ended with. The learning
// rate follows the schedule by the samples seen, all peers together.
#include <cmath>
#include <mutex>

#include "peer_run.h"
#include "peertrain/algo/async_gossip.h"
#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"
#include "peertrain/core/log.h"

namespace peertrain::train {
namespace {

constexpr std::uint64_t kFinalRound = std::uint64_t{1} << 62;  // the report round's key, clear of any step

}  // namespace

void PeerRun::train_async() {
  const auto neighbours = t_.graph.neighbors(rank_);
  const double samples_per_step = static_cast<double>(n_) * config_.batch;  // the synchronous step, all peers
  std::mutex x_mutex;
  algo::AsyncGossip gossip(*network_, x_, x_mutex,
                           {{neighbours.begin(), neighbours.end()},
                            n_,
                            config_.time_budget_s > 0 ? 0.0 : static_cast<double>(total_steps_) * samples_per_step,
                            config_.time_budget_s,
                            config_.seed,
                            false});
  lower_compute_priority();  // the protocol thread, started above, keeps the normal priority
  const float base_lr = config_.optimizer == OptimizerKind::kAdam ? config_.adam.lr : config_.sgd.lr;
  std::vector<float> snapshot(size_);
  long long steps = 0;
  const auto start = SteadyClock::now();
  auto last_progress = start;
  while (!gossip.finished()) {
    const double known = gossip.known_samples();
    const auto global_step = static_cast<long long>(known / samples_per_step);
    optimizer_->set_learning_rate(scheduled_learning_rate(
        config_.lr_schedule, base_lr, std::min(global_step, total_steps_ - 1), total_steps_, config_.warmup_steps));
    {
      std::lock_guard lock(x_mutex);
      snapshot = x_;
    }
    const auto gradient_start = SteadyClock::now();
    const float loss = task_->compute_gradient(snapshot, grads_);
    emulate_straggler(seconds_since(gradient_start));
    compute_s_ += seconds_since(gradient_start);
    if (!std::isfinite(loss))
      throw Error(ErrorKind::kNotConverged,
                  str("peer ", rank_, ": the training loss became ", loss, " at its step ", steps, "; lower --lr"));
    const auto wait_start = SteadyClock::now();
    {
      std::lock_guard lock(x_mutex);  // held briefly by an averaging in progress
      wait_s_ += seconds_since(wait_start);
      const auto update_start = SteadyClock::now();
      optimizer_->step(x_, grads_);
      compute_s_ += seconds_since(update_start);
    }
    gossip.step_done(config_.batch);
    ++steps;
    loss_sum_ += loss;
    ++loss_count_;
    wall_s_ = seconds_since(start);
    if (membership_->is_coordinator() && recorder_ && seconds_since(last_progress) > 0.5) {
      const double global = gossip.known_samples() / samples_per_step;
      recorder_->progress(global, global / static_cast<double>(steps_per_epoch_),
                          loss_sum_ / static_cast<double>(loss_count_), wall_s_, false);
      last_progress = SteadyClock::now();
    }
  }
  gossip.stop();
  wall_s_ = seconds_since(start);
  const algo::AsyncGossipStats s = gossip.stats();
  log::info("adpsgd: ", steps, " steps; asked for ", s.requested, " averagings (", s.averaged, " done, ", s.refused,
            " refused), served ", s.served, " and declined ", s.declined, " of the neighbours', ", s.crossed,
            " crossed; no averaging started at ", s.skipped, " steps (one under way); ",
            s.requested > 0 ? s.exchange_s / static_cast<double>(s.requested) * 1e3 : 0.0, " ms per averaging");
  for (const auto& [peer, why] : gossip.lost()) log::warn("adpsgd: lost ", network_->peer_name(peer), ": ", why);
  const double epochs = gossip.known_samples() / samples_per_step / static_cast<double>(steps_per_epoch_);
  evaluate(std::max<long long>(steps, 1) - 1, epochs, kFinalRound);
  if (recorder_ && membership_->is_coordinator()) recorder_->finish(*membership_, rank_);
  network_->close();
  log::info("finished ", steps, " steps in ", wall_s_, " s");
}

}  // namespace peertrain::train
