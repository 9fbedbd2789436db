// Ring self-attention on devices, the CUDA twin of parallel::RingAttention's online-softmax
// mode (ring-flash-attention): each rank of a comm::Group keeps the queries of its tokens,
// the K/V blocks (and their positions) travel around the ring by send/recv, each arriving
// block is attended with kernels::attention_forward and folded in by attention_merge; in
// backward the dK/dV of a block travel with it and arrive home after the full circle.
//
// Every buffer is device memory ([rows][tokens][head_dim], rows = batch·heads) and every
// rank holds the same number of tokens. The group's operations must act on device memory:
// comm::NcclGroup on GPUs (pass its stream(rank) as `stream`, so that kernels and NCCL
// transfers are ordered on one stream), or a ThreadGroup over the CPU emulator's memory in
// the tests. Each rank posts its sends and receives in the same order (sends first on even
// ranks, receives first on odd ones), which is what NCCL's in-order matching needs.
#pragma once

#include "peertrain/kernels/device.h"
#include "peertrain/kernels/ops.h"
#include "peertrain/comm/group.h"

namespace peertrain::device {

class DeviceRingAttention {
 public:
  DeviceRingAttention(comm::Group& group, kernels::Stream stream, double timeout_s = comm::kDefaultTimeoutS);

  // dims.tq = dims.tk = this rank's tokens. positions: device, this rank's global
  // positions (ascending). Writes out and lse (whole-sequence attention of the local queries).
  void forward(const kernels::AttentionDims& dims, const int* positions, const float* q, const float* k, const float* v,
               float* out, float* lse);
  // Overwrites dq, dk, dv of the local tokens.
  void backward(const kernels::AttentionDims& dims, const int* positions, const float* q, const float* k,
                const float* v, const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv);

 private:
  struct Block {  // one travelling K/V block: k, v, positions (as float bits), dk, dv
    kernels::DeviceArray<float> data;
  };
  void exchange(Block& outgoing, Block& incoming, std::size_t floats);
  void check(const kernels::AttentionDims& dims) const;

  comm::Group& group_;
  kernels::Stream stream_;
  double timeout_s_;
  Block blocks_[2];
  kernels::DeviceArray<float> block_out_, block_lse_, delta_;
};

}  // namespace peertrain::device
