// Peer authentication: the shared secret, the handshake's challenge–response proofs and
// the per-frame MAC. The protocol and what it does and does not protect are described in
// include/peertrain/net/auth.h. Everything cryptographic is OpenSSL's: HMAC-SHA256 for the
// proofs, HKDF-SHA256 (RFC 5869) for the frame keys, ChaCha20-Poly1305 (RFC 8439) as the
// frame MAC.
#include "peertrain/net/auth.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "peertrain/core/error.h"
#include "peertrain/core/log.h"

namespace peertrain::net {
namespace {

// Labels keep the three uses of the secret apart; changing one is a protocol change.
constexpr char kDialerProofLabel[] = "peertrain/1 dialer proof";
constexpr char kAcceptorProofLabel[] = "peertrain/1 acceptor proof";
constexpr char kFrameKeysLabel[] = "peertrain/1 frame keys";
constexpr std::size_t kKeyBytes = 32;
constexpr std::size_t kIvBytes = 12;

// OpenSSL failing on valid arguments is not bad input but a broken environment.
[[noreturn]] void openssl_failed(const char* call) {
  char reason[256] = "no reason given";
  if (const unsigned long code = ERR_get_error()) ERR_error_string_n(code, reason, sizeof reason);
  ERR_clear_error();
  throw Error(ErrorKind::kInternal, str("OpenSSL ", call, " failed: ", reason));
}

#define PEERTRAIN_OPENSSL(call)             \
  do {                                      \
    if ((call) != 1) openssl_failed(#call); \
  } while (false)

void append_u32(std::vector<std::uint8_t>& out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
}
void append_u64(std::vector<std::uint8_t>& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
}
void append(std::vector<std::uint8_t>& out, std::span<const std::uint8_t> bytes) {
  out.insert(out.end(), bytes.begin(), bytes.end());
}
void append_label(std::vector<std::uint8_t>& out, const char* label) {
  append(out, {reinterpret_cast<const std::uint8_t*>(label), std::strlen(label) + 1});  // with its NUL
}

// label ‖ dialer ‖ acceptor ‖ dialer nonce ‖ acceptor nonce ‖ fingerprint ‖ run id
std::vector<std::uint8_t> transcript(const char* label, const HandshakeContext& c) {
  std::vector<std::uint8_t> out;
  append_label(out, label);
  append_u32(out, c.dialer);
  append_u32(out, c.acceptor);
  append(out, c.dialer_nonce);
  append(out, c.acceptor_nonce);
  append_u64(out, c.fingerprint);
  append_u64(out, c.run_id);
  return out;
}

void check_length(std::size_t size, const std::string& what) {
  if (size == 0) throw Error(ErrorKind::kInvalidArgument, str(what, " is empty"));
  if (size < kMinSecretBytes)
    throw Error(ErrorKind::kInvalidArgument,
                str(what, " holds ", size, " bytes; a secret needs at least ", kMinSecretBytes,
                    " random bytes (make one with: head -c 32 /dev/urandom > FILE)"));
  if (size > kMaxSecretBytes)
    throw Error(ErrorKind::kInvalidArgument, str(what, " is longer than ", kMaxSecretBytes, " bytes (is it a key file?)"));
}

}  // namespace

// --- the secret --------------------------------------------------------------------------

Secret::Secret(std::vector<std::uint8_t> bytes)
    : bytes_(new std::vector<std::uint8_t>(std::move(bytes)), [](const std::vector<std::uint8_t>* v) {
        OPENSSL_cleanse(const_cast<std::uint8_t*>(v->data()), v->size());
        delete v;
      }) {}

Secret Secret::from_bytes(std::span<const std::uint8_t> bytes, const std::string& what) {
  check_length(bytes.size(), what);
  return Secret(std::vector<std::uint8_t>(bytes.begin(), bytes.end()));
}

Secret Secret::load(const std::string& path) {
  const std::string what = str("secret file ", path);
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0)
    throw Error(ErrorKind::kIo, errno == ENOENT ? str(what, " does not exist (--secret-file)")
                                                : str("cannot read ", what, ": ", std::strerror(errno)));
  if (S_ISDIR(info.st_mode)) throw Error(ErrorKind::kIo, str(what, " is a directory, not a key file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kIo, str("cannot read ", what, ": ", std::strerror(errno)));
  // Read at most two bytes past the bound (a trailing "\r\n"), never what the file claims.
  std::vector<std::uint8_t> bytes(kMaxSecretBytes + 3);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (in.bad()) throw Error(ErrorKind::kIo, str("cannot read ", what, ": ", std::strerror(errno)));
  std::size_t size = static_cast<std::size_t>(in.gcount());
  if (size > 0 && bytes[size - 1] == '\n') {
    --size;
    if (size > 0 && bytes[size - 1] == '\r') --size;
  }
  Secret secret = from_bytes({bytes.data(), size}, what);
  OPENSSL_cleanse(bytes.data(), bytes.size());
  if (info.st_mode & (S_IRWXG | S_IRWXO)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(info.st_mode & 07777));
    log::warn(what, " may be accessed by group or others (mode ", mode, "); restrict it with: chmod 600 ", path);
  }
  return secret;
}

// --- the handshake -----------------------------------------------------------------------

Nonce random_nonce() {
  Nonce nonce;
  PEERTRAIN_OPENSSL(RAND_bytes(nonce.data(), static_cast<int>(nonce.size())));
  return nonce;
}

const char* to_string(Role role) { return role == Role::kDialer ? "dialer" : "acceptor"; }

Proof handshake_proof(const Secret& secret, Role prover, const HandshakeContext& context) {
  const auto message = transcript(prover == Role::kDialer ? kDialerProofLabel : kAcceptorProofLabel, context);
  Proof proof;
  unsigned int length = 0;
  const auto key = secret.bytes();
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), message.data(), message.size(), proof.data(), &length) ||
      length != proof.size())
    openssl_failed("HMAC");
  return proof;
}

bool verify_handshake_proof(const Secret& secret, Role prover, const HandshakeContext& context,
                            std::span<const std::uint8_t, kProofBytes> proof) {
  const Proof expected = handshake_proof(secret, prover, context);
  return CRYPTO_memcmp(expected.data(), proof.data(), kProofBytes) == 0;
}

// --- frames ------------------------------------------------------------------------------

// One direction of a link: its ChaCha20-Poly1305 context, keyed once, and its counter.
struct FrameAuthenticator::Direction {
  EVP_CIPHER_CTX* ctx = nullptr;
  std::uint64_t counter = 0;
  bool open = false;  // a streaming verification is under way
  std::array<std::uint8_t, kFrameTagBytes> expected_tag{};

  explicit Direction(std::span<const std::uint8_t, kKeyBytes> key) {
    ctx = EVP_CIPHER_CTX_new();
    if (!ctx) openssl_failed("EVP_CIPHER_CTX_new");
    PEERTRAIN_OPENSSL(EVP_EncryptInit_ex(ctx, EVP_chacha20_poly1305(), nullptr, key.data(), nullptr));
  }
  ~Direction() { EVP_CIPHER_CTX_free(ctx); }  // also wipes the key schedule
  Direction(const Direction&) = delete;
  Direction& operator=(const Direction&) = delete;

  // Starts the MAC of frame number `counter`: the header with its tag bytes zeroed.
  void begin(const HeaderBytes& header) {
    PEERTRAIN_CHECK(counter != UINT64_MAX, "frame counter exhausted");
    std::uint8_t iv[kIvBytes] = {};
    for (int i = 0; i < 8; ++i) iv[4 + i] = static_cast<std::uint8_t>(counter >> (8 * i));
    PEERTRAIN_OPENSSL(EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, iv));
    HeaderBytes zeroed = header;
    std::memset(zeroed.data() + kFrameTagOffset, 0, kFrameTagBytes);
    add(zeroed);
  }

  // Associated data only (no output buffer): the payload is authenticated, not encrypted.
  void add(std::span<const std::byte> bytes) {
    constexpr std::size_t kPiece = std::size_t{1} << 30;  // EVP lengths are ints
    while (!bytes.empty()) {
      const std::size_t n = std::min(bytes.size(), kPiece);
      int unused = 0;
      PEERTRAIN_OPENSSL(EVP_EncryptUpdate(ctx, nullptr, &unused, reinterpret_cast<const unsigned char*>(bytes.data()),
                                          static_cast<int>(n)));
      bytes = bytes.subspan(n);
    }
  }

  std::array<std::uint8_t, kFrameTagBytes> finish() {
    unsigned char none[16];
    int unused = 0;
    PEERTRAIN_OPENSSL(EVP_EncryptFinal_ex(ctx, none, &unused));
    std::array<std::uint8_t, kFrameTagBytes> tag;
    PEERTRAIN_OPENSSL(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, static_cast<int>(tag.size()), tag.data()));
    return tag;
  }
};

FrameAuthenticator::FrameAuthenticator(const Secret& secret, const HandshakeContext& context, Role self) {
  // HKDF-SHA256: 64 bytes, the dialer→acceptor key, then the acceptor→dialer key.
  std::vector<std::uint8_t> salt;
  append(salt, context.dialer_nonce);
  append(salt, context.acceptor_nonce);
  std::vector<std::uint8_t> info;
  append_label(info, kFrameKeysLabel);
  append_u32(info, context.dialer);
  append_u32(info, context.acceptor);
  append_u64(info, context.fingerprint);
  append_u64(info, context.run_id);

  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  if (!kdf) openssl_failed("EVP_KDF_fetch(HKDF)");
  EVP_KDF_CTX* kctx = EVP_KDF_CTX_new(kdf);
  EVP_KDF_free(kdf);
  if (!kctx) openssl_failed("EVP_KDF_CTX_new");
  char digest[] = "SHA256";
  const auto key = secret.bytes();
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<std::uint8_t*>(key.data()), key.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, salt.data(), salt.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info.data(), info.size()),
      OSSL_PARAM_construct_end(),
  };
  std::array<std::uint8_t, 2 * kKeyBytes> keys{};
  const int derived = EVP_KDF_derive(kctx, keys.data(), keys.size(), params);
  EVP_KDF_CTX_free(kctx);
  if (derived != 1) openssl_failed("EVP_KDF_derive(HKDF)");

  const std::span<const std::uint8_t, kKeyBytes> dialer_to_acceptor(keys.data(), kKeyBytes);
  const std::span<const std::uint8_t, kKeyBytes> acceptor_to_dialer(keys.data() + kKeyBytes, kKeyBytes);
  const bool dialer = self == Role::kDialer;
  send_ = std::make_unique<Direction>(dialer ? dialer_to_acceptor : acceptor_to_dialer);
  receive_ = std::make_unique<Direction>(dialer ? acceptor_to_dialer : dialer_to_acceptor);
  OPENSSL_cleanse(keys.data(), keys.size());
}

FrameAuthenticator::~FrameAuthenticator() = default;
FrameAuthenticator::FrameAuthenticator(FrameAuthenticator&&) noexcept = default;
FrameAuthenticator& FrameAuthenticator::operator=(FrameAuthenticator&&) noexcept = default;

void FrameAuthenticator::sign(HeaderBytes& header, std::span<const std::byte> payload) {
  Direction& d = *send_;
  d.begin(header);
  d.add(payload);
  const auto tag = d.finish();
  std::memcpy(header.data() + kFrameTagOffset, tag.data(), kFrameTagBytes);
  ++d.counter;
}

bool FrameAuthenticator::verify(const HeaderBytes& header, std::span<const std::byte> payload) {
  begin_verify(header);
  update_verify(payload);
  return end_verify();
}

void FrameAuthenticator::begin_verify(const HeaderBytes& header) {
  Direction& d = *receive_;
  d.begin(header);
  std::memcpy(d.expected_tag.data(), header.data() + kFrameTagOffset, kFrameTagBytes);
  d.open = true;
}

void FrameAuthenticator::update_verify(std::span<const std::byte> chunk) {
  PEERTRAIN_CHECK(receive_->open, "update_verify without begin_verify");
  receive_->add(chunk);
}

bool FrameAuthenticator::end_verify() {
  Direction& d = *receive_;
  PEERTRAIN_CHECK(d.open, "end_verify without begin_verify");
  d.open = false;
  const auto tag = d.finish();
  if (CRYPTO_memcmp(tag.data(), d.expected_tag.data(), kFrameTagBytes) != 0) return false;
  ++d.counter;
  return true;
}

std::uint64_t FrameAuthenticator::frames_signed() const { return send_->counter; }
std::uint64_t FrameAuthenticator::frames_verified() const { return receive_->counter; }

}  // namespace peertrain::net
