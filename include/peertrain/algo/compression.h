// The compressors of compressed gossip (CHOCO-SGD, Koloskova, Stich, Jaggi, ICML 2019):
// Q(v) for the difference between a peer's parameters and its public copy x̂. Each is a
// contraction, E‖Q(v) − v‖² ≤ (1 − δ)‖v‖² with δ > 0, which is what CHOCO's consensus
// needs (unbiased but unscaled operators such as plain QSGD are scaled down to be one):
//  - none:        Q(v) = v, four bytes an element;
//  - top-k:F:     the ⌈F·n⌉ entries of largest magnitude, as delta-coded varint indices
//                 and float values (about five bytes an entry at F = 0.01);
//  - random-k:F:  ⌈F·n⌉ entries at indices drawn from a seed the message carries, so only
//                 the seed and the values travel;
//  - qsgd:BITS:   QSGD (Alistarh et al. 2017) in buckets of 512: each bucket's norm, then
//                 per element a sign bit and a level in 0..s, s = 2^(BITS−1) − 1, rounded
//                 stochastically and packed; scaled by 1/τ, τ = 1 + min(d/s², √d/s);
//  - sign:        the scaled sign (Karimireddy et al. 2019) in buckets of 512: each
//                 bucket's mean magnitude, then one bit an element.
// The message is self-describing (kind, length, parameter), so a receiver checks it
// against what it expects and a malformed one is an Error naming the sender.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "peertrain/core/rng.h"

namespace peertrain::algo {

enum class CompressionKind : std::uint8_t { kNone = 0, kTopK = 1, kRandomK = 2, kQsgd = 3, kSign = 4 };

struct Compression {
  CompressionKind kind = CompressionKind::kNone;
  double fraction = 1.0;  // top-k, random-k: in (0, 1]
  int bits = 0;           // qsgd: 2..16 (a sign bit and BITS − 1 bits of level)
  // "none", "top-k:0.01", "random-k:0.1", "qsgd:8", "sign".
  std::string describe() const;
  // The entries a vector of n keeps (top-k, random-k): ⌈fraction·n⌉, at least 1 when n > 0.
  std::size_t kept(std::size_t n) const;
  // CHOCO's consensus step γ when --gossip-step is not given: 1 for none; 10F within
  // [0.01, 0.2] for top-k and F for random-k; 1/τ for qsgd; 0.5 for sign (δ ≈ 2/π on
  // Gaussian-like differences). From a scan of γ for gossip alone on a ring of 8 and of
  // training on a 16-peer ring (docs/algo.md): each default is at least 2× below where
  // gossip diverges; top-k's leans to the large side, which trains faster (0.04 at F = 0.01
  // never reached experiments/gossip's target loss, 0.1 did).
  double default_gossip_step() const;
  // The exact wire size of Q(v) for a vector of n (top-k: an upper bound, the varints
  // depend on the gaps; compress() returns the exact bytes).
  std::size_t max_bytes(std::size_t n) const;
};

// Parses --compression. Throws Error(kInvalidArgument) naming the flag and the value: an
// unknown name, a fraction outside (0, 1], bits outside 2..16.
Compression parse_compression(std::string_view text);

constexpr std::size_t kQuantBucket = 512;

// Q(v) as the bytes a message carries. `rng` drives QSGD's stochastic rounding and
// random-k's seed (only the sender's: the receiver needs none).
std::vector<std::byte> compress(const Compression& c, std::span<const float> v, Rng& rng);

// out += weight · Q(v), from the message `bytes`, which must encode a vector of
// out.size() with compression c. Throws Error(kParse) naming `from` for a malformed,
// truncated or mismatched message (an index out of range, another kind or length).
void decompress_add(const Compression& c, std::span<const std::byte> bytes, float weight, std::span<float> out,
                    const std::string& from);

}  // namespace peertrain::algo
