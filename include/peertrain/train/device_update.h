// The optimizer on the GPU (--device cuda): train::Sgd's or train::Adam's rule run by the
// device model over its own gradient (model::DeviceModel::set_update_rule), so that a step
// hands the host the update u, and neither the gradient nor the optimizer's pass over the
// parameters crosses to the host. As a train::Optimizer, it takes the u that
// compute_gradient left in `grads` for the gradient it stands in for.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "peertrain/train/optimizer.h"
#include "peertrain/train/trainer.h"

namespace peertrain::model {
class DeviceModel;
}

namespace peertrain::train {

class DeviceUpdate final : public Optimizer {
 public:
  // `grads` of compute_update and step is the device's update u, not a gradient.
  void compute_update(std::span<const float> params, std::span<const float> grads, std::span<float> update) override;
  void step(std::span<float> params, std::span<const float> grads) override;
  // train::Sgd's or train::Adam's layout, read from the device, so checkpoints move
  // between --device cpu and cuda.
  std::span<const float> state() const override;
  void restore_state(std::span<const float> state) override;
  void set_learning_rate(float lr) override;

 private:
  friend std::unique_ptr<Optimizer> make_device_update(model::DeviceModel*, std::size_t, const TrainConfig&);
  DeviceUpdate(model::DeviceModel& device, std::size_t size) : device_(device), size_(size) {}
  model::DeviceModel& device_;
  std::size_t size_;
  mutable std::vector<float> state_;
};

// Whether the algorithm hands the optimizer the peer's own gradient at the x_k it was taken
// at, where u computed on the device is the very u the host would compute: D-PSGD with
// local momentum, CHOCO, D² and local training. Not all-reduce and the parameter server
// (they average gradients first), gradient tracking (its optimizer sees y), quasi-global
// momentum (its own rule) or AD-PSGD (x moves between the gradient and the step).
bool optimizer_sees_own_gradient(const TrainConfig& config);

// DeviceUpdate over `device` when there is one, the algorithm qualifies and the device model
// takes the rule; else null, and the host's optimizer stays.
std::unique_ptr<Optimizer> make_device_update(model::DeviceModel* device, std::size_t size, const TrainConfig& config);

}  // namespace peertrain::train
