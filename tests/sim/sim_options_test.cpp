// The simulated cluster's options as a user writes them (launch --fail, --sim-compute), and
// a received payload shared by several receivers (net::unshare), which the simulated
// transport hands to every neighbour of one send.
#include <gtest/gtest.h>

#include "peertrain/core/error.h"
#include "peertrain/net/transport.h"
#include "peertrain/sim/cluster.h"

namespace peertrain {
namespace {

TEST(Failure, ParsesAHostAndALink) {
  const sim::FailureAt host = sim::parse_failure("3@12.5", 8);
  EXPECT_EQ(host.peer, 3);
  EXPECT_FALSE(host.link());
  EXPECT_DOUBLE_EQ(host.at_s, 12.5);
  const sim::FailureAt link = sim::parse_failure("0-7@2", 8);
  EXPECT_TRUE(link.link());
  EXPECT_EQ(link.peer, 0);
  EXPECT_EQ(link.other, 7);
  EXPECT_DOUBLE_EQ(link.at_s, 2.0);
}

TEST(Failure, RefusesWhatIsNoPeerNoLinkOrNoTime) {
  for (const char* text :
       {"3", "@1", "x@1", "3@", "3@-1", "3@1s", "8@1", "-1@2", "0-8@1", "2-2@1", "0-@1", "0-1-2@1"}) {
    try {
      sim::parse_failure(text, 8);
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(std::string("--fail '") + text + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(ComputeModel, NamesRoundTripAndOthersAreRefused) {
  for (auto model : {sim::ComputeModel::kFlops, sim::ComputeModel::kMeasured})
    EXPECT_EQ(sim::parse_compute_model(sim::to_string(model)), model);
  EXPECT_THROW(sim::parse_compute_model("cycles"), Error);
}

TEST(SharedPayload, TheLastHolderTakesTheBytesAndOthersCopyThem) {
  auto shared = std::make_shared<net::Payload>(net::Payload{std::byte{1}, std::byte{2}, std::byte{3}});
  const std::byte* data = shared->data();
  {
    auto second = shared;
    net::Payload copy = net::unshare(second);  // two holders: a copy
    EXPECT_EQ(copy, *shared);
    EXPECT_NE(copy.data(), data);
  }
  net::Payload moved = net::unshare(std::move(shared));  // the last holder: the bytes themselves
  EXPECT_EQ(moved.data(), data);
  EXPECT_TRUE(net::unshare(nullptr).empty());
}

}  // namespace
}  // namespace peertrain
