// The transformer's layer kernels. The GEMMs read weights in place in the flat parameter
// buffer; the per-element work (LayerNorm, GELU, softmax) runs as Eigen array expressions
// over whole columns, which vectorize, so that no scalar loop sits next to a GEMM.
#include "layers.h"

#include "gelu.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace peertrain::model::layers {
namespace {

using Eigen::Index;
using Matrix = Eigen::Map<Eigen::MatrixXf>;
using ConstMatrix = Eigen::Map<const Eigen::MatrixXf>;
using Array = Eigen::Map<Eigen::ArrayXf>;
using ConstArray = Eigen::Map<const Eigen::ArrayXf>;

}  // namespace

// The bias and the residual ride in the GEMM's epilogue (gemm.h): with our kernel, in the
// stores of y; with Eigen's, in one pass that starts y from them.
void linear_forward(Gemm& gemm, int in, int out, int n, const float* w, const float* b, const float* x, float* y) {
  gemm.run(false, false, out, n, in, w, x, y, false, {.row_bias = b});
}

void linear_residual_forward(Gemm& gemm, int in, int out, int n, const float* w, const float* b, const float* x,
                             const float* residual, float* y) {
  gemm.run(false, false, out, n, in, w, x, y, false, {.row_bias = b, .addend = residual});
}

namespace {

// dW += dy·xᵀ and db += Σ dy; the row sums are taken as the GEMM packs dy.
void weight_and_bias_gradients(Gemm& gemm, int in, int out, int n, const float* x, const float* dy, float* dw,
                               float* db) {
  if (dw != nullptr)
    gemm.run(false, true, out, in, n, dy, x, dw, true, {.a_row_sums = db});
  else if (db != nullptr)
    add_row_sums(out, n, dy, db);
}

}  // namespace

void linear_gelu_forward(Gemm& gemm, int in, int out, int n, const float* w, const float* b, const float* x, float* h,
                         float* g) {
  gemm.run(false, false, out, n, in, w, x, h, false, {.row_bias = b, .gelu_out = g});
}

void linear_gelu_backward(Gemm& gemm, int in, int out, int n, const float* w, const float* x, const float* dy,
                          float* dw, float* db, const float* h, float* dx) {
  weight_and_bias_gradients(gemm, in, out, n, x, dy, dw, db);
  if (dx != nullptr) gemm.run(true, false, in, n, out, w, dy, dx, false, {.gelu_grad_at = h});
}

void linear_backward(Gemm& gemm, int in, int out, int n, const float* w, const float* x, const float* dy, float* dw,
                     float* db, float* dx) {
  weight_and_bias_gradients(gemm, in, out, n, x, dy, dw, db);
  if (dx != nullptr) gemm.run(true, false, in, n, out, w, dy, dx, false);
}

void layernorm_forward(int d, int n, const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd) {
  const ConstArray g(gamma, d), bt(beta, d);
  for (int j = 0; j < n; ++j) {
    const ConstArray xj(x + static_cast<std::ptrdiff_t>(j) * d, d);
    const float mu = xj.mean();
    const float var = (xj - mu).square().mean();
    const float r = 1.0f / std::sqrt(var + kLayerNormEps);
    Array(y + static_cast<std::ptrdiff_t>(j) * d, d) = (xj - mu) * r * g + bt;
    mean[j] = mu;
    rstd[j] = r;
  }
}

void layernorm_backward(int d, int n, const float* x, const float* mean, const float* rstd, const float* gamma,
                        const float* dy, const float* residual, float* dx, float* dgamma, float* dbeta) {
  const ConstArray g(gamma, d);
  Eigen::ArrayXf xhat(d), dxhat(d);
  for (int j = 0; j < n; ++j) {
    const std::ptrdiff_t at = static_cast<std::ptrdiff_t>(j) * d;
    const ConstArray dyj(dy + at, d);
    xhat = (ConstArray(x + at, d) - mean[j]) * rstd[j];
    if (dgamma != nullptr) {
      Array(dgamma, d) += dyj * xhat;
      Array(dbeta, d) += dyj;
    }
    if (dx == nullptr) continue;
    dxhat = dyj * g;
    const float mean_dxhat = dxhat.mean();
    const float mean_dxhat_xhat = (dxhat * xhat).mean();
    Array dxj(dx + at, d);
    if (residual != nullptr)
      dxj = ConstArray(residual + at, d) + (dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * rstd[j];
    else
      dxj = (dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * rstd[j];
  }
}

void gelu_forward(std::size_t count, const float* x, float* y) { gelu::forward(x, y, static_cast<Index>(count)); }

void gelu_backward(std::size_t count, const float* x, const float* dy, float* dx) {
  gelu::backward(x, dy, dx, static_cast<Index>(count));
}

void split_heads(int batch, int tokens, int heads, int head_dim, int rows, int row_offset, const float* x,
                 float* heads_out) {
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(head_dim);
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < tokens; ++t) {
      const float* column = x + (static_cast<std::ptrdiff_t>(b) * tokens + t) * rows + row_offset;
      for (int h = 0; h < heads; ++h)
        std::memcpy(heads_out + ((static_cast<std::ptrdiff_t>(b) * heads + h) * tokens + t) * head_dim,
                    column + h * head_dim, bytes);
    }
}

void merge_heads(int batch, int tokens, int heads, int head_dim, int rows, int row_offset, const float* heads_in,
                 float* x) {
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(head_dim);
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < tokens; ++t) {
      float* column = x + (static_cast<std::ptrdiff_t>(b) * tokens + t) * rows + row_offset;
      for (int h = 0; h < heads; ++h)
        std::memcpy(column + h * head_dim,
                    heads_in + ((static_cast<std::ptrdiff_t>(b) * heads + h) * tokens + t) * head_dim, bytes);
    }
}

void token_embedding_forward(int d, int batch, int tokens, const std::int32_t* ids, const int* positions,
                             const float* wte, const float* wpe, float* out) {
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < tokens; ++t) {
      const std::ptrdiff_t j = static_cast<std::ptrdiff_t>(b) * tokens + t;
      Array(out + j * d, d) = ConstArray(wte + static_cast<std::ptrdiff_t>(ids[j]) * d, d) +
                              ConstArray(wpe + static_cast<std::ptrdiff_t>(positions[t]) * d, d);
    }
}

void token_embedding_backward(int d, int batch, int tokens, const std::int32_t* ids, const int* positions,
                              const float* dout, float* dwte, float* dwpe) {
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < tokens; ++t) {
      const std::ptrdiff_t j = static_cast<std::ptrdiff_t>(b) * tokens + t;
      Array(dwte + static_cast<std::ptrdiff_t>(ids[j]) * d, d) += ConstArray(dout + j * d, d);
    }
  add_positions_backward(d, batch, tokens, positions, dout, dwpe);
}

void gather_patches(int image, int patch, int batch, int tokens, const int* positions, const float* pixels,
                    float* out) {
  const int per_row = image / patch;
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < tokens; ++t) {
      const int row = positions[t] / per_row, col = positions[t] % per_row;
      const float* corner = pixels + static_cast<std::ptrdiff_t>(b) * image * image +
                            static_cast<std::ptrdiff_t>(row) * patch * image + col * patch;
      float* column = out + (static_cast<std::ptrdiff_t>(b) * tokens + t) * patch * patch;
      for (int y = 0; y < patch; ++y) std::memcpy(column + y * patch, corner + y * image, sizeof(float) * patch);
    }
}

void add_positions(int d, int batch, int tokens, const int* positions, const float* wpe, float* out) {
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < tokens; ++t)
      Array(out + (static_cast<std::ptrdiff_t>(b) * tokens + t) * d, d) +=
          ConstArray(wpe + static_cast<std::ptrdiff_t>(positions[t]) * d, d);
}

void add_positions_backward(int d, int batch, int tokens, const int* positions, const float* dout, float* dwpe) {
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < tokens; ++t)
      Array(dwpe + static_cast<std::ptrdiff_t>(positions[t]) * d, d) +=
          ConstArray(dout + (static_cast<std::ptrdiff_t>(b) * tokens + t) * d, d);
}

void sum_pool_forward(int d, int batch, int tokens, const float* x, float* pooled) {
  for (int b = 0; b < batch; ++b) {
    Eigen::Map<Eigen::VectorXf> p(pooled + static_cast<std::ptrdiff_t>(b) * d, d);
    p = ConstMatrix(x + static_cast<std::ptrdiff_t>(b) * tokens * d, d, tokens).rowwise().sum();
  }
}

void sum_pool_backward(int d, int batch, int tokens, const float* dpooled, float scale, float* dx) {
  for (int b = 0; b < batch; ++b)
    Matrix(dx + static_cast<std::ptrdiff_t>(b) * tokens * d, d, tokens).colwise() =
        Eigen::Map<const Eigen::VectorXf>(dpooled + static_cast<std::ptrdiff_t>(b) * d, d) * scale;
}

double softmax_cross_entropy(int classes, int n, float* logits, const std::int32_t* targets, float grad_scale,
                             long long* correct) {
  double loss = 0;
  for (int j = 0; j < n; ++j) {
    Array z(logits + static_cast<std::ptrdiff_t>(j) * classes, classes);
    Index argmax = 0;
    const float max = z.maxCoeff(&argmax);
    const int target = targets[j];
    const float target_logit = z[target];
    z = (z - max).exp();
    const float sum = z.sum();
    loss += std::log(static_cast<double>(sum)) + max - target_logit;
    *correct += argmax == target;
    z *= grad_scale / sum;
    z[target] -= grad_scale;
  }
  return loss;
}

}  // namespace peertrain::model::layers
