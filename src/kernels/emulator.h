// A CPU emulator of the CUDA execution model, for running the kernels where there is no
// GPU (CI, this project's development machines). Each block runs with one host thread per
// CUDA thread, so __syncthreads is a real barrier, warp shuffles exchange values between
// the 32 threads of a warp, and a kernel that races or forgets a barrier can fail here as
// it would on a device. Blocks run one after another, which is why `__shared__` may map
// to a function-static variable. Only what the kernels in this folder use is provided.
//
// Slow by design (a thread per CUDA thread): for tests on small shapes, never for speed.
#pragma once

#include <cmath>
#include <cstddef>
#include <functional>

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// Inline (one definition, constant-initialised, seen by every translation unit) rather than
// extern: GCC reaches an extern thread_local of class type through a TLS wrapper call,
// which UBSan reports as a null member access.
inline thread_local dim3 threadIdx;
inline thread_local dim3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

void __syncthreads();
float atomicAdd(float* address, float value);
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }

namespace peertrain::kernels::emulator {

float shfl_xor(float value, int lane_mask);
int shfl_xor(int value, int lane_mask);
void syncwarp();

// Runs body once per CUDA thread of every block of the grid. shared_bytes of dynamic
// shared memory are reachable through dynamic_shared().
void run(dim3 grid, dim3 block, std::size_t shared_bytes, const std::function<void()>& body);
void* dynamic_shared();

template <typename Kernel, typename... Args>
void launch(dim3 grid, dim3 block, std::size_t shared_bytes, Kernel kernel, Args... args) {
  run(grid, block, shared_bytes, [&] { kernel(args...); });
}

}  // namespace peertrain::kernels::emulator
