// libFuzzer target: the membership protocol's decoders (reports, announcements, rejoin
// requests and answers) must turn any bytes from a peer into a message or a
// peertrain::Error naming the sender — never a crash, a read past the input, an id out of
// range, or an allocation the bytes claim. A decoded message re-encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "../../src/train/membership_codec.h"
#include "peertrain/core/error.h"

namespace {

constexpr int kPeers = 9;

bool same(const peertrain::net::Payload& a, const std::uint8_t* data, std::size_t size) {
  return a.size() == size && std::memcmp(a.data(), data, size) == 0;
}

bool ids_in_range(const std::vector<int>& ids) {
  for (int id : ids)
    if (id < 0 || id >= kPeers) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace peertrain::train;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const LostReport r = decode_report(bytes, kPeers, "fuzz");
    if (!ids_in_range(r.peers) || !same(encode_report(r), data, size)) __builtin_trap();
  } catch (const peertrain::Error&) {
  }
  try {
    const Announcement a = decode_announcement(bytes, kPeers, "fuzz");
    if (!ids_in_range(a.lost) || !same(encode_announcement(a), data, size)) __builtin_trap();
    for (const Rejoin& j : a.joins)
      if (j.peer < 0 || j.peer >= kPeers || j.donor < 0 || j.donor >= kPeers) __builtin_trap();
  } catch (const peertrain::Error&) {
  }
  try {
    decode_rejoin_request(bytes, "fuzz");
    if (!same(encode_rejoin_request(), data, size)) __builtin_trap();
  } catch (const peertrain::Error&) {
  }
  try {
    const RejoinAnswer a = decode_rejoin_answer(bytes, kPeers, "fuzz");
    if (!same(encode_rejoin_answer(a), data, size)) __builtin_trap();
  } catch (const peertrain::Error&) {
  }
  return 0;
}
