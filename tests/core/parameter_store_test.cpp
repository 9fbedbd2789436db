#include <gtest/gtest.h>

#include "peertrain/core/error.h"
#include "peertrain/core/parameter_store.h"

namespace peertrain {
namespace {

TEST(ParameterStore, SlicesAreContiguousViewsOfOneBuffer) {
  ParameterStore store;
  const auto w = store.add("w", 3, 2);
  const auto b = store.add("b", 3, 1);
  store.finalize();
  EXPECT_EQ(store.size(), 9u);
  EXPECT_EQ(store.slice(w).offset, 0u);
  EXPECT_EQ(store.slice(b).offset, 6u);
  store.view(w)(2, 1) = 5.0f;  // column-major: element 2 + 3*1 = 5
  store.view(b)(1, 0) = 7.0f;
  EXPECT_EQ(store.flat()[5], 5.0f);
  EXPECT_EQ(store.flat()[7], 7.0f);
  EXPECT_EQ(store.index_of("b"), b);
}

TEST(ParameterStore, MisuseIsReported) {
  ParameterStore store;
  store.add("w", 2, 2);
  EXPECT_THROW(store.view(0), Error);  // before finalize
  store.finalize();
  EXPECT_THROW(store.add("late", 1, 1), Error);
  EXPECT_THROW(store.index_of("missing"), Error);
}

}  // namespace
}  // namespace peertrain
