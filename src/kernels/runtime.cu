// The device interface over the CUDA runtime.
#include <cuda_runtime.h>

#include "allocation_ledger.h"
#include "compat.h"
#include "peertrain/core/error.h"

namespace peertrain::kernels {
namespace {

void check(cudaError_t status, const char* call, const char* what = "") {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear a sticky launch error so the next call reports its own
  throw Error(ErrorKind::kInternal,
              str("CUDA ", call, what[0] ? " (" : "", what, what[0] ? ")" : "", ": ", cudaGetErrorString(status)));
}

cudaStream_t raw(Stream stream) { return static_cast<cudaStream_t>(stream.handle); }

}  // namespace

namespace detail {
void check_launch(const char* kernel) { check(cudaGetLastError(), "kernel launch", kernel); }
}  // namespace detail

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

bool emulated() { return false; }

std::string device_name(int device) {
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  return properties.name;
}

void set_device(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }

Stream create_stream() {
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return {stream};
}

void destroy_stream(Stream stream) {
  if (stream.handle != nullptr) cudaStreamDestroy(raw(stream));
}

void synchronize(Stream stream) { check(cudaStreamSynchronize(raw(stream)), "cudaStreamSynchronize"); }

Event create_event() {
  cudaEvent_t event = nullptr;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  return {event};
}

void destroy_event(Event event) {
  if (event.handle != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event.handle));
}

void record(Event event, Stream stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(event.handle), raw(stream)), "cudaEventRecord");
}

void wait(Stream stream, Event event) {
  check(cudaStreamWaitEvent(raw(stream), static_cast<cudaEvent_t>(event.handle), 0), "cudaStreamWaitEvent");
}

void* device_malloc(std::size_t bytes, const char* what) {
  if (bytes == 0) return nullptr;
  void* pointer = nullptr;
  check(cudaMalloc(&pointer, bytes), "cudaMalloc", what);
  ledger::allocated(pointer, bytes);
  return pointer;
}

void device_free(void* pointer) {
  if (pointer == nullptr) return;
  ledger::freed(pointer);
  cudaFree(pointer);
}

void* pinned_malloc(std::size_t bytes, const char* what) {
  if (bytes == 0) return nullptr;
  void* pointer = nullptr;
  check(cudaMallocHost(&pointer, bytes), "cudaMallocHost", what);
  return pointer;
}

void pinned_free(void* pointer) {
  if (pointer != nullptr) cudaFreeHost(pointer);
}

void copy_to_device(void* device, const void* host, std::size_t bytes, Stream stream) {
  if (bytes > 0) check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, raw(stream)), "copy to device");
}

void copy_to_host(void* host, const void* device, std::size_t bytes, Stream stream) {
  if (bytes > 0) check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, raw(stream)), "copy to host");
}

void copy_on_device(void* to, const void* from, std::size_t bytes, Stream stream) {
  if (bytes > 0) check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, raw(stream)), "copy on device");
}

void zero(void* device, std::size_t bytes, Stream stream) {
  if (bytes > 0) check(cudaMemsetAsync(device, 0, bytes, raw(stream)), "cudaMemsetAsync");
}

void inject_failure_after(int, const std::string&, bool) {
  throw Error(ErrorKind::kInvalidArgument, "inject_failure_after: a device has no injected failures (emulator only)");
}

}  // namespace peertrain::kernels
