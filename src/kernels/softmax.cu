// Softmax cross-entropy, one warp per column of logits (classes contiguous): max and
// argmax, the sum of exponentials, then the gradient written over the logits in place.
#include "compat.h"
#include "peertrain/kernels/ops.h"

namespace peertrain::kernels {
namespace {

constexpr int kSoftmaxThreads = 128;

__global__ void softmax_cross_entropy_kernel(int classes, int n, float* logits, const std::int32_t* targets,
                                             float grad_scale, float* loss, int* correct) {
  const int lane = static_cast<int>(threadIdx.x) % detail::kWarp;
  const int j = static_cast<int>(blockIdx.x * (blockDim.x / detail::kWarp) + threadIdx.x / detail::kWarp);
  if (j >= n) return;
  float* z = logits + static_cast<std::size_t>(j) * classes;
  // The first largest logit, as the CPU's maxCoeff picks it: ties go to the lower index.
  float best = -INFINITY;
  int best_index = classes;
  for (int c = lane; c < classes; c += detail::kWarp)
    if (z[c] > best) {
      best = z[c];
      best_index = c;
    }
  for (int mask = detail::kWarp / 2; mask > 0; mask /= 2) {
    const float other = PT_SHFL_XOR(best, mask);
    const int other_index = PT_SHFL_XOR(best_index, mask);
    if (other > best || (other == best && other_index < best_index)) {
      best = other;
      best_index = other_index;
    }
  }
  float sum = 0.0f;
  for (int c = lane; c < classes; c += detail::kWarp) sum += expf(z[c] - best);
  sum = detail::warp_sum(sum);
  const int target = targets[j];
  const float target_logit = z[target];
  PT_SYNCWARP();  // every lane has read z[target] before any lane overwrites it
  for (int c = lane; c < classes; c += detail::kWarp) {
    const float p = expf(z[c] - best) / sum * grad_scale;
    z[c] = c == target ? p - grad_scale : p;
  }
  if (lane == 0) {
    loss[j] = logf(sum) + best - target_logit;
    correct[j] = best_index == target ? 1 : 0;
  }
}

}  // namespace

void softmax_cross_entropy(Stream stream, int classes, int n, float* logits, const std::int32_t* targets,
                           float grad_scale, float* loss, int* correct) {
  if (n == 0) return;
  const int per_block = kSoftmaxThreads / detail::kWarp;
  PT_LAUNCH(softmax_cross_entropy_kernel, (n + per_block - 1) / per_block, kSoftmaxThreads, 0, stream, classes, n,
            logits, targets, grad_scale, loss, correct);
  detail::check_launch("softmax_cross_entropy");
}

}  // namespace peertrain::kernels
