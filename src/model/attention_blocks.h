// The two implementations behind attention_block::accumulate and accumulate_backward
// (internal to the model module; the tests reach in to check each against the oracle).
//
// portable: Eigen products on 64-token tiles and a per-query softmax loop; any head_dim,
//   any CPU. The serial twin the fused kernels are tested against.
// avx512:   fused FlashAttention-style kernels (register-blocked products, the online
//   softmax in base 2 between them, no T×T buffer), built where the compiler targets
//   AVX-512 and run for head_dim a multiple of 16 up to 128.
//
// Both follow the contract of attention.h (any tq and tk, keys in ascending position) with
// one generalisation: a token's head vector need not follow the previous token's. Strides
// give the distance in floats: head_dim for the [batch][head][token][head_dim] tensors of
// attention.h, 3·heads·head_dim for q, k, v read straight from the qkv projection.
#pragma once

#include <cstddef>

namespace peertrain::model {

struct Strides {
  std::ptrdiff_t q;    // q and dq
  std::ptrdiff_t kv;   // k, v, dk and dv
  std::ptrdiff_t out;  // out and dout
  static Strides contiguous(int head_dim) { return {head_dim, head_dim, head_dim}; }
};

// Whether attention_block runs the fused kernels where they apply: yes, unless the
// environment says PEERTRAIN_KERNELS=portable (to compare, or to rule them out) or a test
// turned them off. Thread-safe; a change applies to the calls that start after it.
bool fused_kernels_enabled();
void set_fused_kernels_enabled(bool enabled);

namespace portable {
bool accumulate(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k, const float* v,
                const int* k_positions, bool causal, float* max, float* sum, float* acc, const Strides& ld);
void accumulate_backward(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k,
                         const float* v, const int* k_positions, bool causal, const float* lse, const float* delta,
                         const float* dout, float* dq, float* dk, float* dv, const Strides& ld);
}  // namespace portable

namespace avx512 {
// True when this build has the fused kernels and they handle head_dim.
bool supports(int head_dim);
bool accumulate(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k, const float* v,
                const int* k_positions, bool causal, float* max, float* sum, float* acc, const Strides& ld);
void accumulate_backward(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k,
                         const float* v, const int* k_positions, bool causal, const float* lse, const float* delta,
                         const float* dout, float* dq, float* dk, float* dv, const Strides& ld);
}  // namespace avx512

}  // namespace peertrain::model
