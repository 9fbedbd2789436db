#include "peertrain/device/device_ring_attention.h"

#include <cstring>
#include <span>

#include "peertrain/core/error.h"

namespace peertrain::device {
namespace {

// Layout of a travelling block: k, v (rows·tokens·head_dim each), then the positions as
// float-sized words (the group moves bytes; nothing adds them), then dk, dv (backward).
struct BlockLayout {
  std::size_t tensor, k, v, positions, dk, dv, forward_floats, backward_floats;
  explicit BlockLayout(const kernels::AttentionDims& d)
      : tensor(static_cast<std::size_t>(d.rows) * d.tk * d.head_dim),
        k(0),
        v(tensor),
        positions(2 * tensor),
        dk(2 * tensor + d.tk),
        dv(3 * tensor + d.tk),
        forward_floats(2 * tensor + d.tk),
        backward_floats(4 * tensor + d.tk) {}
};

}  // namespace

DeviceRingAttention::DeviceRingAttention(comm::Group& group, kernels::Stream stream, double timeout_s)
    : group_(group), stream_(stream), timeout_s_(timeout_s) {}

void DeviceRingAttention::check(const kernels::AttentionDims& dims) const {
  if (dims.tq != dims.tk)
    throw Error(ErrorKind::kInvalidArgument, str(group_.name(), " rank ", group_.rank(), ": ring attention holds ",
                                                 dims.tq, " queries but ", dims.tk, " keys; every rank holds the same tokens"));
}

// Sends `outgoing` to the next rank and receives the previous rank's block into `incoming`.
// The order alternates by parity so that a transport matching in posting order (NCCL)
// always finds a partner.
void DeviceRingAttention::exchange(Block& outgoing, Block& incoming, std::size_t floats) {
  const int size = group_.size(), rank = group_.rank();
  const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
  kernels::synchronize(stream_);  // the kernels that wrote `outgoing` are done
  const std::span<const float> out(outgoing.data.data(), floats);
  const std::span<float> in(incoming.data.data(), floats);
  constexpr int kTag = 7;
  Work sent, received;
  if (rank % 2 == 0) {
    sent = group_.isend(next, kTag, out);
    received = group_.irecv(previous, kTag, in);
  } else {
    received = group_.irecv(previous, kTag, in);
    sent = group_.isend(next, kTag, out);
  }
  sent.wait(timeout_s_);
  received.wait(timeout_s_);
}

void DeviceRingAttention::forward(const kernels::AttentionDims& dims, const int* positions, const float* q,
                                  const float* k, const float* v, float* out, float* lse) {
  check(dims);
  const BlockLayout at(dims);
  for (Block& b : blocks_) b.data.resize(at.backward_floats, "ring attention block");
  const std::size_t rows = static_cast<std::size_t>(dims.rows) * dims.tq;
  block_out_.resize(at.tensor, "ring attention block output");
  block_lse_.resize(rows, "ring attention block lse");
  float* current = blocks_[0].data.data();
  kernels::copy_on_device(current + at.k, k, sizeof(float) * at.tensor, stream_);
  kernels::copy_on_device(current + at.v, v, sizeof(float) * at.tensor, stream_);
  kernels::copy_on_device(current + at.positions, positions, sizeof(int) * dims.tk, stream_);
  int here = 0;
  for (int step = 0; step < group_.size(); ++step) {
    float* block = blocks_[here].data.data();
    const int* block_positions = reinterpret_cast<const int*>(block + at.positions);
    if (step == 0) {
      kernels::attention_forward(stream_, dims, q, positions, block + at.k, block + at.v, block_positions, out, lse);
    } else {
      kernels::attention_forward(stream_, dims, q, positions, block + at.k, block + at.v, block_positions,
                                 block_out_.data(), block_lse_.data());
      kernels::attention_merge(stream_, dims.rows, dims.tq, dims.head_dim, out, lse, block_out_.data(),
                               block_lse_.data());
    }
    if (step + 1 < group_.size()) {
      exchange(blocks_[here], blocks_[1 - here], at.forward_floats);
      here = 1 - here;
    }
  }
  kernels::synchronize(stream_);
}

void DeviceRingAttention::backward(const kernels::AttentionDims& dims, const int* positions, const float* q,
                                   const float* k, const float* v, const float* out, const float* lse,
                                   const float* dout, float* dq, float* dk, float* dv) {
  check(dims);
  const BlockLayout at(dims);
  for (Block& b : blocks_) b.data.resize(at.backward_floats, "ring attention block");
  delta_.resize(static_cast<std::size_t>(dims.rows) * dims.tq, "ring attention delta");
  kernels::attention_backward_delta(stream_, dims.rows, dims.tq, dims.head_dim, out, dout, delta_.data());
  kernels::zero(dq, sizeof(float) * at.tensor, stream_);
  float* current = blocks_[0].data.data();
  kernels::copy_on_device(current + at.k, k, sizeof(float) * at.tensor, stream_);
  kernels::copy_on_device(current + at.v, v, sizeof(float) * at.tensor, stream_);
  kernels::copy_on_device(current + at.positions, positions, sizeof(int) * dims.tk, stream_);
  kernels::zero(current + at.dk, sizeof(float) * 2 * at.tensor, stream_);
  int here = 0;
  // Size steps: the block's gradients are added here, then it moves on; after the last
  // hop every rank holds its own block again, with the contributions of every query.
  for (int step = 0; step < group_.size(); ++step) {
    float* block = blocks_[here].data.data();
    kernels::attention_backward(stream_, dims, q, positions, block + at.k, block + at.v,
                                reinterpret_cast<const int*>(block + at.positions), lse, delta_.data(), dout, dq,
                                block + at.dk, block + at.dv);
    if (group_.size() > 1) {
      exchange(blocks_[here], blocks_[1 - here], at.backward_floats);
      here = 1 - here;
    }
  }
  const float* home = blocks_[here].data.data();
  kernels::copy_on_device(dk, home + at.dk, sizeof(float) * at.tensor, stream_);
  kernels::copy_on_device(dv, home + at.dv, sizeof(float) * at.tensor, stream_);
  kernels::synchronize(stream_);
}

}  // namespace peertrain::device
