// The handshake's pure functions: encode/decode round trips, every malformed input named,
// and every admission verdict.
#include "../../src/net/handshake.h"

#include <gtest/gtest.h>

#include "../topology/test_util.h"

namespace peertrain::net::handshake {
namespace {

Hello sample_hello() {
  Hello h;
  h.peer = 2;
  h.target = 5;
  h.fingerprint = 0x1122334455667788ULL;
  h.run_id = 0x99aabbccddeeff00ULL;
  h.flags = kFlagAuthenticated;
  for (std::size_t i = 0; i < h.nonce.size(); ++i) h.nonce[i] = static_cast<std::uint8_t>(3 * i + 1);
  return h;
}

TEST(Handshake, HelloRoundTripsAndBadHellosAreNamed) {
  const Hello h = sample_hello();
  const Payload bytes = encode_hello(h);
  ASSERT_EQ(bytes.size(), kHelloBytes);
  const Hello back = decode_hello(bytes, "10.0.0.3:4000");
  EXPECT_EQ(back.peer, h.peer);
  EXPECT_EQ(back.target, h.target);
  EXPECT_EQ(back.fingerprint, h.fingerprint);
  EXPECT_EQ(back.run_id, h.run_id);
  EXPECT_EQ(back.flags, h.flags);
  EXPECT_EQ(back.nonce, h.nonce);

  EXPECT_ERROR_MENTIONS(decode_hello(std::span(bytes).first(63), "10.0.0.3:4000"), "10.0.0.3:4000", "63 bytes");
  Payload other = bytes;
  other[0] = std::byte{9};  // version 9
  EXPECT_ERROR_MENTIONS(decode_hello(other, "x"), "protocol version 9");
  other = bytes;
  other[28] = std::byte{0x80};  // an unknown flag
  EXPECT_ERROR_MENTIONS(decode_hello(other, "x"), "unknown flags");
}

TEST(Handshake, RepliesRoundTripInEveryForm) {
  Reply refused{ReplyStatus::kRefused, "run id differs"};
  Reply r = decode_reply(encode_reply(refused), "peer 1");
  EXPECT_EQ(r.status, ReplyStatus::kRefused);
  EXPECT_EQ(r.reason, "run id differs");
  r = decode_reply(encode_reply({ReplyStatus::kRetry, "not yet"}), "peer 1");
  EXPECT_EQ(r.status, ReplyStatus::kRetry);
  EXPECT_EQ(r.reason, "not yet");
  r = decode_reply(encode_reply({}), "peer 1");
  EXPECT_EQ(r.status, ReplyStatus::kAccepted);
  EXPECT_FALSE(r.authenticated);
  Reply auth;
  auth.authenticated = true;
  auth.acceptor_nonce.fill(4);
  auth.proof.fill(5);
  const Payload bytes = encode_reply(auth);
  ASSERT_EQ(bytes.size(), kAuthReplyBytes);
  r = decode_reply(bytes, "peer 1");
  EXPECT_TRUE(r.authenticated);
  EXPECT_EQ(r.acceptor_nonce, auth.acceptor_nonce);
  EXPECT_EQ(r.proof, auth.proof);

  EXPECT_ERROR_MENTIONS(decode_reply(std::span(bytes).first(2), "peer 1"), "truncated hello-reply from peer 1");
  EXPECT_ERROR_MENTIONS(decode_reply(std::span(bytes).first(10), "peer 1"), "neither plain");
  Payload odd = encode_reply(refused);
  odd[0] = std::byte{7};
  EXPECT_ERROR_MENTIONS(decode_reply(odd, "peer 1"), "unknown status 7");
}

TEST(Handshake, EveryVerdictHasItsReason) {
  const Policy policy{5, 0x1122334455667788ULL, 0x99aabbccddeeff00ULL, true};
  Hello h = sample_hello();
  const LinkView fresh{true, false, false, false, false};
  EXPECT_TRUE(check_hello(h, policy, fresh).accepted());

  auto reason = [&](Hello hello, LinkView link, Policy p) { return check_hello(hello, p, link).reason; };
  Hello wrong = h;
  wrong.target = 6;
  EXPECT_NE(reason(wrong, fresh, policy).find("dialed peer 6 but reached peer 5"), std::string::npos);
  wrong = h;
  wrong.flags = 0;
  EXPECT_NE(reason(wrong, fresh, policy).find("we require --secret-file"), std::string::npos);
  EXPECT_NE(reason(h, fresh, {5, policy.fingerprint, policy.run_id, false}).find("we were started without one"),
            std::string::npos);
  wrong = h;
  wrong.fingerprint = 1;
  EXPECT_NE(reason(wrong, fresh, policy).find("topology fingerprint"), std::string::npos);
  // The stranger learns nothing of this run: neither its fingerprint nor its run id.
  for (const char* ours : {"1122334455667788", "99aabbccddeeff00"})
    EXPECT_EQ(reason(wrong, fresh, policy).find(ours), std::string::npos) << reason(wrong, fresh, policy);
  wrong = h;
  wrong.run_id = 1;
  EXPECT_NE(reason(wrong, fresh, policy).find("run id"), std::string::npos);
  for (const char* ours : {"1122334455667788", "99aabbccddeeff00"})
    EXPECT_EQ(reason(wrong, fresh, policy).find(ours), std::string::npos) << reason(wrong, fresh, policy);
  EXPECT_NE(reason(h, LinkView{}, policy).find("not a neighbour"), std::string::npos);
  wrong = h;
  wrong.peer = 7;  // a higher id never dials a lower one
  EXPECT_NE(reason(wrong, fresh, policy).find("not a neighbour that dials"), std::string::npos);
  EXPECT_NE(reason(h, {true, true, false, false, false}, policy).find("already connected"), std::string::npos);
  EXPECT_NE(reason(h, {true, true, true, false, true}, policy).find("restart it with --rejoin"), std::string::npos);

  Hello back = h;
  back.flags |= kFlagRejoin;
  EXPECT_EQ(check_hello(back, policy, {true, true, false, false, false}).status, ReplyStatus::kRetry);
  EXPECT_TRUE(check_hello(back, policy, {true, true, true, false, true}).accepted());
  EXPECT_NE(reason(back, {true, true, false, false, true}, policy).find("is back already"), std::string::npos);
  EXPECT_NE(reason(back, {true, true, true, true, true}, policy).find("finished this run"), std::string::npos);
  EXPECT_NE(reason(back, {true, false, false, false, false}, policy).find("has not started"), std::string::npos);
}

}  // namespace
}  // namespace peertrain::net::handshake
