#include "peertrain/net/frame.h"

#include <algorithm>
#include <cstring>

#include "peertrain/core/error.h"

namespace peertrain::net {
namespace {

template <typename T>
void put(std::byte*& out, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) *out++ = static_cast<std::byte>((static_cast<std::uint64_t>(value) >> (8 * i)) & 0xff);
}

template <typename T>
T get(const std::byte*& in) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) value |= static_cast<std::uint64_t>(*in++) << (8 * i);
  return static_cast<T>(value);
}

std::uint64_t mix(std::uint64_t x) {  // SplitMix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

[[noreturn]] void bad_frame(const FrameExpectations& expect, const std::string& what) {
  throw Error(ErrorKind::kPeerLost, str("bad frame from ", expect.peer_name, ": ", what, "; closing the link"));
}

}  // namespace

const char* to_string(MessageType type) {
  switch (type) {
    case MessageType::kHello: return "hello";
    case MessageType::kHelloReply: return "hello-reply";
    case MessageType::kParameters: return "parameters";
    case MessageType::kGradients: return "gradients";
    case MessageType::kReduceChunk: return "reduce-chunk";
    case MessageType::kReport: return "report";
    case MessageType::kGoodbye: return "goodbye";
    case MessageType::kMembership: return "membership";
    case MessageType::kHelloProof: return "hello-proof";
    case MessageType::kHeartbeat: return "heartbeat";
    case MessageType::kAverage:
      return "averaging";
    case MessageType::kRingOffer:
      return "ring-offer";
    case MessageType::kRingAccept:
      return "ring-accept";
  }
  return "unknown";
}

namespace {

// The checksum's pass, writing each 32-byte block it reads to `copy_to` when that is set:
// a shared-memory payload is summed as it is copied out (or in), in one pass, and exactly
// the bytes copied are the bytes summed.
std::uint64_t sum_and_copy(std::span<const std::byte> payload, std::byte* copy_to) {
  // Four independent lanes let the compiler vectorize; the tail is folded in bytewise.
  std::uint64_t a[4] = {1, 2, 3, 4}, b[4] = {0, 0, 0, 0};
  const std::size_t words = payload.size() / 32 * 4;
  const std::byte* data = payload.data();
  for (std::size_t i = 0; i < words; i += 4) {
    std::uint64_t w[4];
    std::memcpy(w, data + 8 * i, 32);
    if (copy_to) std::memcpy(copy_to + 8 * i, w, 32);
    for (int k = 0; k < 4; ++k) {
      a[k] += w[k];
      b[k] += a[k];
    }
  }
  std::uint64_t tail = payload.size();
  for (std::size_t i = 8 * words; i < payload.size(); ++i) {
    const std::byte b = data[i];  // read once: the bytes summed are the bytes copied
    if (copy_to) copy_to[i] = b;
    tail = tail * 0x100000001b3ULL + static_cast<std::uint8_t>(b);
  }
  std::uint64_t h = mix(tail);
  for (int k = 0; k < 4; ++k) h = mix(h ^ a[k]) + mix(b[k] + k);
  return h;
}

}  // namespace

std::uint64_t checksum_payload(std::span<const std::byte> payload) { return sum_and_copy(payload, nullptr); }

std::uint64_t copy_and_checksum(std::span<const std::byte> from, std::byte* to) { return sum_and_copy(from, to); }

std::uint64_t frame_checksum(const FrameHeader& header, std::uint64_t payload_sum) {
  std::uint64_t h = mix(payload_sum ^ (static_cast<std::uint64_t>(header.magic) << 16) ^ header.version);
  h = mix(h ^ static_cast<std::uint64_t>(header.type) ^ (static_cast<std::uint64_t>(header.sender) << 32));
  h = mix(h ^ header.tag ^ (header.shared ? std::uint64_t{1} << 40 : 0));
  h = mix(h ^ header.step);
  return mix(h ^ header.length);
}

HeaderBytes encode_header(const FrameHeader& h) {
  HeaderBytes bytes{};
  std::byte* out = bytes.data();
  put(out, h.magic);
  put(out, h.version);
  put(out, static_cast<std::uint16_t>(static_cast<std::uint16_t>(h.type) | (h.shared ? kSharedBit : 0)));
  put(out, h.sender);
  put(out, h.tag);
  put(out, h.step);
  put(out, h.length);
  put(out, h.checksum);
  put(out, std::uint64_t{0});
  return bytes;
}

FrameHeader decode_header(const HeaderBytes& bytes, const FrameExpectations& expect) {
  const std::byte* in = bytes.data();
  FrameHeader h;
  h.magic = get<std::uint32_t>(in);
  h.version = get<std::uint16_t>(in);
  const auto type_bits = get<std::uint16_t>(in);
  const auto type = static_cast<std::uint16_t>(type_bits & ~kSharedBit);
  h.shared = (type_bits & kSharedBit) != 0;
  h.sender = get<std::uint32_t>(in);
  h.tag = get<std::uint32_t>(in);
  h.step = get<std::uint64_t>(in);
  h.length = get<std::uint64_t>(in);
  h.checksum = get<std::uint64_t>(in);
  if (h.magic != kMagic) bad_frame(expect, str("wrong magic 0x", std::hex, h.magic, std::dec, " (not a peertrain peer?)"));
  if (h.version != kProtocolVersion)
    bad_frame(expect, str("protocol version ", h.version, ", expected ", kProtocolVersion));
  if (type < 1 || type > static_cast<std::uint16_t>(MessageType::kLast)) bad_frame(expect, str("unknown message type ", type));
  h.type = static_cast<MessageType>(type);
  if (h.shared && !expect.shared_allowed)
    bad_frame(expect,
              str("a ", to_string(h.type), " frame says its payload is in shared memory, before any ring exists"));
  if (h.sender != expect.sender) bad_frame(expect, str("sender ", h.sender, " on the link to peer ", expect.sender));
  const std::uint64_t bound = std::max<std::uint64_t>(expect.max_payload, kControlPayloadBytes);
  if (h.length > bound)
    bad_frame(expect, str("payload of ", h.length, " bytes, more than the ", bound, " this run sends"));
  return h;
}

void verify_checksum(const FrameHeader& header, std::span<const std::byte> payload, const FrameExpectations& expect) {
  verify_checksum(header, checksum_payload(payload), expect);
}

void verify_checksum(const FrameHeader& header, std::uint64_t payload_sum, const FrameExpectations& expect) {
  if (frame_checksum(header, payload_sum) != header.checksum)
    bad_frame(expect, str("checksum mismatch on a ", to_string(header.type), " frame for step ", header.step));
}

}  // namespace peertrain::net
