// libFuzzer target: the payload decoders a linked peer's bytes reach, each either decoding
// or throwing peertrain::Error — never a crash, a read past the input or an allocation the
// bytes claim. The first byte picks the decoder, the second sizes the run it assumes:
//   0  the evaluation report (train/recorder.h), whose size the run fixes;
//   1  a shared-memory ring offer (net/shared_ring.h), which must re-encode to its bytes;
//   2  AD-PSGD's averaging message (algo/async_gossip_codec.h);
//   3  a top-k sparse vector (algo/sparse_code.h);
//   4  a quantized vector in each format (algo/quantize.h).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "../../src/algo/async_gossip_codec.h"
#include "../../src/net/shared_ring.h"
#include "../../src/train/recorder.h"
#include "peertrain/algo/quantize.h"
#include "peertrain/algo/sparse_code.h"
#include "peertrain/core/error.h"

namespace {

// The length whose encoding takes `size` bytes (wire_bytes grows with it), or the nearest
// one above: most inputs then decode as far as their contents allow, not fail on size.
template <typename Bytes>
std::size_t fitting(std::size_t size, Bytes wire_bytes) {
  std::size_t lo = 0, hi = 8 * size + 8;
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (wire_bytes(mid) < size)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const int which = data[0] % 5;
  const int peers = 1 + data[1] % 16;
  // A heap copy: payloads arrive in heap buffers, aligned for the floats views point at.
  const std::vector<std::byte> copy(reinterpret_cast<const std::byte*>(data + 2),
                                    reinterpret_cast<const std::byte*>(data + size));
  const std::span<const std::byte> bytes(copy);
  using namespace peertrain;
  try {
    switch (which) {
      case 0: {
        const std::size_t parameters = bytes.size() >= 8 * (11 + peers) ? (bytes.size() - 8 * (11 + peers)) / 4 : 0;
        std::vector<double> sent_to;
        std::span<const float> x;
        train::decode_report(bytes, peers, parameters, "fuzz", sent_to, x);
        if (sent_to.size() != static_cast<std::size_t>(peers) || x.size() != parameters) __builtin_trap();
        float sum = 0;
        for (float v : x) sum += v;  // every float inside the input
        (void)sum;
        break;
      }
      case 1: {
        net::SharedRing::Offer offer;
        if (net::SharedRing::Offer::decode(bytes, offer)) {
          const auto again = offer.encode();
          if (bytes.size() != again.size() || std::memcmp(bytes.data(), again.data(), again.size()) != 0)
            __builtin_trap();
        }
        break;
      }
      case 2: {
        const auto m = algo::decode_averaging_message(bytes, peers, "fuzz");
        if (m.counts.size() != static_cast<std::size_t>(peers) || m.kind < 1 || m.kind > 4) __builtin_trap();
        float sum = 0;
        for (float v : m.values) sum += v;
        (void)sum;
        break;
      }
      case 3: {
        const double fraction = (1 + data[1] % 8) / 8.0;
        const std::size_t n = fitting(bytes.size(), [&](std::size_t k) { return algo::sparse_bytes(fraction, k); });
        std::vector<float> out(n);
        algo::sparse_decode_add(fraction, bytes, 0.5f, out, "fuzz");
        break;
      }
      case 4: {
        const algo::QuantFormat formats[] = {algo::QuantFormat::kInt8, algo::QuantFormat::kFp8,
                                             algo::QuantFormat::kInt4};
        const algo::QuantFormat format = formats[data[1] % 3];
        const std::size_t n = fitting(bytes.size(), [&](std::size_t k) { return algo::quantized_bytes(format, k); });
        std::vector<float> out(n);
        algo::dequantize(format, bytes, out, (data[1] & 4) != 0, "fuzz");
        break;
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
