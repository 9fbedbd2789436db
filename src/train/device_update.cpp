#include "peertrain/train/device_update.h"

#include <algorithm>

#include "peertrain/core/error.h"
#include "peertrain/model/device_model.h"

namespace peertrain::train {

void DeviceUpdate::compute_update(std::span<const float> params, std::span<const float> grads,
                                  std::span<float> update) {
  PEERTRAIN_CHECK(params.size() == size_ && grads.size() == size_ && update.size() == size_, "device update over ",
                  size_, " floats got params of ", params.size(), ", u of ", grads.size(), ", update of ",
                  update.size());
  std::copy(grads.begin(), grads.end(), update.begin());
}

void DeviceUpdate::step(std::span<float> params, std::span<const float> grads) {
  PEERTRAIN_CHECK(params.size() == size_ && grads.size() == size_, "device update over ", size_,
                  " floats got params of ", params.size(), " and u of ", grads.size());
  for (std::size_t i = 0; i < size_; ++i) params[i] -= grads[i];
}

std::span<const float> DeviceUpdate::state() const {
  state_ = device_.update_state();
  return state_;
}

void DeviceUpdate::restore_state(std::span<const float> state) { device_.restore_update_state(state); }

void DeviceUpdate::set_learning_rate(float lr) { device_.set_update_learning_rate(lr); }

bool optimizer_sees_own_gradient(const TrainConfig& config) {
  switch (config.algorithm) {
    case Algorithm::kDpsgd:
      return config.momentum_form == MomentumForm::kLocal;
    case Algorithm::kChoco:
    case Algorithm::kD2:
    case Algorithm::kLocal:
      return true;
    case Algorithm::kAdpsgd:  // its step applies weight decay at x as averaged since the gradient's snapshot
    case Algorithm::kAllreduce:
    case Algorithm::kPs:
    case Algorithm::kGt:
    case Algorithm::kDiloco:  // its outer step rewrites x on the host
    case Algorithm::kSgp:     // it sets x to the de-biased z on the host
      return false;
    case Algorithm::kEl:
      return true;
  }
  return false;
}

std::unique_ptr<Optimizer> make_device_update(model::DeviceModel* device, std::size_t size, const TrainConfig& config) {
  if (device == nullptr || !optimizer_sees_own_gradient(config)) return nullptr;
  model::DeviceUpdateRule rule;
  rule.adam = config.optimizer == OptimizerKind::kAdam;
  if (rule.adam) {
    rule.lr = config.adam.lr;
    rule.beta1 = config.adam.beta1;
    rule.beta2 = config.adam.beta2;
    rule.eps = config.adam.eps;
    rule.weight_decay = config.adam.weight_decay;
  } else {
    rule.lr = config.sgd.lr;
    rule.momentum = config.sgd.momentum;
    rule.weight_decay = config.sgd.weight_decay;
  }
  if (!device->set_update_rule(rule)) return nullptr;
  return std::unique_ptr<Optimizer>(new DeviceUpdate(*device, size));
}

}  // namespace peertrain::train
