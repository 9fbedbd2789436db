#include "peertrain/algo/sparse_code.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "peertrain/core/error.h"

namespace peertrain::algo {
namespace {

std::size_t chunk_bytes(double fraction, std::size_t size) {
  const std::size_t k = sparse_kept(fraction, size);
  return 4 + 2 * k + (k + 3) / 4;
}

float level_value(unsigned code, float scale) { return (static_cast<float>(code) / 1.5f - 1.0f) * scale; }

}  // namespace

std::size_t sparse_kept(double fraction, std::size_t size) {
  if (size == 0) return 0;
  return std::clamp<std::size_t>(static_cast<std::size_t>(std::ceil(fraction * static_cast<double>(size))), 1, size);
}

std::size_t sparse_bytes(double fraction, std::size_t n) {
  std::size_t bytes = 0;
  for (std::size_t begin = 0; begin < n; begin += kSparseChunk)
    bytes += chunk_bytes(fraction, std::min(kSparseChunk, n - begin));
  return bytes;
}

std::vector<std::byte> sparse_encode(double fraction, std::span<const float> v, std::span<float> values) {
  PEERTRAIN_CHECK(values.size() == v.size(), "sparse_encode: ", values.size(), " values for ", v.size());
  std::vector<std::byte> out(sparse_bytes(fraction, v.size()));
  std::fill(values.begin(), values.end(), 0.0f);
  std::byte* at = out.data();
  std::vector<std::uint16_t> order;
  for (std::size_t begin = 0; begin < v.size(); begin += kSparseChunk) {
    const std::size_t size = std::min(kSparseChunk, v.size() - begin), k = sparse_kept(fraction, size);
    order.resize(size);
    std::iota(order.begin(), order.end(), std::uint16_t{0});
    // The k largest magnitudes (ties to the lower index, so every run picks the same), in index order.
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k - 1), order.end(),
                     [&](std::uint16_t a, std::uint16_t b) {
                       const float x = std::abs(v[begin + a]), y = std::abs(v[begin + b]);
                       return x > y || (x == y && a < b);
                     });
    std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
    float scale = 0;
    for (std::size_t j = 0; j < k; ++j) scale = std::max(scale, std::abs(v[begin + order[j]]));
    if (scale == 0) scale = 1;
    std::memcpy(at, &scale, 4);
    auto* indices = at + 4;
    auto* codes = reinterpret_cast<unsigned char*>(indices + 2 * k);
    std::fill_n(codes, (k + 3) / 4, 0);
    for (std::size_t j = 0; j < k; ++j) {
      const std::uint16_t i = order[j];
      std::memcpy(indices + 2 * j, &i, 2);
      const long level = std::lround((std::clamp(v[begin + i] / scale, -1.0f, 1.0f) + 1.0f) * 1.5f);
      const auto code = static_cast<unsigned>(std::clamp(level, 0L, 3L));
      codes[j / 4] |= static_cast<unsigned char>(code << (2 * (j % 4)));
      values[begin + i] = level_value(code, scale);
    }
    at += chunk_bytes(fraction, size);
  }
  return out;
}

void sparse_decode_add(double fraction, std::span<const std::byte> bytes, float weight, std::span<float> out,
                       const std::string& from) {
  if (bytes.size() != sparse_bytes(fraction, out.size()))
    throw Error(ErrorKind::kParse, str(from, " sent ", bytes.size(), " bytes of a sparse vector of ", out.size(),
                                       " values, expected ", sparse_bytes(fraction, out.size())));
  const std::byte* at = bytes.data();
  for (std::size_t begin = 0; begin < out.size(); begin += kSparseChunk) {
    const std::size_t size = std::min(kSparseChunk, out.size() - begin), k = sparse_kept(fraction, size);
    float scale = 0;
    std::memcpy(&scale, at, 4);
    const auto* codes = reinterpret_cast<const unsigned char*>(at + 4 + 2 * k);
    long previous = -1;
    for (std::size_t j = 0; j < k; ++j) {
      std::uint16_t i = 0;
      std::memcpy(&i, at + 4 + 2 * j, 2);
      if (i >= size || static_cast<long>(i) <= previous)
        throw Error(ErrorKind::kParse, str(from, " sent a sparse vector whose index ", i, " in a chunk of ", size,
                                           " is out of range or order"));
      previous = i;
      out[begin + i] += weight * level_value((codes[j / 4] >> (2 * (j % 4))) & 3u, scale);
    }
    at += chunk_bytes(fraction, size);
  }
}

}  // namespace peertrain::algo
