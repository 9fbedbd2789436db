// Where peertrain keeps what it can compute again but would rather not: measured profiles,
// trained tokenizers, decompressed data sets. One place, so that one setting moves them all.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace peertrain {

// $XDG_CACHE_HOME/peertrain, else $HOME/.cache/peertrain; "" when neither is set.
std::string user_cache_dir();

// FNV-1a over text, continuing from h: names cache entries after what they were made from.
// Not cryptographic: keys hash what the caller controls, not what an adversary chooses.
constexpr std::uint64_t fnv1a(std::string_view text, std::uint64_t h = 1469598103934665603ULL) {
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  return h;
}

}  // namespace peertrain
