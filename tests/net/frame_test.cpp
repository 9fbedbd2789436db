#include "peertrain/net/frame.h"

#include <gtest/gtest.h>

#include <vector>

#include "../../src/net/wire_clock.h"
#include "../topology/test_util.h"
#include "peertrain/core/rng.h"

namespace peertrain::net {
namespace {

FrameHeader sample(std::span<const std::byte> payload) {
  FrameHeader h;
  h.type = MessageType::kParameters;
  h.sender = 3;
  h.tag = 2;
  h.step = 123456789012ULL;
  h.length = payload.size();
  h.checksum = frame_checksum(h, checksum_payload(payload));
  return h;
}

const FrameExpectations kExpect{3, 1 << 20, "peer 3 (127.0.0.1:29503)"};

std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::byte> bytes(n);
  for (auto& b : bytes) b = static_cast<std::byte>(rng.uniform_below(256));
  return bytes;
}

TEST(Frame, RoundTripsEveryField) {
  const auto payload = random_bytes(1001, 1);
  const FrameHeader h = sample(payload);
  const FrameHeader back = decode_header(encode_header(h), kExpect);
  EXPECT_EQ(back.type, h.type);
  EXPECT_EQ(back.sender, 3u);
  EXPECT_EQ(back.tag, 2u);
  EXPECT_EQ(back.step, h.step);
  EXPECT_EQ(back.length, 1001u);
  EXPECT_NO_THROW(verify_checksum(back, payload, kExpect));
}

TEST(Frame, RejectsEveryBadFieldNamingThePeer) {
  const auto payload = random_bytes(64, 2);
  auto corrupt = [&](std::size_t offset, std::byte value) {
    HeaderBytes bytes = encode_header(sample(payload));
    bytes[offset] = value;
    return bytes;
  };
  EXPECT_ERROR_MENTIONS(decode_header(corrupt(0, std::byte{0x00}), kExpect), "peer 3 (127.0.0.1:29503)", "magic");
  EXPECT_ERROR_MENTIONS(decode_header(corrupt(4, std::byte{0x09}), kExpect), "protocol version 9");
  EXPECT_ERROR_MENTIONS(decode_header(corrupt(6, std::byte{0x63}), kExpect), "unknown message type 99");
  EXPECT_ERROR_MENTIONS(decode_header(corrupt(8, std::byte{0x05}), kExpect), "sender 5");
  EXPECT_ERROR_MENTIONS(decode_header(corrupt(31, std::byte{0x7f}), kExpect), "more than the 1048576");
  // A flipped step or tag passes the field checks but not the checksum.
  const FrameHeader stepped = decode_header(corrupt(16, std::byte{0x01}), kExpect);
  EXPECT_ERROR_MENTIONS(verify_checksum(stepped, payload, kExpect), "checksum mismatch");
}

// The shared-memory bit is refused where no ring can exist (the handshake) and kept where
// the link allows it.
TEST(Frame, ASharedPayloadIsRefusedWhereNoRingMayExist) {
  const auto payload = random_bytes(64, 3);
  FrameHeader h = sample(payload);
  h.shared = true;
  EXPECT_ERROR_MENTIONS(decode_header(encode_header(h), kExpect), "peer 3 (127.0.0.1:29503)",
                        "says its payload is in shared memory");
  FrameExpectations on_a_link = kExpect;
  on_a_link.shared_allowed = true;
  EXPECT_TRUE(decode_header(encode_header(h), on_a_link).shared);
}

TEST(Frame, ChecksumSeesEverySingleByteChange) {
  for (std::size_t size : {0, 1, 7, 31, 32, 33, 1000}) {
    auto payload = random_bytes(size, size + 10);
    const std::uint64_t base = checksum_payload(payload);
    for (std::size_t i = 0; i < size; ++i) {
      payload[i] ^= std::byte{0x10};
      EXPECT_NE(checksum_payload(payload), base) << "size " << size << " byte " << i;
      payload[i] ^= std::byte{0x10};
    }
  }
  // Reordered words must not cancel out.
  std::vector<std::byte> a(64, std::byte{0}), b(64, std::byte{0});
  a[0] = std::byte{1};
  b[8] = std::byte{1};
  EXPECT_NE(checksum_payload(a), checksum_payload(b));
}

// The sender's wire clock runs from when the bytes were ready, not from when the I/O
// thread got to them: a writer woken late by a busy core does not lose wire time (up to
// kCatchUp), a wire idle before the bytes were ready saves nothing up, and a stall longer
// than kCatchUp is idle time.
TEST(WireClock, ALateWriterLosesNoWireTimeButAnIdleWireSavesNothing) {
  using namespace std::chrono;
  const WireClock::Clock::time_point t0{seconds(100)};
  const double mbps = 8.0;         // 1 MB/s
  const std::size_t piece = 1000;  // 1 ms
  WireClock wire;
  // Ready at t0, first reserved 3 ms late: the pieces follow each other from t0.
  EXPECT_EQ(wire.reserve_from(t0, t0 + milliseconds(3), mbps, piece), t0 + milliseconds(1));
  EXPECT_EQ(wire.reserve_from(t0, t0 + milliseconds(3), mbps, piece), t0 + milliseconds(2));
  EXPECT_EQ(wire.reserve_from(t0, t0 + milliseconds(3), mbps, piece), t0 + milliseconds(3));
  EXPECT_EQ(wire.reserve_from(t0, t0 + milliseconds(3), mbps, piece), t0 + milliseconds(4));
  // Idle from t0 + 4 ms; a frame ready at t0 + 60 ms starts then, whenever it is reserved.
  const auto t1 = t0 + milliseconds(60);
  EXPECT_EQ(wire.reserve_from(t1, t1, mbps, piece), t1 + milliseconds(1));
  EXPECT_EQ(wire.reserve_from(t1, t1 + milliseconds(1), mbps, piece), t1 + milliseconds(2));
  // Stalled 50 ms (a receiver that does not read): only kCatchUp is recovered.
  const auto t2 = t1 + milliseconds(52);
  EXPECT_EQ(wire.reserve_from(t1, t2, mbps, piece), t2 - WireClock::kCatchUp + milliseconds(1));
}

}  // namespace
}  // namespace peertrain::net
