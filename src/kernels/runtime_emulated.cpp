// The device interface over host memory, for the CPU emulator: "device" pointers are
// ordinary heap memory and every operation is synchronous.
#include <cstdlib>
#include <cstring>

#include "allocation_ledger.h"
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

}  // namespace

int device_count() { return 1; }
bool emulated() { return true; }
std::string device_name(int) { return "CPU emulator"; }
void set_device(int device) { PEERTRAIN_CHECK(device == 0, "the emulator has one device, not device ", device); }
Stream create_stream() { return {}; }
void destroy_stream(Stream) {}
void synchronize(Stream) {}
// Every emulated operation completes before it returns, so order needs no events.
Event create_event() { return {}; }
void destroy_event(Event) {}
void record(Event, Stream) {}
void wait(Stream, Event) {}

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
  ledger::freed(pointer);
  std::free(pointer);
}

void* pinned_malloc(std::size_t bytes, const char* what) { return allocate(bytes, what); }
void pinned_free(void* pointer) { std::free(pointer); }
void copy_to_device(void* device, const void* host, std::size_t bytes, Stream) {
  if (bytes > 0) std::memcpy(device, host, bytes);
}
void copy_to_host(void* host, const void* device, std::size_t bytes, Stream) {
  if (bytes > 0) std::memcpy(host, device, bytes);
}
void copy_on_device(void* to, const void* from, std::size_t bytes, Stream) {
  if (bytes > 0) std::memmove(to, from, bytes);
}
void zero(void* device, std::size_t bytes, Stream) {
  if (bytes > 0) std::memset(device, 0, bytes);
}

}  // namespace peertrain::kernels
