// Hopper's warpgroup matrix product (wgmma.mma_async, sm_90a) and what goes with it, for
// kernels built for sm_90a alone (attention_wgmma.cu); the emulated build runs them on
// emulator.h's model. Only the form the attention uses: BF16 operands, FP32 accumulators,
// A (64 × 16) from registers in mma.m16n8k16's A layout (warp w of the warpgroup holds rows
// 16w…16w+15), B (16 × N) a K-major operand in shared memory without swizzle, described by
// wgmma_descriptor. The accumulators d[N/8][4] are mma.m16n8k16's C layout per 8 columns.
//
// The product is asynchronous: wgmma_fence() before the first product whose registers
// other instructions wrote, wgmma_commit() to close a group, wgmma_wait<N>() until at most
// N groups are in flight; and because the compiler does not know the registers change at
// the wait, keep_registers() before the fence and after the wait pins the accumulators
// and A fragments in place (CUTLASS's warpgroup_fence_operand). Shared memory that
// ordinary stores or cp.async wrote needs fence_async_shared() in each writing thread
// before the barrier that precedes the product (the tensor cores read it through the
// async proxy).
#pragma once

#include <cstdint>

#include "compat.h"

namespace peertrain::kernels::detail {

// A K-major operand without swizzle: core matrices of 8 rows × 16 bytes stored contiguously
// (128 bytes); `lbo` bytes between core matrices adjacent along K, `sbo` along M or N.
__device__ __forceinline__ std::uint64_t wgmma_descriptor(const void* shared_base, const void* matrix, unsigned lbo,
                                                          unsigned sbo) {
#if defined(__CUDACC__)
  (void)shared_base;
  const std::uint64_t address = static_cast<unsigned>(__cvta_generic_to_shared(matrix));
#else
  const std::uint64_t address =
      static_cast<std::uint64_t>(static_cast<const char*>(matrix) - static_cast<const char*>(shared_base));
  emulator::wgmma_shared_base(shared_base);
#endif
  return ((address & 0x3ffffu) >> 4) | (static_cast<std::uint64_t>((lbo & 0x3ffffu) >> 4) << 16) |
         (static_cast<std::uint64_t>((sbo & 0x3ffffu) >> 4) << 32);
}

// d = a·b (+ d when accumulate), one m64nNk16 product of the warpgroup.
template <int N>
__device__ __forceinline__ void wgmma_bf16(float (&d)[N / 8][4], const std::uint32_t (&a)[4], std::uint64_t b,
                                           bool accumulate);

#if defined(__CUDACC__)
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kInFlight>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kInFlight) : "memory");
}
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
template <int R, int C>
__device__ __forceinline__ void keep_registers(float (&x)[R][C]) {
  PT_UNROLL
  for (int r = 0; r < R; ++r) PT_UNROLL
  for (int c = 0; c < C; ++c) asm volatile("" : "+f"(x[r][c])::"memory");
}
template <int R, int C>
__device__ __forceinline__ void keep_registers(std::uint32_t (&x)[R][C]) {
  PT_UNROLL
  for (int r = 0; r < R; ++r) PT_UNROLL
  for (int c = 0; c < C; ++c) asm volatile("" : "+r"(x[r][c])::"memory");
}

template <>
__device__ __forceinline__ void wgmma_bf16<16>(float (&d)[2][4], const std::uint32_t (&a)[4], std::uint64_t b,
                                               bool accumulate) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %13, 0; "
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, "
      "{%8, %9, %10, %11}, %12, p, 1, 1, 0; }\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}

template <>
__device__ __forceinline__ void wgmma_bf16<32>(float (&d)[4][4], const std::uint32_t (&a)[4], std::uint64_t b,
                                               bool accumulate) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %21, 0; "
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0; }\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}

template <>
__device__ __forceinline__ void wgmma_bf16<64>(float (&d)[8][4], const std::uint32_t (&a)[4], std::uint64_t b,
                                               bool accumulate) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %37, 0; "
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0; }\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}

#else
inline void wgmma_fence() {}
inline void wgmma_commit() { emulator::wgmma_commit(); }
template <int kInFlight>
void wgmma_wait() {
  emulator::wgmma_wait(kInFlight);
}
inline void fence_async_shared() {}
template <typename T, int R, int C>
void keep_registers(T (&)[R][C]) {}
template <int N>
void wgmma_bf16(float (&d)[N / 8][4], const std::uint32_t (&a)[4], std::uint64_t b, bool accumulate) {
  emulator::wgmma_bf16(&d[0][0], N, a, b, accumulate);
}
#endif

}  // namespace peertrain::kernels::detail
