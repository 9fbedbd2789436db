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
constexpr unsigned kWarpgroup = 128;

// What the threads of the block now running share.
struct BlockState {
  explicit BlockState(unsigned threads, std::size_t shared_bytes)
      : block_barrier(threads), slots(threads), mma_slots(threads), dynamic(shared_bytes) {
    for (unsigned first = 0; first < threads; first += kWarp)
      warp_barriers.push_back(std::make_unique<std::barrier<>>(std::min(kWarp, threads - first)));
    for (unsigned first = 0; first + kWarpgroup <= threads; first += kWarpgroup)
      warpgroup_barriers.push_back(std::make_unique<std::barrier<>>(kWarpgroup));
  }
  std::barrier<> block_barrier;
  std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
  std::vector<std::uint32_t> slots;  // one per thread, for shuffles
  std::vector<std::array<std::uint32_t, 6>> mma_slots;  // one per thread: its a and b fragments
  std::vector<std::unique_ptr<std::barrier<>>> warpgroup_barriers;
  std::vector<std::byte> dynamic;
};

thread_local BlockState* current = nullptr;

// A thread's asynchronous operations of one kind (cp.async copies, wgmma products) as the
// device groups them: the open group, then the committed ones, oldest first; a wait
// performs the oldest groups until at most `in_flight` remain.
template <typename Op>
struct AsyncGroups {
  std::vector<Op> open;
  std::deque<std::vector<Op>> committed;

  void commit() {
    committed.push_back(std::move(open));
    open.clear();
  }
  template <typename Perform>
  void wait(int in_flight, Perform perform) {
    while (committed.size() > static_cast<std::size_t>(in_flight)) {
      for (const Op& op : committed.front()) perform(op);
      committed.pop_front();
    }
  }
  bool empty() const { return open.empty() && committed.empty(); }
};

struct PendingCopy {
  void* to;
  const void* from;
  std::size_t bytes;
};
thread_local AsyncGroups<PendingCopy> copies;
thread_local unsigned linear_thread = 0;

struct PendingWgmma {
  float* d;
  int n;
  const std::uint32_t* a;  // read at the wait, as the device may: rewriting it earlier is a bug
  std::uint64_t descriptor;
  const std::byte* shared_base;
  bool accumulate;
};
thread_local const std::byte* wgmma_base = nullptr;
thread_local AsyncGroups<PendingWgmma> products;

// BF16 k of a register holding a pair: the even k in the low half, the odd in the high.
float bf16_of_pair(std::uint32_t bits, unsigned k) {
  const std::uint32_t widened = ((k % 2 == 0 ? bits : bits >> 16) & 0xffffu) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof value);
  return value;
}

// Element (row, k) of mma.m16n8k16's A (row-major 16 × 16) from the slots of the warp's 32
// lanes: lane (row % 8)·4 + (k % 8)/2, register row/8 + 2·(k/8). wgmma's A from registers
// has the same layout per warp of the warpgroup.
float a_fragment_element(const std::array<std::uint32_t, 6>* warp_slots, unsigned row, unsigned k) {
  return bf16_of_pair(warp_slots[(row % 8) * 4 + (k % 8) / 2][row / 8 + 2 * (k / 8)], k);
}

// One wgmma, performed by every thread of the warpgroup together: each posts its A
// fragment, then computes its own accumulators.
void perform_wgmma(const PendingWgmma& op) {
  const unsigned warpgroup = linear_thread / kWarpgroup, first = warpgroup * kWarpgroup;
  std::barrier<>& barrier = *current->warpgroup_barriers[warpgroup];
  current->mma_slots[linear_thread] = {op.a[0], op.a[1], op.a[2], op.a[3], 0u, 0u};  // A as it is now
  barrier.arrive_and_wait();
  // The descriptor: start address, leading (along K) and stride (along N) byte offsets,
  // each in 16-byte units; no swizzle and no base offset are modelled.
  const std::uint64_t desc = op.descriptor;
  PEERTRAIN_CHECK((desc >> 49) == 0, "wgmma: the emulator models unswizzled operands only");
  const std::size_t start = (desc & 0x3fffu) << 4, lbo = ((desc >> 16) & 0x3fffu) << 4,
                    sbo = ((desc >> 32) & 0x3fffu) << 4;
  auto b = [&](unsigned k, unsigned n) {  // core matrices of 8 rows (n) × 8 BF16s (k)
    std::uint16_t bits;
    std::memcpy(&bits, op.shared_base + start + (n / 8) * sbo + (n % 8) * 16 + (k / 8) * lbo + (k % 8) * 2,
                sizeof bits);
    return bf16_of_pair(bits, 0);
  };
  const unsigned in_group = linear_thread % kWarpgroup, warp = in_group / kWarp, lane = in_group % kWarp;
  const std::array<std::uint32_t, 6>* warp_slots = &current->mma_slots[first + warp * kWarp];
  const unsigned group = lane / 4, pair = lane % 4;
  for (int nt = 0; nt < op.n / 8; ++nt)
    for (unsigned i = 0; i < 4; ++i) {
      const unsigned row = group + 8 * (i / 2), n = static_cast<unsigned>(nt) * 8 + 2 * pair + i % 2;
      float sum = 0.0f;
      for (unsigned k = 0; k < 16; ++k) sum += a_fragment_element(warp_slots, row, k) * b(k, n);
      float& d = op.d[nt * 4 + i];
      d = (op.accumulate ? d : 0.0f) + sum;
    }
  barrier.arrive_and_wait();  // nobody overwrites a slot before every thread has read it
}

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
  // A: a_fragment_element. B (16×8, column-major): row k, column n in lane n·4 + (k % 8)/2,
  // register 4 + k/8. C: lane's c0, c1 at row lane/4, columns 2·(lane % 4) + {0, 1}; c2, c3
  // eight rows below.
  const std::array<std::uint32_t, 6>* warp_slots = &current->mma_slots[first];
  const unsigned group = lane / 4, pair = lane % 4;
  for (unsigned i = 0; i < 4; ++i) {
    const unsigned r = group + 8 * (i / 2), n = 2 * pair + i % 2;
    float sum = 0.0f;
    for (unsigned k = 0; k < 16; ++k)
      sum += a_fragment_element(warp_slots, r, k) * bf16_of_pair(warp_slots[n * 4 + (k % 8) / 2][4 + k / 8], k);
    c[i] += sum;
  }
  barrier.arrive_and_wait();  // nobody overwrites a slot before every lane has read it
}

void copy_async(void* shared, const void* global, std::size_t bytes) {
  PEERTRAIN_CHECK(current != nullptr, "cp.async outside a kernel");
  copies.open.push_back({shared, global, bytes});
}

void copy_async_commit() { copies.commit(); }

void copy_async_wait(int in_flight) {
  copies.wait(in_flight, [](const PendingCopy& c) { std::memcpy(c.to, c.from, c.bytes); });
}

void wgmma_shared_base(const void* base) { wgmma_base = static_cast<const std::byte*>(base); }

void wgmma_bf16(float* d, int n, const std::uint32_t a[4], std::uint64_t descriptor, bool accumulate) {
  PEERTRAIN_CHECK(current != nullptr && wgmma_base != nullptr, "wgmma outside a kernel or without a shared base");
  PEERTRAIN_CHECK(linear_thread / kWarpgroup < current->warpgroup_barriers.size(), "wgmma needs a whole warpgroup");
  PEERTRAIN_CHECK(n % 8 == 0 && n >= 8 && n <= 256, "wgmma: n ", n);
  products.open.push_back({d, n, a, descriptor, wgmma_base, accumulate});
}

void wgmma_commit() { products.commit(); }

void wgmma_wait(int in_flight) { products.wait(in_flight, perform_wgmma); }

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
            PEERTRAIN_CHECK(copies.empty(), "a thread ended its block with cp.async copies it never waited for");
            PEERTRAIN_CHECK(products.empty(), "a thread ended its block with wgmma operations it never waited for");
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
