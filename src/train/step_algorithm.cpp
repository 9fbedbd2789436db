#include "step_algorithm.h"

#include <chrono>

#include "membership.h"
#include "peertrain/algo/collectives.h"
#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"

namespace peertrain::train {
namespace {

using Clock = SteadyClock;

// The centralized update: grads holds the sum over `peers`; x ← optimizer step on the mean.
// Returns the seconds it took.
double step_on_mean(std::span<float> x, std::span<float> grads, int peers, Optimizer& optimizer) {
  const auto begin = Clock::now();
  const float inverse_n = 1.0f / static_cast<float>(peers);
  for (float& g : grads) g *= inverse_n;
  optimizer.step(x, grads);
  return seconds_since(begin);
}

// D-PSGD (Lian et al. 2017): x ← Σ_j W_ij x_j − u, the exchange of x_k overlapping the
// gradient. Before each step the membership may switch W (a lost peer, a comeback).
class Dpsgd final : public StepAlgorithm {
 public:
  Dpsgd(StepContext c, std::size_t parameters) : c_(std::move(c)), update_(parameters) {
    PEERTRAIN_CHECK(c_.gossip && c_.membership, "D-PSGD needs the gossip and the membership");
  }
  void start(long long step, std::span<float> x) override {
    if (auto rows = c_.membership->poll(static_cast<std::uint64_t>(step), x)) c_.gossip->set_rows(std::move(*rows));
    c_.gossip->start(step, x);  // overlaps the gradient: both read x_k
  }
  StepTiming finish(long long step, std::span<float> x, std::span<float> grads, Optimizer& optimizer) override {
    StepTiming t;
    const auto begin = Clock::now();
    optimizer.compute_update(x, grads, update_);
    t.compute_s = seconds_since(begin);
    t.wait_s = c_.gossip->finish(x, update_);
    if (c_.trace) c_.trace(step, c_.gossip->applied_row());
    if (!c_.gossip->newly_lost().empty())
      c_.membership->report_lost(static_cast<std::uint64_t>(step), c_.gossip->newly_lost());
    return t;
  }

 private:
  StepContext c_;
  std::vector<float> update_;
};

// C-PSGD with a ring all-reduce of the gradients, then the same step on every peer.
class Allreduce final : public StepAlgorithm {
 public:
  explicit Allreduce(StepContext c) : c_(std::move(c)), ring_(static_cast<std::size_t>(c_.peers)) {
    for (int p = 0; p < c_.peers; ++p) ring_[static_cast<std::size_t>(p)] = p;
  }
  StepTiming finish(long long step, std::span<float> x, std::span<float> grads, Optimizer& optimizer) override {
    StepTiming t;
    const auto begin = Clock::now();
    algo::ring_allreduce(c_.network, ring_, step, grads);
    t.wait_s = seconds_since(begin);
    t.compute_s = step_on_mean(x, grads, c_.peers, optimizer);
    return t;
  }

 private:
  StepContext c_;
  std::vector<int> ring_;
};

// C-PSGD with a parameter server on peer 0: the workers push gradients and pull x.
class ParameterServer final : public StepAlgorithm {
 public:
  explicit ParameterServer(StepContext c) : c_(std::move(c)) {
    for (int p = 1; p < c_.peers; ++p) workers_.push_back(p);
  }
  StepTiming finish(long long step, std::span<float> x, std::span<float> grads, Optimizer& optimizer) override {
    StepTiming t;
    auto begin = Clock::now();
    if (c_.rank != 0) {
      algo::ps_push_pull(c_.network, 0, step, grads, x);
      t.wait_s = seconds_since(begin);
      return t;
    }
    algo::ps_gather(c_.network, workers_, step, grads);
    t.wait_s = seconds_since(begin);
    t.compute_s = step_on_mean(x, grads, c_.peers, optimizer);
    begin = Clock::now();
    algo::ps_broadcast(c_.network, workers_, step, x);
    t.wait_s += seconds_since(begin);
    return t;
  }

 private:
  StepContext c_;
  std::vector<int> workers_;
};

// Each peer alone: the baseline without communication.
class Local final : public StepAlgorithm {
 public:
  StepTiming finish(long long, std::span<float> x, std::span<float> grads, Optimizer& optimizer) override {
    StepTiming t;
    const auto begin = Clock::now();
    optimizer.step(x, grads);
    t.compute_s = seconds_since(begin);
    return t;
  }
};

}  // namespace

std::unique_ptr<StepAlgorithm> make_step_algorithm(Algorithm algorithm, StepContext context, std::size_t parameters) {
  switch (algorithm) {
    case Algorithm::kDpsgd:
      return std::make_unique<Dpsgd>(std::move(context), parameters);
    case Algorithm::kAllreduce:
      return std::make_unique<Allreduce>(std::move(context));
    case Algorithm::kPs:
      return std::make_unique<ParameterServer>(std::move(context));
    case Algorithm::kLocal:
      return std::make_unique<Local>();
  }
  throw Error(ErrorKind::kInvalidArgument, str("no step algorithm for ", to_string(algorithm)));
}

}  // namespace peertrain::train
