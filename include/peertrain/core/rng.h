// A small, fast, seedable generator whose streams are identical on every platform and
// compiler (std::uniform_*_distribution is not), so seeded topologies and initial
// parameters reproduce exactly from a seed. xoshiro256** seeded through SplitMix64.
#pragma once

#include <cstdint>

namespace peertrain {

class Rng {
 public:
  explicit Rng(std::uint64_t seed);

  std::uint64_t next_u64();
  // Uniform in [0, bound), without modulo bias (Lemire's method). bound > 0.
  std::uint64_t uniform_below(std::uint64_t bound);
  // Uniform in [0, 1) with 53 random bits.
  double uniform();
  // Standard normal (Box–Muller; one value per call, the pair's second is cached).
  double normal();

 private:
  std::uint64_t state_[4];
  double cached_normal_ = 0.0;
  bool has_cached_normal_ = false;
};

}  // namespace peertrain
