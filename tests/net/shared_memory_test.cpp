// Payloads through shared memory between peers on one host (src/net/shared_ring.h): the
// ring's allocation as both ends compute it, and the TCP transport moving large payloads
// through it, exactly and in order with the inline ones, under shaping and authentication.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <random>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include "../../src/net/shared_ring.h"
#include "peertrain/net/tcp.h"
#include "middle_proxy.h"
#include "test_support/cluster.h"

namespace peertrain::net {
namespace {

using testing::loopback_endpoints;
using testing::options_for;
using testing::run_peers;

TEST(SharedRing, TheReceiverFindsEachPayloadWhereTheSenderPutItAndNothingInFlightIsOverwritten) {
  auto out = SharedRing::create(64 * 1024);
  std::string why;
  auto in = SharedRing::open(out->offer(), why);
  ASSERT_TRUE(in) << why;
  ASSERT_EQ(in->capacity(), out->capacity());
  struct Frame {
    std::ptrdiff_t at;
    std::size_t bytes;
    std::byte fill;
  };
  std::deque<Frame> flight;
  std::mt19937 rng(7);
  int sent = 0, refused = 0;
  for (int i = 0; i < 5000; ++i) {
    if (flight.empty() || rng() % 3 != 0) {
      const std::size_t bytes = 1 + rng() % (out->capacity() / 3);
      const std::ptrdiff_t at = out->claim(bytes);
      if (at < 0) {
        ASSERT_FALSE(flight.empty()) << "a ring its receiver emptied refuses " << bytes << " bytes";
        ++refused;
        continue;
      }
      ASSERT_LE(static_cast<std::size_t>(at) + bytes, out->capacity());
      const auto fill = static_cast<std::byte>(rng());
      std::memset(out->data() + at, static_cast<int>(fill), bytes);
      flight.push_back({at, bytes, fill});
      ++sent;
    } else {
      const Frame f = flight.front();
      flight.pop_front();
      ASSERT_EQ(in->next(f.bytes), f.at) << "the receiver's mirror lost the sender's place";
      for (std::size_t k = 0; k < f.bytes; ++k)
        ASSERT_EQ(in->data()[f.at + static_cast<std::ptrdiff_t>(k)], f.fill) << "a payload in flight was overwritten";
      in->release();
    }
  }
  EXPECT_GT(sent, 1000);
  EXPECT_GT(refused, 50);  // the sender did run into the receiver, and waited for it
  EXPECT_EQ(out->claim(out->capacity() + 1), -1);
  EXPECT_EQ(in->next(out->capacity() + 1), -1);
}

TEST(SharedRing, AnOfferThatIsNotThisSegmentIsRefusedWithTheReason) {
  auto out = SharedRing::create(8192);
  std::string why;
  auto forged = out->offer();
  forged.nonce ^= 1;
  EXPECT_FALSE(SharedRing::open(forged, why));
  EXPECT_NE(why.find("not the ring offered"), std::string::npos) << why;
  auto elsewhere = out->offer();
  elsewhere.fd = 1000000;
  EXPECT_FALSE(SharedRing::open(elsewhere, why));
  EXPECT_NE(why.find("cannot open /proc/"), std::string::npos) << why;
  auto resized = out->offer();
  resized.capacity *= 2;
  EXPECT_FALSE(SharedRing::open(resized, why));
  EXPECT_NE(why.find("not a sealed ring of 16384 bytes"), std::string::npos) << why;
  SharedRing::Offer decoded;
  EXPECT_FALSE(SharedRing::Offer::decode(std::vector<std::byte>(31), decoded));
}

// Fresh random floats for (sender, step), of a size that varies from step to step: some
// below kSharedMinBytes (inline), some above.
std::vector<float> message(int sender, std::uint64_t step, std::size_t max_floats) {
  std::mt19937 rng(static_cast<unsigned>(sender * 100003 + step));
  std::vector<float> v(1 + rng() % max_floats);
  std::normal_distribution<float> normal;
  for (float& x : v) x = normal(rng);
  return v;
}

void expect_message(const Payload& got, int sender, std::uint64_t step, std::size_t max_floats) {
  const auto want = message(sender, step, max_floats);
  ASSERT_EQ(got.size(), want.size() * sizeof(float)) << "step " << step;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0) << "step " << step << " from peer " << sender;
}

// Both directions at once, step after step, as D-PSGD does; returns the messages sent and
// those of them at least kSharedMinBytes.
std::pair<int, int> exchange(Transport& net, int rank, int steps, std::size_t max_floats) {
  int large = 0;
  for (std::uint64_t step = 0; step < static_cast<std::uint64_t>(steps); ++step) {
    const auto mine = message(rank, step, max_floats);
    if (mine.size() * sizeof(float) >= kSharedMinBytes) ++large;
    auto s = net.send(1 - rank, MessageType::kParameters, step, 0, as_bytes(mine));
    expect_message(net.receive(1 - rank, MessageType::kParameters, step, 0), 1 - rank, step, max_floats);
    s.wait(20);
  }
  return {steps, large};
}

TEST(SharedMemoryTransport, LargePayloadsGoThroughSharedMemoryExactlyAndSmallOnesInline) {
  const auto endpoints = loopback_endpoints(2);
  constexpr std::size_t kMaxFloats = 300'000;  // up to 1.2 MB
  run_peers(2, [&](int rank) {
    auto o = options_for(rank, endpoints, {1 - rank}, kMaxFloats * 4);
    // Three times the largest frame: the newest in flight never blocks the next, wherever
    // it lies (with two, one could straddle the place the next must wrap to).
    o.shared_ring_bytes = 3 * kMaxFloats * 4;
    auto net = make_tcp_transport(o);
    net->connect();
    const LinkCounters before = net->counters(1 - rank);
    const auto [messages, large] = exchange(*net, rank, 60, kMaxFloats);
    const LinkCounters after = net->counters(1 - rank);
    EXPECT_GT(large, 40);
    EXPECT_LT(large, messages);
    // One frame in flight at most: the ring is never full, so every large payload went
    // through it, and none of the small ones.
    EXPECT_EQ(after.messages_shared - before.messages_shared, static_cast<std::uint64_t>(large));
    EXPECT_EQ(after.messages_sent - before.messages_sent, static_cast<std::uint64_t>(messages));
    net->close();
  });
}

TEST(SharedMemoryTransport, AFullRingSendsInlineAndOrderHolds) {
  const auto endpoints = loopback_endpoints(2);
  constexpr std::size_t kMaxFloats = 120'000;  // up to 480 KB, in a 512 KiB ring
  constexpr int kSteps = 40;
  run_peers(2, [&](int rank) {
    auto o = options_for(rank, endpoints, {1 - rank}, kMaxFloats * 4);
    o.shared_ring_bytes = 512 * 1024;
    auto net = make_tcp_transport(o);
    net->connect();
    // Every send queued at once: the ring fills, the rest go inline behind its frames.
    std::vector<std::vector<float>> mine;
    std::vector<Work> sends;
    std::uint64_t large = 0;
    for (std::uint64_t step = 0; step < kSteps; ++step) {
      mine.push_back(message(rank, step, kMaxFloats));
      if (mine.back().size() * sizeof(float) >= kSharedMinBytes) ++large;
    }
    for (std::uint64_t step = 0; step < kSteps; ++step)
      sends.push_back(net->send(1 - rank, MessageType::kParameters, step, 0, as_bytes(mine[step])));
    for (std::uint64_t step = 0; step < kSteps; ++step)
      expect_message(net->receive(1 - rank, MessageType::kParameters, step, 0), 1 - rank, step, kMaxFloats);
    for (auto& s : sends) s.wait(20);
    const LinkCounters c = net->counters(1 - rank);
    EXPECT_GT(c.messages_shared, 0u);
    EXPECT_LT(c.messages_shared, large);  // some large ones found the ring full and went inline
    net->close();
  });
}

TEST(SharedMemoryTransport, AuthenticatedLinksUseItAndOffMeansTcpOnly) {
  for (const bool secret : {true, false}) {
    const auto endpoints = loopback_endpoints(2);
    run_peers(2, [&](int rank) {
      auto o = options_for(rank, endpoints, {1 - rank}, 1 << 20);
      if (secret) o.secret = Secret::from_bytes(std::vector<std::uint8_t>(kSecretBytes, 0x5a));
      o.shared_ring_bytes = 3 * 800'000;      // the newest in flight never blocks the next
      o.shared_memory = secret || rank == 0;  // without the secret: peer 1 turns it off
      auto net = make_tcp_transport(o);
      net->connect();
      const auto [messages, large] = exchange(*net, rank, 20, 200'000);
      EXPECT_GT(large, 0);
      const LinkCounters c = net->counters(1 - rank);
      if (secret) {
        EXPECT_EQ(c.messages_shared, static_cast<std::uint64_t>(large)) << "rank " << rank;
      } else {
        EXPECT_EQ(c.messages_shared, 0u) << "rank " << rank << ": one side is off, so neither uses it";
      }
      net->close();
    });
  }
}

TEST(SharedMemoryTransport, ABandwidthCapHoldsSharedFramesAsLongAsInlineOnes) {
  const auto endpoints = loopback_endpoints(2);
  run_peers(2, [&](int rank) {
    auto o = options_for(rank, endpoints, {1 - rank});
    o.shaping = [](int) { return LinkShaping{0.0, 80.0}; };  // 10 MB/s
    auto net = make_tcp_transport(o);
    net->connect();
    const std::vector<float> x(1 << 18, static_cast<float>(rank));  // 1 MiB: at least 0.1 s
    const auto start = std::chrono::steady_clock::now();
    auto s = net->send(1 - rank, MessageType::kParameters, 0, 0, as_bytes(x));
    const Payload got = net->receive(1 - rank, MessageType::kParameters, 0, 0);
    s.wait(20);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GE(seconds, 0.8 * (1 << 20) / 10e6) << seconds;  // a lower bound only
    EXPECT_EQ(net->counters(1 - rank).messages_shared, 1u);
    ASSERT_EQ(got.size(), x.size() * 4);
    EXPECT_EQ(reinterpret_cast<const float*>(got.data())[12345], static_cast<float>(1 - rank));
    net->close();
  });
}

TEST(SharedMemoryTransport, AnIngressCapReadsSharedFramesPieceByPiece) {
  const auto endpoints = loopback_endpoints(2);
  run_peers(2, [&](int rank) {
    auto o = options_for(rank, endpoints, {1 - rank});
    if (rank == 0) o.node_ingress_mbps = 80.0;  // 10 MB/s into peer 0
    auto net = make_tcp_transport(o);
    net->connect();
    if (rank == 0) {
      const auto start = std::chrono::steady_clock::now();
      expect_message(net->receive(1, MessageType::kParameters, 0, 0), 1, 0, 400'000);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double bytes = static_cast<double>(message(1, 0, 400'000).size() * 4);
      EXPECT_GE(seconds, 0.8 * bytes / 10e6) << seconds;
    } else {
      const auto x = message(1, 0, 400'000);
      ASSERT_GE(x.size() * 4, kSharedMinBytes);
      net->send(0, MessageType::kParameters, 0, 0, as_bytes(x)).wait(20);
      EXPECT_EQ(net->counters(0).messages_shared, 1u);
    }
    net->close();
  });
}

// A man in the middle sets the shared bit in the type of peer 0's first parameters frame,
// whose 4,000 bytes are inline: peer 1 names the frame and closes the link, whether it
// keeps every byte on TCP (no ring) or has a ring (no sender puts so small a payload there).
TEST(SharedMemoryTransport, AForgedSharedBitIsABadFrame) {
  // The header's first 8 bytes: magic, version, type (parameters).
  const std::array<std::uint8_t, 8> wanted = {0x50, 0x54, 0x52, 0x31, kProtocolVersion, 0, 3, 0};
  for (const bool receiver_shares : {false, true}) {
    bool done = false;
    const std::string receiver_error = testing::receiver_error_through_proxy(
        [&](std::vector<std::byte>& held, long long) -> std::size_t {
          if (done) return 0;
          for (std::size_t i = 0; i + wanted.size() <= held.size(); ++i)
            if (std::memcmp(held.data() + i, wanted.data(), wanted.size()) == 0) {
              held[i + 7] |= std::byte{0x80};  // the type's top bit: "the payload is in the ring"
              done = true;
              return 0;
            }
          for (std::size_t k = std::min(held.size(), wanted.size() - 1); k > 0; --k)
            if (std::memcmp(held.data() + held.size() - k, wanted.data(), k) == 0) return k;
          return 0;
        },
        [&](int rank, TcpOptions& o) { o.shared_memory = rank == 0 || receiver_shares; });
    EXPECT_NE(receiver_error.find("bad frame from peer 0"), std::string::npos) << receiver_error;
    EXPECT_NE(receiver_error.find(receiver_shares ? "puts its 4000 bytes in shared memory, which no sender puts there"
                                                  : "puts its 4000 bytes in shared memory, but the link has no ring"),
              std::string::npos)
        << receiver_error;
  }
}

// Two processes, as in a real run: the ring is mapped through the other process's /proc.
// The child plays peer 1 and reports by its exit status.
TEST(SharedMemoryTransport, TwoProcessesShareTheirRings) {
  const auto endpoints = loopback_endpoints(2);
  constexpr std::size_t kMaxFloats = 200'000;
  auto run = [&](int rank) {
    auto o = options_for(rank, endpoints, {1 - rank}, kMaxFloats * 4);
    o.shared_ring_bytes = 3 * kMaxFloats * 4;
    auto net = make_tcp_transport(o);
    net->connect();
    const auto [messages, large] = exchange(*net, rank, 20, kMaxFloats);
    const bool all_shared = net->counters(1 - rank).messages_shared == static_cast<std::uint64_t>(large);
    net->close();
    return large > 0 && all_shared;
  };
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    bool ok = false;
    try {
      ok = run(1) && !::testing::Test::HasFailure();
    } catch (...) {
    }
    std::_Exit(ok ? 0 : 1);
  }
  EXPECT_TRUE(run(0)) << "peer 0's large payloads did not all go through peer 1's mapping of its ring";
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "peer 1, in its own process, failed";
}

}  // namespace
}  // namespace peertrain::net
