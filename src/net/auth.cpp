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
#include <optional>
#include <algorithm>
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
  if (size != kSecretBytes)
    throw Error(ErrorKind::kInvalidArgument, str(what, " holds ", size, " bytes; a key is exactly ", kSecretBytes,
                                                 " random bytes (make one with: peertrain keygen FILE)"));
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The text as hex, or nothing when it is not hex.
std::optional<std::vector<std::uint8_t>> from_hex(const std::string& text) {
  if (text.size() % 2 != 0) return std::nullopt;
  std::vector<std::uint8_t> out;
  for (std::size_t i = 0; i < text.size(); i += 2) {
    const int hi = hex_digit(text[i]), lo = hex_digit(text[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<std::uint8_t>(hi * 16 + lo));
  }
  return out;
}

// The text as standard base64 (padding optional), or nothing when it is not base64.
std::optional<std::vector<std::uint8_t>> from_base64(std::string text) {
  while (!text.empty() && text.back() == '=') text.pop_back();
  if (text.size() % 4 == 1) return std::nullopt;
  std::vector<std::uint8_t> out;
  std::uint32_t buffer = 0;
  int bits = 0;
  for (char c : text) {
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+') v = 62;
    else if (c == '/') v = 63;
    else return std::nullopt;
    buffer = (buffer << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<std::uint8_t>(buffer >> bits));
    }
  }
  return out;
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
  // Read at most one byte past the bound, never what the file claims.
  std::string text(kMaxSecretFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw Error(ErrorKind::kIo, str("cannot read ", what, ": ", std::strerror(errno)));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxSecretFileBytes)
    throw Error(ErrorKind::kInvalidArgument, str(what, " is longer than ", kMaxSecretFileBytes, " bytes; it is not a key file"));
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  std::size_t first = 0, last = text.size();
  while (first < last && space(text[first])) ++first;
  while (last > first && space(text[last - 1])) --last;
  const std::string key = text.substr(first, last - first);
  OPENSSL_cleanse(text.data(), text.size());
  const std::string how = "; a key file holds 32 random bytes as 64 hex digits or as base64 (make one with: "
                          "peertrain keygen FILE, or openssl rand -hex 32 > FILE)";
  if (key.empty()) throw Error(ErrorKind::kInvalidArgument, str(what, " is empty", how));
  std::optional<std::vector<std::uint8_t>> bytes = from_hex(key);
  const char* form = "hex";
  if (!bytes) {
    bytes = from_base64(key);
    form = "base64";
  }
  if (!bytes)
    throw Error(ErrorKind::kInvalidArgument,
                str(what, " holds ", key.size(), " characters that are neither hex nor base64 (a passphrase?)", how));
  if (bytes->size() != kSecretBytes)
    throw Error(ErrorKind::kInvalidArgument, str(what, " holds ", bytes->size(), " bytes as ", form, ", not ", kSecretBytes, how));
  if (std::all_of(bytes->begin(), bytes->end(), [&](std::uint8_t b) { return b == bytes->front(); }))
    throw Error(ErrorKind::kInvalidArgument, str(what, " holds one byte repeated: that is not a random key", how));
  Secret secret(std::move(*bytes));
  if (info.st_mode & (S_IRWXG | S_IRWXO)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(info.st_mode & 07777));
    log::warn(what, " may be accessed by group or others (mode ", mode, "); restrict it with: chmod 600 ", path);
  }
  return secret;
}

Secret Secret::generate() {
  std::vector<std::uint8_t> bytes(kSecretBytes);
  PEERTRAIN_OPENSSL(RAND_bytes(bytes.data(), static_cast<int>(bytes.size())));
  return Secret(std::move(bytes));
}

std::string Secret::hex() const {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (std::uint8_t b : *bytes_) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
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

// --- data at rest ------------------------------------------------------------------------

FileMac file_mac(const Secret& secret, std::span<const std::byte> data) {
  static constexpr std::string_view kLabel = "peertrain checkpoint mac v1";
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (!mac) openssl_failed("EVP_MAC_fetch(HMAC)");
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
  EVP_MAC_free(mac);
  if (!ctx) openssl_failed("EVP_MAC_CTX_new");
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0), OSSL_PARAM_construct_end()};
  const auto key = secret.bytes();
  FileMac out{};
  std::size_t length = 0;
  const bool ok = EVP_MAC_init(ctx, key.data(), key.size(), params) &&
                  EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(kLabel.data()), kLabel.size()) &&
                  EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(data.data()), data.size()) &&
                  EVP_MAC_final(ctx, out.data(), &length, out.size()) && length == out.size();
  EVP_MAC_CTX_free(ctx);
  if (!ok) openssl_failed("HMAC of a file");
  return out;
}

bool verify_file_mac(const Secret& secret, std::span<const std::byte> data,
                     std::span<const std::uint8_t, kFileMacBytes> mac) {
  const FileMac expected = file_mac(secret, data);
  return CRYPTO_memcmp(expected.data(), mac.data(), kFileMacBytes) == 0;
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
