// The running total of device memory this process holds, kept by both runtimes
// (runtime.cu, runtime_emulated.cpp) around their allocations: the figure behind
// allocated_bytes() and peak_allocated_bytes().
#pragma once

#include <cstddef>

namespace peertrain::kernels::ledger {

void allocated(void* pointer, std::size_t bytes);
void freed(void* pointer);

}  // namespace peertrain::kernels::ledger
