// The wire format between peers: a fixed 48-byte little-endian header, then the payload.
//
//   magic u32 | version u16 | type u16 | sender u32 | tag u32 | step u64 | length u64 |
//   checksum u64 | reserved u64
//
// The type's top bit (kSharedBit) says that the payload is not on the wire but in the
// link's shared-memory ring (shared_ring.h): length bytes, at the place both ends compute.
// `tag` tells apart messages of one type in one step (the chunk of a ring all-reduce).
// `checksum` covers the other header fields and the payload, so a corrupted or forged
// length, step or sender is caught as well as corrupted data. Decoding checks every field
// against what the link expects, and the payload length against a bound the run sets, so
// a frame can never make a peer allocate more than the run needs (gloo's transport
// header and NCCL's checked calls are the models).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace peertrain::net {

inline constexpr std::uint32_t kMagic = 0x31525450;  // "PTR1" in memory order
inline constexpr std::uint16_t kProtocolVersion = 3;
inline constexpr std::uint16_t kSharedBit = 0x8000;
inline constexpr std::size_t kHeaderBytes = 48;
// What any frame may carry, whatever the run's own bound: the transport's frames (a ring
// offer) must fit in a run of tiny messages.
inline constexpr std::uint64_t kControlPayloadBytes = 64;

enum class MessageType : std::uint16_t {
  kHello = 1,        // handshake, dialer → acceptor
  kHelloReply = 2,   // handshake answer: accepted, or the reason for refusal
  kParameters = 3,   // a parameter vector (gossip, parameter-server pull)
  kGradients = 4,    // gradients (parameter-server push)
  kReduceChunk = 5,  // one chunk of a ring all-reduce
  kReport = 6,       // metrics and parameters for evaluation at peer 0
  kGoodbye = 7,      // the sender finished cleanly and will close the link
  kMembership = 8,   // a lost peer reported to peer 0, or peer 0's new membership
  kHelloProof = 9,   // handshake, dialer's proof that it holds the shared secret
  kHeartbeat = 10,   // "still here": sent on a link that has been quiet for a second
  kAverage = 11,     // AD-PSGD: a pairwise averaging request, its answer, or "done"
  kRingOffer = 12,   // a shared-memory ring for this link's payloads, offered by their sender
  kRingAccept = 13,  // the offer's ring is mapped: payloads may go through it
  kLast = kRingAccept,
};
const char* to_string(MessageType type);

struct FrameHeader {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kProtocolVersion;
  MessageType type = MessageType::kHello;
  std::uint32_t sender = 0;
  std::uint32_t tag = 0;
  std::uint64_t step = 0;
  std::uint64_t length = 0;
  std::uint64_t checksum = 0;
  bool shared = false;  // the payload lies in the link's shared-memory ring
};

using HeaderBytes = std::array<std::byte, kHeaderBytes>;

// A fast 64-bit checksum (four-lane Fletcher over 64-bit words, then mixed): several GB/s,
// so it does not limit the transport, and any single changed byte changes it.
std::uint64_t checksum_payload(std::span<const std::byte> payload);
// The same checksum, computed while copying the payload to `to` (from.size() bytes), in one
// pass over it.
std::uint64_t copy_and_checksum(std::span<const std::byte> from, std::byte* to);
// The checksum a header must carry for this payload: payload sum mixed with the fields.
std::uint64_t frame_checksum(const FrameHeader& header, std::uint64_t payload_sum);

HeaderBytes encode_header(const FrameHeader& header);

struct FrameExpectations {
  std::uint32_t sender = 0;         // the peer at the other end of the link
  std::uint64_t max_payload = 0;    // bytes; the largest message the run sends
  std::string peer_name;            // for errors: "peer 3 (127.0.0.1:29503)"
  // Whether a frame may say its payload is in a shared-memory ring: only once the link is
  // established, never in the handshake, when no ring exists yet.
  bool shared_allowed = false;
};

// Throws Error(kPeerLost) naming the peer and the field: wrong magic, version, unknown
// type, wrong sender, oversized length, a shared payload where none may be. The checksum is verified after the payload.
FrameHeader decode_header(const HeaderBytes& bytes, const FrameExpectations& expect);
void verify_checksum(const FrameHeader& header, std::span<const std::byte> payload, const FrameExpectations& expect);
// The same, for a payload whose checksum_payload is already known.
void verify_checksum(const FrameHeader& header, std::uint64_t payload_sum, const FrameExpectations& expect);

}  // namespace peertrain::net
