#include <gtest/gtest.h>

#include "peertrain/core/error.h"
#include "peertrain/core/log.h"

namespace peertrain {
namespace {

TEST(Error, StrConcatenatesAnythingThatStreams) {
  EXPECT_EQ(str("peer ", 3, " at step ", 12L, ": ", 0.5), "peer 3 at step 12: 0.5");
  EXPECT_EQ(str(), "");
}

TEST(Error, KeepsItsKindAndMessage) {
  try {
    throw Error(ErrorKind::kTimeout, "peer 2 did not answer within 5 s");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
    EXPECT_STREQ(e.what(), "peer 2 did not answer within 5 s");
    EXPECT_EQ(to_string(e.kind()), "timeout");
  }
}

TEST(Error, CheckPrintsTheExpressionAndBothValues) {
  const int have = 3, want = 4;
  try {
    PEERTRAIN_CHECK(have == want, "have ", have, ", want ", want);
    FAIL() << "the check did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    const std::string message = e.what();
    EXPECT_NE(message.find("have == want"), std::string::npos) << message;
    EXPECT_NE(message.find("have 3, want 4"), std::string::npos) << message;
  }
}

TEST(Log, ParsesLevelsAndRejectsUnknownOnes) {
  EXPECT_EQ(log::parse_level("warn"), log::Level::kWarn);
  EXPECT_THROW(log::parse_level("loud"), Error);
}

}  // namespace
}  // namespace peertrain
