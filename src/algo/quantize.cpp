#include "peertrain/algo/quantize.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "peertrain/core/error.h"

namespace peertrain::algo {
namespace {

constexpr float kFp8Max = 448.0f;

// The non-negative e4m3 values by code 0..126 (127 is NaN), increasing: subnormals
// m·2⁻⁹ for exponent 0, then (1 + m/8)·2^(e−7).
const std::array<float, 127>& e4m3_table() {
  static const std::array<float, 127> table = [] {
    std::array<float, 127> t{};
    for (int code = 0; code < 127; ++code) {
      const int e = code >> 3, m = code & 7;
      t[static_cast<std::size_t>(code)] =
          e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
    }
    return t;
  }();
  return table;
}

std::size_t value_bytes(QuantFormat format, std::size_t n) {
  switch (format) {
    case QuantFormat::kNone:
      return 4 * n;
    case QuantFormat::kInt8:
    case QuantFormat::kFp8:
      return n;
    case QuantFormat::kInt4:
      return (n + 1) / 2;
  }
  return 0;
}

float block_scale(QuantFormat format, std::span<const float> block) {
  float largest = 0;
  for (float v : block) largest = std::max(largest, std::abs(v));
  const float top = format == QuantFormat::kInt8 ? 127.0f : format == QuantFormat::kInt4 ? 7.0f : kFp8Max;
  return largest > 0 ? largest / top : 1.0f;
}

// One block: its scale, then its values; `values` (empty or the block's size) gets what
// dequantizing reads back.
void quantize_block(QuantFormat format, std::span<const float> block, std::byte* out, std::span<float> values) {
  const float scale = block_scale(format, block);
  std::memcpy(out, &scale, sizeof scale);
  auto* codes = reinterpret_cast<unsigned char*>(out + sizeof scale);
  const float inverse = 1.0f / scale;
  if (format == QuantFormat::kInt4) std::fill_n(codes, value_bytes(format, block.size()), 0);
  for (std::size_t i = 0; i < block.size(); ++i) {
    float back = 0;
    if (format == QuantFormat::kFp8) {
      const unsigned char code = to_e4m3(std::clamp(block[i] * inverse, -kFp8Max, kFp8Max));
      codes[i] = code;
      back = from_e4m3(code) * scale;
    } else {
      const float top = format == QuantFormat::kInt8 ? 127.0f : 7.0f;
      const int level = static_cast<int>(std::lround(std::clamp(block[i] * inverse, -top, top)));
      if (format == QuantFormat::kInt8)
        codes[i] = static_cast<unsigned char>(static_cast<signed char>(level));
      else
        codes[i / 2] |= static_cast<unsigned char>((level & 0xF) << (4 * (i % 2)));
      back = static_cast<float>(level) * scale;
    }
    if (!values.empty()) values[i] = back;
  }
}

}  // namespace

std::string_view to_string(QuantFormat format) {
  switch (format) {
    case QuantFormat::kNone:
      return "none";
    case QuantFormat::kInt8:
      return "int8";
    case QuantFormat::kFp8:
      return "fp8";
    case QuantFormat::kInt4:
      return "int4";
  }
  return "?";
}

QuantFormat parse_quant_format(std::string_view name, std::string_view flag) {
  for (auto f : {QuantFormat::kNone, QuantFormat::kInt8, QuantFormat::kFp8, QuantFormat::kInt4})
    if (to_string(f) == name) return f;
  throw Error(ErrorKind::kInvalidArgument, str(flag, " '", name, "' is not one of none, int8, fp8, int4"));
}

std::size_t quantized_bytes(QuantFormat format, std::size_t n) {
  if (format == QuantFormat::kNone) return 4 * n;
  const std::size_t full = n / kQuantBlock, rest = n % kQuantBlock;
  return full * (4 + value_bytes(format, kQuantBlock)) + (rest ? 4 + value_bytes(format, rest) : 0);
}

unsigned char to_e4m3(float v) {
  const auto& table = e4m3_table();
  const float magnitude = std::min(std::abs(v), kFp8Max);
  const auto above = std::lower_bound(table.begin(), table.end(), magnitude);
  std::size_t code = static_cast<std::size_t>(above - table.begin());
  if (code == table.size() || (code > 0 && magnitude - table[code - 1] <= table[code] - magnitude)) --code;
  return static_cast<unsigned char>(code | (std::signbit(v) && code ? 0x80u : 0u));
}

float from_e4m3(unsigned char code) {
  const float magnitude = e4m3_table()[std::min<std::size_t>(code & 0x7F, 126)];
  return code & 0x80 ? -magnitude : magnitude;
}

void quantize(QuantFormat format, std::span<const float> v, std::vector<std::byte>& out, std::span<float> values) {
  PEERTRAIN_CHECK(values.empty() || values.size() == v.size(), "quantize: ", values.size(), " values for ", v.size());
  out.resize(quantized_bytes(format, v.size()));
  if (format == QuantFormat::kNone) {
    if (!v.empty()) std::memcpy(out.data(), v.data(), v.size_bytes());  // (an empty span's data may be null)
    if (!values.empty()) std::copy(v.begin(), v.end(), values.begin());
    return;
  }
  std::byte* at = out.data();
  for (std::size_t begin = 0; begin < v.size(); begin += kQuantBlock) {
    const std::size_t size = std::min(kQuantBlock, v.size() - begin);
    quantize_block(format, v.subspan(begin, size), at, values.empty() ? values : values.subspan(begin, size));
    at += 4 + value_bytes(format, size);
  }
}

void dequantize(QuantFormat format, std::span<const std::byte> bytes, std::span<float> out, bool add,
                const std::string& from) {
  if (bytes.size() != quantized_bytes(format, out.size()))
    throw Error(ErrorKind::kParse, str(from, " sent ", bytes.size(), " bytes of a ", to_string(format), " vector of ",
                                       out.size(), " values, expected ", quantized_bytes(format, out.size())));
  if (format == QuantFormat::kNone) {
    const auto* values = reinterpret_cast<const float*>(bytes.data());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = add ? out[i] + values[i] : values[i];
    return;
  }
  const std::byte* at = bytes.data();
  for (std::size_t begin = 0; begin < out.size(); begin += kQuantBlock) {
    const std::size_t size = std::min(kQuantBlock, out.size() - begin);
    float scale = 0;
    std::memcpy(&scale, at, sizeof scale);
    const auto* codes = reinterpret_cast<const unsigned char*>(at + sizeof scale);
    for (std::size_t i = 0; i < size; ++i) {
      float v = 0;
      if (format == QuantFormat::kFp8) {
        v = from_e4m3(codes[i]) * scale;
      } else if (format == QuantFormat::kInt8) {
        v = static_cast<float>(static_cast<signed char>(codes[i])) * scale;
      } else {
        int level = (codes[i / 2] >> (4 * (i % 2))) & 0xF;
        if (level > 7) level -= 16;
        v = static_cast<float>(level) * scale;
      }
      float& o = out[begin + i];
      o = add ? o + v : v;
    }
    at += 4 + value_bytes(format, size);
  }
}

}  // namespace peertrain::algo
