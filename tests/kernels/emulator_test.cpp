// The CPU emulator of the CUDA execution model (src/kernels/emulator.h) on small kernels of
// its own: __syncthreads and warp shuffles against the serial answer, the order that
// exposes a missing barrier, and the launches that must fail rather than hang or abort:
// a thread whose check fails, and threads that wait at a barrier the others never reach.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "../../src/kernels/emulator.h"
#include "peertrain/core/error.h"
#include "peertrain/kernels/device.h"

namespace peertrain::kernels::emulator {
namespace {

constexpr unsigned kThreads = 96;  // three warps

// The thread whose slot thread t reads: `step` threads on, or its own at the block's ends.
unsigned neighbour(unsigned t, int step) {
  const int n = static_cast<int>(t) + step;
  return n < 0 || n >= static_cast<int>(kThreads) ? t : static_cast<unsigned>(n);
}

// Each thread writes its value to shared memory and reads its neighbour's; with the
// barrier every read sees the write, without it some read what was there.
void rotate(const int* in, int* out, bool barrier, int step = 1) {
  __shared__ int slots[kThreads];
  const unsigned t = threadIdx.x;
  slots[t] = -1;
  if (barrier) __syncthreads();
  slots[t] = in[blockIdx.x * kThreads + t];
  if (barrier) __syncthreads();
  out[blockIdx.x * kThreads + t] = slots[neighbour(t, step)];
  if (barrier) __syncthreads();
}

TEST(Emulator, SyncthreadsMakesEveryWriteVisibleAcrossBlocks) {
  constexpr unsigned blocks = 3;
  std::vector<int> in(blocks * kThreads), out(in.size(), 0);
  std::iota(in.begin(), in.end(), 1000);
  for (int launch_twice = 0; launch_twice < 2; ++launch_twice)  // one round up the threads, one down
    for (int step : {1, -1}) {
      launch(dim3(blocks), dim3(kThreads), 0, rotate, in.data(), out.data(), true, step);
      for (unsigned b = 0; b < blocks; ++b)
        for (unsigned t = 0; t < kThreads; ++t)
          EXPECT_EQ(out[b * kThreads + t], in[b * kThreads + neighbour(t, step)])
              << "block " << b << " thread " << t << " step " << step;
    }
}

// Each thread runs until it waits, up the threads in one launch and down in the next: a
// kernel that forgets its barrier reads before its neighbour wrote in one launch of every
// two, whichever neighbour it reads, instead of one run in a thousand.
TEST(Emulator, AMissingBarrierShowsInOneLaunchOfEveryTwo) {
  std::vector<int> in(kThreads), out(kThreads, 0);
  for (int step : {1, -1}) {
    int stale_launches = 0;
    for (int launch_twice = 0; launch_twice < 2; ++launch_twice) {
      std::iota(in.begin(), in.end(), 1000 + 1000 * (2 * launch_twice + (step > 0)));  // never what a slot held
      launch(dim3(1), dim3(kThreads), 0, rotate, in.data(), out.data(), false, step);
      bool stale = false;
      for (unsigned t = 0; t < kThreads; ++t) stale = stale || out[t] != in[neighbour(t, step)];
      stale_launches += stale;
    }
    EXPECT_EQ(stale_launches, 1) << "step " << step;
  }
}

// A butterfly sum over each warp with shfl_xor, against the serial sums.
void warp_sums(const float* in, float* out) {
  float v = in[threadIdx.x];
  for (int mask = 16; mask > 0; mask /= 2) v += shfl_xor(v, mask);
  out[threadIdx.x] = v;
}

TEST(Emulator, WarpShufflesSumEachWarp) {
  std::vector<float> in(kThreads), out(kThreads, 0.0f);
  for (unsigned t = 0; t < kThreads; ++t) in[t] = static_cast<float>((t * 37) % 11) - 5.0f;
  launch(dim3(1), dim3(kThreads), 0, warp_sums, in.data(), out.data());
  for (unsigned t = 0; t < kThreads; ++t) {
    const unsigned first = t / 32 * 32;
    const float want = std::accumulate(in.begin() + first, in.begin() + first + 32, 0.0f);
    EXPECT_EQ(out[t], want) << "thread " << t;
  }
}

// Thread 5 fails a check while the others wait at the barrier: the launch throws the
// check's error (no abort, no hang), and the next launch runs normally.
void failing(int* out) {
  if (threadIdx.x == 5) PEERTRAIN_CHECK(false, "thread 5 of block ", blockIdx.x, " found a bad input");
  __syncthreads();
  out[threadIdx.x] = static_cast<int>(threadIdx.x);
}

TEST(Emulator, AFailedCheckInOneThreadFailsTheLaunchAndTheNextOneRuns) {
  std::vector<int> out(kThreads, -1);
  try {
    launch(dim3(2), dim3(kThreads), 0, failing, out.data());
    FAIL() << "the launch did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("thread 5 of block 0 found a bad input"), std::string::npos) << e.what();
  }
  std::vector<int> in(kThreads), rotated(kThreads);
  std::iota(in.begin(), in.end(), 0);
  launch(dim3(1), dim3(kThreads), 0, rotate, in.data(), rotated.data(), true, 1);
  EXPECT_EQ(rotated[kThreads - 2], kThreads - 1);
}

// The even threads wait at a second __syncthreads that the odd ones never reach: on a
// device, undefined; here a named error instead of a hang.
void uneven_barriers() {
  __syncthreads();
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
    __syncthreads();
  }
}

TEST(Emulator, ThreadsWaitingForABarrierOthersNeverReachAreADeadlockNotAHang) {
  try {
    launch(dim3(1), dim3(64), 0, uneven_barriers);
    FAIL() << "the launch did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deadlocked"), std::string::npos) << e.what();
  }
}

// Streams are lazy (runtime_emulated.cpp), as a GPU's are asynchronous: what one stream
// reads of another's work without an event between them is stale, so a program that
// forgets the event fails its test here and not only on a device.
TEST(Emulator, AStreamThatDoesNotWaitForAnothersEventReadsStaleMemory) {
  const Stream producer = create_stream(), consumer = create_stream();
  const Event written = create_event();
  auto* source = static_cast<float*>(device_malloc(sizeof(float), "source"));
  auto* target = static_cast<float*>(device_malloc(sizeof(float), "target"));
  const float one = 1.0f, stale = -1.0f;
  for (const bool with_event : {false, true}) {
    copy_to_device(source, &stale, sizeof(float), Stream{});  // the default stream: done at once
    copy_to_device(source, &one, sizeof(float), producer);    // queued: not run yet
    record(written, producer);
    if (with_event) wait(consumer, written);
    copy_on_device(target, source, sizeof(float), consumer);
    float got = 0.0f;
    copy_to_host(&got, target, sizeof(float), consumer);  // pageable: synchronous
    EXPECT_EQ(got, with_event ? one : stale) << (with_event ? "with" : "without") << " the event";
    synchronize(producer);
  }
  // Pinned memory is written when the stream runs, not when the copy is asked for.
  auto* pinned = static_cast<float*>(pinned_malloc(sizeof(float), "pinned"));
  *pinned = stale;
  copy_to_host(pinned, source, sizeof(float), consumer);
  EXPECT_EQ(*pinned, stale);
  synchronize(consumer);
  EXPECT_EQ(*pinned, one);
  pinned_free(pinned);
  device_free(source);
  device_free(target);
  destroy_event(written);
  destroy_stream(producer);
  destroy_stream(consumer);
}

}  // namespace
}  // namespace peertrain::kernels::emulator
