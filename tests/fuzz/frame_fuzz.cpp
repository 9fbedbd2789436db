// libFuzzer target: the frame decoder must turn any 48 header bytes and any payload into
// a decoded, checksummed frame or a peertrain::Error naming the peer — never a crash, a
// hang or an allocation a frame claims.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "peertrain/core/error.h"
#include "peertrain/net/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace peertrain::net;
  if (size < kHeaderBytes) return 0;
  HeaderBytes header;
  std::memcpy(header.data(), data, kHeaderBytes);
  const auto* payload = reinterpret_cast<const std::byte*>(data + kHeaderBytes);
  const FrameExpectations expect{3, 1 << 16, "peer 3 (fuzz)", /*shared_allowed=*/true};
  try {
    const FrameHeader h = decode_header(header, expect);
    if (h.length != size - kHeaderBytes) return 0;  // the transport reads exactly `length` bytes
    verify_checksum(h, {payload, static_cast<std::size_t>(h.length)}, expect);
    // A frame that passes must re-encode to the same bytes.
    const HeaderBytes again = encode_header(h);
    if (std::memcmp(again.data(), header.data(), 40) != 0) __builtin_trap();
  } catch (const peertrain::Error&) {
  }
  return 0;
}
