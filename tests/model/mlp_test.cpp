// The MLP against finite differences, against PyTorch's values in tests/data (made by
// tests/make_mlp_reference.py), and on a toy problem it must learn.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "test_support/normalized_error.h"
#include "transformer_test_util.h"
#include "peertrain/core/error.h"
#include "peertrain/core/parameter_store.h"
#include "peertrain/core/rng.h"
#include "peertrain/model/mlp.h"

namespace peertrain::model {
namespace {

using test::normal_vector;

std::vector<std::int32_t> random_labels(int n, int classes, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> labels(n);
  for (auto& y : labels) y = static_cast<std::int32_t>(rng.uniform_below(classes));
  return labels;
}

TEST(Mlp, LayoutMatchesTheParameterStore) {
  Mlp mlp({.inputs = 6, .hidden = {5, 4}, .classes = 3});
  EXPECT_EQ(mlp.num_parameters(), 6u * 5 + 5 + 5 * 4 + 4 + 4 * 3 + 3);
  ParameterStore store;
  mlp.register_parameters(store);
  store.finalize();
  EXPECT_EQ(store.size(), mlp.num_parameters());
  ASSERT_EQ(store.slices().size(), 6u);
  EXPECT_EQ(store.slices()[0].name, "fc0.weight");
  EXPECT_EQ(store.slices()[0].rows, 5);
  EXPECT_EQ(store.slices()[0].cols, 6);
  EXPECT_EQ(store.slices()[1].name, "fc0.bias");
  EXPECT_EQ(store.slices()[1].offset, 30u);
  EXPECT_EQ(store.slices()[5].name, "fc2.bias");
  EXPECT_EQ(store.slices()[5].offset + 3, mlp.num_parameters());
  // 2·m·n·k per GEMM: forward and weight gradient everywhere, input gradient above layer 0.
  EXPECT_DOUBLE_EQ(mlp.flops_per_step(7), 2.0 * 7 * (2 * 30 + 3 * 20 + 3 * 12));
}

TEST(Mlp, InitializationIsSeededAndBoundedLikePyTorch) {
  Mlp mlp({.inputs = 16, .hidden = {9}, .classes = 4});
  std::vector<float> a(mlp.num_parameters()), b(a.size()), c(a.size());
  mlp.initialize(a, 5);
  mlp.initialize(b, 5);
  mlp.initialize(c, 6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // fc0 (weight and bias) within 1/sqrt(16), fc1 within 1/sqrt(9), and the range is used.
  const std::size_t fc0_end = 16 * 9 + 9;
  float max0 = 0, max1 = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    float& max = i < fc0_end ? max0 : max1;
    max = std::max(max, std::abs(a[i]));
  }
  EXPECT_LE(max0, 0.25f);
  EXPECT_GT(max0, 0.2f);
  EXPECT_LE(max1, 1.0f / 3);
  EXPECT_GT(max1, 0.25f);
}

// Central differences of the mean loss, one parameter at a time, on fresh random inputs.
// The model computes in float32, so the step is large enough for float rounding of the loss
// (~1e-7 relative) to stay far below the difference, and small enough that no pre-activation
// crosses a ReLU kink: the normalized error is ~6e-6 here (1e-5 at a step of 1e-3, where
// rounding dominates; 2e-2 at 3e-2, where kinks are crossed). The tolerance is 1e-4.
TEST(Mlp, GradientMatchesFiniteDifferences) {
  Mlp mlp({.inputs = 6, .hidden = {5, 4}, .classes = 3});
  const int batch = 4;
  std::vector<float> params(mlp.num_parameters()), grads(params.size());
  mlp.initialize(params, 11);
  const auto inputs = normal_vector(6 * batch, 12);
  const auto labels = random_labels(batch, 3, 13);
  mlp.forward_backward(params, inputs.data(), labels.data(), batch, grads);

  constexpr float kStep = 3e-3f;
  std::vector<double> analytic(grads.begin(), grads.end()), numeric;
  auto loss_at = [&](std::vector<float>& p) {
    return mlp.evaluate(p, inputs.data(), labels.data(), batch).loss_sum / batch;
  };
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::vector<float> p = params;
    p[i] = params[i] + kStep;
    const double up = loss_at(p);
    p[i] = params[i] - kStep;
    const double down = loss_at(p);
    numeric.push_back((up - down) / (static_cast<double>(params[i] + kStep) - static_cast<double>(params[i] - kStep)));
  }
  EXPECT_LT(normalized_error(analytic, numeric), 1e-4);
}

struct MlpReference {
  std::vector<int> widths;
  int batch = 0;
  std::vector<float> inputs, params;
  std::vector<std::int32_t> labels;
  double loss = 0;
  std::vector<double> grads;
};

MlpReference read_mlp_reference(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::kIo, str(path, ": cannot open"));
  MlpReference r;
  std::string key;
  std::size_t count = 0;
  auto read_section = [&](const char* name, auto& values) {
    in >> key >> count;
    if (key != name) throw Error(ErrorKind::kParse, str(path, ": expected section '", name, "', got '", key, "'"));
    values.resize(count);
    for (auto& v : values) in >> v;
  };
  in >> key;
  for (int w; in.peek() != '\n' && in >> w;) r.widths.push_back(w);
  in >> key >> r.batch;
  read_section("inputs", r.inputs);
  read_section("labels", r.labels);
  read_section("params", r.params);
  std::vector<double> loss;
  read_section("loss", loss);
  read_section("grads", r.grads);
  if (!in || loss.size() != 1) throw Error(ErrorKind::kParse, str(path, ": truncated"));
  r.loss = loss[0];
  return r;
}

// PyTorch computed the reference in float64 from the same float32 values; the model's
// float32 result must agree to 1e-5 relative, element by element. An element much smaller
// than the gradient's scale is compared against that scale instead (cancellation makes its
// own relative error meaningless).
TEST(Mlp, MatchesPyTorchLossAndEveryGradient) {
  const MlpReference ref = read_mlp_reference(std::string(PEERTRAIN_SOURCE_DIR) + "/tests/data/mlp_reference.txt");
  ASSERT_EQ(ref.widths.size(), 4u);
  Mlp mlp({.inputs = ref.widths[0], .hidden = {ref.widths[1], ref.widths[2]}, .classes = ref.widths[3]});
  ASSERT_EQ(ref.params.size(), mlp.num_parameters());
  ASSERT_EQ(ref.inputs.size(), static_cast<std::size_t>(ref.widths[0] * ref.batch));
  std::vector<float> grads(mlp.num_parameters());
  const float loss = mlp.forward_backward(ref.params, ref.inputs.data(), ref.labels.data(), ref.batch, grads);
  EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss);

  double scale = 0;
  for (double g : ref.grads) scale = std::max(scale, std::abs(g));
  int wrong = 0;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const double tolerance = 1e-5 * std::max(std::abs(ref.grads[i]), 1e-2 * scale);
    if (std::abs(grads[i] - ref.grads[i]) > tolerance) {
      if (++wrong <= 5) ADD_FAILURE() << "grad[" << i << "] = " << grads[i] << ", PyTorch " << ref.grads[i];
    }
  }
  EXPECT_EQ(wrong, 0) << "of " << grads.size() << " gradients";
}

// The workspace grows with the batch and is reused; a smaller batch after a larger one, and
// the multi-threaded GEMM path, must give the same gradient as a fresh single-threaded model,
// and batches of one must work.
TEST(Mlp, ResultsDoNotDependOnEarlierCallsOrThreads) {
  const MlpConfig config{.inputs = 33, .hidden = {40, 17}, .classes = 7};
  Mlp used(config), fresh(config);
  std::vector<float> params(used.num_parameters()), g1(params.size()), g2(params.size());
  used.initialize(params, 3);
  const auto big = normal_vector(33 * 50, 4);
  const auto big_labels = random_labels(50, 7, 5);
  used.forward_backward(params, big.data(), big_labels.data(), 50, g1);
  const auto small = normal_vector(33 * 9, 6);
  const auto small_labels = random_labels(9, 7, 7);
  const float loss_used = used.forward_backward(params, small.data(), small_labels.data(), 9, g1);
  const float loss_fresh = fresh.forward_backward(params, small.data(), small_labels.data(), 9, g2);
  EXPECT_EQ(loss_used, loss_fresh);
  EXPECT_EQ(g1, g2);

  const int threads = Eigen::nbThreads();
  Eigen::setNbThreads(2);
  std::vector<float> g3(params.size());
  used.forward_backward(params, big.data(), big_labels.data(), 50, g3);
  Eigen::setNbThreads(1);
  std::vector<float> g4(params.size());
  fresh.forward_backward(params, big.data(), big_labels.data(), 50, g4);
  Eigen::setNbThreads(threads);
  EXPECT_LT(normalized_error(std::vector<double>(g3.begin(), g3.end()), std::vector<double>(g4.begin(), g4.end())),
            1e-6);

  // Batch 1, the smallest GEMMs: the gradient of a batch of two is the mean of theirs.
  std::vector<float> first(params.size()), second(params.size()), both(params.size());
  const float loss_first = fresh.forward_backward(params, small.data(), small_labels.data(), 1, first);
  const float loss_second = fresh.forward_backward(params, small.data() + 33, small_labels.data() + 1, 1, second);
  const float loss_both = fresh.forward_backward(params, small.data(), small_labels.data(), 2, both);
  EXPECT_NEAR(loss_both, 0.5f * (loss_first + loss_second), 1e-6f * loss_both);
  std::vector<double> mean(params.size());
  for (std::size_t i = 0; i < mean.size(); ++i) mean[i] = 0.5 * (first[i] + second[i]);
  EXPECT_LT(normalized_error(std::vector<double>(both.begin(), both.end()), mean), 1e-6);
}

TEST(Mlp, EvaluateCountsLossAndCorrectPredictions) {
  Mlp mlp({.inputs = 4, .hidden = {3}, .classes = 3});
  std::vector<float> params(mlp.num_parameters(), 0.0f);
  // All weights zero: every example gets the logits of the last bias, (0, 0, ln 2), so
  // every prediction is class 2 with probability 1/2.
  params.back() = std::log(2.0f);
  const auto inputs = normal_vector(4 * 6, 1);
  const std::vector<std::int32_t> labels = {2, 0, 2, 1, 2, 0};
  const EvalResult r = mlp.evaluate(params, inputs.data(), labels.data(), 6);
  EXPECT_EQ(r.count, 6);
  EXPECT_EQ(r.correct, 3);
  EXPECT_NEAR(r.loss_sum, 3 * std::log(2.0) + 3 * std::log(4.0), 1e-6);
}

TEST(Mlp, LearnsASeparableProblem) {
  // Two classes split by a hyperplane through the origin, in 8 dimensions.
  const int features = 8, batch = 64;
  Mlp mlp({.inputs = features, .hidden = {16}, .classes = 2});
  std::vector<float> params(mlp.num_parameters()), grads(params.size());
  mlp.initialize(params, 1);
  const auto direction = normal_vector(features, 2);
  Rng rng(3);
  std::vector<float> x(features * batch);
  std::vector<std::int32_t> y(batch);
  auto draw = [&] {
    for (int j = 0; j < batch; ++j) {
      double dot = 0;
      for (int i = 0; i < features; ++i) dot += (x[j * features + i] = static_cast<float>(rng.normal())) * direction[i];
      y[j] = dot > 0;
    }
  };
  draw();
  const double first = mlp.evaluate(params, x.data(), y.data(), batch).loss_sum / batch;
  for (int step = 0; step < 300; ++step) {
    draw();
    mlp.forward_backward(params, x.data(), y.data(), batch, grads);
    for (std::size_t i = 0; i < params.size(); ++i) params[i] -= 0.2f * grads[i];
  }
  draw();
  const EvalResult last = mlp.evaluate(params, x.data(), y.data(), batch);
  EXPECT_GT(first, 0.5);
  EXPECT_LT(last.loss_sum / batch, 0.25);
  EXPECT_GE(last.correct, batch * 9 / 10);
}

TEST(Mlp, BadInputIsReported) {
  EXPECT_THROW(Mlp({.inputs = 0}), Error);
  EXPECT_THROW(Mlp({.inputs = 4, .hidden = {3, -1}, .classes = 2}), Error);
  Mlp mlp({.inputs = 2, .hidden = {}, .classes = 3});
  std::vector<float> params(mlp.num_parameters()), grads(params.size());
  const std::vector<float> x = {1, 2, 3, 4};
  const std::vector<std::int32_t> bad = {0, 3};
  try {
    mlp.forward_backward(params, x.data(), bad.data(), 2, grads);
    FAIL() << "label 3 of 3 classes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 3 of example 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mlp.evaluate(params, x.data(), bad.data(), 0), Error);
}

}  // namespace
}  // namespace peertrain::model
