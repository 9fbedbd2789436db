#include "peertrain/core/allocator.h"

#include <cstdlib>  // defines __GLIBC__ where the C library is glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace peertrain {

bool keep_freed_memory() {
#if defined(__GLIBC__)
  bool ok = mallopt(M_MMAP_THRESHOLD, 256 << 20) == 1;
  ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 && ok;
  return mallopt(M_TOP_PAD, 64 << 20) == 1 && ok;
#else
  return false;
#endif
}

}  // namespace peertrain
