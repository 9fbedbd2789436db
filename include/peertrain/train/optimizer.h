// Optimizers over one flat parameter buffer.
// SGD with momentum and weight decay, with PyTorch's semantics (torch.optim.SGD, dampening
// 0, no Nesterov):
//   d = g + wd·x;  v ← m·v + d  (v starts at 0, so the first v is d, as in PyTorch);  x ← x − lr·v.
// D-PSGD needs the update apart from the parameters, because it applies it to the mixed
// parameters: x_{k+1} = Σ_j W_ij x_j − u, hence compute_update().
// Adam with decoupled weight decay (Loshchilov & Hutter 2019; torch.optim.AdamW): the
// transformers train with it, since plain SGD needs far more steps on them.
//   x ← x − lr·wd·x;  m ← β1 m + (1−β1) g;  v ← β2 v + (1−β2) g²;
//   x ← x − lr · (m / (1−β1ᵗ)) / (√(v / (1−β2ᵗ)) + ε).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace peertrain::train {

struct SgdConfig {
  float lr = 0.05f;
  float momentum = 0.9f;
  float weight_decay = 1e-4f;
};

struct AdamConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

enum class OptimizerKind { kSgd, kAdam };
OptimizerKind parse_optimizer(std::string_view name);  // throws Error naming the choices

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // u such that params − u is the step; params are not changed.
  virtual void compute_update(std::span<const float> params, std::span<const float> grads, std::span<float> update) = 0;
  // params ← params − u: the centralized step.
  virtual void step(std::span<float> params, std::span<const float> grads) = 0;
  // Everything a checkpoint keeps so that the updates that follow are those of the run
  // that saved it; restore_state throws Error when the size differs.
  virtual std::span<const float> state() const = 0;
  virtual void restore_state(std::span<const float> state) = 0;
  // The schedule sets the rate before every step; the rest of the configuration is fixed.
  virtual void set_learning_rate(float lr) = 0;
};

// The learning-rate schedule: constant, or a linear warm-up over `warmup` steps followed by
// a cosine decay to 10% of the base rate at the last step (the schedule of GPT-2 / nanoGPT
// training). A function of the step alone, so resumed and rejoined peers agree on it.
enum class LrSchedule { kConstant, kCosine };
LrSchedule parse_lr_schedule(std::string_view name);  // throws Error naming the choices
float scheduled_learning_rate(LrSchedule schedule, float base, long long step, long long total_steps,
                              long long warmup);

std::unique_ptr<Optimizer> make_optimizer(OptimizerKind kind, std::size_t size, const SgdConfig& sgd,
                                          const AdamConfig& adam);

class Sgd final : public Optimizer {
 public:
  Sgd(std::size_t size, SgdConfig config);

  // u ← lr·v after updating the momentum buffer v from grads taken at params.
  void compute_update(std::span<const float> params, std::span<const float> grads, std::span<float> update) override;
  // params ← params − lr·v.
  void step(std::span<float> params, std::span<const float> grads) override;
  std::span<const float> state() const override { return velocity_; }
  void restore_state(std::span<const float> state) override { restore_momentum(state); }
  void set_learning_rate(float lr) override { config_.lr = lr; }

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

class Adam final : public Optimizer {
 public:
  Adam(std::size_t size, AdamConfig config);
  void compute_update(std::span<const float> params, std::span<const float> grads, std::span<float> update) override;
  void step(std::span<float> params, std::span<const float> grads) override;
  // m, then v, then the number of steps taken (exact in a float up to 2²⁴ steps).
  std::span<const float> state() const override { return state_; }
  void restore_state(std::span<const float> state) override;
  void set_learning_rate(float lr) override { config_.lr = lr; }

 private:
  AdamConfig config_;
  std::size_t size_;
  std::vector<float> state_;
};

}  // namespace peertrain::train
