// The step algorithms as the trainer drives them (start, gradient, finish with the
// optimizer), against their serial twins on fresh random gradients that do not depend on
// x, so each twin is a few lines of dense algebra:
//  - D-PSGD atc on the complete graph with W = J is the all-reduce step, to 1e-6;
//  - CHOCO with --compression none and γ = 1 is D-PSGD, in both update forms;
//  - D² is W(2x_k − x_{k−1} − u_k + u_{k−1}), with (I + W)/2 when λ_min(W) ≤ −1/3;
//  - quasi-global momentum is Lin et al.'s recursion, in both update forms;
//  - gradient tracking is its dense recursion, and x̄ moves by the mean gradient;
//  - tree and recursive-doubling all-reduce give the ring's iterates.
#include <gtest/gtest.h>

#include <map>

#include "step_harness.h"

namespace peertrain::train {
namespace {

using topology::Topology;

using harness::topology_from;

constexpr int kDim = 257, kSteps = 6;

std::vector<float> gradient(int rank, int step) { return harness::gradient(rank, step, kDim); }
using harness::every_peer_linked;
using harness::relative;

// Every peer's x after kSteps of `config.algorithm`, all starting from the same x_0.
Eigen::MatrixXf run_algorithm(const Topology& t, const TrainConfig& config) {
  return harness::run_steps(t, config, {kSteps, kDim, {}}).back();
}

TrainConfig config_for(Algorithm algorithm, float momentum = 0.9f) {
  TrainConfig c;
  c.algorithm = algorithm;
  c.sgd = {0.05f, momentum, 1e-4f};
  return c;
}

TEST(UpdateForm, AtcWithEqualWeightsIsTheAllreduceStep) {
  const Topology t = topology_from("graph: {generator: complete, n: 4}");  // Metropolis: every weight 1/4
  TrainConfig atc = config_for(Algorithm::kDpsgd);
  atc.update = UpdateForm::kAtc;
  const Eigen::MatrixXf got = run_algorithm(t, atc);
  const Eigen::MatrixXf reference = run_algorithm(t, config_for(Algorithm::kAllreduce));
  EXPECT_LT(relative(got, reference), 1e-6);
  // cta is not: its momentum is taken at the unmixed model, a step behind.
  EXPECT_GT(relative(run_algorithm(t, config_for(Algorithm::kDpsgd)), reference), 1e-3);
}

TEST(UpdateForm, ChocoWithoutCompressionIsDpsgdInBothForms) {
  const Topology t = topology_from("graph: {generator: ring, n: 6}");
  for (UpdateForm form : {UpdateForm::kCta, UpdateForm::kAtc}) {
    SCOPED_TRACE(form == UpdateForm::kCta ? "cta" : "atc");
    TrainConfig dpsgd = config_for(Algorithm::kDpsgd), choco = config_for(Algorithm::kChoco);
    dpsgd.update = choco.update = form;
    choco.gossip_step = 1.0;
    EXPECT_LT(relative(run_algorithm(t, choco), run_algorithm(t, dpsgd)), 1e-6);
  }
}

// D² in dense form: X_1 = W(X_0 − U_0), X_{k+1} = W(2X_k − X_{k−1} − U_k + U_{k−1}), U = lr·G.
Eigen::MatrixXf d2_twin(const Eigen::MatrixXf& w, int n, float lr) {
  Rng init(3);
  Eigen::RowVectorXf x0(kDim);
  for (int j = 0; j < kDim; ++j) x0(j) = static_cast<float>(init.normal());
  Eigen::MatrixXf x = x0.replicate(n, 1), previous_x, previous_u;
  for (int k = 0; k < kSteps; ++k) {
    Eigen::MatrixXf u(n, kDim);
    for (int i = 0; i < n; ++i) {
      const auto g = gradient(i, k);
      for (int j = 0; j < kDim; ++j) u(i, j) = lr * g[static_cast<std::size_t>(j)];
    }
    Eigen::MatrixXf z = k == 0 ? Eigen::MatrixXf(x - u) : Eigen::MatrixXf(2 * x - previous_x - u + previous_u);
    previous_x = x;
    previous_u = u;
    x = w * z;
  }
  return x;
}

TEST(D2, EqualsItsDenseRecursion) {
  for (const auto& [yaml, lazy] : {std::pair{"graph: {generator: ring, n: 5}", false},    // λ_min ≈ −0.21
                                   std::pair{"graph: {generator: ring, n: 6}", true}}) {  // λ_min = −1/3
    SCOPED_TRACE(yaml);
    const Topology t = topology_from(yaml);
    TrainConfig d2 = config_for(Algorithm::kD2, 0.0f);
    d2.sgd.weight_decay = 0;
    Eigen::MatrixXf w = Eigen::MatrixXd(t.mixing).cast<float>();
    if (lazy) w = (0.5f * (Eigen::MatrixXf::Identity(t.num_peers(), t.num_peers()) + w)).eval();
    EXPECT_LT(relative(run_algorithm(t, d2), d2_twin(w, t.num_peers(), d2.sgd.lr)), 1e-5);
  }
}

// QG-DSGDm in dense form (Lin et al. 2021, Algorithm 1): U = η(βM̂ + G + wd·X); atc
// X' = W(X − U), cta X' = WX − U; M̂ ← βM̂ + (1 − β)(X − X')/η.
Eigen::MatrixXf quasi_global_twin(const Eigen::MatrixXf& w, int n, const SgdConfig& sgd, UpdateForm form) {
  Rng init(3);
  Eigen::RowVectorXf x0(kDim);
  for (int j = 0; j < kDim; ++j) x0(j) = static_cast<float>(init.normal());
  Eigen::MatrixXf x = x0.replicate(n, 1), buffer = Eigen::MatrixXf::Zero(n, kDim);
  for (int k = 0; k < kSteps; ++k) {
    Eigen::MatrixXf g(n, kDim);
    for (int i = 0; i < n; ++i) {
      const auto gi = gradient(i, k);
      for (int j = 0; j < kDim; ++j) g(i, j) = gi[static_cast<std::size_t>(j)];
    }
    const Eigen::MatrixXf u = sgd.lr * (sgd.momentum * buffer + g + sgd.weight_decay * x);
    const Eigen::MatrixXf next = form == UpdateForm::kAtc ? Eigen::MatrixXf(w * (x - u)) : Eigen::MatrixXf(w * x - u);
    buffer = sgd.momentum * buffer + (1 - sgd.momentum) / sgd.lr * (x - next);
    x = next;
  }
  return x;
}

TEST(UpdateForm, QuasiGlobalMomentumIsLinEtAlsRecursion) {
  const Topology t = topology_from("graph: {generator: ring, n: 6}");
  const Eigen::MatrixXf w = Eigen::MatrixXd(t.mixing).cast<float>();
  for (UpdateForm form : {UpdateForm::kCta, UpdateForm::kAtc}) {
    SCOPED_TRACE(form == UpdateForm::kCta ? "cta" : "atc");
    TrainConfig c = config_for(Algorithm::kDpsgd);
    c.update = form;
    c.momentum_form = MomentumForm::kQuasiGlobal;
    const Eigen::MatrixXf got = run_algorithm(t, c);
    EXPECT_LT(relative(got, quasi_global_twin(w, t.num_peers(), c.sgd, form)), 1e-5);
    // It is not the local heavy ball.
    TrainConfig local = c;
    local.momentum_form = MomentumForm::kLocal;
    EXPECT_GT(relative(run_algorithm(t, local), got), 1e-3);
  }
}

// Gradient tracking in dense form: Y_0 = G_0, Y_{k+1} = W Y_k + G_{k+1} − G_k, X_{k+1} =
// W(X_k − U_k). U_k is plain SGD's η Y_k, or with quasi-global momentum η(βM̂ + Y_k + wd·X_k)
// and M̂ ← βM̂ + (1 − β)(X_k − X_{k+1})/η.
Eigen::MatrixXf tracking_twin(const Eigen::MatrixXf& w, int n, const SgdConfig& sgd, MomentumForm form) {
  Rng init(3);
  Eigen::RowVectorXf x0(kDim);
  for (int j = 0; j < kDim; ++j) x0(j) = static_cast<float>(init.normal());
  Eigen::MatrixXf x = x0.replicate(n, 1), y, previous_g, buffer = Eigen::MatrixXf::Zero(n, kDim);
  for (int k = 0; k < kSteps; ++k) {
    Eigen::MatrixXf g(n, kDim);
    for (int i = 0; i < n; ++i) {
      const auto gi = gradient(i, k);
      for (int j = 0; j < kDim; ++j) g(i, j) = gi[static_cast<std::size_t>(j)];
    }
    y = k == 0 ? g : Eigen::MatrixXf(w * y + g - previous_g);
    previous_g = g;
    const Eigen::MatrixXf u = form == MomentumForm::kLocal
                                  ? Eigen::MatrixXf(sgd.lr * y)
                                  : Eigen::MatrixXf(sgd.lr * (sgd.momentum * buffer + y + sgd.weight_decay * x));
    const Eigen::MatrixXf next = w * (x - u);
    buffer = sgd.momentum * buffer + (1 - sgd.momentum) / sgd.lr * (x - next);
    x = next;
  }
  return x;
}

TEST(GradientTracking, EqualsItsDenseRecursionAndTracksTheMeanGradient) {
  const Topology t = topology_from("graph: {generator: ring, n: 6}");
  TrainConfig gt = config_for(Algorithm::kGt, 0.0f);
  gt.sgd.weight_decay = 0;
  const Eigen::MatrixXf w = Eigen::MatrixXd(t.mixing).cast<float>();
  const Eigen::MatrixXf got = run_algorithm(t, gt);
  EXPECT_LT(relative(got, tracking_twin(w, t.num_peers(), gt.sgd, MomentumForm::kLocal)), 1e-5);
  // x̄ moves by exactly −η·(mean gradient) per step: W keeps the mean of x, and that of y is ḡ_k.
  Rng init(3);
  Eigen::RowVectorXf expected(kDim);
  for (int j = 0; j < kDim; ++j) expected(j) = static_cast<float>(init.normal());
  for (int k = 0; k < kSteps; ++k)
    for (int i = 0; i < t.num_peers(); ++i) {
      const auto g = gradient(i, k);
      for (int j = 0; j < kDim; ++j) expected(j) -= gt.sgd.lr * g[static_cast<std::size_t>(j)] / t.num_peers();
    }
  EXPECT_LT((got.colwise().mean() - expected).norm() / expected.norm(), 1e-5);
}

TEST(GradientTracking, WithQuasiGlobalMomentumEqualsItsDenseRecursion) {
  const Topology t = topology_from("graph: {generator: ring, n: 6}");
  TrainConfig gt = config_for(Algorithm::kGt);
  gt.momentum_form = MomentumForm::kQuasiGlobal;
  const Eigen::MatrixXf w = Eigen::MatrixXd(t.mixing).cast<float>();
  const Eigen::MatrixXf got = run_algorithm(t, gt);
  EXPECT_LT(relative(got, tracking_twin(w, t.num_peers(), gt.sgd, MomentumForm::kQuasiGlobal)), 1e-5);
  TrainConfig local = gt;  // the local heavy ball over y differs
  local.momentum_form = MomentumForm::kLocal;
  EXPECT_GT(relative(run_algorithm(t, local), got), 1e-3);
}

// A peer crashes at step 8 of 40 on a ring of 6. The survivors recompute W at one agreed
// step and restart the tracking there (y = g), so from then on their mean x moves by exactly
// −η·(their mean gradient) again; without the restart the crashed peer's share of Σy
// would bias every later step by the same amount.
TEST(GradientTracking, AfterALostPeerTheSurvivorsTrackTheirMeanGradientAgain) {
  const Topology t = topology_from("graph: {generator: ring, n: 6}");
  const int n = t.num_peers(), victim = 3;
  constexpr int kLong = 40, kDeath = 8;
  TrainConfig gt = config_for(Algorithm::kGt, 0.0f);
  gt.sgd.weight_decay = 0;
  net::LoopbackFabric fabric(every_peer_linked(n, 5));
  std::mutex mutex;
  std::map<std::pair<int, int>, std::vector<float>> after;  // (peer, step): x after the step
  testing::run_peers(n, [&](int rank) {
    auto net = fabric.transport(rank);
    algo::Gossip gossip(*net, algo::mixing_rows(t, rank));
    Membership membership(*net, t, rank, {SplitPolicy::kContinue, 0, kLong, 0});
    auto algorithm = make_step_algorithm(gt, {*net, rank, n, &gossip, &membership, {}, &t, kSteps, {}}, kDim);
    auto optimizer = make_optimizer(OptimizerKind::kSgd, kDim, gt.sgd, gt.adam);
    Rng init(3);
    std::vector<float> x(kDim);
    for (float& v : x) v = static_cast<float>(init.normal());
    for (int k = 0; k < kLong; ++k) {
      if (rank == victim && k == kDeath) return net->abort();
      algorithm->start(k, x);
      std::vector<float> g = gradient(rank, k);
      algorithm->finish(k, x, g, *optimizer);
      std::lock_guard lock(mutex);
      after[{rank, k}] = x;
    }
    net->close();
  });
  // r_k = x̄_{k+1} − x̄_k + η ḡ_k over the survivors, relative to η‖ḡ_k‖.
  auto residual = [&](int k) {
    Eigen::VectorXd step = Eigen::VectorXd::Zero(kDim), mean_g = Eigen::VectorXd::Zero(kDim);
    for (int p = 0; p < n; ++p) {
      if (p == victim) continue;
      const auto g = gradient(p, k);
      for (int j = 0; j < kDim; ++j) {
        step(j) += after.at({p, k})[static_cast<std::size_t>(j)] - after.at({p, k - 1})[static_cast<std::size_t>(j)];
        mean_g(j) += g[static_cast<std::size_t>(j)];
      }
    }
    step /= n - 1;
    mean_g /= n - 1;
    return (step + gt.sgd.lr * mean_g).norm() / (gt.sgd.lr * mean_g.norm());
  };
  // The membership switches within a few steps of the crash; the last ten are well after.
  for (int k = kLong - 10; k < kLong; ++k) EXPECT_LT(residual(k), 1e-4) << "step " << k;
}

TEST(Allreduce, TreeAndRecursiveDoublingGiveTheRingsIterates) {
  const Topology t = topology_from("graph: {generator: complete, n: 6}");
  const Eigen::MatrixXf ring = run_algorithm(t, config_for(Algorithm::kAllreduce));
  for (auto algo : {algo::AllreduceAlgo::kTree, algo::AllreduceAlgo::kRecursiveDoubling}) {
    TrainConfig c = config_for(Algorithm::kAllreduce);
    c.allreduce_algo = algo;
    EXPECT_LT(relative(run_algorithm(t, c), ring), 1e-6) << algo::to_string(algo);
  }
}

}  // namespace
}  // namespace peertrain::train
