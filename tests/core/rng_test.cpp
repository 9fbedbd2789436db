#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "peertrain/core/rng.h"

namespace peertrain {
namespace {

TEST(Rng, SameSeedSameStreamDifferentSeedDifferentStream) {
  Rng a(42), b(42), c(43);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const auto x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    differs = differs || x != c.next_u64();
  }
  EXPECT_TRUE(differs);
}

TEST(Rng, UniformBelowStaysInRangeAndCoversIt) {
  Rng rng(7);
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 70'000; ++i) {
    const auto x = rng.uniform_below(7);
    ASSERT_LT(x, 7u);
    ++counts[x];
  }
  for (int c : counts) EXPECT_NEAR(c, 10'000, 600);  // > 6 standard deviations of slack
}

TEST(Rng, NormalHasUnitVariance) {
  Rng rng(1);
  double sum = 0, sum_sq = 0;
  const int n = 200'000;
  for (int i = 0; i < n; ++i) {
    const double x = rng.normal();
    sum += x;
    sum_sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.02);
}

TEST(Rng, UniformIsInUnitInterval) {
  Rng rng(3);
  for (int i = 0; i < 10'000; ++i) {
    const double u = rng.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

}  // namespace
}  // namespace peertrain
