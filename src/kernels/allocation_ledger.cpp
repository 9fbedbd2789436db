#include "allocation_ledger.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "peertrain/kernels/device.h"

namespace peertrain::kernels {
namespace {

std::mutex sizes_mutex;
std::unordered_map<void*, std::size_t> sizes;  // live allocations, so that a free knows its size
std::atomic<std::size_t> held{0};
std::atomic<std::size_t> peak{0};

}  // namespace

void ledger::allocated(void* pointer, std::size_t bytes) {
  if (pointer == nullptr) return;
  {
    std::lock_guard lock(sizes_mutex);
    sizes[pointer] = bytes;
  }
  const std::size_t now = held.fetch_add(bytes) + bytes;
  std::size_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
}

void ledger::freed(void* pointer) {
  if (pointer == nullptr) return;
  std::lock_guard lock(sizes_mutex);
  auto it = sizes.find(pointer);
  if (it == sizes.end()) return;
  held.fetch_sub(it->second);
  sizes.erase(it);
}

std::size_t allocated_bytes() { return held.load(); }
std::size_t peak_allocated_bytes() { return peak.load(); }
void reset_peak_allocated_bytes() { peak.store(held.load()); }

}  // namespace peertrain::kernels
