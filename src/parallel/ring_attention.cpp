// RingAttention's public face: the sequence splits, the per-call checks every rank agrees
// on, and the choice between the online-softmax ring (ring_online.cpp, Liu et al. 2023)
// and Ring Self-Attention (ring_rsa.cpp, Li et al. 2021).
#include "peertrain/parallel/ring_attention.h"

#include <array>
#include <string>

#include "peertrain/core/error.h"
#include "ring_modes.h"

namespace peertrain::parallel {

SequenceSplit parse_sequence_split(std::string_view text, std::string_view flag) {
  if (text == "zigzag") return SequenceSplit::kZigzag;
  if (text == "contiguous") return SequenceSplit::kContiguous;
  throw Error(ErrorKind::kInvalidArgument, str(flag, " '", text, "': expected zigzag or contiguous"));
}

RingMode parse_ring_mode(std::string_view text, std::string_view flag) {
  if (text == "ring" || text == "online" || text == "online-softmax") return RingMode::kOnlineSoftmax;
  if (text == "rsa") return RingMode::kRsa;
  throw Error(ErrorKind::kInvalidArgument,
              str(flag, " '", text, "': expected ring (online softmax; also 'online') or rsa"));
}

std::string_view to_string(SequenceSplit split) {
  return split == SequenceSplit::kZigzag ? "zigzag" : "contiguous";
}

std::string_view to_string(RingMode mode) { return mode == RingMode::kOnlineSoftmax ? "ring" : "rsa"; }

std::vector<int> sequence_positions(int tokens, int ranks, int rank, SequenceSplit split) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw Error(ErrorKind::kInvalidArgument,
                str("sequence split: rank ", rank, " of SP=", ranks, " (expected SP >= 1 and 0 <= rank < SP)"));
  if (tokens < 0) throw Error(ErrorKind::kInvalidArgument, str("sequence split: T=", tokens, " tokens"));
  const int chunks = split == SequenceSplit::kZigzag ? 2 * ranks : ranks;
  // Rejected, not padded: pad tokens would shift every rank's work and loss and hide a
  // configuration mistake; the caller picks a T the split divides.
  if (tokens % chunks != 0)
    throw Error(ErrorKind::kInvalidArgument,
                str("sequence split: T=", tokens, " tokens cannot be split ", to_string(split), " over SP=", ranks,
                    " ranks: T must be a multiple of ", chunks,
                    split == SequenceSplit::kZigzag ? " (2·SP chunks)" : " (SP chunks)",
                    "; sequences are not padded"));
  const int chunk = tokens / chunks;
  std::vector<int> positions;
  positions.reserve(static_cast<std::size_t>(tokens / ranks));
  auto take = [&](int c) {
    for (int i = 0; i < chunk; ++i) positions.push_back(c * chunk + i);
  };
  take(rank);
  if (split == SequenceSplit::kZigzag) take(2 * ranks - 1 - rank);
  return positions;
}

RingAttention::RingAttention(comm::Group& group, RingMode mode, double timeout_s, int block_tokens)
    : group_(group), mode_(mode), timeout_s_(timeout_s), block_tokens_(block_tokens) {
  if (!(timeout_s > 0))
    throw Error(ErrorKind::kInvalidArgument, str("ring attention on '", group.name(), "': timeout ", timeout_s,
                                                 " s, expected > 0"));
  if (block_tokens < 1)
    throw Error(ErrorKind::kInvalidArgument,
                str("ring attention on '", group.name(), "': block of ", block_tokens, " tokens, expected >= 1"));
}

// Every rank states its call and whether it is valid in one all-gather, so that a bad call
// on one rank fails all of them at once with the same verdict, instead of leaving the
// others waiting in the ring until their timeout.
void RingAttention::check_call(const model::AttentionShape& shape, std::span<const int> positions, const char* op) {
  std::string problem;
  if (shape.batch < 0 || shape.heads < 1 || shape.head_dim < 1 || shape.tokens < 0)
    problem = str("bad shape: batch ", shape.batch, ", heads ", shape.heads, ", head_dim ", shape.head_dim,
                  ", tokens ", shape.tokens);
  else if (static_cast<long long>(positions.size()) != shape.tokens)
    problem = str(positions.size(), " positions for ", shape.tokens, " tokens");
  else
    for (std::size_t i = 1; i < positions.size(); ++i)
      if (positions[i] <= positions[i - 1]) {
        problem = str("positions must ascend, but position ", i, " is ", positions[i], " after ", positions[i - 1]);
        break;
      }
  constexpr int kFields = 7;
  const std::array<float, kFields> mine = {problem.empty() ? 1.0f : 0.0f,     static_cast<float>(shape.batch),
                                           static_cast<float>(shape.heads),   static_cast<float>(shape.head_dim),
                                           static_cast<float>(shape.tokens),  shape.causal ? 1.0f : 0.0f,
                                           static_cast<float>(static_cast<int>(mode_))};
  const int ranks = group_.size();
  std::vector<float> all(static_cast<std::size_t>(kFields) * ranks);
  group_.all_gather(mine, all, timeout_s_);
  const std::string where = str("ring attention ", op, " on '", group_.name(), "' rank ", group_.rank());
  if (!problem.empty()) throw Error(ErrorKind::kInvalidArgument, str(where, ": ", problem));
  static const char* const kNames[kFields] = {"valid", "batch", "heads", "head_dim", "tokens", "causal", "mode"};
  for (int r = 0; r < ranks; ++r) {
    if (all[static_cast<std::size_t>(r) * kFields] == 0.0f)
      throw Error(ErrorKind::kInvalidArgument, str(where, ": rank ", r, " made an invalid call (see its error)"));
    for (int f = 1; f < kFields; ++f)
      if (all[static_cast<std::size_t>(r) * kFields + f] != mine[f])
        throw Error(ErrorKind::kInvalidArgument, str(where, ": ", kNames[f], " is ", mine[f], " here but ",
                                                     all[static_cast<std::size_t>(r) * kFields + f], " on rank ", r,
                                                     "; every rank must make the same call"));
  }
}

void RingAttention::forward(const model::AttentionShape& shape, std::span<const int> positions, const float* q,
                            const float* k, const float* v, float* out, float* lse) {
  check_call(shape, positions, "forward");
  detail::MemoryMeter meter;
  work_ = 0;
  const detail::RingCall call{group_, timeout_s_, block_tokens_, shape, positions.data(), meter, work_};
  if (mode_ == RingMode::kOnlineSoftmax)
    detail::online_forward(call, q, k, v, out, lse);
  else
    detail::rsa_forward(call, q, k, v, out, lse);
  peak_bytes_ = meter.peak();
}

void RingAttention::backward(const model::AttentionShape& shape, std::span<const int> positions, const float* q,
                             const float* k, const float* v, const float* out, const float* lse, const float* dout,
                             float* dq, float* dk, float* dv) {
  check_call(shape, positions, "backward");
  detail::MemoryMeter meter;
  work_ = 0;
  const detail::RingCall call{group_, timeout_s_, block_tokens_, shape, positions.data(), meter, work_};
  if (mode_ == RingMode::kOnlineSoftmax)
    detail::online_backward(call, q, k, v, out, lse, dout, dq, dk, dv);
  else
    detail::rsa_backward(call, q, k, v, out, lse, dout, dq, dk, dv);
  peak_bytes_ = meter.peak();
}

std::size_t RingAttention::planned_peak_bytes(const model::AttentionShape& local, int ranks, RingMode mode,
                                              bool backward, int block_tokens) {
  return mode == RingMode::kOnlineSoftmax ? detail::online_planned_bytes(local, ranks, backward, block_tokens)
                                          : detail::rsa_planned_bytes(local, ranks, backward);
}

int RingAttention::ring_units(const model::AttentionShape& local, int block_tokens) {
  return detail::online_units(local, block_tokens);
}

}  // namespace peertrain::parallel
