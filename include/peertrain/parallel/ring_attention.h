// Sequence-parallel attention: the tokens of every sequence are split over the SP ranks of
// a comm::Group, each rank keeps the queries of its tokens, and the keys and values travel
// around the ring of ranks.
//
//   kOnlineSoftmax — Ring Attention (Liu, Zaharia & Abbeel 2023, "Ring Attention with
//     Blockwise Transformers for Near-Infinite Context"), with the backward pass of
//     ring-flash-attention (zhuzilin 2024): K/V blocks hop SP − 1 times, merged into each
//     query block with the online softmax (attention_block::accumulate); in backward the
//     dK/dV of a block travel with it and arrive home after the full circle. No rank holds
//     more than one score tile; the memory of a rank falls as 1/SP.
//   kRsa — Ring Self-Attention (Li et al. 2021, "Sequence Parallelism: Long Sequence
//     Training from System Perspective"): a first ring pass of K builds the full score strip
//     (local queries × all T keys), a plain softmax runs over it, a second ring pass of V
//     computes the output. It holds (local tokens × T) scores per (sequence, head): memory
//     quadratic in T, kept as the baseline whose memory the benchmark measures.
//
// The split of a sequence over the ranks: kContiguous gives rank r the r-th chunk of T/SP
// tokens; kZigzag cuts the sequence into 2·SP chunks and gives rank r chunks r and
// 2·SP − 1 − r, so that under the causal mask every rank has the same work (the zigzag of
// ring-flash-attention; Llama 3's context parallelism splits the same way). A sequence whose length
// the split does not divide is rejected, not padded: padding would change what every rank
// computes and hide a configuration mistake.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "peertrain/comm/group.h"
#include "peertrain/model/attention.h"

namespace peertrain::parallel {

enum class SequenceSplit { kZigzag, kContiguous };
enum class RingMode { kOnlineSoftmax, kRsa };

// "zigzag" | "contiguous"; throws kInvalidArgument naming the flag and the choices.
SequenceSplit parse_sequence_split(std::string_view text, std::string_view flag = "--sequence-split");
// "ring" (also "online", "online-softmax") | "rsa".
RingMode parse_ring_mode(std::string_view text, std::string_view flag = "--ring-mode");
std::string_view to_string(SequenceSplit split);
std::string_view to_string(RingMode mode);

// The positions in the whole sequence of the tokens rank `rank` of `ranks` holds, ascending.
// Throws kInvalidArgument naming T and SP when ranks (kZigzag: 2·ranks) does not divide
// tokens, or when ranks or rank are out of range.
std::vector<int> sequence_positions(int tokens, int ranks, int rank, SequenceSplit split);

// The tokens of one query tile and of one travelling K/V block, unless a caller says
// otherwise (plan's simulator counts the engine's ring with it).
inline constexpr int kDefaultRingBlockTokens = 256;

// One rank's attention over a sequence split across `group`. Every rank of the group calls
// forward (and backward) together, with the same shape and its own positions (ascending;
// from sequence_positions, or any split with the same tokens per rank). Not thread-safe:
// one instance per rank's thread.
//
// Errors: a shape that differs between ranks is kInvalidArgument on every rank; a partner
// that does not come is kTimeout after timeout_s; any failure inside the ring aborts the
// group (kPeerLost for the others), so that no rank waits out its timeout for a dead one.
class RingAttention final : public model::AttentionCore {
 public:
  // block_tokens: the tokens of one query tile and of one travelling K/V block; it bounds
  // the score tile (block_tokens²) and the transfer buffers, whatever T is.
  explicit RingAttention(comm::Group& group, RingMode mode = RingMode::kOnlineSoftmax,
                         double timeout_s = comm::kDefaultTimeoutS, int block_tokens = kDefaultRingBlockTokens);

  void forward(const model::AttentionShape& shape, std::span<const int> positions, const float* q, const float* k,
               const float* v, float* out, float* lse) override;
  void backward(const model::AttentionShape& shape, std::span<const int> positions, const float* q, const float* k,
                const float* v, const float* out, const float* lse, const float* dout, float* dq, float* dk,
                float* dv) override;

  RingMode mode() const { return mode_; }
  // The largest number of bytes this core's own buffers held during the last forward or
  // backward call: transfer buffers, score tiles (RSA: strips), softmax statistics and
  // travelling gradient accumulators. The caller's q, k, v, out, lse and gradients are not
  // counted. Equal to planned_peak_bytes for the same call.
  std::size_t peak_bytes() const { return peak_bytes_; }
  // Score entries the last call computed on this rank (query × key pairs of the tiles it
  // did not skip): the work the causal split balances, or does not.
  long long work() const { return work_; }

  // The peak_bytes() a call will have, from the shape alone: for capacity planning without
  // running (bench/ring_attention_bench.cpp checks it against runs).
  static std::size_t planned_peak_bytes(const model::AttentionShape& local, int ranks, RingMode mode, bool backward,
                                        int block_tokens = kDefaultRingBlockTokens);
  // The units an online-softmax ring pass carries for a call of `local` (each part of each
  // a rendezvous on every hop): a block of a (sequence, head)'s keys, or whole heads whose
  // keys fit a block, up to block_tokens keys a unit. plan's simulator counts its waits.
  static int ring_units(const model::AttentionShape& local, int block_tokens = kDefaultRingBlockTokens);

 private:
  void check_call(const model::AttentionShape& shape, std::span<const int> positions, const char* op);

  comm::Group& group_;
  RingMode mode_;
  double timeout_s_;
  int block_tokens_;
  std::size_t peak_bytes_ = 0;
  long long work_ = 0;
};

}  // namespace peertrain::parallel
