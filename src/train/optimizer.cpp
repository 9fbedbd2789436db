// SGD with momentum and weight decay; see optimizer.h for the update rule. Each call is one
// pass over the buffers, so the optimizer costs a few memory sweeps of the parameters.
#include "peertrain/train/optimizer.h"

#include "peertrain/core/error.h"

namespace peertrain::train {

Sgd::Sgd(std::size_t size, SgdConfig config) : config_(config), velocity_(size, 0.0f) {
  if (!(config_.lr > 0) || !(config_.momentum >= 0 && config_.momentum < 1) || !(config_.weight_decay >= 0))
    throw Error(ErrorKind::kInvalidArgument,
                str("SGD: lr ", config_.lr, " must be > 0, momentum ", config_.momentum, " in [0, 1), weight decay ",
                    config_.weight_decay, " >= 0"));
}

void Sgd::check_sizes(std::size_t params, std::size_t grads) const {
  PEERTRAIN_CHECK(params == velocity_.size() && grads == velocity_.size(), "SGD over ", velocity_.size(),
                  " floats got params of ", params, " and grads of ", grads);
}

void Sgd::restore_momentum(std::span<const float> momentum) {
  if (momentum.size() != velocity_.size())
    throw Error(ErrorKind::kInvalidArgument, str("SGD over ", velocity_.size(), " floats cannot restore a momentum buffer of ",
                                                 momentum.size()));
  velocity_.assign(momentum.begin(), momentum.end());
}

void Sgd::compute_update(std::span<const float> params, std::span<const float> grads, std::span<float> update) {
  check_sizes(params.size(), grads.size());
  PEERTRAIN_CHECK(update.size() == velocity_.size(), "update has ", update.size(), " floats, SGD ",
                  velocity_.size());
  const float lr = config_.lr, wd = config_.weight_decay;
  const float m = config_.momentum;
  float* v = velocity_.data();
  for (std::size_t i = 0; i < velocity_.size(); ++i) {
    v[i] = m * v[i] + (grads[i] + wd * params[i]);
    update[i] = lr * v[i];
  }
}

void Sgd::step(std::span<float> params, std::span<const float> grads) {
  check_sizes(params.size(), grads.size());
  const float lr = config_.lr, wd = config_.weight_decay;
  const float m = config_.momentum;
  float* v = velocity_.data();
  for (std::size_t i = 0; i < velocity_.size(); ++i) {
    v[i] = m * v[i] + (grads[i] + wd * params[i]);
    params[i] -= lr * v[i];
  }
}

}  // namespace peertrain::train
