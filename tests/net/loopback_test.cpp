// The in-process transport and the fault-injecting decorator: the same contract as the
// TCP transport (delivery by address, a lost link named, goodbye, drop and rejoin), and
// each injected fault doing what it says.
#include "peertrain/net/loopback.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "../topology/test_util.h"
#include "peertrain/net/faulty.h"

namespace peertrain::net {
namespace {

using Clock = std::chrono::steady_clock;

LoopbackOptions pair_options(double timeout_s = 2) { return {2, {{1}, {0}}, timeout_s}; }

Payload bytes_of(std::initializer_list<int> values) {
  Payload p;
  for (int v : values) p.push_back(static_cast<std::byte>(v));
  return p;
}

TEST(Loopback, DeliversByAddressInAnyOrderAndCounts) {
  LoopbackFabric fabric(pair_options());
  auto a = fabric.transport(0), b = fabric.transport(1);
  Payload first = bytes_of({1, 2, 3});
  a->send(1, MessageType::kParameters, 7, 0, first).wait(1);
  first[0] = std::byte{9};  // the send copied it: a borrowed buffer is free once the send is done
  a->send(1, MessageType::kParameters, 6, 2, bytes_of({4})).wait(1);
  EXPECT_EQ(b->receive(0, MessageType::kParameters, 6, 2), bytes_of({4}));
  EXPECT_EQ(b->receive(0, MessageType::kParameters, 7, 0), bytes_of({1, 2, 3}));
  EXPECT_FALSE(b->try_receive(0, MessageType::kParameters, 8, 0).has_value());
  EXPECT_EQ(a->counters(1).messages_sent, 2u);
  EXPECT_EQ(b->counters(0).bytes_received, 2 * kHeaderBytes + 4);
}

TEST(Loopback, ALostPeerIsNamedAndAGoodbyeIsNot) {
  LoopbackFabric fabric({3, {{1, 2}, {0}, {0}}, 2});
  auto a = fabric.transport(0), b = fabric.transport(1), c = fabric.transport(2);
  b->abort();
  EXPECT_ERROR_MENTIONS(a->receive(1, MessageType::kParameters, 0, 0), "peer 1 (loopback) closed the connection");
  EXPECT_FALSE(a->alive(1));
  c->close();
  EXPECT_ERROR_MENTIONS(a->receive(2, MessageType::kParameters, 0, 0), "finished and left");
  EXPECT_FALSE(a->try_receive(2, MessageType::kParameters, 0, 0).has_value());  // a goodbye is not a loss
  EXPECT_EQ(a->lost_links(),
            std::vector<std::string>{"peer 1 (loopback) closed the connection (it exited or crashed)"});
  const auto start = Clock::now();
  LoopbackFabric quiet(pair_options(0.3));
  auto q = quiet.transport(0), r = quiet.transport(1);
  EXPECT_ERROR_MENTIONS(q->receive(1, MessageType::kParameters, 0, 0), "sent no parameters for step 0 within 0.3");
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 2.0);
}

TEST(Loopback, ADroppedPeerRejoinsWithAFreshLink) {
  LoopbackFabric fabric(pair_options());
  auto a = fabric.transport(0);
  {
    auto old = fabric.transport(1);
    old->send(0, MessageType::kParameters, 5, 0, bytes_of({5})).wait(1);
    old->abort();
  }
  EXPECT_THROW(a->receive(1, MessageType::kParameters, 6, 0), Error);
  std::thread dropper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    a->drop(1, "test: lost");
  });
  auto again = fabric.rejoin(1);  // waits for the drop, like a "not yet" answer retried
  dropper.join();
  EXPECT_TRUE(a->alive(1));
  EXPECT_EQ(a->rejoins(1), 1);
  again->send(0, MessageType::kParameters, 5, 0, bytes_of({6})).wait(1);  // the old process's step 5 is gone
  EXPECT_EQ(a->receive(1, MessageType::kParameters, 5, 0), bytes_of({6}));
}

TEST(Loopback, ASecondCopyOfAMessageFailsTheLink) {
  LoopbackFabric fabric(pair_options());
  auto a = fabric.transport(0), b = fabric.transport(1);
  a->send(1, MessageType::kParameters, 1, 0, bytes_of({1})).wait(1);
  // The receiver closes the link naming the duplicate; the sender hears the link close.
  EXPECT_ERROR_MENTIONS(a->send(1, MessageType::kParameters, 1, 0, bytes_of({1})).wait(1), "closed the connection");
  EXPECT_ERROR_MENTIONS(b->receive(0, MessageType::kParameters, 2, 0), "a second parameters for step 1");
  EXPECT_FALSE(b->alive(0));
}

TEST(Faulty, DropsOnlyTheChosenMessages) {
  LoopbackFabric fabric(pair_options(0.3));
  auto a = make_faulty_transport(fabric.transport(0), {{Fault::kDrop, 1, MessageType::kParameters, 3, 4}});
  auto b = fabric.transport(1);
  for (std::uint64_t step = 0; step < 6; ++step) a->send(1, MessageType::kParameters, step, 0, bytes_of({int(step)})).wait(1);
  for (std::uint64_t step : {0, 1, 2, 5}) EXPECT_EQ(b->receive(0, MessageType::kParameters, step, 0), bytes_of({int(step)}));
  EXPECT_ERROR_MENTIONS(b->receive(0, MessageType::kParameters, 3, 0), "sent no parameters for step 3");
}

TEST(Faulty, DelaysWithoutReordering) {
  LoopbackFabric fabric(pair_options());
  auto a = make_faulty_transport(fabric.transport(0), {{.action = Fault::kDelay, .from_step = 2, .to_step = 3, .delay_s = 0.2}});
  auto b = fabric.transport(1);
  const auto start = Clock::now();
  Work late = a->send(1, MessageType::kParameters, 2, 0, bytes_of({2}));
  a->send(1, MessageType::kParameters, 1, 0, bytes_of({1})).wait(1);
  EXPECT_EQ(b->receive(0, MessageType::kParameters, 1, 0), bytes_of({1}));
  // Step 1 went past the delayed step 2, which is still held back: no bound on how fast
  // step 1 came, only on the order (a loaded machine may take any time to deliver it).
  EXPECT_FALSE(late.done());
  EXPECT_EQ(b->receive(0, MessageType::kParameters, 2, 0), bytes_of({2}));
  EXPECT_GE(std::chrono::duration<double>(Clock::now() - start).count(), 0.19);
  late.wait(1);
}

TEST(Faulty, ACorruptedFrameClosesTheLinkAndIsNamed) {
  LoopbackFabric fabric(pair_options());
  auto a = fabric.transport(0);
  auto b = make_faulty_transport(fabric.transport(1), {{.action = Fault::kCorrupt, .peer = 0, .from_step = 4}});
  a->send(1, MessageType::kParameters, 3, 0, bytes_of({3})).wait(1);
  a->send(1, MessageType::kParameters, 4, 0, bytes_of({4})).wait(1);
  EXPECT_EQ(b->receive(0, MessageType::kParameters, 3, 0), bytes_of({3}));
  EXPECT_ERROR_MENTIONS(b->receive(0, MessageType::kParameters, 4, 0), "bad frame from peer 0", "checksum", "step 4");
  EXPECT_FALSE(a->alive(1));  // the sender hears that the link was closed
}

TEST(Faulty, AKilledLinkFailsFromItsStepOn) {
  LoopbackFabric fabric(pair_options());
  auto a = make_faulty_transport(fabric.transport(0), {{.action = Fault::kKill, .peer = 1, .from_step = 10}});
  auto b = fabric.transport(1);
  a->send(1, MessageType::kParameters, 9, 0, bytes_of({9})).wait(1);
  EXPECT_ERROR_MENTIONS(a->send(1, MessageType::kParameters, 10, 0, bytes_of({10})).wait(1), "injected fault",
                        "killed at step 10");
  EXPECT_EQ(b->receive(0, MessageType::kParameters, 9, 0), bytes_of({9}));
  EXPECT_ERROR_MENTIONS(b->receive(0, MessageType::kParameters, 10, 0), "closed the connection");
}

}  // namespace
}  // namespace peertrain::net
