// The device interface over host memory, for the CPU emulator: "device" pointers are
// ordinary heap memory.
//
// Streams are lazy, as a GPU's are asynchronous: a kernel, a copy or a memset on a created
// stream is queued and runs only when something needs it done — synchronize() of its
// stream, a wait() on an event recorded behind it that another stream reaches, a copy
// into pageable host memory (synchronous in CUDA), or a free (cudaFree waits for the
// device). A program that forgets an event between two streams (reads on one what the
// other has queued, but not run, yet) or reads pinned memory before synchronizing thus
// reads stale memory here, and its serial-twin test fails: on the eager emulator such a
// program passed, and only a GPU could show the race. The default stream (Stream{}) runs
// its own work at once and, like CUDA's legacy stream beside the non-blocking streams
// runtime.cu makes, waits for no other. A failure inside queued work is kept and thrown
// by that stream's next synchronisation, as a device reports an asynchronous error.
//
// One device: all queued work runs under one lock, on whichever host thread needs it
// done; a wait runs the other stream up to the event first.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "allocation_ledger.h"
#include "emulator.h"
#include "peertrain/kernels/device.h"
#include "peertrain/core/error.h"

namespace peertrain::kernels {
namespace {

void* allocate(std::size_t bytes, const char* what) {
  if (bytes == 0) return nullptr;
  // Aligned like cudaMalloc, so that vector loads in kernels behave alike.
  void* pointer = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (pointer == nullptr) throw Error(ErrorKind::kInternal, str("emulated device: out of memory for ", what));
  return pointer;
}

struct Queue;
// One queued operation: work to run, or a wait for another queue to reach a position.
struct Op {
  std::function<void()> run;
  Queue* wait_on = nullptr;
  std::uint64_t wait_until = 0;
};
struct Queue {
  std::deque<Op> ops;
  std::uint64_t queued = 0, done = 0;  // operations ever queued, ever run
  // The first failure of its work since it was last reported: kept, as a device keeps an
  // asynchronous error, and thrown by the next synchronize() of this stream (or a copy
  // into pageable memory on it), never by a free or a destroy, which run in destructors.
  std::exception_ptr error;
};
struct EventState {
  Queue* queue = nullptr;  // null: recorded on the default stream, or never
  std::uint64_t position = 0;
};

std::recursive_mutex device_mutex;  // every queue and every run of queued work
std::set<Queue*> queues;            // the live streams'
// Every queue ever made, kept until exit: an event recorded on a destroyed stream still
// names its queue (whose work has all run, so a wait on it is met at once).
std::vector<std::unique_ptr<Queue>> every_queue;
std::map<std::uintptr_t, std::size_t> pinned;  // page-locked allocations: start, bytes

// Runs `queue` up to its operation number `until` (the ones queued so far at most).
void drain(Queue& queue, std::uint64_t until) {
  while (queue.done < until && !queue.ops.empty()) {
    Op op = std::move(queue.ops.front());
    queue.ops.pop_front();
    ++queue.done;
    if (op.wait_on != nullptr) {
      drain(*op.wait_on, op.wait_until);
      continue;
    }
    try {
      op.run();
    } catch (...) {  // reported at this stream's next synchronisation, as on a device
      if (!queue.error) queue.error = std::current_exception();
    }
  }
}
// Throws the queue's kept failure, once.
void report(Queue& queue) {
  if (queue.error) std::rethrow_exception(std::exchange(queue.error, nullptr));
}
void drain_all() {
  for (Queue* queue : queues) drain(*queue, queue->queued);
}

void queue_op(Stream stream, Op op) {
  std::lock_guard lock(device_mutex);
  // The default stream runs its work at once. It does not wait for the others: runtime.cu
  // makes every stream non-blocking, which CUDA's legacy default stream does not wait
  // for either, so only an event orders the two.
  if (stream.handle == nullptr) {
    if (op.wait_on != nullptr)
      drain(*op.wait_on, op.wait_until);
    else
      op.run();
    return;
  }
  Queue& queue = *static_cast<Queue*>(stream.handle);
  queue.ops.push_back(std::move(op));
  ++queue.queued;
}

bool is_pinned(const void* host) {
  std::lock_guard lock(device_mutex);
  const auto address = reinterpret_cast<std::uintptr_t>(host);
  auto it = pinned.upper_bound(address);
  if (it == pinned.begin()) return false;
  --it;
  return address < it->first + it->second;
}

}  // namespace

namespace {
int operations_until_failure = -1;  // under device_mutex; -1: none injected
std::string injected_failure;
bool inject_at_launch = false;
}  // namespace

void inject_failure_after(int operations, const std::string& message, bool at_launch) {
  PEERTRAIN_CHECK(operations >= 1, "inject_failure_after: operations must be at least 1");
  std::lock_guard lock(device_mutex);
  operations_until_failure = operations;
  injected_failure = message;
  inject_at_launch = at_launch;
}

namespace emulator {
void enqueue(Stream stream, std::function<void()> work) {
  if (stream.handle != nullptr) {
    std::lock_guard lock(device_mutex);
    if (operations_until_failure > 0 && --operations_until_failure == 0) {
      operations_until_failure = -1;
      if (inject_at_launch) throw Error(ErrorKind::kInternal, injected_failure);
      work = [message = injected_failure] { throw Error(ErrorKind::kInternal, message); };
    }
  }
  queue_op(stream, Op{std::move(work)});
}
}  // namespace emulator

int device_count() { return 1; }
bool emulated() { return true; }
std::string device_name(int) { return "CPU emulator"; }
void set_device(int device) { PEERTRAIN_CHECK(device == 0, "the emulator has one device, not device ", device); }
Stream create_stream() {
  std::lock_guard lock(device_mutex);
  Queue* queue = every_queue.emplace_back(std::make_unique<Queue>()).get();
  queues.insert(queue);
  return {queue};
}
void destroy_stream(Stream stream) {
  if (stream.handle == nullptr) return;
  std::lock_guard lock(device_mutex);
  auto* queue = static_cast<Queue*>(stream.handle);
  drain_all();  // no other stream may still wait on its work; a failure is dropped with it
  queue->error = nullptr;
  queues.erase(queue);  // the queue itself stays (every_queue): events may name it
}
// The default stream ran its work at once; a created one runs what it holds now.
void synchronize(Stream stream) {
  if (stream.handle == nullptr) return;
  std::lock_guard lock(device_mutex);
  auto* queue = static_cast<Queue*>(stream.handle);
  drain(*queue, queue->queued);
  report(*queue);
}
Event create_event() { return {new EventState}; }
void destroy_event(Event event) { delete static_cast<EventState*>(event.handle); }
// The event marks what its stream has queued so far; a wait() queues, on the waiting
// stream, "run that stream up to there first".
void record(Event event, Stream stream) {
  std::lock_guard lock(device_mutex);
  auto* state = static_cast<EventState*>(event.handle);
  auto* queue = static_cast<Queue*>(stream.handle);
  state->queue = queue;
  state->position = queue != nullptr ? queue->queued : 0;
}
void wait(Stream stream, Event event) {
  const auto* state = static_cast<const EventState*>(event.handle);
  if (state->queue == nullptr) return;  // never recorded, or on the default stream: nothing to wait for
  queue_op(stream, Op{{}, state->queue, state->position});
}

void* device_malloc(std::size_t bytes, const char* what) {
  void* pointer = allocate(bytes, what);
  if (pointer == nullptr) return nullptr;
  // Fresh device memory is garbage, not zeros: poison it so a kernel that reads what
  // nobody wrote fails its test here too.
  std::memset(pointer, 0x7f, bytes);
  ledger::allocated(pointer, bytes);
  return pointer;
}

void device_free(void* pointer) {
  if (pointer == nullptr) return;
  {
    std::lock_guard lock(device_mutex);
    drain_all();  // cudaFree waits for the device: nothing queued may still use it
  }
  ledger::freed(pointer);
  std::free(pointer);
}

void* pinned_malloc(std::size_t bytes, const char* what) {
  void* pointer = allocate(bytes, what);
  if (pointer == nullptr) return nullptr;
  std::lock_guard lock(device_mutex);
  pinned[reinterpret_cast<std::uintptr_t>(pointer)] = bytes;
  return pointer;
}
void pinned_free(void* pointer) {
  if (pointer == nullptr) return;
  {
    std::lock_guard lock(device_mutex);
    drain_all();  // cudaFreeHost waits for the device too
    pinned.erase(reinterpret_cast<std::uintptr_t>(pointer));
  }
  std::free(pointer);
}
// From pinned memory the copy reads the host when it runs, as a DMA would; from pageable
// memory CUDA stages the bytes before it returns, so they are taken now.
void copy_to_device(void* device, const void* host, std::size_t bytes, Stream stream) {
  if (bytes == 0) return;
  if (is_pinned(host)) return emulator::enqueue(stream, [=] { std::memcpy(device, host, bytes); });
  auto staged =
      std::make_shared<std::vector<char>>(static_cast<const char*>(host), static_cast<const char*>(host) + bytes);
  emulator::enqueue(stream, [=] { std::memcpy(device, staged->data(), bytes); });
}
// Into pageable memory the copy is synchronous: the stream runs up to it before this returns.
void copy_to_host(void* host, const void* device, std::size_t bytes, Stream stream) {
  if (bytes == 0) return;
  emulator::enqueue(stream, [=] { std::memcpy(host, device, bytes); });
  if (!is_pinned(host)) synchronize(stream);
}
void copy_on_device(void* to, const void* from, std::size_t bytes, Stream stream) {
  if (bytes > 0) emulator::enqueue(stream, [=] { std::memmove(to, from, bytes); });
}
void zero(void* device, std::size_t bytes, Stream stream) {
  if (bytes > 0) emulator::enqueue(stream, [=] { std::memset(device, 0, bytes); });
}

}  // namespace peertrain::kernels
