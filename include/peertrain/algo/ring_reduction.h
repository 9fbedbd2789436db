// A ring all-reduce (reduce-scatter, then all-gather; Patarasuk & Yuan) that moves when
// asked instead of blocking: begun at one step, advanced by progress() between the
// computations that follow, and finished by finish(). Streaming DiLoCo overlaps its outer
// exchange with the next inner steps this way, on TCP and on a simulated cluster alike,
// without a thread of its own.
//
// With a QuantFormat other than none every chunk travels quantized (algo/quantize.h) and
// every receiver adds in fp32: a hop of the reduce-scatter dequantizes the partial sum it
// gets, adds its own values and quantizes the result for the next hop; the owner of a
// finished chunk quantizes it once and the all-gather forwards those bytes untouched, so
// every peer ends with bitwise the same sum. Each quantization's error (the values minus
// what the receivers read back) is added to the quantizing peer's `residual` at the same
// positions, so the residuals of all peers hold exactly what the sum lost: error feedback
// that adds its residual into the next round's vector loses nothing over the rounds.
// Without quantization the result is bitwise ring_allreduce's.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "peertrain/algo/quantize.h"
#include "peertrain/core/work.h"
#include "peertrain/net/transport.h"

namespace peertrain::algo {

class RingReduction {
 public:
  // Sums `data` over `ring` (every peer the same list, self included) in place, keyed by
  // `key` (a step no other all-reduce of the run uses). `data`, and `residual` when given
  // (data's size), must stay valid until finish() returns.
  RingReduction(net::Transport& network, std::vector<int> ring, std::uint64_t key, std::span<float> data,
                QuantFormat format = QuantFormat::kNone, std::span<float> residual = {});
  RingReduction(const RingReduction&) = delete;
  RingReduction& operator=(const RingReduction&) = delete;
  ~RingReduction();  // waits for its sends

  // Advances as far as the messages that have arrived allow, without waiting; true when done.
  bool progress();
  // Waits for the rest (throws Error like receive() on a lost or silent peer).
  void finish();
  bool done() const { return stage_ >= stages_; }

 private:
  // One stage: sends (once) and, when its message is there or `wait` is set, takes it in.
  bool advance(bool wait);
  void send_stage();
  net::Payload receive_unless_broken(std::uint32_t tag);
  void take(const net::Payload& in);
  std::span<float> chunk(int c) const;
  // Quantizes values into out_, adding the error to the residual at `offset`.
  void quantize_out(std::span<const float> values, std::size_t offset);

  net::Transport& network_;
  std::vector<int> ring_;
  std::uint64_t key_;
  std::span<float> data_;
  QuantFormat format_;
  std::span<float> residual_;
  int n_ = 1, position_ = 0, next_ = 0, previous_ = 0;
  int stage_ = 0, stages_ = 0;
  bool sent_ = false;
  Work send_;
  net::Payload forward_;          // the all-gather's bytes this peer passes on
  std::vector<float> read_back_;  // what the receivers of out_ read
};

}  // namespace peertrain::algo
