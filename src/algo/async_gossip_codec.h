// AD-PSGD's averaging message on the wire (src/algo/async_gossip.cpp): a kind (request,
// accept, refuse, done), the sender's step count for every peer, then its parameters for
// a request or an accept. Private to the algo module; the fuzzer reads it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace peertrain::algo {

struct AveragingMessage {
  std::uint32_t kind = 0;             // 1..4
  std::vector<std::uint64_t> counts;  // one per peer of the run
  std::span<const float> values;      // a view into the payload (aligned: a heap buffer)
};

// Throws Error(kParse) naming `what` for an unknown kind, counts of another run's size, or
// parameters that are not whole floats.
AveragingMessage decode_averaging_message(std::span<const std::byte> payload, int peers, const std::string& what);

}  // namespace peertrain::algo
