#include "emulator.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "peertrain/core/error.h"

#include "peertrain/core/sanitizers.h"
#ifdef PEERTRAIN_ADDRESS_SANITIZER
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// On x86-64 fibers switch by saving the callee-saved registers on their own stack and
// swapping stack pointers. glibc's swapcontext also saves and restores the signal mask, a
// system call each way: 1.15 million rt_sigprocmask calls and 22 s of system time in one
// 47 s device test on a VM. Under AddressSanitizer too: the switches below tell it each
// stack, so it need not follow swapcontext.
// The fibers never change the signal mask, and the FPU control words stay at their
// defaults, so the registers the ABI makes callee-saved are all a switch must keep.
// (Where a kernel and libc turn on shadow stacks, this switch would have to swap those too.)
#if defined(__x86_64__)
#define PEERTRAIN_EMULATOR_FAST_SWITCH 1
// pt_emulator_switch(save, next): pushes rbp, rbx, r12–r15, stores the stack pointer in
// *save, loads next, pops the same registers and returns on that stack.
extern "C" void pt_emulator_switch(void** save, void* next);
asm(R"(
  .text
  .globl pt_emulator_switch
  .type pt_emulator_switch, @function
pt_emulator_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size pt_emulator_switch, .-pt_emulator_switch
)");
#endif

namespace peertrain::kernels::emulator {
namespace {

constexpr unsigned kWarp = 32;
constexpr unsigned kWarpgroup = 128;

// Every CUDA thread of a block is a fiber (a ucontext with its own stack) on the host
// thread that launched the kernel. A fiber runs until it waits (a barrier, a shuffle, an
// mma) or ends, then the next one runs, round robin. Context switches inside one host
// thread cost a fraction of the kernel's time, where a host thread per CUDA thread spent
// most of it in the operating system's scheduler (a 256-thread block on 2 cores: every barrier
// woke 256 threads). Running each thread until it blocks makes a missing barrier show
// wherever a reader runs before its writer; the rounds go up the threads in one launch
// and down in the next, so a read of a later thread's write (t reading t + 1's slot) is
// stale in one launch of every two, and a read of an earlier thread's in the other.
struct Fiber;
thread_local Fiber* self = nullptr;  // the fiber running now on this host thread
#ifdef PEERTRAIN_EMULATOR_FAST_SWITCH
thread_local void* scheduler_sp = nullptr;  // the scheduler's stack pointer while a fiber runs
#else
thread_local ucontext_t scheduler_context;
#endif
thread_local std::uint64_t launches = 0;  // odd launches run their rounds from the last thread down

struct FiberBarrier;
// Switches back to the scheduler until `barrier` has left phase `phase`.
void waiting_on(const FiberBarrier* barrier, std::uint64_t phase);

// A barrier of `expected` fibers: the last to arrive opens it and runs on; the others wait.
struct FiberBarrier {
  explicit FiberBarrier(unsigned expected_) : expected(expected_) {}
  void arrive_and_wait() {
    const std::uint64_t mine = phase;
    if (++arrived == expected) {
      arrived = 0;
      ++phase;
      return;
    }
    waiting_on(this, mine);
  }
  unsigned expected, arrived = 0;
  std::uint64_t phase = 0;
};

// What the threads of the block now running share.
struct BlockState {
  explicit BlockState(unsigned threads, std::size_t shared_bytes)
      : block_barrier(threads), slots(threads), mma_slots(threads), dynamic(shared_bytes) {
    for (unsigned first = 0; first < threads; first += kWarp)
      warp_barriers.emplace_back(std::min(kWarp, threads - first));
    for (unsigned first = 0; first + kWarpgroup <= threads; first += kWarpgroup)
      warpgroup_barriers.emplace_back(kWarpgroup);
  }
  FiberBarrier block_barrier;
  std::vector<FiberBarrier> warp_barriers;
  std::vector<std::uint32_t> slots;  // one per thread, for shuffles
  std::vector<std::array<std::uint32_t, 6>> mma_slots;  // one per thread: its a and b fragments
  std::vector<FiberBarrier> warpgroup_barriers;
  std::vector<std::byte> dynamic;
  // The launch: every fiber runs body once per block of the grid.
  dim3 grid;
  const std::function<void()>* body = nullptr;
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

struct PendingWgmma {
  float* d;
  int n;
  const std::uint32_t* a;  // read at the wait, as the device may: rewriting it earlier is a bug
  std::uint64_t descriptor;
  const std::byte* shared_base;
  bool accumulate;
};

// Kernels keep small arrays in registers; a sanitized build's frames are several times
// larger. The pages are only touched as the stack grows.
constexpr std::size_t kStackBytes = std::size_t{1} << 20;
constexpr std::size_t kGuardBytes = 4096;

// One CUDA thread: its stack and context, and what a device keeps per thread.
struct Fiber {
  unsigned linear = 0;  // threadIdx flattened, x fastest
  dim3 thread_idx, block_idx;
  AsyncGroups<PendingCopy> copies;
  AsyncGroups<PendingWgmma> products;
  const std::byte* wgmma_base = nullptr;
#ifdef PEERTRAIN_EMULATOR_FAST_SWITCH
  void* sp = nullptr;  // its stack pointer while it is switched out
#else
  ucontext_t context{};
#endif
  void* stack = nullptr;
  bool done = false;
  std::exception_ptr error;
  // The barrier this thread waits at, and its phase then: the scheduler resumes the
  // thread only once the barrier has opened, so a wait costs two switches, not a round each.
  const FiberBarrier* barrier = nullptr;
  std::uint64_t barrier_phase = 0;
#ifdef PEERTRAIN_ADDRESS_SANITIZER
  void* fake_stack = nullptr;
  const void* scheduler_bottom = nullptr;
  std::size_t scheduler_size = 0;
#endif
  Fiber() = default;
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;
  ~Fiber() {
    if (stack != nullptr) munmap(static_cast<std::byte*>(stack) - kGuardBytes, kGuardBytes + kStackBytes);
  }
};

// The raw switches into fiber f from the scheduler and back: the one place that picks the
// mechanism (the AddressSanitizer annotations stay with their callers below).
void switch_into(Fiber& f) {
#ifdef PEERTRAIN_EMULATOR_FAST_SWITCH
  pt_emulator_switch(&scheduler_sp, f.sp);
#else
  swapcontext(&scheduler_context, &f.context);
#endif
}

void switch_out(Fiber& f) {
#ifdef PEERTRAIN_EMULATOR_FAST_SWITCH
  pt_emulator_switch(&f.sp, scheduler_sp);
#else
  swapcontext(&f.context, &scheduler_context);
#endif
}

// The switches, told to AddressSanitizer where it runs, so that it follows the stacks.
void enter_fiber(Fiber& f) {
  self = &f;
  threadIdx = f.thread_idx;
  blockIdx = f.block_idx;
#ifdef PEERTRAIN_ADDRESS_SANITIZER
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack, kStackBytes);
  switch_into(f);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  switch_into(f);
#endif
  self = nullptr;
}

void yield() {
  Fiber& f = *self;
  f.block_idx = blockIdx;
#ifdef PEERTRAIN_ADDRESS_SANITIZER
  __sanitizer_start_switch_fiber(&f.fake_stack, f.scheduler_bottom, f.scheduler_size);
  switch_out(f);
  __sanitizer_finish_switch_fiber(f.fake_stack, &f.scheduler_bottom, &f.scheduler_size);
#else
  switch_out(f);
#endif
}

void waiting_on(const FiberBarrier* barrier, std::uint64_t phase) {
  self->barrier = barrier;
  self->barrier_phase = phase;
  yield();
  self->barrier = nullptr;
}

bool runnable(const Fiber& f) { return !f.done && (f.barrier == nullptr || f.barrier->phase != f.barrier_phase); }

// The fiber's last switch: it is never resumed. (A swap, not setcontext in a noreturn
// function: AddressSanitizer hooks noreturn calls and would look for the wrong stack.)
void leave_fiber(Fiber& f) {
  f.done = true;
#ifdef PEERTRAIN_ADDRESS_SANITIZER
  __sanitizer_start_switch_fiber(nullptr, f.scheduler_bottom, f.scheduler_size);  // this stack ends
#endif
  switch_out(f);
}

void fiber_main() {
  Fiber& f = *self;
#ifdef PEERTRAIN_ADDRESS_SANITIZER
  __sanitizer_finish_switch_fiber(nullptr, &f.scheduler_bottom, &f.scheduler_size);
#endif
  const BlockState& launch = *current;
  try {
    for (unsigned z = 0; z < launch.grid.z; ++z)
      for (unsigned y = 0; y < launch.grid.y; ++y)
        for (unsigned x = 0; x < launch.grid.x; ++x) {
          blockIdx = f.block_idx = dim3(x, y, z);
          (*launch.body)();
          PEERTRAIN_CHECK(f.copies.empty(), "a thread ended its block with cp.async copies it never waited for");
          PEERTRAIN_CHECK(f.products.empty(), "a thread ended its block with wgmma operations it never waited for");
          // Every thread, also one that returned early, waits here for the block to end.
          current->block_barrier.arrive_and_wait();
        }
  } catch (...) {
    f.error = std::current_exception();
  }
  leave_fiber(f);
}

// Each host thread keeps its fibers, stacks mapped, from launch to launch: a test launches
// thousands of kernels of a few block sizes, and a sanitized build maps and unmaps every
// large allocation (a 256-thread block's fibers are 300 KB).
thread_local std::deque<Fiber> fiber_pool;

// Readies fiber t of a block for a launch.
void prepare(Fiber& f, unsigned t, dim3 block) {
  if (f.stack == nullptr) {
    // A guard page below the stack: stacks mapped one after another would otherwise let an
    // overflow write into the next fiber's, unseen even by AddressSanitizer.
    void* base = mmap(nullptr, kGuardBytes + kStackBytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    PEERTRAIN_CHECK(base != MAP_FAILED, "the emulator could not map a ", kStackBytes, "-byte thread stack");
    if (mprotect(base, kGuardBytes, PROT_NONE) != 0) {
      munmap(base, kGuardBytes + kStackBytes);
      PEERTRAIN_CHECK(false, "the emulator could not protect a thread stack's guard page");
    }
    f.stack = static_cast<std::byte*>(base) + kGuardBytes;
  }
  f.linear = t;
  f.thread_idx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
  f.copies = {};
  f.products = {};
  f.wgmma_base = nullptr;
  f.done = false;
  f.error = nullptr;
  f.barrier = nullptr;
#ifdef PEERTRAIN_EMULATOR_FAST_SWITCH
  // The frame pt_emulator_switch pops on the first switch in: six zero registers, then
  // fiber_main as the return address, then a zero return address for fiber_main (which
  // never returns), with the stack 16-byte aligned below it as at any call.
  auto* top = reinterpret_cast<std::uintptr_t*>(static_cast<std::byte*>(f.stack) + kStackBytes);
  top[-1] = 0;
  top[-2] = reinterpret_cast<std::uintptr_t>(&fiber_main);
  for (int r = 3; r <= 8; ++r) top[-r] = 0;
  f.sp = top - 8;
#else
  getcontext(&f.context);
  f.context.uc_stack = {.ss_sp = f.stack, .ss_flags = 0, .ss_size = kStackBytes};
  f.context.uc_link = nullptr;
  makecontext(&f.context, fiber_main, 0);
#endif
#if defined(PEERTRAIN_ADDRESS_SANITIZER) && !defined(PEERTRAIN_EMULATOR_FAST_SWITCH)
  // AddressSanitizer's swapcontext clears the shadow of the stack named here at every
  // switch (128 KiB for 1 MiB), which made switches cost more than the kernels: the
  // annotations tell it the stacks instead, and makecontext has used the field. (It still
  // warns once that it does not fully support swapcontext.)
  f.context.uc_stack = {};
#endif
}

// After a launch. A fiber that finished unwound every frame but fiber_main's, at the top;
// one left waiting (its launch failed) leaves redzones anywhere. (Unpoisoning all of every
// stack makes AddressSanitizer remap its shadow each launch.)
void release([[maybe_unused]] Fiber& f) {
#ifdef PEERTRAIN_ADDRESS_SANITIZER
  constexpr std::size_t kTop = 16 * 1024;
  if (f.done)
    __asan_unpoison_memory_region(static_cast<std::byte*>(f.stack) + kStackBytes - kTop, kTop);
  else
    __asan_unpoison_memory_region(f.stack, kStackBytes);
#endif
}

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
  const unsigned linear_thread = self->linear;
  const unsigned warpgroup = linear_thread / kWarpgroup, first = warpgroup * kWarpgroup;
  FiberBarrier& barrier = current->warpgroup_barriers[warpgroup];
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
  PEERTRAIN_CHECK(current != nullptr && self != nullptr, "a warp shuffle outside a kernel");
  const unsigned linear_thread = self->linear;
  const unsigned warp = linear_thread / kWarp, lane = linear_thread % kWarp;
  const unsigned first = warp * kWarp;
  FiberBarrier& barrier = current->warp_barriers[warp];
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
  PEERTRAIN_CHECK(current != nullptr && self != nullptr, "__syncwarp outside a kernel");
  current->warp_barriers[self->linear / kWarp].arrive_and_wait();
}

void mma_m16n8k16_bf16(float c[4], const std::uint32_t a[4], const std::uint32_t b[2]) {
  PEERTRAIN_CHECK(current != nullptr && self != nullptr, "mma outside a kernel");
  const unsigned linear_thread = self->linear;
  const unsigned warp = linear_thread / kWarp, lane = linear_thread % kWarp, first = warp * kWarp;
  PEERTRAIN_CHECK(first + kWarp <= current->mma_slots.size(), "mma needs a whole warp");
  FiberBarrier& barrier = current->warp_barriers[warp];
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
  PEERTRAIN_CHECK(current != nullptr && self != nullptr, "cp.async outside a kernel");
  self->copies.open.push_back({shared, global, bytes});
}

void copy_async_commit() {
  PEERTRAIN_CHECK(self != nullptr, "cp.async.commit_group outside a kernel");
  self->copies.commit();
}

void copy_async_wait(int in_flight) {
  PEERTRAIN_CHECK(self != nullptr, "cp.async.wait_group outside a kernel");
  self->copies.wait(in_flight, [](const PendingCopy& c) { std::memcpy(c.to, c.from, c.bytes); });
}

void wgmma_shared_base(const void* base) {
  PEERTRAIN_CHECK(self != nullptr, "wgmma's shared base outside a kernel");
  self->wgmma_base = static_cast<const std::byte*>(base);
}

void wgmma_bf16(float* d, int n, const std::uint32_t a[4], std::uint64_t descriptor, bool accumulate) {
  PEERTRAIN_CHECK(current != nullptr && self != nullptr && self->wgmma_base != nullptr,
                  "wgmma outside a kernel or without a shared base");
  PEERTRAIN_CHECK(self->linear / kWarpgroup < current->warpgroup_barriers.size(), "wgmma needs a whole warpgroup");
  PEERTRAIN_CHECK(n % 8 == 0 && n >= 8 && n <= 256, "wgmma: n ", n);
  self->products.open.push_back({d, n, a, descriptor, self->wgmma_base, accumulate});
}

void wgmma_commit() {
  PEERTRAIN_CHECK(self != nullptr, "wgmma.commit_group outside a kernel");
  self->products.commit();
}

void wgmma_wait(int in_flight) {
  PEERTRAIN_CHECK(self != nullptr, "wgmma.wait_group outside a kernel");
  self->products.wait(in_flight, perform_wgmma);
}

void* dynamic_shared() { return current != nullptr ? current->dynamic.data() : nullptr; }

void run(dim3 grid, dim3 block, std::size_t shared_bytes, const std::function<void()>& body) {
  const unsigned threads = block.x * block.y * block.z;
  PEERTRAIN_CHECK(threads > 0 && threads <= 1024, "emulated launch of ", threads, " threads per block");
  PEERTRAIN_CHECK(self == nullptr, "a kernel launched from inside an emulated kernel");
  std::lock_guard lock(launch_mutex);
  BlockState state(threads, shared_bytes);
  state.grid = grid;
  state.body = &body;
  while (fiber_pool.size() < threads) fiber_pool.emplace_back();
  for (unsigned t = 0; t < threads; ++t) prepare(fiber_pool[t], t, block);
  current = &state;  // only now: nothing below throws until it is reset
  blockDim = block;
  gridDim = grid;
  const bool downward = launches++ % 2 == 1;
  std::exception_ptr error;
  for (unsigned live = threads; live > 0 && !error;) {
    // A fiber that runs arrives at a barrier, ends or fails before it yields: a round in
    // which none could run is a deadlock.
    bool ran = false;
    for (unsigned i = 0; i < threads; ++i) {
      Fiber& f = fiber_pool[downward ? threads - 1 - i : i];
      if (!runnable(f)) continue;
      ran = true;
      enter_fiber(f);
      if (f.done) {
        --live;
        if (f.error) {
          error = f.error;  // the first thread to fail stops the launch; the others are left where they wait
          break;
        }
      }
    }
    if (!error && live > 0 && !ran)
      error = std::make_exception_ptr(
          Error(ErrorKind::kInternal, str("emulated kernel deadlocked: its ", live, " unfinished threads of a ",
                                          threads, "-thread block each wait at a barrier the others never reach")));
  }
  for (unsigned t = 0; t < threads; ++t) release(fiber_pool[t]);
  current = nullptr;
  if (error) std::rethrow_exception(error);
}

}  // namespace peertrain::kernels::emulator

void __syncthreads() {
  PEERTRAIN_CHECK(peertrain::kernels::emulator::self != nullptr, "__syncthreads outside a kernel");
  peertrain::kernels::emulator::current->block_barrier.arrive_and_wait();
}

float atomicAdd(float* address, float value) { return std::atomic_ref<float>(*address).fetch_add(value); }
