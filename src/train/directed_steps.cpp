// Stochastic Gradient Push and Epidemic Learning: the step algorithms over directed graphs
// (algo::PushGossip).
#include <cmath>

#include "membership.h"
#include "peertrain/algo/push_gossip.h"
#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"
#include "peertrain/core/log.h"
#include "step_algorithm.h"

namespace peertrain::train {
namespace {

using Clock = RunClock;

// What both share: the membership is polled every step (it keeps reports and takeovers
// moving); its recomputed W is not needed, since push-sum and a row average each take a
// lost peer out on their own (algo/push_gossip.h). Lost sources are reported to it.
class DirectedStep : public StepAlgorithm {
 protected:
  DirectedStep(StepContext c, algo::DirectedMixing mixing, int max_delay)
      : c_(std::move(c)), gossip_(c_.network, mixing, max_delay) {
    PEERTRAIN_CHECK(c_.membership && c_.topology, "a directed algorithm needs the membership and the topology");
  }
  void poll(long long step, std::span<const float> x) {
    (void)c_.membership->poll(static_cast<std::uint64_t>(step), x);
  }
  virtual algo::DirectedRow row(long long step) const = 0;
  // cta: the push of v starts in start() (v_k, while the gradient is computed); atc: after
  // the local step.
  void start_push(long long step, std::span<const float> v, UpdateForm form, UpdateForm now) {
    if (form == now) gossip_.start(static_cast<std::uint64_t>(step), row(step), v);
  }
  // The local step u and the mix, as the form says: cta v ← Mv − u (its push under way),
  // atc v ← M(v − u). `began` is when the step's own arithmetic began.
  StepTiming step_and_mix(long long step, std::span<float> v, std::span<const float> update, UpdateForm form,
                          RunClock::time_point began) {
    StepTiming t;
    if (form == UpdateForm::kAtc) {
      for (std::size_t i = 0; i < v.size(); ++i) v[i] -= update[i];
      t.compute_s = seconds_since(began);
      start_push(step, v, form, UpdateForm::kAtc);
      t.wait_s = gossip_.finish(v);
    } else {
      t.compute_s = seconds_since(began);
      t.wait_s = gossip_.finish(v, update);
    }
    return t;
  }
  void after_exchange(long long step) {
    if (c_.trace) {
      const algo::DirectedRow& row = gossip_.applied_row();
      c_.trace(step, algo::MixingRow{row.sources, row.weights, row.self_weight});
    }
    if (!gossip_.newly_lost().empty())
      c_.membership->report_lost(static_cast<std::uint64_t>(step), gossip_.newly_lost());
  }
  StepContext c_;
  algo::PushGossip gossip_;
};

// SGP (Assran, Loizou, Ballas, Rabbat, ICML 2019): every peer holds the numerator x and the
// weight w, mixes both with the column-stochastic P(t) of the topology, and computes its
// gradient at the de-biased z = x/w, which is what the trainer holds and evaluates.
// cta: (x, w) ← P(x, w) − (u, 0), the push overlapping the gradient at z; atc: x − u
// first, then the push. With max_delay D > 0 a message is mixed when it arrives, at most D
// steps late (overlap SGP); the last step takes every message still owed. On a symmetric
// doubly stochastic W, w stays 1 and this is D-PSGD.
class Sgp final : public DirectedStep {
 public:
  Sgp(StepContext c, std::size_t parameters, UpdateForm form, int max_delay)
      : DirectedStep(std::move(c), algo::DirectedMixing::kPushSum, max_delay),
        numerator_(parameters + 1),
        update_(parameters + 1, 0.0f),
        form_(form) {
    const topology::Topology& t = *c_.topology;
    if (!t.redrawn())
      for (int step = 0; step < t.period(); ++step) rows_.push_back(algo::directed_row(t.mixing_at(step), c_.rank));
  }
  void start(long long step, std::span<float> z) override {
    poll(step, z);
    if (!started_) {  // x_0 = z_0 (shared by every peer), w_0 = 1
      std::copy(z.begin(), z.end(), numerator_.begin());
      numerator_.back() = 1.0f;
      started_ = true;
    }
    start_push(step, numerator_, form_, UpdateForm::kCta);
  }
  StepTiming finish(long long step, std::span<float> z, std::span<float> grads, Optimizer& optimizer) override {
    auto begin = Clock::now();
    const std::size_t n = z.size();
    optimizer.compute_update(z, grads, std::span<float>(update_.data(), n));
    StepTiming t = step_and_mix(step, numerator_, update_, form_, begin);  // w's update is 0
    if (gossip_.max_delay() > 0 && step + 1 == c_.total_steps) t.wait_s += gossip_.drain(numerator_);
    begin = Clock::now();
    const float w = numerator_.back();
    for (std::size_t i = 0; i < n; ++i) z[i] = numerator_[i] / w;
    t.compute_s += seconds_since(begin);
    after_exchange(step);
    return t;
  }

 private:
  algo::DirectedRow row(long long step) const override {
    if (rows_.empty()) return algo::directed_row(c_.topology->mixing_at(step), c_.rank);
    return rows_[static_cast<std::size_t>(step % static_cast<long long>(rows_.size()))];
  }
  std::vector<float> numerator_;         // x, then w
  std::vector<float> update_;            // u, then 0 for w
  std::vector<algo::DirectedRow> rows_;  // one period; empty when the graph is redrawn each step
  UpdateForm form_;
  bool started_ = false;
};

// Epidemic Learning (de Vos, Farhadkhani, Guerraoui, Kermarrec, Pires, Sharma, NeurIPS
// 2023): each round every peer sends its model to s peers of a random digraph drawn from
// the run's seed and the step, and averages its own with those it received, uniformly.
// atc (the paper's): the local step first, then the exchange; cta overlaps it with the gradient.
class EpidemicLearning final : public DirectedStep {
 public:
  EpidemicLearning(StepContext c, std::size_t parameters, UpdateForm form, int fanout, EpidemicVariant variant,
                   std::uint64_t seed)
      : DirectedStep(std::move(c), algo::DirectedMixing::kRows, 0),
        update_(parameters),
        form_(form),
        fanout_(fanout),
        variant_(variant),
        seed_(seed) {}
  void start(long long step, std::span<float> x) override {
    poll(step, x);
    start_push(step, x, form_, UpdateForm::kCta);
  }
  StepTiming finish(long long step, std::span<float> x, std::span<float> grads, Optimizer& optimizer) override {
    const auto begin = Clock::now();
    optimizer.compute_update(x, grads, update_);
    const StepTiming t = step_and_mix(step, x, update_, form_, begin);
    after_exchange(step);
    return t;
  }

 private:
  algo::DirectedRow row(long long step) const override {
    const int n = c_.peers;
    const topology::Digraph g = variant_ == EpidemicVariant::kOracle
                                    ? topology::random_regular_out_step(n, fanout_, seed_, step)
                                    : topology::random_out_step(n, fanout_, seed_, step);
    algo::DirectedRow row;
    row.targets.assign(g.out(c_.rank).begin(), g.out(c_.rank).end());
    row.shares.assign(row.targets.size(), 0.0f);  // a row average: the sender keeps nothing back
    row.sources.assign(g.in(c_.rank).begin(), g.in(c_.rank).end());
    const float weight = 1.0f / static_cast<float>(1 + row.sources.size());
    row.weights.assign(row.sources.size(), weight);
    row.self_weight = weight;
    return row;
  }
  std::vector<float> update_;
  UpdateForm form_;
  int fanout_;
  EpidemicVariant variant_;
  std::uint64_t seed_;
};

}  // namespace

std::unique_ptr<StepAlgorithm> make_sgp(const TrainConfig& config, StepContext context, std::size_t parameters) {
  return std::make_unique<Sgp>(std::move(context), parameters, config.update, config.max_staleness);
}

std::unique_ptr<StepAlgorithm> make_epidemic(const TrainConfig& config, StepContext context, std::size_t parameters) {
  const int n = context.peers;
  const int fanout = config.fanout > 0 ? config.fanout : topology::default_fanout(n);
  if (n < 2 || fanout > n - 1)
    throw Error(ErrorKind::kInvalidArgument,
                str("--fanout ", fanout, " needs at least ", fanout + 1, " peers; the topology has ", n));
  if (context.rank == 0)
    log::info("el: each round every peer sends to ", fanout, " peers (",
              config.el_variant == EpidemicVariant::kOracle ? "an s-regular digraph" : "each drawing its own", ")");
  // The graph's own stream: every peer draws the same digraph from the run's seed.
  return std::make_unique<EpidemicLearning>(std::move(context), parameters, config.update, fanout, config.el_variant,
                                            config.seed ^ 0x5eed0fe1ULL);
}

}  // namespace peertrain::train
