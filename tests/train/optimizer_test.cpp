// SGD against a trajectory worked out by hand, and the D-PSGD split (compute_update, then
// subtract) against the centralized step.
#include <gtest/gtest.h>
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "peertrain/core/error.h"
#include "peertrain/train/optimizer.h"

namespace peertrain::train {
namespace {

// lr 0.1, momentum 0.5, weight decay 0.1, x0 = (1, -2), gradients g1..g3 below.
//   step 1: d = g + 0.1x = (0.6, -0.2) + (0.1, -0.2) = (0.7, -0.4);  v = d;       x = (0.93, -1.96)
//   step 2: d = (-0.4, 0.0) + (0.093, -0.196) = (-0.307, -0.196);
//           v = 0.5(0.7, -0.4) + d = (0.043, -0.396);                          x = (0.9257, -1.9204)
//   step 3: d = (0.2, 1.0) + (0.09257, -0.19204) = (0.29257, 0.80796);
//           v = 0.5(0.043, -0.396) + d = (0.31407, 0.60996);                   x = (0.894293, -1.981396)
TEST(Sgd, FollowsAHandComputedMomentumAndWeightDecayTrajectory) {
  Sgd sgd(2, {.lr = 0.1f, .momentum = 0.5f, .weight_decay = 0.1f});
  std::vector<float> x = {1.0f, -2.0f};
  const std::vector<std::vector<float>> grads = {{0.6f, -0.2f}, {-0.4f, 0.0f}, {0.2f, 1.0f}};
  const std::vector<std::vector<double>> want_x = {{0.93, -1.96}, {0.9257, -1.9204}, {0.894293, -1.981396}};
  const std::vector<std::vector<double>> want_v = {{0.7, -0.4}, {0.043, -0.396}, {0.31407, 0.60996}};
  for (std::size_t k = 0; k < grads.size(); ++k) {
    sgd.step(x, grads[k]);
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(x[i], want_x[k][i], 1e-6) << "step " << k + 1 << " x[" << i << "]";
      EXPECT_NEAR(sgd.momentum()[i], want_v[k][i], 1e-6) << "step " << k + 1 << " v[" << i << "]";
    }
  }
}

// Four steps of `central` against `split`'s compute_update then a subtraction (what D-PSGD
// applies to the mixed parameters), over n coordinates: compute_update leaves the
// parameters alone, and the two agree to a float's last bit or two (step() may fuse
// x − u into one FMA, which rounds once where the split rounds twice). Then their states.
void expect_compute_update_then_subtract_equals_step(Optimizer& central, Optimizer& split, std::size_t n) {
  std::vector<float> x(n), y(n), g(n), update(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = y[i] = 0.1f * static_cast<float>(i) - 1.5f;
  for (int step = 0; step < 4; ++step) {
    for (std::size_t i = 0; i < n; ++i) g[i] = 0.01f * static_cast<float>((i * 7 + step * 3) % 11) - 0.05f;
    central.step(x, g);
    const std::vector<float> before = y;
    split.compute_update(y, g, update);
    EXPECT_EQ(y, before) << "compute_update changed the parameters";
    for (std::size_t i = 0; i < n; ++i) y[i] -= update[i];
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_NEAR(x[i], y[i], 2e-7 * (1 + std::abs(x[i]))) << "step " << step << " element " << i;
  }
  const auto a = central.state(), b = split.state();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 2e-7 * (1 + std::abs(a[i]))) << "state " << i;
}

TEST(Sgd, ComputeUpdateThenSubtractEqualsStep) {
  const SgdConfig config{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f};
  Sgd central(37, config), split(37, config);
  expect_compute_update_then_subtract_equals_step(central, split, 37);
}

TEST(Sgd, BadSettingsAreReported) {
  EXPECT_THROW(Sgd(3, {.lr = 0.0f}), Error);
  EXPECT_THROW(Sgd(3, {.lr = 0.1f, .momentum = 1.0f}), Error);
  EXPECT_THROW(Sgd(3, {.lr = 0.1f, .momentum = 0.9f, .weight_decay = -1.0f}), Error);
  Sgd sgd(3, {});
  std::vector<float> x(3), g(2);
  EXPECT_THROW(sgd.step(x, g), Error);  // a size mismatch is a bug, reported as kInternal
}


// A resumed run restores x and v; from there its updates must be the original run's, bit
// for bit, in both the centralized and the D-PSGD form.
TEST(Sgd, RestoredMomentumGivesIdenticalUpdates) {
  const SgdConfig config{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f};
  constexpr std::size_t n = 53;
  auto grads_at = [](int step) {
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i)
      g[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(step));
    return g;
  };
  Sgd original(n, config);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = std::cos(0.11f * static_cast<float>(i));
  for (int step = 0; step < 3; ++step) original.step(x, grads_at(step));

  Sgd resumed(n, config);
  resumed.restore_momentum(original.momentum());
  EXPECT_TRUE(std::equal(original.momentum().begin(), original.momentum().end(), resumed.momentum().begin()));
  std::vector<float> y = x, update_a(n), update_b(n);
  for (int step = 3; step < 6; ++step) {
    const auto g = grads_at(step);
    original.compute_update(x, g, update_a);
    resumed.compute_update(y, g, update_b);
    ASSERT_EQ(update_a, update_b) << "step " << step;
    original.step(x, g);
    resumed.step(y, g);
    ASSERT_EQ(x, y) << "step " << step;
  }
}

TEST(Sgd, RestoringMomentumOfTheWrongSizeIsReported) {
  Sgd sgd(4, {});
  const std::vector<float> wrong(5, 1.0f);
  try {
    sgd.restore_momentum(wrong);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("5"), std::string::npos) << e.what();
  }
  EXPECT_EQ(sgd.momentum()[0], 0.0f) << "a refused restore changed the buffer";
}

}  // namespace
}  // namespace peertrain::train

namespace peertrain::train {
namespace {

// step() updates in place in one pass, compute_update() apart: the same arithmetic. Enough
// coordinates for the vector loop and its remainder.
TEST(Adam, ComputeUpdateThenSubtractEqualsStep) {
  const AdamConfig config{.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f};
  Adam central(67, config), split(67, config);
  expect_compute_update_then_subtract_equals_step(central, split, 67);
}

// Three AdamW steps against the formula evaluated in double.
TEST(Adam, FollowsTheAdamWFormula) {
  const AdamConfig config{.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f};
  Adam adam(2, config);
  std::vector<float> x = {0.5f, -1.5f};
  std::vector<double> xd = {0.5, -1.5}, m(2, 0.0), v(2, 0.0);
  const std::vector<std::vector<float>> grads = {{1.0f, -2.0f}, {0.5f, 0.25f}, {-3.0f, 1.0f}};
  for (int t = 1; t <= 3; ++t) {
    adam.step(x, grads[t - 1]);
    for (int i = 0; i < 2; ++i) {
      const double g = grads[t - 1][i];
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.99 * v[i] + 0.01 * g * g;
      const double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.99, t));
      xd[i] -= 0.01 * (0.1 * xd[i] + mh / (std::sqrt(vh) + 1e-8));
      EXPECT_NEAR(x[i], xd[i], 1e-6) << "step " << t << " x[" << i << "]";
    }
  }
  Adam resumed(2, config);
  resumed.restore_state(adam.state());
  std::vector<float> a = x, b = x;
  adam.step(a, grads[0]);
  resumed.step(b, grads[0]);
  EXPECT_EQ(a, b) << "a restored Adam continues differently";
  EXPECT_THROW(resumed.restore_state(std::vector<float>(3)), Error);
  EXPECT_THROW(Adam(2, {.lr = 0.0f}), Error);
}

}  // namespace
}  // namespace peertrain::train

namespace peertrain::train {
namespace {

TEST(LrSchedule, WarmsUpThenDecaysToATenth) {
  EXPECT_EQ(scheduled_learning_rate(LrSchedule::kConstant, 0.1f, 50, 100, 10), 0.1f);
  EXPECT_FLOAT_EQ(scheduled_learning_rate(LrSchedule::kCosine, 1.0f, 0, 101, 10), 0.1f);   // 1/10 of warm-up
  EXPECT_FLOAT_EQ(scheduled_learning_rate(LrSchedule::kCosine, 1.0f, 9, 101, 10), 1.0f);   // warm-up done
  EXPECT_FLOAT_EQ(scheduled_learning_rate(LrSchedule::kCosine, 1.0f, 10, 101, 10), 1.0f);  // decay starts
  EXPECT_NEAR(scheduled_learning_rate(LrSchedule::kCosine, 1.0f, 55, 101, 10), 0.55f, 1e-6);  // half way
  EXPECT_FLOAT_EQ(scheduled_learning_rate(LrSchedule::kCosine, 1.0f, 100, 101, 10), 0.1f);  // last step
  float previous = 2.0f;
  for (long long step = 10; step < 101; ++step) {
    const float lr = scheduled_learning_rate(LrSchedule::kCosine, 1.0f, step, 101, 10);
    EXPECT_LE(lr, previous) << "step " << step;
    previous = lr;
  }
  EXPECT_THROW(parse_lr_schedule("linear"), Error);
}

}  // namespace
}  // namespace peertrain::train

namespace peertrain::train {
namespace {

// With Eigen's thread count above one, a pass over enough coordinates runs on ranges, one
// per thread: every coordinate is its own update, so 2 and 3 threads give the one-thread
// bits, through step() and compute_update(), SGD's and Adam's (their states included).
// 200,003 floats: three ranges of at least 2^16, the last one ragged.
TEST(Optimizer, MoreThreadsGiveTheOneThreadBits) {
  constexpr std::size_t kSize = 200003;
  std::mt19937 rng(41);
  std::normal_distribution<float> normal;
  std::vector<float> x0(kSize);
  std::vector<std::vector<float>> grads(3, std::vector<float>(kSize));
  for (float& v : x0) v = normal(rng);
  for (auto& g : grads)
    for (float& v : g) v = normal(rng);
  const SgdConfig sgd{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f};
  const AdamConfig adam{.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f};
  const int limit = omp_get_max_threads();
  for (const bool use_adam : {false, true})
    for (const bool in_place : {true, false}) {
      std::vector<std::vector<float>> params, states;
      for (const int threads : {1, 2, 3}) {
        Eigen::setNbThreads(threads);
        omp_set_num_threads(threads);  // 3 ranges on a 2-core machine too (the passes take the smaller)
        std::unique_ptr<Optimizer> optimizer =
            make_optimizer(use_adam ? OptimizerKind::kAdam : OptimizerKind::kSgd, kSize, sgd, adam);
        std::vector<float> x = x0, update(kSize);
        for (const auto& g : grads) {
          if (in_place) {
            optimizer->step(x, g);
          } else {
            optimizer->compute_update(x, g, update);
            for (std::size_t i = 0; i < kSize; ++i) x[i] -= update[i];
          }
        }
        params.push_back(x);
        const auto state = optimizer->state();
        states.emplace_back(state.begin(), state.end());
      }
      Eigen::setNbThreads(1);
      omp_set_num_threads(limit);
      const std::string what = std::string(use_adam ? "Adam" : "SGD") + (in_place ? " step" : " compute_update");
      EXPECT_NE(params[0], x0) << what << " did not move the parameters";
      EXPECT_EQ(params[1], params[0]) << what << ", 2 threads";
      EXPECT_EQ(params[2], params[0]) << what << ", 3 threads";
      EXPECT_EQ(states[1], states[0]) << what << ", its state, 2 threads";
      EXPECT_EQ(states[2], states[0]) << what << ", its state, 3 threads";
    }
}

}  // namespace
}  // namespace peertrain::train
