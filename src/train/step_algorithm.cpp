#include "step_algorithm.h"

#include <chrono>

#include "membership.h"
#include "peertrain/algo/choco.h"
#include "peertrain/algo/collectives.h"
#include "peertrain/core/log.h"
#include "peertrain/topology/spectrum.h"
#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"

namespace peertrain::train {
namespace {

using Clock = RunClock;  // simulated seconds on a simulated cluster

// The centralized update: grads holds the sum over `peers`; x ← optimizer step on the mean.
// Returns the seconds it took.
double step_on_mean(std::span<float> x, std::span<float> grads, int peers, Optimizer& optimizer) {
  const auto begin = Clock::now();
  const float inverse_n = 1.0f / static_cast<float>(peers);
  for (float& g : grads) g *= inverse_n;
  optimizer.step(x, grads);
  return seconds_since(begin);
}

// What the gossiping algorithms share: the membership may switch W before a step (a lost
// peer, a comeback), and after the exchange the applied row is traced and newly lost
// neighbours are reported.
class Gossiping : public StepAlgorithm {
 protected:
  explicit Gossiping(StepContext c) : c_(std::move(c)) {
    PEERTRAIN_CHECK(c_.gossip && c_.membership, "a gossiping algorithm needs the gossip and the membership");
  }
  void switch_rows(long long step, std::span<const float> x) {
    if (auto rows = c_.membership->poll(static_cast<std::uint64_t>(step), x))
      c_.gossip->set_rows(adjust(std::move(*rows)));
  }
  virtual std::vector<algo::MixingRow> adjust(std::vector<algo::MixingRow> rows) { return rows; }
  void after_exchange(long long step) {
    if (c_.trace) c_.trace(step, c_.gossip->applied_row());
    if (!c_.gossip->newly_lost().empty())
      c_.membership->report_lost(static_cast<std::uint64_t>(step), c_.gossip->newly_lost());
  }
  StepContext c_;
};

// The step u_k from the gradient (or tracked gradient) g. local: the optimizer's own step
// (u = η·m, m ← βm + g at the peer's own model). quasi-global (Lin et al. 2021, Algorithm
// 1): u = η(βm̂ + g + λx), where m̂ follows the peer's whole move, mixing included,
// m̂ ← βm̂ + (1 − β)(x_k − x_{k+1})/η; so peers on different shards share one direction
// (SGD only).
class MomentumStep {
 public:
  MomentumStep(std::size_t parameters, MomentumForm form) : update_(parameters) {
    if (form == MomentumForm::kQuasiGlobal) {
      buffer_.assign(parameters, 0.0f);
      before_.resize(parameters);
    }
  }
  // u_k, into update().
  void compute(std::span<const float> x, std::span<const float> g, Optimizer& optimizer) {
    if (buffer_.empty()) {
      optimizer.compute_update(x, g, update_);
      return;
    }
    sgd_ = dynamic_cast<const Sgd*>(&optimizer);
    PEERTRAIN_CHECK(sgd_, "quasi-global momentum needs SGD");
    const float lr = sgd_->config().lr, beta = sgd_->config().momentum, wd = sgd_->config().weight_decay;
    std::copy(x.begin(), x.end(), before_.begin());
    for (std::size_t i = 0; i < x.size(); ++i) update_[i] = lr * (beta * buffer_[i] + g[i] + wd * x[i]);
  }
  // After the exchange: x holds x_{k+1}. Returns the seconds it took.
  double moved(std::span<const float> x) {
    if (buffer_.empty()) return 0;
    const auto begin = Clock::now();
    const float beta = sgd_->config().momentum, scale = (1 - beta) / sgd_->config().lr;
    for (std::size_t i = 0; i < x.size(); ++i) buffer_[i] = beta * buffer_[i] + scale * (before_[i] - x[i]);
    return seconds_since(begin);
  }
  std::span<float> update() { return update_; }

 private:
  std::vector<float> update_;
  std::vector<float> buffer_, before_;  // quasi-global: m̂, and x_k
  const Sgd* sgd_ = nullptr;
};

// D-PSGD (Lian et al. 2017). cta: x ← Σ_j W_ij x_j − u, the exchange of x_k overlapping
// the gradient. atc: x ← Σ_j W_ij (x_j − u_j), the exchange after the local step. The
// momentum is local in both by default, the form of Lian et al. for cta and of Lin et al.
// 2021 and Koloskova et al. 2020 for atc, or quasi-global (MomentumStep).
class Dpsgd final : public Gossiping {
 public:
  Dpsgd(StepContext c, std::size_t parameters, UpdateForm form, MomentumForm momentum)
      : Gossiping(std::move(c)), step_(parameters, momentum), form_(form) {}
  void start(long long step, std::span<float> x) override {
    switch_rows(step, x);
    if (form_ == UpdateForm::kCta) c_.gossip->start(step, x);  // overlaps the gradient: both read x_k
  }
  StepTiming finish(long long step, std::span<float> x, std::span<float> grads, Optimizer& optimizer) override {
    StepTiming t;
    const auto begin = Clock::now();
    step_.compute(x, grads, optimizer);
    const std::span<float> update = step_.update();
    if (form_ == UpdateForm::kAtc) {
      for (std::size_t i = 0; i < x.size(); ++i) x[i] -= update[i];
      t.compute_s = seconds_since(begin);
      c_.gossip->start(step, x);
      t.wait_s = c_.gossip->finish(x);
    } else {
      t.compute_s = seconds_since(begin);
      t.wait_s = c_.gossip->finish(x, update);
    }
    t.compute_s += step_.moved(x);
    after_exchange(step);
    return t;
  }

 private:
  MomentumStep step_;
  UpdateForm form_;
};

// CHOCO-SGD (Koloskova, Stich, Jaggi 2019) over algo::ChocoGossip. cta: the compressed
// difference of x_k travels while the gradient is computed, then x ← x + γ·mix − u. atc
// (the paper's Algorithm 2): x − u first, then its difference is compressed, sent and
// mixed. With --compression none and γ = 1 each form is D-PSGD's, up to rounding.
class Choco final : public Gossiping {
 public:
  Choco(StepContext c, std::size_t parameters, UpdateForm form, algo::Compression compression, float gamma,
        std::uint64_t seed)
      : Gossiping(std::move(c)),
        update_(parameters),
        form_(form),
        choco_(*c_.gossip, compression, gamma, seed, c_.topology && c_.topology->time_varying(),
               /*common_start=*/true) {}  // every peer initializes the model from the shared seed
  void start(long long step, std::span<float> x) override {
    switch_rows(step, x);
    choco_.prime(x);  // x_0, which every peer shares
    if (form_ == UpdateForm::kCta) choco_.start(static_cast<std::uint64_t>(step), x);
  }
  StepTiming finish(long long step, std::span<float> x, std::span<float> grads, Optimizer& optimizer) override {
    StepTiming t;
    auto begin = Clock::now();
    optimizer.compute_update(x, grads, update_);
    if (form_ == UpdateForm::kAtc) {
      for (std::size_t i = 0; i < x.size(); ++i) x[i] -= update_[i];
      choco_.start(static_cast<std::uint64_t>(step), x);
      t.compute_s = seconds_since(begin);
      begin = Clock::now();
      t.wait_s = choco_.finish(x);
    } else {
      t.compute_s = seconds_since(begin);
      begin = Clock::now();
      t.wait_s = choco_.finish(x, update_);
    }
    t.compute_s += seconds_since(begin) - t.wait_s;  // decoding and mixing
    after_exchange(step);
    return t;
  }

 private:
  std::vector<float> update_;
  UpdateForm form_;
  algo::ChocoGossip choco_;
};

// D² (Tang, Lian, Yan, Zhang, Liu, ICML 2018): x_{k+1} = W (2x_k − x_{k−1} − u_k + u_{k−1}),
// the first step x_1 = W (x_0 − u_0). The correction cancels the bias that different
// local objectives (non-iid shards) leave in D-PSGD's fixed point. The exchanged vector
// needs u_k, so nothing overlaps the exchange (like atc). With momentum, u is the
// optimizer's update η·m; Tang et al. analyse plain SGD (--momentum 0).
class D2 final : public Gossiping {
 public:
  D2(StepContext c, std::size_t parameters, bool lazy) : Gossiping(std::move(c)), update_(parameters), lazy_(lazy) {
    if (lazy_) c_.gossip->set_rows(lazy_rows(algo::mixing_rows(*c_.topology, c_.rank)));
  }
  void start(long long step, std::span<float> x) override { switch_rows(step, x); }
  StepTiming finish(long long step, std::span<float> x, std::span<float> grads, Optimizer& optimizer) override {
    StepTiming t;
    const auto begin = Clock::now();
    optimizer.compute_update(x, grads, update_);
    const std::size_t n = x.size();
    if (previous_x_.empty()) {
      previous_x_.assign(x.begin(), x.end());
      previous_u_ = update_;
      for (std::size_t i = 0; i < n; ++i) x[i] -= update_[i];
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const float next = 2 * x[i] - previous_x_[i] - update_[i] + previous_u_[i];
        previous_x_[i] = x[i];
        x[i] = next;
      }
      std::swap(previous_u_, update_);
    }
    t.compute_s = seconds_since(begin);
    c_.gossip->start(step, x);
    t.wait_s = c_.gossip->finish(x);
    after_exchange(step);
    return t;
  }

 private:
  std::vector<algo::MixingRow> adjust(std::vector<algo::MixingRow> rows) override {
    return lazy_ ? lazy_rows(std::move(rows)) : rows;
  }
  std::vector<float> update_, previous_x_, previous_u_;
  bool lazy_;
};

// Gradient tracking (DSGT: Pu & Nedić 2020; Nedić, Olshevsky, Shi 2017; Di Lorenzo &
// Scutari 2016): y_k tracks the peers' average gradient, y_0 = g_0 and y_{k+1} = W y_k +
// g_{k+1} − g_k, and the step follows it: x_{k+1} = W (x_k − u_k), u_k the step with y_k
// as its gradient (MomentumStep: local momentum over y, or quasi-global). Non-iid shards
// then do not pull each peer towards its own optimum. x − u and y travel as one message of
// 2N floats, after the local step (like atc), so nothing overlaps the exchange and each
// step sends twice D-PSGD's bytes.
class GradientTracking final : public Gossiping {
 public:
  GradientTracking(StepContext c, std::size_t parameters, MomentumForm momentum)
      : Gossiping(std::move(c)), step_(parameters, momentum), both_(2 * parameters) {}
  void start(long long step, std::span<float> x) override { switch_rows(step, x); }
  StepTiming finish(long long step, std::span<float> x, std::span<float> grads, Optimizer& optimizer) override {
    StepTiming t;
    const auto begin = Clock::now();
    const std::size_t n = x.size();
    const std::span<float> y(both_.data() + n, n);  // holds W y_{k−1} from the last exchange
    // (After W changed, previous_g_ is empty: y starts again from g, see adjust().)
    if (previous_g_.empty()) {
      std::copy(grads.begin(), grads.end(), y.begin());
      previous_g_.assign(grads.begin(), grads.end());
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        y[i] += grads[i] - previous_g_[i];
        previous_g_[i] = grads[i];
      }
    }
    step_.compute(x, y, optimizer);
    const std::span<float> update = step_.update();
    for (std::size_t i = 0; i < n; ++i) both_[i] = x[i] - update[i];
    t.compute_s = seconds_since(begin);
    c_.gossip->start(step, both_);
    t.wait_s = c_.gossip->finish(both_);
    std::copy_n(both_.begin(), n, x.begin());
    t.compute_s += step_.moved(x);
    after_exchange(step);
    return t;
  }

 private:
  // A lost (or returning) peer takes its share of Σy with it, and Σy = Σg no longer holds
  // among the peers that mix: x̄ would drift by that share on every later step. Every
  // peer switches W at the same step, so all restart the tracking there from y = g.
  std::vector<algo::MixingRow> adjust(std::vector<algo::MixingRow> rows) override {
    previous_g_.clear();
    return rows;
  }

  MomentumStep step_;
  std::vector<float> both_, previous_g_;
};

// C-PSGD with an all-reduce of the gradients (ring, tree or recursive doubling), then the
// same step on every peer.
class Allreduce final : public StepAlgorithm {
 public:
  Allreduce(StepContext c, algo::AllreduceAlgo algo)
      : c_(std::move(c)), algo_(algo), peers_(static_cast<std::size_t>(c_.peers)) {
    for (int p = 0; p < c_.peers; ++p) peers_[static_cast<std::size_t>(p)] = p;
  }
  StepTiming finish(long long step, std::span<float> x, std::span<float> grads, Optimizer& optimizer) override {
    StepTiming t;
    const auto begin = Clock::now();
    algo::allreduce(algo_, c_.network, peers_, static_cast<std::uint64_t>(step), grads);
    t.wait_s = seconds_since(begin);
    t.compute_s = step_on_mean(x, grads, c_.peers, optimizer);
    return t;
  }

 private:
  StepContext c_;
  algo::AllreduceAlgo algo_;
  std::vector<int> peers_;
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

std::vector<algo::MixingRow> lazy_rows(std::vector<algo::MixingRow> rows) {
  for (algo::MixingRow& row : rows) {
    row.self_weight = 0.5f + 0.5f * row.self_weight;
    for (float& w : row.weights) w *= 0.5f;
  }
  return rows;
}

std::unique_ptr<StepAlgorithm> make_step_algorithm(const TrainConfig& config, StepContext context,
                                                   std::size_t parameters) {
  const Algorithm algorithm = config.algorithm;
  switch (algorithm) {
    case Algorithm::kDpsgd:
      return std::make_unique<Dpsgd>(std::move(context), parameters, config.update, config.momentum_form);
    case Algorithm::kChoco:
      return std::make_unique<Choco>(std::move(context), parameters, config.update, config.compression,
                                     static_cast<float>(config.choco_gamma()),
                                     config.seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(context.rank));
    case Algorithm::kD2: {
      bool lazy = false;
      if (context.topology && !context.topology->time_varying()) {
        const auto spectrum = topology::analyze_spectrum(context.topology->mixing, context.topology->graph);
        lazy = spectrum.lambda_min <= -1.0 / 3.0 + 1e-6;
        if (lazy && context.rank == 0)
          log::info("d2: W's smallest eigenvalue is ", spectrum.lambda_min,
                    " (D² needs more than -1/3); mixing with (I + W)/2");
      }
      return std::make_unique<D2>(std::move(context), parameters, lazy);
    }
    case Algorithm::kGt:
      return std::make_unique<GradientTracking>(std::move(context), parameters, config.momentum_form);
    case Algorithm::kAllreduce:
      return std::make_unique<Allreduce>(std::move(context), config.allreduce_algo);
    case Algorithm::kPs:
      return std::make_unique<ParameterServer>(std::move(context));
    case Algorithm::kLocal:
      return std::make_unique<Local>();
    case Algorithm::kDiloco:
      return make_diloco(config, std::move(context), parameters);
    case Algorithm::kSgp:
      return make_sgp(config, std::move(context), parameters);
    case Algorithm::kEl:
      return make_epidemic(config, std::move(context), parameters);
    case Algorithm::kAdpsgd:
      break;  // no global step: PeerRun::train_async (peer_async.cpp) runs it
  }
  throw Error(ErrorKind::kInvalidArgument, str("no step algorithm for ", to_string(algorithm)));
}

}  // namespace peertrain::train
