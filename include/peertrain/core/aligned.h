// Float buffers that Eigen reads, allocated at Eigen's packet alignment.
//
// Why: Eigen's vectorized reductions (a column's sum, its max) first add the scalars up to
// the first packet-aligned address and then whole packets, so the order of the additions,
// and the last bit of the result, depend on where the buffer starts. malloc guarantees 16
// bytes; an AVX packet wants 32. A buffer allocated on a worker thread could start on a
// 32-byte boundary in one run and not in the next, and `--sp 2` runs reported losses that
// differed in the last bit from run to run. At Eigen's alignment every run adds alike.
#pragma once

#include <vector>

#include <Eigen/Core>

namespace peertrain {

template <typename T>
using AlignedVector = std::vector<T, Eigen::aligned_allocator<T>>;

}  // namespace peertrain
