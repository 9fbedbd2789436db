// What lets one kernel source build two ways: by nvcc for the GPU, and by the host C++
// compiler against the CPU emulator (emulator.h), which runs every CUDA thread of a block
// as a host thread. The emulated build is how CI, which has no GPU, runs the kernels'
// indexing, shared-memory and warp-reduction logic against the CPU model; the nvcc build
// is what runs on a device. Kernels use only what this file and emulator.h provide.
#pragma once

#include <cstddef>

#include "peertrain/kernels/device.h"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#define PT_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<(grid), (block), (shared_bytes), static_cast<cudaStream_t>((stream).handle)>>>(__VA_ARGS__)
#define PT_SHFL_XOR(value, lane_mask) __shfl_xor_sync(0xffffffffu, (value), (lane_mask))
#define PT_SYNCWARP() __syncwarp()

namespace peertrain::kernels::detail {
// Throws peertrain::Error naming the kernel when its launch failed (bad configuration,
// no device); errors inside a running kernel surface at the next synchronisation.
void check_launch(const char* kernel);
}  // namespace peertrain::kernels::detail

#else
#include "emulator.h"

#define PT_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  ((void)(stream), ::peertrain::kernels::emulator::launch(dim3(grid), dim3(block), (shared_bytes), kernel, __VA_ARGS__))
#define PT_SHFL_XOR(value, lane_mask) ::peertrain::kernels::emulator::shfl_xor((value), (lane_mask))
#define PT_SYNCWARP() ::peertrain::kernels::emulator::syncwarp()

namespace peertrain::kernels::detail {
inline void check_launch(const char*) {}
}  // namespace peertrain::kernels::detail
#endif

namespace peertrain::kernels::detail {

constexpr int kWarp = 32;

// Sum and max over the 32 lanes of a warp; every lane gets the result.
__device__ __forceinline__ float warp_sum(float value) {
  for (int mask = kWarp / 2; mask > 0; mask /= 2) value += PT_SHFL_XOR(value, mask);
  return value;
}
__device__ __forceinline__ float warp_max(float value) {
  for (int mask = kWarp / 2; mask > 0; mask /= 2) value = fmaxf(value, PT_SHFL_XOR(value, mask));
  return value;
}

// Blocks for a grid-stride loop over `count` elements: enough to fill a GPU, never more
// than the elements need.
inline int grid_for(std::size_t count, int threads, int cap = 4096) {
  const std::size_t blocks = (count + static_cast<std::size_t>(threads) - 1) / static_cast<std::size_t>(threads);
  return static_cast<int>(blocks < 1 ? 1 : (blocks > static_cast<std::size_t>(cap) ? cap : blocks));
}

}  // namespace peertrain::kernels::detail
