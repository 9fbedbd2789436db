// SGD with momentum and weight decay over one flat parameter buffer, with PyTorch's
// semantics (torch.optim.SGD, dampening 0, no Nesterov):
//   d = g + wd·x;  v ← m·v + d  (v starts at 0, so the first v is d, as in PyTorch);  x ← x − lr·v.
// D-PSGD needs the update apart from the parameters, because it applies it to the mixed
// parameters: x_{k+1} = Σ_j W_ij x_j − u, hence compute_update().
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace peertrain::train {

struct SgdConfig {
  float lr = 0.05f;
  float momentum = 0.9f;
  float weight_decay = 1e-4f;
};

class Sgd {
 public:
  Sgd(std::size_t size, SgdConfig config);

  // u ← lr·v after updating the momentum buffer v from grads taken at params; params are
  // not changed.
  void compute_update(std::span<const float> params, std::span<const float> grads, std::span<float> update);
  // params ← params − lr·v: the centralized step.
  void step(std::span<float> params, std::span<const float> grads);

  const SgdConfig& config() const { return config_; }
  std::span<const float> momentum() const { return velocity_; }
  // Replaces the momentum buffer, e.g. by one saved in a checkpoint, so the updates that
  // follow are those of the run that saved it. Throws Error when the size differs.
  void restore_momentum(std::span<const float> momentum);

 private:
  void check_sizes(std::size_t params, std::size_t grads) const;

  SgdConfig config_;
  std::vector<float> velocity_;
};

}  // namespace peertrain::train
