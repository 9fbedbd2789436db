#include <gtest/gtest.h>

#include <cmath>

#include "peertrain/core/json.h"

namespace peertrain {
namespace {

TEST(Json, EscapesAndOrdersKeys) {
  json::Object inner;
  inner.add("x", 1);
  json::Object o;
  o.add("name", "a \"quoted\"\nline").add("gap", 0.5).add("ok", true).add("nan", std::nan("")).add("inner", inner);
  o.add_raw("list", json::array(std::vector<int>{1, 2}));
  EXPECT_EQ(o.dump(0), R"({"name":"a \"quoted\"\nline", "gap":0.5, "ok":true, "nan":null, "inner":{"x":1}, "list":[1, 2]})");
}

}  // namespace
}  // namespace peertrain
