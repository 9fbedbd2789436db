// libFuzzer target: the handshake's decoders and admission check must turn any bytes into
// a hello or reply, or a peertrain::Error naming the sender — never a crash, a read past
// the input or an allocation the bytes claim. A decoded hello re-encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "../../src/net/handshake.h"
#include "peertrain/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace peertrain::net::handshake;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const Hello hello = decode_hello(bytes, "fuzz");
    const auto again = encode_hello(hello);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) __builtin_trap();
    // Every verdict on every link state is a verdict, with a reason unless accepted.
    for (int state = 0; state < 32; ++state) {
      const LinkView link{(state & 1) != 0, (state & 2) != 0, (state & 4) != 0, (state & 8) != 0, (state & 16) != 0};
      const Verdict v = check_hello(hello, {5, 0x1122334455667788ULL, 42, (state & 1) != 0}, link);
      if (!v.accepted() && v.reason.empty()) __builtin_trap();
    }
  } catch (const peertrain::Error&) {
  }
  try {
    const Reply reply = decode_reply(bytes, "fuzz");
    const auto again = encode_reply(reply);
    if (reply.authenticated && again.size() != size) __builtin_trap();
  } catch (const peertrain::Error&) {
  }
  return 0;
}
