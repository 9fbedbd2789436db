// Throughput of the MACs that could authenticate peertrain's frames, on 10 MB buffers (a
// parameter message), against the transport's rate: the choice in net/auth.h rests on it.
// Built as build/bench/auth_bench; bench/all.sh reports its FrameAuthenticator rows.
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "peertrain/net/auth.h"
#include "peertrain/net/frame.h"

namespace {

constexpr std::size_t kBytes = 10 << 20;
constexpr double kTransportGBps = 30.0 / 8;  // the loopback transport, docs/net.md

// Best of five one-second runs, in GB/s.
double measure(const std::function<void()>& once) {
  once();
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    int reps = 0;
    const auto start = std::chrono::steady_clock::now();
    double seconds = 0;
    do {
      once();
      ++reps;
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } while (seconds < 0.2);
    best = std::max(best, static_cast<double>(kBytes) * reps / seconds / 1e9);
  }
  return best;
}

void report(const char* name, double gbps) {
  std::printf("%-48s %6.2f GB/s  %5.0f%% of a 30 Gbit/s link's time\n", name, gbps, 100 * kTransportGBps / gbps);
}

bool ok(int rc) {
  if (rc != 1) {
    std::fprintf(stderr, "OpenSSL call failed\n");
    std::exit(1);
  }
  return true;
}

}  // namespace

int main() {
  std::vector<unsigned char> data(kBytes);
  ok(RAND_bytes(data.data(), static_cast<int>(data.size())));
  unsigned char key[32], iv[12] = {}, tag[64];
  ok(RAND_bytes(key, sizeof key));

  // An AEAD with empty plaintext and the payload as associated data is a MAC.
  auto aead_as_mac = [&](const EVP_CIPHER* cipher) {
    return [&, cipher] {
      EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
      int n = 0;
      ok(EVP_EncryptInit_ex(ctx, cipher, nullptr, key, iv));
      ok(EVP_EncryptUpdate(ctx, nullptr, &n, data.data(), static_cast<int>(data.size())));
      ok(EVP_EncryptFinal_ex(ctx, tag, &n));
      ok(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, tag));
      EVP_CIPHER_CTX_free(ctx);
    };
  };
  auto evp_mac = [&](const char* algorithm, const char* digest, std::size_t key_bytes) {
    return [&, algorithm, digest, key_bytes] {
      EVP_MAC* mac = EVP_MAC_fetch(nullptr, algorithm, nullptr);
      EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
      OSSL_PARAM params[2] = {OSSL_PARAM_construct_end(), OSSL_PARAM_construct_end()};
      if (digest) params[0] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, const_cast<char*>(digest), 0);
      ok(EVP_MAC_init(ctx, key, key_bytes, params));
      ok(EVP_MAC_update(ctx, data.data(), data.size()));
      std::size_t n = 0;
      ok(EVP_MAC_final(ctx, tag, &n, sizeof tag));
      EVP_MAC_CTX_free(ctx);
      EVP_MAC_free(mac);
    };
  };

  std::printf("MAC throughput on %zu MB buffers, one core (transport: %.2f GB/s)\n", kBytes >> 20, kTransportGBps);
  report("ChaCha20-Poly1305, payload as AAD (chosen)", measure(aead_as_mac(EVP_chacha20_poly1305())));
  report("Poly1305 alone (EVP_MAC, one-time key)", measure(evp_mac("POLY1305", nullptr, 32)));
  report("AES-256-GCM as GMAC, payload as AAD", measure(aead_as_mac(EVP_aes_256_gcm())));
  report("AES-128-GCM as GMAC, payload as AAD", measure(aead_as_mac(EVP_aes_128_gcm())));
  report("HMAC-SHA256 (EVP_MAC)", measure(evp_mac("HMAC", "SHA256", 32)));
  report("HMAC-SHA512 (EVP_MAC)", measure(evp_mac("HMAC", "SHA512", 32)));
  report("BLAKE2b-MAC (EVP_MAC)", measure(evp_mac("BLAKE2BMAC", nullptr, 32)));
  report("SipHash-2-4 (EVP_MAC)", measure(evp_mac("SIPHASH", nullptr, 16)));

  using namespace peertrain::net;
  const auto payload = std::span<const std::byte>(reinterpret_cast<const std::byte*>(data.data()), data.size());
  std::uint64_t sink = 0;
  report("Fletcher checksum (unauthenticated, for scale)", measure([&] { sink ^= checksum_payload(payload); }));
  const Secret secret = Secret::from_bytes(std::span<const std::uint8_t>(key, sizeof key));
  HandshakeContext context;
  context.dialer_nonce = random_nonce();
  context.acceptor_nonce = random_nonce();
  FrameAuthenticator dialer(secret, context, Role::kDialer), acceptor(secret, context, Role::kAcceptor);
  FrameHeader h;
  h.type = MessageType::kParameters;
  h.length = payload.size();
  const HeaderBytes plain = encode_header(h);
  // Sign a run of frames, then verify them in order: the receiver's counter must follow.
  constexpr int kFrames = 300;
  std::vector<HeaderBytes> headers(kFrames, plain);
  auto seconds_for = [](const std::function<void()>& work) {
    const auto start = std::chrono::steady_clock::now();
    work();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const double sign_s = seconds_for([&] {
    for (HeaderBytes& header : headers) dialer.sign(header, payload);
  });
  int failed = 0;
  const double verify_s = seconds_for([&] {
    for (const HeaderBytes& header : headers) failed += !acceptor.verify(header, payload);
  });
  report("FrameAuthenticator::sign", kFrames * static_cast<double>(kBytes) / sign_s / 1e9);
  report("FrameAuthenticator::verify", kFrames * static_cast<double>(kBytes) / verify_s / 1e9);
  std::printf("verified %d frames, %d failed (checksum sink %llx)\n", kFrames, failed, static_cast<unsigned long long>(sink));
  return failed == 0 ? 0 : 1;
}
