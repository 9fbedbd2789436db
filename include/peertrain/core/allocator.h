// How the process's malloc treats freed memory.
#pragma once

namespace peertrain {

// Makes glibc's malloc keep the memory this process frees for its next allocation, instead
// of unmapping it: blocks up to 256 MiB come from the heap (not from mmap), and a free top
// of the heap is kept up to 1 GiB. Without this, every block over the (moving) mmap
// threshold is fresh pages, faulted in again on each step; the pipeline engine, whose
// stages allocate each micro-batch's activations, paid ~680 page faults and 7 ms of system
// time a step on a Zen 5 VM (gpt d 128, --pp 2 --microbatches 4: 40 ms a step against 30
// with this). It is what a caching allocator (PyTorch's, jemalloc's) does for a training
// loop, at the price of a resident size that stays at its peak. Call it first thing in
// main(); a no-op where the C library is not glibc. Returns whether it took effect.
bool keep_freed_memory();

}  // namespace peertrain
