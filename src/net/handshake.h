// The handshake between two peers as pure functions: encode, decode and check. The TCP
// transport moves these bytes; everything it decides about a stranger's hello is decided
// here, so it can be unit-tested and fuzzed without a socket (tests/fuzz/handshake_fuzz.cpp).
//
//   hello (dialer → acceptor, 64 bytes):
//     version u32 | peer u32 | target u32 | fingerprint u64 | run id u64 | flags u32 |
//     nonce [32]
//   hello-reply (acceptor → dialer):
//     status u32 (0 accepted, 1 refused, 2 not yet: retry) | reason (refused, not yet) or
//     acceptor nonce [32] ‖ acceptor proof [32] (accepted, authenticated)
//
// All integers little-endian (the core byte codec).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "peertrain/net/auth.h"
#include "peertrain/net/transport.h"

namespace peertrain::net::handshake {

inline constexpr std::size_t kHelloBytes = 64;
inline constexpr std::size_t kAuthReplyBytes = 4 + kNonceBytes + kProofBytes;
inline constexpr std::uint64_t kMaxReplyBytes = 1024;
inline constexpr std::uint32_t kFlagAuthenticated = 1;
inline constexpr std::uint32_t kFlagRejoin = 2;  // a restarted peer coming back to a running run

struct Hello {
  std::uint32_t version = kProtocolVersion;
  std::uint32_t peer = 0;
  std::uint32_t target = 0;
  std::uint64_t fingerprint = 0;
  std::uint64_t run_id = 0;
  std::uint32_t flags = 0;
  Nonce nonce{};  // the dialer's, for the challenge–response
};

Payload encode_hello(const Hello& hello);
// Throws Error(kParse) naming `from` when the bytes are not a hello of this version.
Hello decode_hello(std::span<const std::byte> bytes, const std::string& from);

enum class ReplyStatus : std::uint32_t { kAccepted = 0, kRefused = 1, kRetry = 2 };

struct Reply {
  ReplyStatus status = ReplyStatus::kAccepted;
  std::string reason;    // refused or retry
  bool authenticated = false;  // accepted with a proof
  Nonce acceptor_nonce{};
  Proof proof{};
};

Payload encode_reply(const Reply& reply);
// Throws Error(kParse) naming `from` when the bytes are not a reply.
Reply decode_reply(std::span<const std::byte> bytes, const std::string& from);

// What the acceptor knows of the link the hello claims, read under its lock.
struct LinkView {
  bool exists = false;     // the claimed peer is a neighbour of ours in this topology
  bool connected = false;  // it connected once
  bool dead = false;
  bool left = false;       // it said goodbye
  bool dropped = false;    // we gave up on it and have not counted it in again
};

struct Policy {
  std::uint32_t self = 0;
  std::uint64_t fingerprint = 0;
  std::uint64_t run_id = 0;
  bool authenticated = false;  // we were started with --secret-file
};

struct Verdict {
  ReplyStatus status = ReplyStatus::kAccepted;
  std::string reason;  // empty when accepted
  bool accepted() const { return status == ReplyStatus::kAccepted; }
};

// May this hello become a link? Checked when the hello arrives and again, under the
// acceptor's lock, just before the link is established (after the proof, which takes a
// round trip during which another connection may have claimed the same peer).
Verdict check_hello(const Hello& hello, const Policy& policy, const LinkView& link);

std::string hex(std::uint64_t value);

}  // namespace peertrain::net::handshake
