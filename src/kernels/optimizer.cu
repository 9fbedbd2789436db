// The optimizers' element-wise updates, with train/optimizer.cpp's rules term for term so
// that a device run follows the CPU trajectory to rounding.
#include <cmath>

#include "compat.h"
#include "peertrain/kernels/ops.h"

namespace peertrain::kernels {
namespace {

constexpr int kOptimizerThreads = 256;

__global__ void sgd_kernel(std::size_t count, float* params, const float* grads, float* velocity, float* update,
                           float lr, float momentum, float weight_decay) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float v = momentum * velocity[i] + (grads[i] + weight_decay * params[i]);
    velocity[i] = v;
    if (update != nullptr)
      update[i] = lr * v;
    else
      params[i] -= lr * v;
  }
}

__global__ void adamw_kernel(std::size_t count, float* params, const float* grads, float* m, float* v, float* update,
                             float lr, float beta1, float beta2, float eps, float weight_decay, float c1, float c2) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float g = grads[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float u = lr * (weight_decay * params[i] + (mi * c1) / (sqrtf(vi * c2) + eps));
    if (update != nullptr)
      update[i] = u;
    else
      params[i] -= u;
  }
}

}  // namespace

void sgd_update(Stream stream, std::size_t count, float* params, const float* grads, float* velocity, float* update,
                float lr, float momentum, float weight_decay) {
  if (count == 0) return;
  PT_LAUNCH(sgd_kernel, detail::grid_for(count, kOptimizerThreads), kOptimizerThreads, 0, stream, count, params, grads,
            velocity, update, lr, momentum, weight_decay);
  detail::check_launch("sgd_update");
}

void adamw_update(Stream stream, std::size_t count, float* params, const float* grads, float* m, float* v,
                  float* update, float lr, float beta1, float beta2, float eps, float weight_decay, float step) {
  if (count == 0) return;
  // The bias corrections on the host, in float, exactly as the CPU Adam computes them.
  const float c1 = 1.0f / (1.0f - std::pow(beta1, step)), c2 = 1.0f / (1.0f - std::pow(beta2, step));
  PT_LAUNCH(adamw_kernel, detail::grid_for(count, kOptimizerThreads), kOptimizerThreads, 0, stream, count, params,
            grads, m, v, update, lr, beta1, beta2, eps, weight_decay, c1, c2);
  detail::check_launch("adamw_update");
}

}  // namespace peertrain::kernels
