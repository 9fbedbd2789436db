#include "emulator.h"

#include <array>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "peertrain/core/error.h"

namespace peertrain::kernels::emulator {
namespace {

constexpr unsigned kWarp = 32;

// What the threads of the block now running share.
struct BlockState {
  explicit BlockState(unsigned threads, std::size_t shared_bytes)
      : block_barrier(threads), slots(threads), mma_slots(threads), dynamic(shared_bytes) {
    for (unsigned first = 0; first < threads; first += kWarp)
      warp_barriers.push_back(std::make_unique<std::barrier<>>(std::min(kWarp, threads - first)));
  }
  std::barrier<> block_barrier;
  std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
  std::vector<std::uint32_t> slots;  // one per thread, for shuffles
  std::vector<std::array<std::uint32_t, 6>> mma_slots;  // one per thread: its a and b fragments
  std::vector<std::byte> dynamic;
};

thread_local BlockState* current = nullptr;

// This thread's cp.async copies: the open group, then the committed ones, oldest first.
struct PendingCopy {
  void* to;
  const void* from;
  std::size_t bytes;
};
thread_local std::vector<PendingCopy> open_copies;
thread_local std::deque<std::vector<PendingCopy>> committed_copies;
thread_local unsigned linear_thread = 0;

// Function-static __shared__ variables are one per kernel, not per block: blocks of two
// launches must never overlap.
std::mutex launch_mutex;

std::uint32_t exchange(std::uint32_t bits, int lane_mask) {
  PEERTRAIN_CHECK(current != nullptr, "a warp shuffle outside a kernel");
  const unsigned warp = linear_thread / kWarp, lane = linear_thread % kWarp;
  const unsigned first = warp * kWarp;
  std::barrier<>& barrier = *current->warp_barriers[warp];
  current->slots[linear_thread] = bits;
  barrier.arrive_and_wait();
  const unsigned source = first + (lane ^ static_cast<unsigned>(lane_mask));
  const std::uint32_t result = source < current->slots.size() ? current->slots[source] : bits;
  barrier.arrive_and_wait();  // nobody overwrites a slot before every lane has read it
  return result;
}

}  // namespace

float shfl_xor(float value, int lane_mask) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  bits = exchange(bits, lane_mask);
  std::memcpy(&value, &bits, sizeof bits);
  return value;
}

int shfl_xor(int value, int lane_mask) {
  return static_cast<int>(exchange(static_cast<std::uint32_t>(value), lane_mask));
}

void syncwarp() {
  PEERTRAIN_CHECK(current != nullptr, "__syncwarp outside a kernel");
  current->warp_barriers[linear_thread / kWarp]->arrive_and_wait();
}

void mma_m16n8k16_bf16(float c[4], const std::uint32_t a[4], const std::uint32_t b[2]) {
  PEERTRAIN_CHECK(current != nullptr, "mma outside a kernel");
  const unsigned warp = linear_thread / kWarp, lane = linear_thread % kWarp, first = warp * kWarp;
  PEERTRAIN_CHECK(first + kWarp <= current->mma_slots.size(), "mma needs a whole warp");
  std::barrier<>& barrier = *current->warp_barriers[warp];
  current->mma_slots[linear_thread] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  barrier.arrive_and_wait();
  // One BF16 of a lane's register: the even column (k) in the low half, the odd in the high.
  auto element = [&](unsigned source_lane, unsigned reg, unsigned k) {
    const std::uint32_t bits = current->mma_slots[first + source_lane][reg];
    const std::uint32_t half = (k % 2 == 0 ? bits : bits >> 16) & 0xffffu;
    float value;
    const std::uint32_t widened = half << 16;
    std::memcpy(&value, &widened, sizeof value);
    return value;
  };
  // A (row-major 16×16): row r, column k sits in lane (r % 8)·4 + (k % 8)/2, register
  // r/8 + 2·(k/8). B (16×8, column-major): row k, column n in lane n·4 + (k % 8)/2,
  // register 4 + k/8. C: lane's c0, c1 at row lane/4, columns 2·(lane % 4) + {0, 1}; c2, c3
  // eight rows below.
  const unsigned group = lane / 4, pair = lane % 4;
  for (unsigned i = 0; i < 4; ++i) {
    const unsigned r = group + 8 * (i / 2), n = 2 * pair + i % 2;
    float sum = 0.0f;
    for (unsigned k = 0; k < 16; ++k)
      sum += element((r % 8) * 4 + (k % 8) / 2, r / 8 + 2 * (k / 8), k) * element(n * 4 + (k % 8) / 2, 4 + k / 8, k);
    c[i] += sum;
  }
  barrier.arrive_and_wait();  // nobody overwrites a slot before every lane has read it
}

void copy_async(void* shared, const void* global, std::size_t bytes) {
  PEERTRAIN_CHECK(current != nullptr, "cp.async outside a kernel");
  open_copies.push_back({shared, global, bytes});
}

void copy_async_commit() {
  committed_copies.push_back(std::move(open_copies));
  open_copies.clear();
}

void copy_async_wait(int in_flight) {
  while (committed_copies.size() > static_cast<std::size_t>(in_flight)) {
    for (const PendingCopy& c : committed_copies.front()) std::memcpy(c.to, c.from, c.bytes);
    committed_copies.pop_front();
  }
}

void* dynamic_shared() { return current != nullptr ? current->dynamic.data() : nullptr; }

void run(dim3 grid, dim3 block, std::size_t shared_bytes, const std::function<void()>& body) {
  const unsigned threads = block.x * block.y * block.z;
  PEERTRAIN_CHECK(threads > 0 && threads <= 1024, "emulated launch of ", threads, " threads per block");
  std::lock_guard lock(launch_mutex);
  BlockState state(threads, shared_bytes);
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (unsigned t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      current = &state;
      linear_thread = t;
      threadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
      blockDim = block;
      gridDim = grid;
      for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
          for (unsigned x = 0; x < grid.x; ++x) {
            blockIdx = dim3(x, y, z);
            body();
            PEERTRAIN_CHECK(open_copies.empty() && committed_copies.empty(),
                            "a thread ended its block with cp.async copies it never waited for");
            // Every thread, also one that returned early, waits here for the block to end.
            state.block_barrier.arrive_and_wait();
          }
      current = nullptr;
    });
  for (std::thread& w : workers) w.join();
}

}  // namespace peertrain::kernels::emulator

void __syncthreads() {
  PEERTRAIN_CHECK(peertrain::kernels::emulator::current != nullptr, "__syncthreads outside a kernel");
  peertrain::kernels::emulator::current->block_barrier.arrive_and_wait();
}

float atomicAdd(float* address, float value) { return std::atomic_ref<float>(*address).fetch_add(value); }
