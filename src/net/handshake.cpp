#include "handshake.h"

#include <cstdio>

#include "peertrain/core/codec.h"
#include "peertrain/core/error.h"

namespace peertrain::net::handshake {

std::string hex(std::uint64_t value) {
  char buffer[24];
  std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(value));
  return buffer;
}

Payload encode_hello(const Hello& h) {
  codec::Writer out;
  out.u32(h.version).u32(h.peer).u32(h.target).u64(h.fingerprint).u64(h.run_id).u32(h.flags).bytes(h.nonce);
  return out.take();
}

Hello decode_hello(std::span<const std::byte> bytes, const std::string& from) {
  if (bytes.size() != kHelloBytes)
    throw Error(ErrorKind::kParse, str("hello from ", from, " is ", bytes.size(), " bytes, expected ", kHelloBytes));
  codec::Reader in(bytes, str("hello from ", from));
  Hello h;
  h.version = in.u32();
  h.peer = in.u32();
  h.target = in.u32();
  h.fingerprint = in.u64();
  h.run_id = in.u64();
  h.flags = in.u32();
  in.bytes(h.nonce);
  if (h.version != kProtocolVersion)
    throw Error(ErrorKind::kParse, str("hello from ", from, " speaks protocol version ", h.version, ", we speak ",
                                       kProtocolVersion));
  if ((h.flags & ~(kFlagAuthenticated | kFlagRejoin)) != 0)
    throw Error(ErrorKind::kParse, str("hello from ", from, " has unknown flags ", hex(h.flags)));
  return h;
}

Payload encode_reply(const Reply& r) {
  codec::Writer out;
  out.u32(static_cast<std::uint32_t>(r.status));
  if (r.status == ReplyStatus::kAccepted && r.authenticated) out.bytes(r.acceptor_nonce).bytes(r.proof);
  else out.text(r.reason.substr(0, kMaxReplyBytes - 4));
  return out.take();
}

Reply decode_reply(std::span<const std::byte> bytes, const std::string& from) {
  codec::Reader in(bytes, str("hello-reply from ", from));
  Reply r;
  const std::uint32_t status = in.u32();
  if (status > static_cast<std::uint32_t>(ReplyStatus::kRetry))
    throw Error(ErrorKind::kParse, str("hello-reply from ", from, " has unknown status ", status));
  r.status = static_cast<ReplyStatus>(status);
  if (r.status == ReplyStatus::kAccepted && bytes.size() == kAuthReplyBytes) {
    r.authenticated = true;
    in.bytes(r.acceptor_nonce);
    in.bytes(r.proof);
  } else if (r.status == ReplyStatus::kAccepted && bytes.size() != 4) {
    throw Error(ErrorKind::kParse, str("hello-reply from ", from, " is ", bytes.size(), " bytes: neither plain (4) nor "
                                       "authenticated (", kAuthReplyBytes, ")"));
  } else {
    r.reason = in.rest_as_text();
  }
  return r;
}

Verdict check_hello(const Hello& hello, const Policy& policy, const LinkView& link) {
  const auto refuse = [](std::string why) { return Verdict{ReplyStatus::kRefused, std::move(why)}; };
  const std::uint32_t peer = hello.peer;
  const bool rejoining = (hello.flags & kFlagRejoin) != 0;
  if (hello.target != policy.self)
    return refuse(str("it dialed peer ", hello.target, " but reached peer ", policy.self, " (check the addresses)"));
  const bool dialer_authenticates = (hello.flags & kFlagAuthenticated) != 0;
  if (policy.authenticated && !dialer_authenticates) return refuse("we require --secret-file, and it was started without one");
  if (!policy.authenticated && dialer_authenticates) return refuse("it uses --secret-file, but we were started without one");
  // The reply goes to whoever dialed: it names the dialer's values, never this run's, which
  // would let a stranger pass the next handshake as one of its peers.
  if (hello.fingerprint != policy.fingerprint)
    return refuse(str("topology fingerprint ", hex(hello.fingerprint),
                      " differs from this run's (was it started with a different topology file?)"));
  if (hello.run_id != policy.run_id)
    return refuse(str("run id ", hex(hello.run_id),
                      " differs from this run's (a peer of another run, or started with other training flags?)"));
  if (rejoining) {
    if (!link.exists) return refuse(str("peer ", peer, " is not linked with peer ", policy.self, " in this topology"));
    if (!link.connected) return refuse(str("peer ", peer, " cannot rejoin: peer ", policy.self, " has not started training yet"));
    if (link.left) return refuse(str("peer ", peer, " finished this run already"));
    if (!link.dropped) return {ReplyStatus::kRetry, str("peer ", policy.self, " has not dropped peer ", peer, " yet")};
    if (!link.dead) return refuse(str("peer ", peer, " is back already (is another process running as peer ", peer, "?)"));
    return {};
  }
  if (!link.exists || peer > policy.self)
    return refuse(str("peer ", peer, " is not a neighbour that dials peer ", policy.self, " in this topology"));
  if (link.connected && link.dead)
    return refuse(str("peer ", peer, " was dropped from this run, which is under way; restart it with --rejoin"));
  if (link.connected) return refuse(str("peer ", peer, " is already connected"));
  return {};
}

}  // namespace peertrain::net::handshake
