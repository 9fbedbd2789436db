// The D-PSGD mix x ← Σ_j w_j x_j on the device: one pass, each output element reads its
// inputs once, so it runs at memory bandwidth.
#include <cuda_runtime.h>

#include "device.h"

namespace peertrain::kernels {
namespace {

constexpr int kMaxInputs = 64;

struct MixArgs {
  const float* inputs[kMaxInputs];
  float weights[kMaxInputs];
};

__global__ void gossip_mix_kernel(float* x, MixArgs args, int num_inputs, std::size_t count) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < num_inputs; ++j) acc += args.weights[j] * args.inputs[j][i];
    x[i] = acc;
  }
}

}  // namespace

std::string gossip_mix(float* x, const float* const* inputs, const float* weights, int num_inputs,
                       std::size_t count) {
  if (num_inputs < 1 || num_inputs > kMaxInputs) return "gossip_mix: between 1 and 64 inputs are supported";
  if (count == 0) return {};
  MixArgs args{};
  for (int j = 0; j < num_inputs; ++j) {
    args.inputs[j] = inputs[j];
    args.weights[j] = weights[j];
  }
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<std::size_t>((count + threads - 1) / threads, 4096));
  gossip_mix_kernel<<<blocks, threads>>>(x, args, num_inputs, count);
  const cudaError_t status = cudaGetLastError();
  return status == cudaSuccess ? std::string() : std::string("gossip_mix: ") + cudaGetErrorString(status);
}

}  // namespace peertrain::kernels
