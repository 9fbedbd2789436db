// What lets one kernel source build two ways: by nvcc for the GPU, and by the host C++
// compiler against the CPU emulator (emulator.h), which runs every CUDA thread of a block
// as a host thread. The emulated build is how CI, which has no GPU, runs the kernels'
// indexing, shared-memory and warp-reduction logic against the CPU model; the nvcc build
// is what runs on a device. Kernels use only what this file and emulator.h provide.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "peertrain/kernels/device.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define PT_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<(grid), (block), (shared_bytes), static_cast<cudaStream_t>((stream).handle)>>>(__VA_ARGS__)
#define PT_SHFL_XOR(value, lane_mask) __shfl_xor_sync(0xffffffffu, (value), (lane_mask))
#define PT_SYNCWARP() __syncwarp()
// Unrolls a loop of constant trip count, so that register arrays indexed by its counter
// stay in registers (a run-time index would move them to local memory).
#define PT_UNROLL _Pragma("unroll")

namespace peertrain::kernels::detail {
// Throws peertrain::Error naming the kernel when its launch failed (bad configuration,
// no device); errors inside a running kernel surface at the next synchronisation.
void check_launch(const char* kernel);
}  // namespace peertrain::kernels::detail

#else
#include "emulator.h"

#define PT_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  ::peertrain::kernels::emulator::launch_on((stream), dim3(grid), dim3(block), (shared_bytes), kernel, __VA_ARGS__)
#define PT_SHFL_XOR(value, lane_mask) ::peertrain::kernels::emulator::shfl_xor((value), (lane_mask))
#define PT_SYNCWARP() ::peertrain::kernels::emulator::syncwarp()
#define PT_UNROLL

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

// Two floats rounded to BF16 (to nearest, ties to even) in one register, `lo` in the low
// half: the operand format of the tensor cores' BF16 mma.
__device__ __forceinline__ std::uint32_t pack_bf16x2(float lo, float hi) {
#if defined(__CUDACC__)
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  std::uint32_t bits;
  memcpy(&bits, &pair, sizeof bits);
  return bits;
#else
  auto round = [](float x) -> std::uint32_t {
    std::uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (bits >> 16) | 0x40u;  // NaN stays NaN
    return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  };
  return round(lo) | (round(hi) << 16);
#endif
}

// c += a·b on the tensor cores: one m16n8k16 BF16 mma with FP32 accumulation by the whole
// warp, fragments in PTX's layouts (emulator.h spells them out).
__device__ __forceinline__ void mma_bf16_m16n8k16(float c[4], const std::uint32_t a[4], const std::uint32_t b[2]) {
#if defined(__CUDACC__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  emulator::mma_m16n8k16_bf16(c, a, b);
#endif
}

// 2^x by the special-function unit (ex2.approx: 2 ulp, subnormals flushed), the one
// exponential of the tensor-core attention's online softmax.
__device__ __forceinline__ float fast_exp2(float x) {
#if defined(__CUDACC__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

// Asynchronous 16-byte copies from global to shared memory (cp.async, sm_80+): issue, close
// a group with copy_async_commit(), and copy_async_wait<N>() until at most N of this
// thread's groups are still in flight. The emulator defers each group's copies until a
// wait retires it, so a kernel that reads a tile before waiting for it reads stale data
// there too, as it could on a device.
__device__ __forceinline__ void copy_async_16(void* shared, const void* global) {
#if defined(__CUDACC__)
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global));
#else
  emulator::copy_async(shared, global, 16);
#endif
}
__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDACC__)
  asm volatile("cp.async.commit_group;\n" ::);
#else
  emulator::copy_async_commit();
#endif
}
template <int kInFlight>
__device__ __forceinline__ void copy_async_wait() {
#if defined(__CUDACC__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kInFlight));
#else
  emulator::copy_async_wait(kInFlight);
#endif
}

// Blocks for a grid-stride loop over `count` elements: enough to fill a GPU, never more
// than the elements need.
inline int grid_for(std::size_t count, int threads, int cap = 4096) {
  const std::size_t blocks = (count + static_cast<std::size_t>(threads) - 1) / static_cast<std::size_t>(threads);
  return static_cast<int>(blocks < 1 ? 1 : (blocks > static_cast<std::size_t>(cap) ? cap : blocks));
}

}  // namespace peertrain::kernels::detail
