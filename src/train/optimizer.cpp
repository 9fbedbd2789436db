// SGD with momentum and weight decay; see optimizer.h for the update rule. Each call is one
// pass over the buffers, so the optimizer costs a few memory sweeps of the parameters.
#include "peertrain/train/optimizer.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "peertrain/core/error.h"

namespace peertrain::train {
namespace {

// Runs pass(begin, end) over contiguous ranges of [0, size), one per thread of Eigen's
// count: the --threads an MLP run gives its GEMMs (a batch-parallel transformer engine sets
// it to one and keeps its threads for the model). Every coordinate's update is its own, so
// the ranges give the one-thread bits. At 2 threads one pass over a 784-512-512-10 MLP's
// buffers was 12 % of its step, all on one core while the other waited.
constexpr std::size_t kMinFloatsPerThread = 1 << 16;
template <class Pass>
void over_ranges(std::size_t size, Pass pass) {
  int threads = Eigen::nbThreads();
#ifdef _OPENMP
  threads = std::min(threads, omp_get_max_threads());  // this thread's limit, as the GEMM
#endif
  const auto parts = static_cast<long>(
      std::min<std::size_t>(static_cast<std::size_t>(std::max(1, threads)), size / kMinFloatsPerThread));
  if (parts <= 1) {
    pass(std::size_t{0}, size);
    return;
  }
#pragma omp parallel for num_threads(parts) schedule(static, 1)
  for (long part = 0; part < parts; ++part)
    pass(size * static_cast<std::size_t>(part) / static_cast<std::size_t>(parts),
         size * static_cast<std::size_t>(part + 1) / static_cast<std::size_t>(parts));
}

// SGD's pass over [begin, end): v = m·v + g + wd·x, then x −= lr·v. The loops of both
// optimizers take their scalars as parameters, never as a lambda's captures: the closure's
// floats live in memory that the stores through v and x might, for all the compiler knows,
// overwrite, so it reloads them on every coordinate and does not vectorize (Adam's pass ran
// 5x slower so).
void sgd_step_range(float lr, float wd, float m, float* v, const float* g, float* x, std::size_t begin,
                    std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) {
    v[i] = m * v[i] + (g[i] + wd * x[i]);
    x[i] -= lr * v[i];
  }
}
// The same with the step lr·v written to update, x unchanged.
void sgd_update_range(float lr, float wd, float m, float* v, const float* g, const float* x, float* update,
                      std::size_t begin, std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) {
    v[i] = m * v[i] + (g[i] + wd * x[i]);
    update[i] = lr * v[i];
  }
}

}  // namespace

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
  const float *g = grads.data(), *x = params.data();
  float* u = update.data();
  over_ranges(velocity_.size(),
              [&](std::size_t begin, std::size_t end) { sgd_update_range(lr, wd, m, v, g, x, u, begin, end); });
}

void Sgd::step(std::span<float> params, std::span<const float> grads) {
  check_sizes(params.size(), grads.size());
  const float lr = config_.lr, wd = config_.weight_decay;
  const float m = config_.momentum;
  float* v = velocity_.data();
  const float* g = grads.data();
  float* x = params.data();
  over_ranges(velocity_.size(),
              [&](std::size_t begin, std::size_t end) { sgd_step_range(lr, wd, m, v, g, x, begin, end); });
}

OptimizerKind parse_optimizer(std::string_view name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adam") return OptimizerKind::kAdam;
  throw Error(ErrorKind::kInvalidArgument, str("--optimizer '", name, "' is not one of sgd, adam"));
}

std::unique_ptr<Optimizer> make_optimizer(OptimizerKind kind, std::size_t size, const SgdConfig& sgd,
                                          const AdamConfig& adam) {
  if (kind == OptimizerKind::kAdam) return std::make_unique<Adam>(size, adam);
  return std::make_unique<Sgd>(size, sgd);
}

Adam::Adam(std::size_t size, AdamConfig config) : config_(config), size_(size), state_(2 * size + 1, 0.0f) {
  if (!(config_.lr > 0) || !(config_.beta1 >= 0 && config_.beta1 < 1) || !(config_.beta2 >= 0 && config_.beta2 < 1) ||
      !(config_.eps > 0) || !(config_.weight_decay >= 0))
    throw Error(ErrorKind::kInvalidArgument, str("Adam: lr ", config_.lr, " must be > 0, betas ", config_.beta1, ", ",
                                                 config_.beta2, " in [0, 1), eps ", config_.eps,
                                                 " > 0, weight decay ", config_.weight_decay, " >= 0"));
}

void Adam::restore_state(std::span<const float> state) {
  if (state.size() != state_.size())
    throw Error(ErrorKind::kInvalidArgument,
                str("Adam over ", size_, " floats cannot restore a state of ", state.size(), " floats"));
  state_.assign(state.begin(), state.end());
}

namespace {

// Adam's pass over [begin, end), its scalars as parameters (see sgd_step_range).
template <class Apply>
void adam_range(float b1, float b2, float lr, float wd, float eps, float c1, float c2, float* m, float* v,
                const float* params, const float* grads, std::size_t begin, std::size_t end, Apply apply) {
  for (std::size_t i = begin; i < end; ++i) {
    const float g = grads[i];
    m[i] = b1 * m[i] + (1.0f - b1) * g;
    v[i] = b2 * v[i] + (1.0f - b2) * g * g;
    apply(i, lr * (wd * params[i] + (m[i] * c1) / (std::sqrt(v[i] * c2) + eps)));
  }
}

// One Adam pass over every coordinate; apply(i, u) receives coordinate i's update. Both
// entry points run this loop; step()'s x − u may fuse into one FMA, so it agrees with
// compute_update() then a subtraction to a float's last bit or two (as Sgd's).
template <class Apply>
void adam_pass(const AdamConfig& config, float steps, float* m, float* v, const float* params, const float* grads,
               std::size_t size, Apply apply) {
  const float b1 = config.beta1, b2 = config.beta2, lr = config.lr, wd = config.weight_decay, eps = config.eps;
  const float c1 = 1.0f / (1.0f - std::pow(b1, steps)), c2 = 1.0f / (1.0f - std::pow(b2, steps));
  over_ranges(size, [&](std::size_t begin, std::size_t end) {
    adam_range(b1, b2, lr, wd, eps, c1, c2, m, v, params, grads, begin, end, apply);
  });
}

}  // namespace

void Adam::compute_update(std::span<const float> params, std::span<const float> grads, std::span<float> update) {
  PEERTRAIN_CHECK(params.size() == size_ && grads.size() == size_ && update.size() == size_, "Adam over ", size_,
                  " floats got params of ", params.size(), ", grads of ", grads.size(), ", update of ", update.size());
  float& steps = state_[2 * size_];
  steps += 1.0f;
  float* u = update.data();
  adam_pass(config_, steps, state_.data(), state_.data() + size_, params.data(), grads.data(), size_,
            [u](std::size_t i, float x) { u[i] = x; });
}

// In place, in the same pass: no update buffer (a fresh 4·size bytes each step, whose
// page faults and zeroing cost more than the arithmetic) and no second pass.
void Adam::step(std::span<float> params, std::span<const float> grads) {
  PEERTRAIN_CHECK(params.size() == size_ && grads.size() == size_, "Adam over ", size_, " floats got params of ",
                  params.size(), ", grads of ", grads.size());
  float& steps = state_[2 * size_];
  steps += 1.0f;
  float* p = params.data();
  adam_pass(config_, steps, state_.data(), state_.data() + size_, p, grads.data(), size_,
            [p](std::size_t i, float x) { p[i] -= x; });
}

LrSchedule parse_lr_schedule(std::string_view name) {
  if (name == "constant") return LrSchedule::kConstant;
  if (name == "cosine") return LrSchedule::kCosine;
  throw Error(ErrorKind::kInvalidArgument, str("--lr-schedule '", name, "' is not one of constant, cosine"));
}

float scheduled_learning_rate(LrSchedule schedule, float base, long long step, long long total_steps,
                              long long warmup) {
  if (schedule == LrSchedule::kConstant) return base;
  if (step < warmup) return base * static_cast<float>(step + 1) / static_cast<float>(warmup);
  const double span = std::max<long long>(1, total_steps - 1 - warmup);
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / span);
  constexpr double kFloor = 0.1;
  return static_cast<float>(base * (kFloor + (1 - kFloor) * 0.5 * (1 + std::cos(3.141592653589793 * progress))));
}

}  // namespace peertrain::train
