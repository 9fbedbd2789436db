// The MLP classifier's forward and backward passes. Every GEMM reads the weights in place in
// the flat parameter buffer and writes straight into the gradient buffer or the workspace,
// so a step makes no allocation and no copy of a weight; the transposes in the backward pass
// are only a storage order given to the GEMM. The elementwise work around the GEMMs is
// fused into one pass each: bias + ReLU in a hidden layer's GEMM (its epilogue); softmax, the loss,
// its gradient and the last bias gradient in one pass over the logits; the ReLU mask and the
// bias gradient in one pass over each backpropagated gradient.
#include "peertrain/model/mlp.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "gemm.h"
#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"

namespace peertrain::model {
namespace {

// delta ← delta ⊙ [activation > 0] (ReLU's derivative, read from its output), and
// bias_grad ← the row sums of the result.
void relu_backward_bias_grad(float* delta, const float* activation, float* bias_grad, int rows, int cols) {
  std::fill(bias_grad, bias_grad + rows, 0.0f);
  for (int j = 0; j < cols; ++j, delta += rows, activation += rows)
    for (int i = 0; i < rows; ++i) {
      const float d = activation[i] > 0.0f ? delta[i] : 0.0f;
      delta[i] = d;
      bias_grad[i] += d;
    }
}

}  // namespace

Mlp::Mlp(MlpConfig config) : config_(std::move(config)), gemm_(std::make_unique<Gemm>()) {
  if (config_.inputs <= 0 || config_.classes <= 0)
    throw Error(ErrorKind::kInvalidArgument,
                str("MLP: inputs (", config_.inputs, ") and classes (", config_.classes, ") must be positive"));
  std::vector<int> widths = {config_.inputs};
  for (int h : config_.hidden) {
    if (h <= 0) throw Error(ErrorKind::kInvalidArgument, str("MLP: hidden width ", h, " must be positive"));
    widths.push_back(h);
    max_width_ = std::max(max_width_, h);
  }
  widths.push_back(config_.classes);
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    Layer layer;
    layer.in = widths[l];
    layer.out = widths[l + 1];
    layer.weight_offset = num_parameters_;
    num_parameters_ += static_cast<std::size_t>(layer.out) * layer.in;
    layer.bias_offset = num_parameters_;
    num_parameters_ += layer.out;
    layers_.push_back(layer);
  }
  activations_.resize(layers_.size());
}

void Mlp::register_parameters(ParameterStore& store) const {
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    // The store lays slices out in the order they are added, which is this model's layout.
    const std::size_t w = store.add(str("fc", l, ".weight"), layer.out, layer.in);
    const std::size_t b = store.add(str("fc", l, ".bias"), layer.out, 1);
    PEERTRAIN_CHECK(store.slice(b).offset - store.slice(w).offset == layer.bias_offset - layer.weight_offset,
                    "layer ", l, " slices are not adjacent in the store");
  }
}

void Mlp::initialize(std::span<float> params, std::uint64_t seed) const {
  PEERTRAIN_CHECK(params.size() == num_parameters_, "params has ", params.size(), " floats, the MLP ",
                  num_parameters_);
  Rng rng(seed);
  for (const Layer& layer : layers_) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(layer.in));
    const std::size_t end = layer.bias_offset + layer.out;
    for (std::size_t i = layer.weight_offset; i < end; ++i)
      params[i] = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
  }
}

void Mlp::check_call(std::span<const float> params, const std::int32_t* labels, int batch) const {
  PEERTRAIN_CHECK(params.size() == num_parameters_, "params has ", params.size(), " floats, the MLP ",
                  num_parameters_);
  if (batch <= 0) throw Error(ErrorKind::kInvalidArgument, str("MLP: batch ", batch, " must be positive"));
  for (int j = 0; j < batch; ++j)
    if (labels[j] < 0 || labels[j] >= config_.classes)
      throw Error(ErrorKind::kInvalidArgument,
                  str("MLP: label ", labels[j], " of example ", j, " is outside [0, ", config_.classes, ")"));
}

void Mlp::reserve(int batch) {
  if (batch <= capacity_) return;
  for (std::size_t l = 0; l < layers_.size(); ++l)
    activations_[l].resize(static_cast<std::size_t>(layers_[l].out) * batch);
  delta_a_.resize(static_cast<std::size_t>(max_width_) * batch);
  delta_b_.resize(static_cast<std::size_t>(max_width_) * batch);
  capacity_ = batch;
}

void Mlp::forward(std::span<const float> params, const float* inputs, int batch) {
  reserve(batch);
  const float* x = inputs;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    float* z = activations_[l].data();
    const bool hidden = l + 1 < layers_.size();
    gemm_->run(false, false, layer.out, batch, layer.in, params.data() + layer.weight_offset, x, z, false,
               {.row_bias = params.data() + layer.bias_offset, .relu = hidden});
    x = z;
  }
}

float Mlp::forward_backward(std::span<const float> params, const float* inputs, const std::int32_t* labels,
                            int batch, std::span<float> grads) {
  check_call(params, labels, batch);
  PEERTRAIN_CHECK(grads.size() == num_parameters_, "grads has ", grads.size(), " floats, the MLP ",
                  num_parameters_);
  forward(params, inputs, batch);

  // Softmax cross-entropy over the logits, in place: each column becomes
  // d(mean loss)/d(logits) = (softmax − onehot(label)) / batch.
  const Layer& top = layers_.back();
  const int classes = top.out;
  float* delta = activations_.back().data();
  float* top_bias_grad = grads.data() + top.bias_offset;
  std::fill(top_bias_grad, top_bias_grad + classes, 0.0f);
  const float inv_batch = 1.0f / static_cast<float>(batch);
  double loss_sum = 0;
  for (int j = 0; j < batch; ++j) {
    float* z = delta + static_cast<std::size_t>(j) * classes;
    const float max = *std::max_element(z, z + classes);
    const float label_logit = z[labels[j]];
    float sum = 0;
    for (int i = 0; i < classes; ++i) sum += (z[i] = std::exp(z[i] - max));
    loss_sum += std::log(sum) + max - label_logit;
    const float scale = inv_batch / sum;
    for (int i = 0; i < classes; ++i) z[i] *= scale;
    z[labels[j]] -= inv_batch;
    for (int i = 0; i < classes; ++i) top_bias_grad[i] += z[i];
  }

  // Walk the layers down. delta holds d(loss)/d(output before activation) of layer l.
  float* spare = delta_a_.data();
  for (std::size_t l = layers_.size(); l-- > 0;) {
    const Layer& layer = layers_[l];
    const float* x = l == 0 ? inputs : activations_[l - 1].data();
    gemm_->run(false, true, layer.out, layer.in, batch, delta, x, grads.data() + layer.weight_offset, false);
    if (l == 0) break;  // nobody needs the gradient of the inputs
    gemm_->run(true, false, layer.in, batch, layer.out, params.data() + layer.weight_offset, delta, spare, false);
    const Layer& below = layers_[l - 1];
    relu_backward_bias_grad(spare, activations_[l - 1].data(), grads.data() + below.bias_offset, below.out, batch);
    delta = spare;
    spare = spare == delta_a_.data() ? delta_b_.data() : delta_a_.data();
  }
  return static_cast<float>(loss_sum / batch);
}

Mlp::~Mlp() = default;
Mlp::Mlp(Mlp&&) noexcept = default;
Mlp& Mlp::operator=(Mlp&&) noexcept = default;

EvalResult Mlp::evaluate(std::span<const float> params, const float* inputs, const std::int32_t* labels,
                         int batch) {
  check_call(params, labels, batch);
  forward(params, inputs, batch);
  const int classes = layers_.back().out;
  EvalResult result;
  for (int j = 0; j < batch; ++j) {
    const float* z = activations_.back().data() + static_cast<std::size_t>(j) * classes;
    const int argmax = static_cast<int>(std::max_element(z, z + classes) - z);
    double sum = 0;
    for (int i = 0; i < classes; ++i) sum += std::exp(static_cast<double>(z[i]) - z[argmax]);
    result.loss_sum += std::log(sum) + z[argmax] - z[labels[j]];
    result.correct += argmax == labels[j];
  }
  result.count = batch;
  return result;
}

double Mlp::flops_per_step(int batch) const {
  double flops = 0;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const double gemm = 2.0 * layers_[l].out * layers_[l].in * batch;
    flops += gemm * (l == 0 ? 2 : 3);  // forward, weight gradient, and (above layer 0) input gradient
  }
  return flops;
}

}  // namespace peertrain::model
