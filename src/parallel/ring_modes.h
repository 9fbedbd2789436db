// The two ways RingAttention computes, private to src/parallel: ring_online.cpp (online
// softmax, Liu et al. 2023) and ring_rsa.cpp (Ring Self-Attention, Li et al. 2021).
#pragma once

#include <cstddef>

#include "peertrain/comm/group.h"
#include "peertrain/model/attention.h"
#include "ring_pass.h"

namespace peertrain::parallel::detail {

// What one forward or backward call works with; shape and positions are checked already.
struct RingCall {
  comm::Group& group;
  double timeout_s;
  int block_tokens;
  const model::AttentionShape& shape;
  const int* positions;  // [shape.tokens], ascending
  MemoryMeter& meter;
  long long& work;
};

void online_forward(const RingCall& call, const float* q, const float* k, const float* v, float* out, float* lse);
void online_backward(const RingCall& call, const float* q, const float* k, const float* v, const float* out,
                     const float* lse, const float* dout, float* dq, float* dk, float* dv);
std::size_t online_planned_bytes(const model::AttentionShape& local, int ranks, bool backward, int block_tokens);
int online_units(const model::AttentionShape& local, int block_tokens);

void rsa_forward(const RingCall& call, const float* q, const float* k, const float* v, float* out, float* lse);
void rsa_backward(const RingCall& call, const float* q, const float* k, const float* v, const float* out,
                  const float* lse, const float* dout, float* dq, float* dk, float* dv);
std::size_t rsa_planned_bytes(const model::AttentionShape& local, int ranks, bool backward);

}  // namespace peertrain::parallel::detail
