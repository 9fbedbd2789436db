// The ring pass: units hop rank → rank + 1, double-buffered, with travelling sums (the
// dK/dV of ring-flash-attention's backward) that each rank adds its share to and that come
// home after the full circle. All ranks walk the units in the same order and step in near
// lockstep, so a rank's send of step s always meets its neighbour's receive of the same
// step: unit-major order (every hop of a unit before the next unit) is what lets the units
// be small without deadlock under a rendezvous transport, and small units keep the
// buffers a constant size, whatever the sequence length.
#include "ring_pass.h"

#include <cstring>
#include <exception>
#include <numeric>

#include "peertrain/core/error.h"

namespace peertrain::parallel::detail {
namespace {

constexpr int kSumTagOffset = 16;   // travelling sums of accumulator a: tag_base + 16 + a
constexpr int kHomeTagOffset = 32;  // sums on their way home: tag_base + 32 + a

// Spans of words as the comm layer moves them: it only copies bytes, so a run of ints may
// travel as a span of floats.
std::span<const float> words(const void* data, std::size_t count) {
  static_assert(sizeof(int) == sizeof(float));
  return {static_cast<const float*>(data), count};
}
std::span<float> words(void* data, std::size_t count) { return {static_cast<float*>(data), count}; }

}  // namespace

std::size_t ring_pass_bytes(int ranks, const std::vector<std::size_t>& part_words,
                            const std::vector<std::size_t>& accumulator_words) {
  if (ranks <= 1) return 0;  // no ring: units are read where they live, sums land at home
  const std::size_t parts = std::accumulate(part_words.begin(), part_words.end(), std::size_t{0});
  const std::size_t sums = std::accumulate(accumulator_words.begin(), accumulator_words.end(), std::size_t{0});
  return 4 * (2 * parts + 2 * sums);  // two payload buffers; a sum's incoming and local copy
}

void ring_pass(comm::Group& group, double timeout_s, int tag_base, MemoryMeter& meter, const RingPassSpec& spec) {
  const int ranks = group.size(), rank = group.rank();
  const int next = (rank + 1) % ranks, prev = (rank + ranks - 1) % ranks;
  std::vector<const void*> parts(spec.parts);
  std::vector<float*> sums(spec.accumulators);

  if (ranks == 1) {
    for (int u = 0; u < spec.units; ++u) {
      for (int p = 0; p < spec.parts; ++p) parts[p] = spec.source(u, p).data;
      for (int a = 0; a < spec.accumulators; ++a) {
        const std::span<float> home = spec.home(u, a);
        std::fill(home.begin(), home.end(), 0.0f);
        sums[a] = home.data();
      }
      spec.compute(u, 0, parts, sums);
    }
    return;
  }

  // Buffers sized for the largest unit; offsets of each part and sum inside them.
  std::vector<std::size_t> part_words(spec.parts, 0), sum_words(spec.accumulators, 0);
  for (int u = 0; u < spec.units; ++u) {
    for (int p = 0; p < spec.parts; ++p) part_words[p] = std::max(part_words[p], spec.source(u, p).words);
    for (int a = 0; a < spec.accumulators; ++a) sum_words[a] = std::max(sum_words[a], spec.home(u, a).size());
  }
  std::vector<std::size_t> part_offset(spec.parts + 1, 0), sum_offset(spec.accumulators + 1, 0);
  for (int p = 0; p < spec.parts; ++p) part_offset[p + 1] = part_offset[p] + part_words[p];
  for (int a = 0; a < spec.accumulators; ++a) sum_offset[a + 1] = sum_offset[a] + sum_words[a];
  // Raw bytes: memcpy creates the floats or ints a part holds (C++20 implicit objects).
  Tracked<std::byte> payload0(meter, 4 * part_offset.back()), payload1(meter, 4 * part_offset.back());
  Tracked<std::byte>* payload[2] = {&payload0, &payload1};
  const std::size_t sum_size = spec.accumulators > 0 ? sum_offset.back() : 0;
  Tracked<float> local(meter, sum_size), incoming(meter, sum_size);

  std::vector<Work> part_sends(spec.parts), part_recvs(spec.parts), sum_sends(spec.accumulators),
      sum_recvs(spec.accumulators), homes;
  const auto wait_all = [&](std::vector<Work>& requests) {
    for (auto& r : requests) r.wait(timeout_s);
  };
  try {
    for (int u = 0; u < spec.units; ++u) {
      for (int a = 0; a < spec.accumulators; ++a)
        homes.push_back(group.irecv(prev, tag_base + kHomeTagOffset + a, spec.home(u, a)));
      for (int hop = 0; hop < ranks; ++hop) {
        std::byte* here = payload[hop % 2]->data();
        std::byte* after = payload[(hop + 1) % 2]->data();
        for (int p = 0; p < spec.parts; ++p)
          parts[p] = hop == 0 ? spec.source(u, p).data : here + 4 * part_offset[p];
        if (hop + 1 < ranks)
          for (int p = 0; p < spec.parts; ++p) {
            const std::size_t count = spec.source(u, p).words;
            part_recvs[p] = group.irecv(prev, tag_base + p, words(after + 4 * part_offset[p], count));
            part_sends[p] = group.isend(next, tag_base + p, words(parts[p], count));
          }
        for (int a = 0; a < spec.accumulators; ++a) {
          sums[a] = local.data() + sum_offset[a];
          std::fill_n(sums[a], spec.home(u, a).size(), 0.0f);
        }
        spec.compute(u, hop, parts, sums);
        // The sums move after the compute they carry; the next hop's compute overlaps them
        // only on an asynchronous transport (ThreadGroup copies on the later caller's thread).
        for (int a = 0; a < spec.accumulators; ++a) {
          const std::size_t count = spec.home(u, a).size();
          if (hop > 0) {
            sum_recvs[a].wait(timeout_s);
            const float* in = incoming.data() + sum_offset[a];
            for (std::size_t i = 0; i < count; ++i) sums[a][i] += in[i];
          }
          const int tag = tag_base + (hop + 1 < ranks ? kSumTagOffset : kHomeTagOffset) + a;
          sum_sends[a] = group.isend(next, tag, std::span<const float>(sums[a], count));
          if (hop + 1 < ranks)
            sum_recvs[a] = group.irecv(prev, tag_base + kSumTagOffset + a,
                                       std::span<float>(incoming.data() + sum_offset[a], count));
        }
        if (hop + 1 < ranks) {
          wait_all(part_sends);
          wait_all(part_recvs);
        }
        wait_all(sum_sends);
      }
    }
    wait_all(homes);
  } catch (const std::exception& e) {
    // The others would wait out their timeouts for this rank: end them now.
    group.abort(str("ring attention failed on rank ", rank, " of '", group.name(), "': ", e.what()));
    throw;
  }
}

}  // namespace peertrain::parallel::detail
