// The one device interface that model, parallel and comm use for GPU work: devices,
// streams, memory, and (ops.h) the kernels. No CUDA header leaks through it, so the rest
// of the code compiles without the toolkit. Every call checks the CUDA status and throws
// peertrain::Error (kInternal) naming the call and the CUDA error.
//
// Two implementations share this header: runtime.cu (the CUDA runtime) and
// runtime_emulated.cpp (host memory, for the CPU emulator that the tests run on).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>

namespace peertrain::kernels {

// A CUDA stream (cudaStream_t); the default-constructed one is the legacy default stream.
struct Stream {
  void* handle = nullptr;
};

// Number of usable devices; 0 when there is no driver or no GPU. The emulated build
// reports one.
int device_count();
bool emulated();  // true in the CPU-emulated build
std::string device_name(int device);
void set_device(int device);

Stream create_stream();
void destroy_stream(Stream stream);
void synchronize(Stream stream);

// A CUDA event (cudaEvent_t, timing disabled): record() marks a point in a stream's work,
// wait() makes another stream's later work wait for it. How the GPT's parameter and
// gradient copies run on their own stream beside the compute.
struct Event {
  void* handle = nullptr;
};
Event create_event();
void destroy_event(Event event);
void record(Event event, Stream stream);
void wait(Stream stream, Event event);

void* device_malloc(std::size_t bytes, const char* what);
void device_free(void* pointer);
void* pinned_malloc(std::size_t bytes, const char* what);  // page-locked host memory
void pinned_free(void* pointer);
// Asynchronous on `stream` (synchronous for pageable host memory, as in CUDA).
void copy_to_device(void* device, const void* host, std::size_t bytes, Stream stream);
void copy_to_host(void* host, const void* device, std::size_t bytes, Stream stream);
void copy_on_device(void* to, const void* from, std::size_t bytes, Stream stream);
void zero(void* device, std::size_t bytes, Stream stream);

// Bytes this process holds through device_malloc now, and the most it has held since the
// last reset: the "peak device memory per rank" of the benchmarks.
std::size_t allocated_bytes();
std::size_t peak_allocated_bytes();
void reset_peak_allocated_bytes();

// For tests of error paths, on the emulator only: the `operations`-th kernel, copy or
// memset queued on a created stream from now on fails with `message`: when it runs, as an
// asynchronous device error does (reported at that stream's next synchronisation), or,
// `at_launch`, at once, thrown by the call that queues it, as a launch error or an
// allocation that fails is. A CUDA build throws kInvalidArgument: a device has no such
// switch.
void inject_failure_after(int operations, const std::string& message, bool at_launch = false);

// An owning array of T in device memory (kPinned false) or page-locked host memory, so
// that copies to and from it are asynchronous (kPinned true). resize() only grows, and
// loses the contents when it does.
template <typename T, bool kPinned>
class OwnedArray {
 public:
  OwnedArray() = default;
  explicit OwnedArray(std::size_t count, const char* what = "array") { resize(count, what); }
  ~OwnedArray() { release(); }
  OwnedArray(OwnedArray&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  OwnedArray& operator=(OwnedArray&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    return *this;
  }
  void resize(std::size_t count, const char* what = "array") {
    if (count <= count_) return;
    release();
    const std::size_t bytes = count * sizeof(T);
    data_ = static_cast<T*>(kPinned ? pinned_malloc(bytes, what) : device_malloc(bytes, what));
    count_ = count;
  }
  T* data() const { return data_; }
  std::size_t size() const { return count_; }
  std::span<T> span() const { return {data_, count_}; }

 private:
  void release() {
    if (kPinned)
      pinned_free(data_);
    else
      device_free(data_);
    data_ = nullptr;
    count_ = 0;
  }
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

template <typename T>
using DeviceArray = OwnedArray<T, false>;
template <typename T>
using PinnedArray = OwnedArray<T, true>;

}  // namespace peertrain::kernels
