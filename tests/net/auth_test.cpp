#include "peertrain/net/auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "../topology/test_util.h"
#include "peertrain/core/rng.h"

namespace peertrain::net {
namespace {

namespace fs = std::filesystem;

std::vector<std::byte> random_bytes(std::size_t n, Rng& rng) {
  std::vector<std::byte> bytes(n);
  for (std::size_t i = 0; i < n; i += 8) {
    const std::uint64_t word = rng.next_u64();
    for (std::size_t k = 0; k < 8 && i + k < n; ++k) bytes[i + k] = static_cast<std::byte>(word >> (8 * k));
  }
  return bytes;
}

Secret random_secret() {
  const Nonce key = random_nonce();
  return Secret::from_bytes(key);
}

HandshakeContext fresh_context() {
  HandshakeContext c;
  c.dialer = 1;
  c.acceptor = 4;
  c.dialer_nonce = random_nonce();
  c.acceptor_nonce = random_nonce();
  c.fingerprint = 0x1234abcd5678ef90ULL;
  c.run_id = 0x0badc0ffee15900dULL;
  return c;
}

HeaderBytes header_for(std::uint32_t sender, std::uint64_t step, std::span<const std::byte> payload) {
  FrameHeader h;
  h.type = MessageType::kParameters;
  h.sender = sender;
  h.tag = 3;
  h.step = step;
  h.length = payload.size();
  return encode_header(h);
}

struct Frame {
  HeaderBytes header;
  std::vector<std::byte> payload;
};

Frame signed_frame(FrameAuthenticator& from, std::uint32_t sender, std::uint64_t step, std::size_t size, Rng& rng) {
  Frame f{{}, random_bytes(size, rng)};
  f.header = header_for(sender, step, f.payload);
  from.sign(f.header, f.payload);
  return f;
}

// --- the secret file -----------------------------------------------------------------

class SecretFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("peertrain_auth_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::permissions(dir_ / "unreadable.key", fs::perms::owner_all, ignored);
    fs::remove_all(dir_, ignored);
  }
  std::string write(const std::string& name, const std::string& content,
                    fs::perms perms = fs::perms::owner_read | fs::perms::owner_write) {
    const fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary) << content;
    fs::permissions(path, perms);
    return path.string();
  }
  fs::path dir_;
};

TEST_F(SecretFile, ReadsThirtyTwoBytesAsHexOrBase64AroundWhiteSpace) {
  const Secret made = Secret::generate();
  const std::string hex = made.hex();
  ASSERT_EQ(hex.size(), 64u);
  for (const char* ending : {"", "\n", "\r\n", "  \n\n"}) {
    const Secret s = Secret::load(write("ok.key", hex + ending));
    EXPECT_TRUE(std::equal(s.bytes().begin(), s.bytes().end(), made.bytes().begin(), made.bytes().end()))
        << "ending of " << std::strlen(ending) << " bytes";
  }
  std::string upper = hex;
  for (char& c : upper) c = static_cast<char>(std::toupper(c));
  EXPECT_TRUE(std::ranges::equal(Secret::load(write("upper.key", upper)).bytes(), made.bytes()));
  // The same 32 bytes (0, 1, ..., 31) in base64, with and without padding.
  std::vector<std::uint8_t> counting(32);
  for (std::size_t i = 0; i < 32; ++i) counting[i] = static_cast<std::uint8_t>(i);
  for (const char* b64 : {"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n", "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"})
    EXPECT_TRUE(std::ranges::equal(Secret::load(write("b64.key", b64)).bytes(), counting)) << b64;
}

TEST_F(SecretFile, EachBadFileIsNamedInTheError) {
  const std::string missing = (dir_ / "missing.key").string();
  EXPECT_ERROR_MENTIONS(Secret::load(missing), missing.c_str(), "does not exist");
  const std::string dir = dir_.string();
  EXPECT_ERROR_MENTIONS(Secret::load(dir), dir.c_str(), "directory");
  const std::string empty = write("empty.key", "");
  EXPECT_ERROR_MENTIONS(Secret::load(empty), empty.c_str(), "empty", "peertrain keygen");
  const std::string newline = write("newline.key", "\n");
  EXPECT_ERROR_MENTIONS(Secret::load(newline), newline.c_str(), "empty");
  const std::string phrase = write("phrase.key", "correct horse battery staple\n");
  EXPECT_ERROR_MENTIONS(Secret::load(phrase), phrase.c_str(), "neither hex nor base64", "passphrase");
  const std::string short_hex = write("short.key", std::string(32, 'a') + "\n");  // 16 bytes as hex
  EXPECT_ERROR_MENTIONS(Secret::load(short_hex), short_hex.c_str(), "16 bytes as hex", "not 32");
  const std::string raw = write("raw.key", std::string("\x01\x02\xff\x80", 4) + std::string(28, 'q'));
  EXPECT_ERROR_MENTIONS(Secret::load(raw), raw.c_str(), "neither hex nor base64");
  const std::string same = write("same.key", std::string(64, '0'));
  EXPECT_ERROR_MENTIONS(Secret::load(same), same.c_str(), "one byte repeated");
  const std::string long_key = write("long.key", std::string(kMaxSecretFileBytes + 1, 'k'));
  EXPECT_ERROR_MENTIONS(Secret::load(long_key), long_key.c_str(), "longer than 4096");

  const std::string unreadable = write("unreadable.key", Secret::generate().hex(), fs::perms::none);
  if (std::ifstream(unreadable)) {
    std::printf("(running as root: skipping the unreadable-file case)\n");
  } else {
    EXPECT_ERROR_MENTIONS(Secret::load(unreadable), unreadable.c_str(), "cannot read");
  }
}

TEST_F(SecretFile, WarnsWhenOthersMayReadIt) {
  const std::string open_key =
      write("open.key", Secret::generate().hex(), fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  ::testing::internal::CaptureStderr();
  Secret::load(open_key);
  std::string warning = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warning.find(open_key), std::string::npos) << warning;
  EXPECT_NE(warning.find("chmod 600"), std::string::npos) << warning;

  const std::string private_key = write("private.key", Secret::generate().hex());
  ::testing::internal::CaptureStderr();
  Secret::load(private_key);
  warning = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(warning, "");
}

TEST(Secret, FromBytesChecksTheLength) {
  const std::vector<std::uint8_t> short_key(8, 1);
  EXPECT_ERROR_MENTIONS(Secret::from_bytes(short_key, "the test key"), "the test key", "8 bytes");
  const Nonce a = random_nonce(), b = random_nonce();
  EXPECT_NE(a, b);  // 2^-256 to fail
}

// --- handshake proofs ----------------------------------------------------------------

TEST(HandshakeProof, VerifiesWithTheSameSecretOnly) {
  const Secret secret = random_secret();
  const HandshakeContext c = fresh_context();
  for (Role role : {Role::kDialer, Role::kAcceptor}) {
    const Proof proof = handshake_proof(secret, role, c);
    EXPECT_TRUE(verify_handshake_proof(secret, role, c, proof)) << to_string(role);
    EXPECT_FALSE(verify_handshake_proof(random_secret(), role, c, proof)) << to_string(role);
    // Every bit of the proof matters.
    for (std::size_t bit = 0; bit < 8 * kProofBytes; ++bit) {
      Proof bad = proof;
      bad[bit / 8] ^= static_cast<std::uint8_t>(1u << (bit % 8));
      EXPECT_FALSE(verify_handshake_proof(secret, role, c, bad)) << "bit " << bit;
    }
  }
}

TEST(HandshakeProof, AReflectedProofFails) {
  const Secret secret = random_secret();
  const HandshakeContext c = fresh_context();
  EXPECT_NE(handshake_proof(secret, Role::kDialer, c), handshake_proof(secret, Role::kAcceptor, c));
  EXPECT_FALSE(verify_handshake_proof(secret, Role::kAcceptor, c, handshake_proof(secret, Role::kDialer, c)));
  EXPECT_FALSE(verify_handshake_proof(secret, Role::kDialer, c, handshake_proof(secret, Role::kAcceptor, c)));
}

TEST(HandshakeProof, IsBoundToEveryField) {
  const Secret secret = random_secret();
  const HandshakeContext c = fresh_context();
  const Proof proof = handshake_proof(secret, Role::kDialer, c);
  std::vector<std::pair<const char*, HandshakeContext>> changed(8, {"", c});
  changed[0].first = "dialer";
  changed[0].second.dialer ^= 1;
  changed[1].first = "acceptor";
  changed[1].second.acceptor ^= 1;
  changed[2].first = "dialer nonce";
  changed[2].second.dialer_nonce[31] ^= 1;
  changed[3].first = "acceptor nonce";
  changed[3].second.acceptor_nonce[0] ^= 0x80;
  changed[4].first = "fingerprint";
  changed[4].second.fingerprint ^= 1ULL << 63;
  changed[5].first = "run id";
  changed[5].second.run_id += 1;
  changed[6].first = "nonces swapped";
  std::swap(changed[6].second.dialer_nonce, changed[6].second.acceptor_nonce);
  changed[7].first = "ids swapped";
  std::swap(changed[7].second.dialer, changed[7].second.acceptor);
  for (const auto& [what, context] : changed)
    EXPECT_FALSE(verify_handshake_proof(secret, Role::kDialer, context, proof)) << what;
}

// Known answers, so a change of the wire format cannot pass unnoticed. Made with Python's
// hmac/hashlib (HKDF written out per RFC 5869) and cryptography's ChaCha20Poly1305:
//   secret = bytes(range(32)); dn = bytes(0x40+i for i in range(32)); an = bytes(0x80+i ...)
//   proof = HMAC-SHA256(secret, label + b"\0" + pack("<II", 2, 5) + dn + an + pack("<QQ", fp, run))
//   keys = HKDF-SHA256(secret, salt=dn+an, info=b"peertrain/1 frame keys\0" + pack("<IIQQ", 2, 5, fp, run), 64)
//   tag = ChaCha20Poly1305(key).encrypt(b"\0"*4 + pack("<Q", counter), b"", header_with_zero_tag + b"hello")
HandshakeContext known_context() {
  HandshakeContext c;
  c.dialer = 2;
  c.acceptor = 5;
  for (std::size_t i = 0; i < kNonceBytes; ++i) {
    c.dialer_nonce[i] = static_cast<std::uint8_t>(0x40 + i);
    c.acceptor_nonce[i] = static_cast<std::uint8_t>(0x80 + i);
  }
  c.fingerprint = 0x0123456789abcdefULL;
  c.run_id = 0xfedcba9876543210ULL;
  return c;
}

Secret known_secret() {
  std::vector<std::uint8_t> key(32);
  for (std::size_t i = 0; i < key.size(); ++i) key[i] = static_cast<std::uint8_t>(i);
  return Secret::from_bytes(key);
}

template <std::size_t N>
std::string hex(const std::array<std::uint8_t, N>& bytes) {
  std::string out;
  char buffer[3];
  for (std::uint8_t b : bytes) {
    std::snprintf(buffer, sizeof buffer, "%02x", b);
    out += buffer;
  }
  return out;
}

std::string tag_hex(const HeaderBytes& header) {
  std::array<std::uint8_t, kFrameTagBytes> tag;
  std::memcpy(tag.data(), header.data() + kFrameTagOffset, kFrameTagBytes);
  return hex(tag);
}

TEST(Auth, KnownAnswers) {
  const Secret secret = known_secret();
  const HandshakeContext c = known_context();
  EXPECT_EQ(hex(handshake_proof(secret, Role::kDialer, c)), "e51d2b3d2c5b5f06719b4fa52e9a0b8ffa5abc07bf0c1fd17d7bfb4130386e29");
  EXPECT_EQ(hex(handshake_proof(secret, Role::kAcceptor, c)), "7ab860e528895c6fadb117bf44648211557f48bce13f793cebf5e6dbcd64b109");

  const std::string text = "hello";
  const std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(text.data()), text.size());
  FrameHeader h;
  h.version = 1;  // the vectors were computed over a version-1 header; they pin the MAC, not the version
  h.type = MessageType::kParameters;
  h.sender = 2;
  h.tag = 7;
  h.step = 42;
  h.length = payload.size();
  h.checksum = 0x5555;  // ignored: the tag overwrites it
  FrameAuthenticator dialer(secret, c, Role::kDialer), acceptor(secret, c, Role::kAcceptor);
  HeaderBytes first = encode_header(h), second = encode_header(h), back = encode_header(h);
  dialer.sign(first, payload);
  dialer.sign(second, payload);
  acceptor.sign(back, payload);
  EXPECT_EQ(tag_hex(first), "03d3b856607c86bc22d95326264b5502");
  EXPECT_EQ(tag_hex(second), "7e032a8daabf0d1d8e969328ccf372ab");
  EXPECT_EQ(tag_hex(back), "bce9d1408070fdcdfda77383de9f3995");
}

// --- frames --------------------------------------------------------------------------

TEST(FrameAuthenticator, RoundTripsManyFramesBothWays) {
  const Secret secret = random_secret();
  const HandshakeContext c = fresh_context();
  FrameAuthenticator dialer(secret, c, Role::kDialer), acceptor(secret, c, Role::kAcceptor);
  Rng rng(7);
  const std::size_t sizes[] = {0, 1, 1000, 1 << 20, 1000003};
  std::uint64_t step = 0;
  for (int round = 0; round < 3; ++round)
    for (std::size_t size : sizes) {
      const Frame there = signed_frame(dialer, c.dialer, step, size, rng);
      const Frame back = signed_frame(acceptor, c.acceptor, step, size, rng);
      EXPECT_TRUE(acceptor.verify(there.header, there.payload)) << "size " << size << " round " << round;
      EXPECT_TRUE(dialer.verify(back.header, back.payload)) << "size " << size << " round " << round;
      ++step;
    }
  EXPECT_EQ(dialer.frames_signed(), 15u);
  EXPECT_EQ(acceptor.frames_verified(), 15u);
}

TEST(FrameAuthenticator, StreamingVerifyMatchesOneShot) {
  const Secret secret = random_secret();
  const HandshakeContext c = fresh_context();
  FrameAuthenticator dialer(secret, c, Role::kDialer), acceptor(secret, c, Role::kAcceptor);
  Rng rng(11);
  for (std::size_t size : {std::size_t{0}, std::size_t{17}, std::size_t{1} << 20}) {
    Frame f = signed_frame(dialer, c.dialer, 0, size, rng);
    acceptor.begin_verify(f.header);
    std::span<const std::byte> rest = f.payload;
    while (!rest.empty()) {  // odd chunk sizes, as a socket delivers them
      const std::size_t n = std::min<std::size_t>(rest.size(), 1 + rng.uniform_below(70000));
      acceptor.update_verify(rest.first(n));
      rest = rest.subspan(n);
    }
    EXPECT_TRUE(acceptor.end_verify()) << "size " << size;
  }
}

TEST(FrameAuthenticator, AnyFlippedBitFails) {
  const Secret secret = random_secret();
  const HandshakeContext c = fresh_context();
  FrameAuthenticator dialer(secret, c, Role::kDialer), acceptor(secret, c, Role::kAcceptor);
  Rng rng(3);
  for (std::size_t size : {std::size_t{1000}, std::size_t{1} << 20}) {
    Frame f = signed_frame(dialer, c.dialer, 9, size, rng);
    // A failed verification does not advance the counter, so the same receiver checks
    // every corruption of this frame and then the frame itself.
    for (std::size_t bit = 0; bit < 8 * kHeaderBytes; ++bit) {
      f.header[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
      EXPECT_FALSE(acceptor.verify(f.header, f.payload)) << "header bit " << bit;
      f.header[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    }
    // Every payload bit of the small frame; of the large one, the ends and a random sample.
    std::vector<std::size_t> bits;
    if (size <= 1000) {
      for (std::size_t bit = 0; bit < 8 * size; ++bit) bits.push_back(bit);
    } else {
      bits = {0, 7, 8 * size - 8, 8 * size - 1};
      for (int i = 0; i < 200; ++i) bits.push_back(rng.uniform_below(8 * size));
    }
    for (std::size_t bit : bits) {
      f.payload[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
      EXPECT_FALSE(acceptor.verify(f.header, f.payload)) << "payload bit " << bit << " of " << size << " bytes";
      f.payload[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    }
    // A truncated or extended payload fails too.
    EXPECT_FALSE(acceptor.verify(f.header, std::span<const std::byte>(f.payload).first(size - 1)));
    std::vector<std::byte> longer = f.payload;
    longer.push_back(std::byte{0});
    EXPECT_FALSE(acceptor.verify(f.header, longer));
    EXPECT_TRUE(acceptor.verify(f.header, f.payload)) << "the untouched frame, " << size << " bytes";
  }
}

TEST(FrameAuthenticator, ReplayedReorderedAndReflectedFramesFail) {
  const Secret secret = random_secret();
  const HandshakeContext c = fresh_context();
  FrameAuthenticator dialer(secret, c, Role::kDialer), acceptor(secret, c, Role::kAcceptor);
  Rng rng(5);
  const Frame f0 = signed_frame(dialer, c.dialer, 0, 100, rng);
  const Frame f1 = signed_frame(dialer, c.dialer, 1, 100, rng);
  EXPECT_FALSE(acceptor.verify(f1.header, f1.payload)) << "reordered";
  EXPECT_TRUE(acceptor.verify(f0.header, f0.payload));
  EXPECT_FALSE(acceptor.verify(f0.header, f0.payload)) << "replayed";
  EXPECT_FALSE(dialer.verify(f1.header, f1.payload)) << "reflected to its sender";
  EXPECT_TRUE(acceptor.verify(f1.header, f1.payload));
  EXPECT_FALSE(acceptor.verify(f1.header, f1.payload)) << "replayed";
}

TEST(FrameAuthenticator, OtherSecretsAndOtherHandshakesFail) {
  const Secret secret = random_secret();
  const HandshakeContext c = fresh_context();
  Rng rng(13);
  FrameAuthenticator acceptor(secret, c, Role::kAcceptor);
  FrameAuthenticator stranger(random_secret(), c, Role::kDialer);
  const Frame forged = signed_frame(stranger, c.dialer, 0, 1000, rng);
  EXPECT_FALSE(acceptor.verify(forged.header, forged.payload)) << "another secret";

  // The same secret, but a frame recorded from an earlier handshake of the same peers.
  HandshakeContext earlier = c;
  earlier.acceptor_nonce = random_nonce();
  FrameAuthenticator old_dialer(secret, earlier, Role::kDialer);
  const Frame replayed = signed_frame(old_dialer, c.dialer, 0, 1000, rng);
  EXPECT_FALSE(acceptor.verify(replayed.header, replayed.payload)) << "another handshake";

  FrameAuthenticator dialer(secret, c, Role::kDialer);
  const Frame good = signed_frame(dialer, c.dialer, 0, 1000, rng);
  EXPECT_TRUE(acceptor.verify(good.header, good.payload));
}

TEST(FrameAuthenticator, DirectionsCountIndependently) {
  const Secret secret = random_secret();
  const HandshakeContext c = fresh_context();
  FrameAuthenticator dialer(secret, c, Role::kDialer), acceptor(secret, c, Role::kAcceptor);
  Rng rng(17);
  std::vector<Frame> there, back;
  for (int i = 0; i < 5; ++i) there.push_back(signed_frame(dialer, c.dialer, i, 64, rng));
  for (int i = 0; i < 2; ++i) back.push_back(signed_frame(acceptor, c.acceptor, i, 64, rng));
  // Interleaved arbitrarily across directions, in order within each.
  EXPECT_TRUE(dialer.verify(back[0].header, back[0].payload));
  EXPECT_TRUE(acceptor.verify(there[0].header, there[0].payload));
  EXPECT_TRUE(acceptor.verify(there[1].header, there[1].payload));
  EXPECT_TRUE(acceptor.verify(there[2].header, there[2].payload));
  back.push_back(signed_frame(acceptor, c.acceptor, 2, 64, rng));
  EXPECT_TRUE(dialer.verify(back[1].header, back[1].payload));
  EXPECT_TRUE(acceptor.verify(there[3].header, there[3].payload));
  EXPECT_TRUE(dialer.verify(back[2].header, back[2].payload));
  EXPECT_TRUE(acceptor.verify(there[4].header, there[4].payload));
  EXPECT_EQ(dialer.frames_signed(), 5u);
  EXPECT_EQ(dialer.frames_verified(), 3u);
  EXPECT_EQ(acceptor.frames_signed(), 3u);
  EXPECT_EQ(acceptor.frames_verified(), 5u);
}

}  // namespace
}  // namespace peertrain::net
