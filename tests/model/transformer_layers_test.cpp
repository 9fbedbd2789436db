// The transformer's layer kernels (src/model/layers.h) against central finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../../src/model/layers.h"
#include "transformer_test_util.h"

namespace peertrain::model {
namespace {

using namespace test;

// Each kernel against central differences, with kLayerStep and kLayerTolerance
// (transformer_test_util.h).

TEST(TransformerLayers, LinearBackwardMatchesFiniteDifferences) {
  const int in = 5, out = 4, n = 6;
  layers::Gemm gemm;
  auto w = normal_vector(out * in, 1), b = normal_vector(out, 2), x = normal_vector(in * n, 3);
  const auto r = normal_vector(out * n, 4);
  std::vector<float> y(out * n);
  auto loss = [&] {
    layers::linear_forward(gemm, in, out, n, w.data(), b.data(), x.data(), y.data());
    return project(y, r);
  };
  // The backward adds: start the parameter gradients from non-zero values.
  std::vector<float> dw = normal_vector(w.size(), 5), db = normal_vector(b.size(), 6), dx(x.size());
  const auto dw0 = dw, db0 = db;
  layers::linear_backward(gemm, in, out, n, w.data(), x.data(), r.data(), dw.data(), db.data(), dx.data());
  for (std::size_t i = 0; i < dw.size(); ++i) dw[i] -= dw0[i];
  for (std::size_t i = 0; i < db.size(); ++i) db[i] -= db0[i];
  EXPECT_LT(normalized_error(dw, numeric_gradient(w, loss, kLayerStep)), kLayerTolerance);
  EXPECT_LT(normalized_error(db, numeric_gradient(b, loss, kLayerStep)), kLayerTolerance);
  EXPECT_LT(normalized_error(dx, numeric_gradient(x, loss, kLayerStep)), kLayerTolerance);
}

TEST(TransformerLayers, LayerNormBackwardMatchesFiniteDifferences) {
  const int d = 7, n = 5;
  auto x = normal_vector(d * n, 11), gamma = normal_vector(d, 12), beta = normal_vector(d, 13);
  for (auto& g : gamma) g += 1.0f;
  const auto r = normal_vector(d * n, 14);
  std::vector<float> y(d * n), mean(n), rstd(n);
  auto loss = [&] {
    layers::layernorm_forward(d, n, x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data());
    return project(y, r);
  };
  loss();
  // The column mean is 0 and the variance 1 (up to eps).
  double col_mean = 0, col_var = 0;
  for (int i = 0; i < d; ++i) col_mean += (y[i] - beta[i]) / gamma[i] / d;
  for (int i = 0; i < d; ++i) col_var += std::pow((y[i] - beta[i]) / gamma[i], 2) / d;
  EXPECT_NEAR(col_mean, 0, 1e-6);
  EXPECT_NEAR(col_var, 1, 1e-3);
  std::vector<float> dgamma(d), dbeta(d), dx = normal_vector(d * n, 15);
  const auto dx0 = dx;
  layers::layernorm_backward(d, n, x.data(), mean.data(), rstd.data(), gamma.data(), r.data(), /*residual=*/dx.data(),
                             dx.data(), dgamma.data(), dbeta.data());
  for (std::size_t i = 0; i < dx.size(); ++i) dx[i] -= dx0[i];
  EXPECT_LT(normalized_error(dx, numeric_gradient(x, loss, kLayerStep)), kLayerTolerance);
  EXPECT_LT(normalized_error(dgamma, numeric_gradient(gamma, loss, kLayerStep)), kLayerTolerance);
  EXPECT_LT(normalized_error(dbeta, numeric_gradient(beta, loss, kLayerStep)), kLayerTolerance);
}

TEST(TransformerLayers, GeluIsTheTanhApproximationAndItsBackwardMatches) {
  const std::vector<float> at = {-3.0f, -0.5f, 0.0f, 1.0f, 2.5f};
  std::vector<float> y(at.size());
  layers::gelu_forward(at.size(), at.data(), y.data());
  for (std::size_t i = 0; i < at.size(); ++i) {
    const double v = at[i];
    const double want = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(y[i], want, 1e-6) << "at " << v;
  }
  // Past 4096 elements, to cross the backward's block boundary.
  const std::size_t n = 5000;
  auto x = normal_vector(n, 21, 2.0);
  const auto r = normal_vector(n, 22);
  std::vector<float> out(n), dx(n);
  auto loss = [&] {
    layers::gelu_forward(n, x.data(), out.data());
    return project(out, r);
  };
  layers::gelu_backward(n, x.data(), r.data(), dx.data());
  EXPECT_LT(normalized_error(dx, numeric_gradient(x, loss, kLayerStep)), kLayerTolerance);
}

TEST(TransformerLayers, EmbeddingsAndPoolingBackwardMatchFiniteDifferences) {
  const int d = 4, vocab = 6, seq = 5, batch = 2, tokens = 3;
  const std::vector<int> positions = {0, 2, 4};
  const auto ids = random_ids(batch * tokens, vocab, 31);
  auto wte = normal_vector(d * vocab, 32), wpe = normal_vector(d * seq, 33);
  const auto r = normal_vector(d * batch * tokens, 34);
  std::vector<float> y(r.size());
  auto loss = [&] {
    layers::token_embedding_forward(d, batch, tokens, ids.data(), positions.data(), wte.data(), wpe.data(), y.data());
    return project(y, r);
  };
  std::vector<float> dwte(wte.size()), dwpe(wpe.size());
  layers::token_embedding_backward(d, batch, tokens, ids.data(), positions.data(), r.data(), dwte.data(), dwpe.data());
  EXPECT_LT(normalized_error(dwte, numeric_gradient(wte, loss, kLayerStep)), kLayerTolerance);
  EXPECT_LT(normalized_error(dwpe, numeric_gradient(wpe, loss, kLayerStep)), kLayerTolerance);

  auto x = normal_vector(d * batch * tokens, 35);
  const auto rp = normal_vector(d * batch, 36);
  std::vector<float> pooled(d * batch), dx(x.size());
  auto pool_loss = [&] {
    layers::sum_pool_forward(d, batch, tokens, x.data(), pooled.data());
    return project(pooled, rp);
  };
  layers::sum_pool_backward(d, batch, tokens, rp.data(), 1.0f, dx.data());
  EXPECT_LT(normalized_error(dx, numeric_gradient(x, pool_loss, kLayerStep)), kLayerTolerance);
}

TEST(TransformerLayers, SoftmaxCrossEntropyGradientMatchesFiniteDifferences) {
  const int classes = 5, n = 4;
  auto logits = normal_vector(classes * n, 41, 2.0);
  const auto targets = random_ids(n, classes, 42);
  long long correct = 0;
  auto loss = [&] {
    std::vector<float> z = logits;
    long long c = 0;
    return layers::softmax_cross_entropy(classes, n, z.data(), targets.data(), 1.0f, &c);
  };
  std::vector<float> grad = logits;
  const double value = layers::softmax_cross_entropy(classes, n, grad.data(), targets.data(), 1.0f, &correct);
  double want = 0;
  long long want_correct = 0;
  for (int j = 0; j < n; ++j) {
    const float* z = logits.data() + j * classes;
    double sum = 0;
    for (int i = 0; i < classes; ++i) sum += std::exp(static_cast<double>(z[i]));
    want += std::log(sum) - z[targets[j]];
    want_correct += std::max_element(z, z + classes) - z == targets[j];
  }
  EXPECT_NEAR(value, want, 1e-5);
  EXPECT_EQ(correct, want_correct);
  EXPECT_LT(normalized_error(grad, numeric_gradient(logits, loss, 1e-3f)), kLayerTolerance);
}

TEST(TransformerLayers, HeadsSplitAndMergeAreInverse) {
  const int batch = 2, tokens = 3, heads = 2, head_dim = 2, rows = 3 * heads * head_dim;
  const auto x = normal_vector(rows * batch * tokens, 51);
  std::vector<float> h(heads * head_dim * batch * tokens), back(x.size());
  for (int part = 0; part < 3; ++part) {
    const int offset = part * heads * head_dim;
    layers::split_heads(batch, tokens, heads, head_dim, rows, offset, x.data(), h.data());
    // Element (b, head 1, token 2, dim 1) is row offset + 1·head_dim + 1 of column b·tokens + 2.
    EXPECT_EQ(h[((1 * heads + 1) * tokens + 2) * head_dim + 1], x[(1 * tokens + 2) * rows + offset + head_dim + 1]);
    layers::merge_heads(batch, tokens, heads, head_dim, rows, offset, h.data(), back.data());
  }
  EXPECT_EQ(back, x);
}

}  // namespace
}  // namespace peertrain::model
