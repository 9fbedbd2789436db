#include "peertrain/algo/ring_reduction.h"

#include <algorithm>

#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"

namespace peertrain::algo {

RingReduction::RingReduction(net::Transport& network, std::vector<int> ring, std::uint64_t key, std::span<float> data,
                             QuantFormat format, std::span<float> residual)
    : network_(network), ring_(std::move(ring)), key_(key), data_(data), format_(format), residual_(residual) {
  n_ = static_cast<int>(ring_.size());
  const auto at = std::find(ring_.begin(), ring_.end(), network.self()) - ring_.begin();
  PEERTRAIN_CHECK(at < n_, "peer ", network.self(), " is not on the all-reduce ring");
  PEERTRAIN_CHECK(residual_.empty() || residual_.size() == data_.size(), "a residual of ", residual_.size(), " for ",
                  data_.size(), " values");
  position_ = static_cast<int>(at);
  next_ = ring_[static_cast<std::size_t>((position_ + 1) % n_)];
  previous_ = ring_[static_cast<std::size_t>((position_ + n_ - 1) % n_)];
  stages_ = n_ == 1 || data_.empty() ? 0 : 2 * (n_ - 1);
}

RingReduction::~RingReduction() {
  if (!send_.valid()) return;
  try {
    send_.wait();
  } catch (const Error&) {
  }
}

// Chunk c covers [begin(c), begin(c + 1)); sizes differ by at most one element (as ring_allreduce).
std::span<float> RingReduction::chunk(int c) const {
  c = ((c % n_) + n_) % n_;
  auto begin = [&](int i) { return data_.size() * static_cast<std::size_t>(i) / static_cast<std::size_t>(n_); };
  return data_.subspan(begin(c), begin(c + 1) - begin(c));
}

void RingReduction::quantize_out(std::span<const float> values, std::size_t offset) {
  read_back_.resize(values.size());
  net::Payload out;
  quantize(format_, values, out, read_back_);
  if (!residual_.empty())
    for (std::size_t i = 0; i < values.size(); ++i) residual_[offset + i] += values[i] - read_back_[i];
  forward_ = std::move(out);
}

void RingReduction::send_stage() {
  const bool gather = stage_ >= n_ - 1;
  const int s = gather ? stage_ - (n_ - 1) : stage_;
  const auto tag = static_cast<std::uint32_t>(gather ? n_ + s : s);
  const std::span<float> out = gather ? chunk(position_ + 1 - s) : chunk(position_ - s);
  if (format_ == QuantFormat::kNone) {
    send_ = network_.send(next_, net::MessageType::kReduceChunk, key_, tag, net::as_bytes(out));
    return;
  }
  if (!gather || s == 0) {
    // A partial sum, or this peer's finished chunk: quantized here. The finished chunk
    // becomes what every other peer will read, so all end with the same sum.
    quantize_out(out, static_cast<std::size_t>(out.data() - data_.data()));
    if (gather) std::copy(read_back_.begin(), read_back_.end(), out.begin());
  }
  // (Later all-gather stages forward the bytes they received, untouched.)
  send_ =
      network_.send(next_, net::MessageType::kReduceChunk, key_, tag, std::move(forward_));  // owned: not needed after
}

void RingReduction::take(const net::Payload& in) {
  const bool gather = stage_ >= n_ - 1;
  const int s = gather ? stage_ - (n_ - 1) : stage_;
  const std::span<float> into = gather ? chunk(position_ - s) : chunk(position_ - s - 1);
  dequantize(format_, in, into, /*add=*/!gather, network_.peer_name(previous_));
}

bool RingReduction::advance(bool wait) {
  if (!sent_) {
    send_stage();
    sent_ = true;
  }
  // The next stage may change what this one's send reads: it moves on only once that is out.
  if (!wait && !send_.done()) return false;
  const bool gather = stage_ >= n_ - 1;
  const auto tag = static_cast<std::uint32_t>(gather ? n_ + stage_ - (n_ - 1) : stage_);
  std::optional<net::Payload> in;
  if (wait)
    in = receive_unless_broken(tag);
  else
    in = network_.try_receive(previous_, net::MessageType::kReduceChunk, key_, tag);
  if (!in) return false;
  take(*in);
  if (stage_ >= n_ - 1 && format_ != QuantFormat::kNone)
    forward_ = std::move(*in);  // the all-gather passes these bytes on, untouched
  else
    network_.recycle(std::move(*in));
  send_.wait();
  sent_ = false;
  ++stage_;
  return true;
}

// Waits in slices: a ring with a lost peer cannot complete, so a peer waiting on a live
// neighbour (which gave up itself) stops as soon as its transport counts any peer of the
// ring lost, rather than after the whole peer timeout.
net::Payload RingReduction::receive_unless_broken(std::uint32_t tag) {
  const auto start = RunClock::now();
  for (;;) {
    const double left = network_.peer_timeout_s() - seconds_since(start);
    try {
      return network_.receive(previous_, net::MessageType::kReduceChunk, key_, tag, std::clamp(left, 0.001, 0.25));
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kTimeout || left <= 0.25) throw;
      for (int p : ring_)
        if (p != network_.self() && !network_.alive(p))
          throw Error(ErrorKind::kPeerLost, str(network_.peer_name(p), " is lost, so the ring all-reduce for step ",
                                                key_, " cannot complete"));
    }
  }
}

bool RingReduction::progress() {
  while (!done() && advance(false)) {
  }
  return done();
}

void RingReduction::finish() {
  while (!done()) advance(true);
  if (send_.valid()) send_.wait();
}

}  // namespace peertrain::algo
