// SparseLoCo's pseudo-gradient message (Sarfi et al. 2025): in chunks of kSparseChunk
// values, the ⌈F·chunk⌉ of largest magnitude, each as its 16-bit index in the chunk and a
// 2-bit code, after one fp32 scale m per chunk (the largest kept magnitude): the codes
// are the levels −m, −m/3, m/3, m, rounded to nearest. At F = 1/64 a value costs about
// 0.04 bytes against fp32's 4. Everything not kept, and every rounding, is left to the
// sender's error feedback (diloco.cpp). Receivers add the decoded vectors in fp32.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace peertrain::algo {

constexpr std::size_t kSparseChunk = 4096;

// The values a chunk of `size` keeps at fraction F: ⌈F·size⌉, at least 1.
std::size_t sparse_kept(double fraction, std::size_t size);
// The exact wire size of a vector of n.
std::size_t sparse_bytes(double fraction, std::size_t n);

// v's message; `values` (v's size) gets what a receiver decodes from it (0 where dropped).
std::vector<std::byte> sparse_encode(double fraction, std::span<const float> v, std::span<float> values);

// out += weight · the decoded vector; throws Error(kParse) naming `from` for a message of
// another size, or an index out of range or out of order.
void sparse_decode_add(double fraction, std::span<const std::byte> bytes, float weight, std::span<float> out,
                       const std::string& from);

}  // namespace peertrain::algo
