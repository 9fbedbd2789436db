// Low-precision vectors for the outer exchange of DiLoCo (--outer-compression): a vector
// travels in blocks of kQuantBlock values, each block one fp32 scale followed by its
// values at a few bits each, rounded to nearest (deterministic, so every peer that
// dequantizes the same bytes gets the same floats):
//  - int8: the block's largest magnitude maps to 127, values to round(v/s) in −127..127;
//  - int4: the same to 7, values in −7..7, two to a byte;
//  - fp8:  the block's largest magnitude maps to 448, values to the nearest e4m3 number
//          (OCP FP8 E4M3: 4 exponent bits, 3 mantissa bits, no infinities).
// Sums are never formed in these formats: a receiver dequantizes and adds in fp32.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace peertrain::algo {

constexpr std::size_t kQuantBlock = 512;

enum class QuantFormat { kNone, kInt8, kFp8, kInt4 };

// "none", "int8", "fp8", "int4".
std::string_view to_string(QuantFormat format);
// Throws Error(kInvalidArgument) naming `flag` and the choices.
QuantFormat parse_quant_format(std::string_view name, std::string_view flag = "--outer-compression");

// The exact wire size of n values.
std::size_t quantized_bytes(QuantFormat format, std::size_t n);

// Writes v as `format` into out (resized to quantized_bytes) and, when `values` is not
// empty (it must then have v's size), the floats a receiver will read back from it.
void quantize(QuantFormat format, std::span<const float> v, std::vector<std::byte>& out, std::span<float> values = {});

// out = (or += when add) the values in `bytes`, which must hold out.size() values as
// `format`; throws Error(kParse) naming `from` when the size is not that.
void dequantize(QuantFormat format, std::span<const std::byte> bytes, std::span<float> out, bool add,
                const std::string& from);

// The e4m3 number nearest to v (|v| ≤ 448), as its code and back: for tests.
unsigned char to_e4m3(float v);
float from_e4m3(unsigned char code);

}  // namespace peertrain::algo
