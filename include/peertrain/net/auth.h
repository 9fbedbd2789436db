// Authentication of peers that share a secret key file (`--secret-file`).
//
// Threat model. Every peer of a run reads the same secret. A process without it must be
// unable to (a) complete a handshake, i.e. join the run, or (b) inject, alter, replay,
// reorder or reflect frames on an established link. Parameters are not secret, so nothing
// is encrypted: frames are authenticated, not hidden.
//
// Protocol.
//  1. dialer → acceptor   hello       {…, dialer nonce}            32 fresh random bytes
//  2. acceptor → dialer   hello-reply {accepted, acceptor nonce, acceptor proof}
//  3. dialer → acceptor   hello-proof {dialer proof}
//  Each proof is HMAC-SHA256(secret, label ‖ dialer id ‖ acceptor id ‖ dialer nonce ‖
//  acceptor nonce ‖ topology fingerprint ‖ run id), all integers little-endian, with one
//  label for the dialer's proof and another for the acceptor's, so a proof reflected back
//  to its sender fails. The dialer checks the acceptor's proof before it sends its own,
//  the acceptor checks the dialer's before the link counts as connected; both compare in
//  constant time. Fresh nonces on both sides make every proof good for one handshake only.
//
//  Then each side derives two frame keys, one per direction, with HKDF-SHA256 (RFC 5869):
//  key material = the secret, salt = dialer nonce ‖ acceptor nonce, info = a label and the
//  same ids, fingerprint and run id. Every frame after the handshake carries a 128-bit
//  ChaCha20-Poly1305 tag (RFC 8439, used as a MAC: empty plaintext, header ‖ payload as
//  the associated data), keyed with its direction's key, under the nonce 0u32 ‖ frame
//  counter u64. The counter is not sent: each side counts the frames it signed and the
//  frames it verified, so a replayed, dropped, reordered or reflected frame fails, and so
//  does a frame from another link or another handshake (other keys).
//
// The tag takes the header's last 16 bytes (offset 32: the checksum and reserved fields).
// Poly1305 and GHASH tags must not be truncated to the 8-byte reserved field alone: a
// forger's odds against a truncated polynomial MAC grow with the message length (tens of
// MB here) and every forgery leaks key bits (Ferguson 2005; NIST SP 800-38D, app. C). On
// an authenticated link the tag replaces the Fletcher checksum, which it subsumes.
//
// Not protected: confidentiality (parameters travel in clear); the hello and hello-reply
// fields, beyond what the proofs bind (a forged refusal can still turn a peer away);
// denial of service (an on-path attacker can always reset or stall a TCP connection);
// and a weak secret: the proofs allow an offline guess per transcript, so the file must
// hold 32 random bytes (`peertrain keygen run.key`), not a password; load() refuses anything
// else.
//
// Speed on one core here, OpenSSL 3.0, 10 MB buffers (bench/auth_bench.cpp): sign and verify
// 13.8 GB/s; AES-256-GCM as GMAC would give 9.2, HMAC-SHA256 1.8, against a transport of
// 3.75 GB/s (30 Gbit/s), so a frame's MAC costs about a quarter of its time on the wire.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "peertrain/net/frame.h"

namespace peertrain::net {

inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kProofBytes = 32;
inline constexpr std::size_t kFrameTagOffset = 32;  // the header's checksum and reserved fields
inline constexpr std::size_t kFrameTagBytes = 16;
inline constexpr std::size_t kSecretBytes = 32;
inline constexpr std::size_t kMaxSecretFileBytes = 4096;
static_assert(kFrameTagOffset + kFrameTagBytes == kHeaderBytes);

using Nonce = std::array<std::uint8_t, kNonceBytes>;
using Proof = std::array<std::uint8_t, kProofBytes>;

// The shared key. Copies share one buffer, which is wiped when the last copy goes.
class Secret {
 public:
  // Reads a key file: kSecretBytes random bytes written as 64 hex digits or as base64
  // (`openssl rand -hex 32 > run.key`, `peertrain keygen run.key`), with white space
  // around it ignored. Anything else is refused, a passphrase above all: the proofs
  // allow an offline guess per transcript, so only a random key of full length is safe.
  // Throws Error naming the file if it is missing, a directory, unreadable (kIo), or not
  // such a key (kInvalidArgument: what it holds and how to make a good one). Warns if
  // group or others may access it.
  static Secret load(const std::string& path);
  // 32 fresh bytes from OpenSSL's CSPRNG, and their hex text for a key file.
  static Secret generate();
  std::string hex() const;
  // For tests and callers that hold the key already: exactly kSecretBytes; `what` names it.
  static Secret from_bytes(std::span<const std::uint8_t> bytes, const std::string& what = "the secret");

  std::span<const std::uint8_t> bytes() const { return *bytes_; }

 private:
  explicit Secret(std::vector<std::uint8_t> bytes);
  std::shared_ptr<const std::vector<std::uint8_t>> bytes_;
};

// 32 bytes from OpenSSL's CSPRNG (RAND_bytes); throws Error(kInternal) if it fails.
Nonce random_nonce();

enum class Role : std::uint8_t { kDialer, kAcceptor };
const char* to_string(Role role);

// What both proofs and the frame keys are bound to.
struct HandshakeContext {
  std::uint32_t dialer = 0;    // the peer id that dialed (the lower one)
  std::uint32_t acceptor = 0;  // the peer id that accepted
  Nonce dialer_nonce{};
  Nonce acceptor_nonce{};
  std::uint64_t fingerprint = 0;  // the topology fingerprint both sides checked
  std::uint64_t run_id = 0;
};

// The proof that `prover` knows the secret, for this handshake.
Proof handshake_proof(const Secret& secret, Role prover, const HandshakeContext& context);
// Constant-time comparison (CRYPTO_memcmp) with the proof `prover` should have sent.
bool verify_handshake_proof(const Secret& secret, Role prover, const HandshakeContext& context,
                            std::span<const std::uint8_t, kProofBytes> proof);

// A MAC of data at rest (a checkpoint) under the run's key: HMAC-SHA256(secret, label ‖
// data), the label keeping it apart from the handshake's proofs. verify_file_mac compares
// in constant time.
inline constexpr std::size_t kFileMacBytes = 32;
using FileMac = std::array<std::uint8_t, kFileMacBytes>;
FileMac file_mac(const Secret& secret, std::span<const std::byte> data);
bool verify_file_mac(const Secret& secret, std::span<const std::byte> data,
                     std::span<const std::uint8_t, kFileMacBytes> mac);

// One per link and side, made once the handshake succeeded. sign() and verify() keep
// separate state (a key and a counter each), so one thread may sign while another
// verifies; two concurrent sign() calls, or two verify() calls, are not allowed, and
// frames must reach the wire in the order they were signed.
class FrameAuthenticator {
 public:
  FrameAuthenticator(const Secret& secret, const HandshakeContext& context, Role self);
  ~FrameAuthenticator();
  FrameAuthenticator(FrameAuthenticator&&) noexcept;
  FrameAuthenticator& operator=(FrameAuthenticator&&) noexcept;

  // Writes the tag of the next outgoing frame into header[32..48) (whatever was there, the
  // checksum included, is ignored) and advances the send counter.
  void sign(HeaderBytes& header, std::span<const std::byte> payload);

  // True if header[32..48) is the tag of the next incoming frame from the peer; advances the
  // receive counter only then. A false answer means the link must be closed: the counters
  // no longer agree.
  bool verify(const HeaderBytes& header, std::span<const std::byte> payload);

  // verify() in pieces, so the MAC can run while the payload arrives:
  // begin_verify(header); update_verify(chunk)…; end_verify() answers as verify() would.
  void begin_verify(const HeaderBytes& header);
  void update_verify(std::span<const std::byte> chunk);
  bool end_verify();

  std::uint64_t frames_signed() const;
  std::uint64_t frames_verified() const;

 private:
  struct Direction;
  std::unique_ptr<Direction> send_;
  std::unique_ptr<Direction> receive_;
};

}  // namespace peertrain::net
