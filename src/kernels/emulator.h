// A CPU emulator of the CUDA execution model, for running the kernels where there is no
// GPU (CI, this project's development machines). Each CUDA thread of a block is a fiber
// on the launching host thread, run until it waits at a barrier (__syncthreads, a warp
// shuffle, an mma) or ends: barriers are real, warp shuffles exchange values between the
// 32 threads of a warp, and a kernel that forgets a barrier reads stale shared memory in
// one launch of every two (emulator.cpp). Blocks run one after another, which is why `__shared__` may map to a
// function-static variable. Only what the kernels in this folder use is provided.
//
// Slow by design (every CUDA thread in turn on one core): for tests on small shapes,
// never for speed.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "peertrain/kernels/device.h"

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

// PTX's mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 over the 32 lanes of a warp:
// c += a·b, a 16×16 and b 16×8 in BF16 pairs, c 16×8 in FP32, each lane holding the
// elements PTX's fragment layouts give it (PTX ISA, "Matrix Fragments for mma.m16n8k16").
// Every lane must call it, as on a device. Products are exact in FP32; the sum runs in
// another order than the tensor core's, so results agree to FP32 rounding, not bitwise.
void mma_m16n8k16_bf16(float c[4], const std::uint32_t a[4], const std::uint32_t b[2]);

// cp.async: copy_async queues a copy in this thread's open group, commit closes the group,
// wait(n) performs the oldest groups' copies until at most n remain queued. A kernel that
// reads shared memory before the wait that covers it sees what was there before.
void copy_async(void* shared, const void* global, std::size_t bytes);
void copy_async_commit();
void copy_async_wait(int in_flight);

// Hopper's wgmma.mma_async (BF16 in, FP32 accumulators, A from registers, B a K-major
// operand in shared memory without swizzle) over the 128 threads of a warpgroup:
// d (n/8 × 4 floats per thread, the m64nN accumulator layout) = A·B, + d when accumulate.
// As on a device the product is asynchronous: issued here, performed by the wgmma_wait
// that retires its group (reading a, b and d then), so a kernel that reads d, or rewrites
// A's registers or B's shared memory, before that wait sees what a device could show it.
// The fences (wgmma.fence, fence.proxy.async) are not modelled. The descriptor's address is an offset from
// the shared base last given to wgmma_shared_base.
void wgmma_shared_base(const void* base);
void wgmma_bf16(float* d, int n, const std::uint32_t a[4], std::uint64_t descriptor, bool accumulate);
void wgmma_commit();
void wgmma_wait(int in_flight);

// Runs body once per CUDA thread of every block of the grid. Throws the first error a
// thread throws, and Error(kInternal) when every unfinished thread waits at a barrier
// that cannot open (a deadlock on a device). shared_bytes of dynamic
// shared memory are reachable through dynamic_shared().
void run(dim3 grid, dim3 block, std::size_t shared_bytes, const std::function<void()>& body);
void* dynamic_shared();

template <typename Kernel, typename... Args>
void launch(dim3 grid, dim3 block, std::size_t shared_bytes, Kernel kernel, Args... args) {
  run(grid, block, shared_bytes, [&] { kernel(args...); });
}

// Queues `work` on `stream`, to run when the stream is synchronised (runtime_emulated.cpp:
// emulated streams are lazy, so a missing event between streams shows as stale reads).
void enqueue(Stream stream, std::function<void()> work);

// A kernel launch on a stream (PT_LAUNCH): its arguments are taken now, by value, as a
// launch does; it runs when the stream gets there.
template <typename Kernel, typename... Args>
void launch_on(Stream stream, dim3 grid, dim3 block, std::size_t shared_bytes, Kernel kernel, Args... args) {
  enqueue(stream, [=] { run(grid, block, shared_bytes, [&] { kernel(args...); }); });
}

}  // namespace peertrain::kernels::emulator
