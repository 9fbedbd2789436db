#include "emulator.h"

#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstring>
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
      : block_barrier(threads), slots(threads), dynamic(shared_bytes) {
    for (unsigned first = 0; first < threads; first += kWarp)
      warp_barriers.push_back(std::make_unique<std::barrier<>>(std::min(kWarp, threads - first)));
  }
  std::barrier<> block_barrier;
  std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
  std::vector<std::uint32_t> slots;  // one per thread, for shuffles
  std::vector<std::byte> dynamic;
};

thread_local BlockState* current = nullptr;
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
