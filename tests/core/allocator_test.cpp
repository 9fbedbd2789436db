#include "peertrain/core/allocator.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>

#include "peertrain/core/sanitizers.h"

namespace {

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Touches a fresh 40 MiB block and returns the page faults that took. 40 MiB is over
// glibc's largest dynamic mmap threshold (32 MiB), so by default every such block is
// mapped fresh and unmapped on free.
long faults_to_use_a_block() {
  constexpr std::size_t kBytes = 40u << 20;
  const long before = minor_faults();
  auto* block = static_cast<char*>(std::malloc(kBytes));
  EXPECT_NE(block, nullptr);
  std::memset(block, 1, kBytes);
  // The compiler may drop a block that is written and never read; this says it is read.
  asm volatile("" : : "r"(block) : "memory");
  const long faults = minor_faults() - before;
  std::free(block);
  return faults;
}

TEST(Allocator, AFreedBlockIsReusedWithoutFaultingItsPagesInAgain) {
#if defined(PEERTRAIN_ADDRESS_SANITIZER)  // its malloc ignores mallopt
  GTEST_SKIP() << "AddressSanitizer replaces malloc, and its allocator ignores mallopt";
#elif defined(__GLIBC__)
  ASSERT_TRUE(peertrain::keep_freed_memory());
  const long first = faults_to_use_a_block();  // the first use maps the pages
  const long again = faults_to_use_a_block();
  // 10,240 faults of 4 KiB pages (about 20 with transparent huge pages) the first time;
  // a block given back to the kernel on free would fault as many again.
  EXPECT_GE(first, 16);
  EXPECT_LT(again * 4, first) << "the freed block was given back to the kernel: " << again << " faults again";
#else
  GTEST_SKIP() << "not glibc";
#endif
}

}  // namespace
