// Online-softmax attention: the block kernels' dispatch (fused AVX-512 or portable), the
// single-rank core, and the head-splitting bridge from the layers' token-major tensors.
#include "peertrain/model/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "attention_blocks.h"
#include "layers.h"
#include "peertrain/core/aligned.h"
#include "peertrain/core/error.h"

namespace peertrain::model {
namespace {

constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();
// Queries per call of the block kernels from LocalAttention: the state (max, sum, acc) of
// one tile lives on the stack of the call, whatever the sequence length.
constexpr int kQueryTile = 64;

std::atomic<bool>& fused_kernels_flag() {
  static std::atomic<bool> enabled = [] {
    const char* choice = std::getenv("PEERTRAIN_KERNELS");
    return choice == nullptr || std::string_view(choice) != "portable";
  }();
  return enabled;
}
bool fused(int head_dim) { return fused_kernels_flag().load(std::memory_order_relaxed) && avx512::supports(head_dim); }
}  // namespace

bool fused_kernels_enabled() { return fused_kernels_flag().load(); }
void set_fused_kernels_enabled(bool enabled) { fused_kernels_flag().store(enabled); }

namespace {

bool accumulate(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k, const float* v,
                const int* k_positions, bool causal, float* max, float* sum, float* acc, const Strides& ld) {
  if (fused(head_dim))
    return avx512::accumulate(head_dim, tq, tk, q, q_positions, k, v, k_positions, causal, max, sum, acc, ld);
  return portable::accumulate(head_dim, tq, tk, q, q_positions, k, v, k_positions, causal, max, sum, acc, ld);
}

void accumulate_backward(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k,
                         const float* v, const int* k_positions, bool causal, const float* lse, const float* delta,
                         const float* dout, float* dq, float* dk, float* dv, const Strides& ld) {
  if (fused(head_dim))
    return avx512::accumulate_backward(head_dim, tq, tk, q, q_positions, k, v, k_positions, causal, lse, delta, dout,
                                       dq, dk, dv, ld);
  portable::accumulate_backward(head_dim, tq, tk, q, q_positions, k, v, k_positions, causal, lse, delta, dout, dq, dk,
                                dv, ld);
}

// finish and backward_delta with out's columns ld floats apart.
void finish_strided(int head_dim, int tq, const float* max, const float* sum, const float* acc, float* out,
                    std::ptrdiff_t ld, float* lse) {
  for (int j = 0; j < tq; ++j) {
    float* o = out + ld * j;
    const float* a = acc + static_cast<std::ptrdiff_t>(head_dim) * j;
    if (sum[j] == 0.0f) {
      std::fill(o, o + head_dim, 0.0f);
      lse[j] = kMinusInfinity;
      continue;
    }
    const float inverse = 1.0f / sum[j];
    for (int c = 0; c < head_dim; ++c) o[c] = a[c] * inverse;
    lse[j] = max[j] + std::log(sum[j]);
  }
}

void delta_strided(int head_dim, int tq, const float* out, const float* dout, std::ptrdiff_t ld, float* delta) {
  for (int j = 0; j < tq; ++j) {
    const float *o = out + ld * j, *g = dout + ld * j;
    float dot = 0.0f;
    for (int c = 0; c < head_dim; ++c) dot += o[c] * g[c];
    delta[j] = dot;
  }
}

}  // namespace

namespace attention_block {

void start(int head_dim, int tq, float* max, float* sum, float* acc) {
  std::fill(max, max + tq, kMinusInfinity);
  std::fill(sum, sum + tq, 0.0f);
  std::fill(acc, acc + static_cast<std::ptrdiff_t>(head_dim) * tq, 0.0f);
}

bool accumulate(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k, const float* v,
                const int* k_positions, bool causal, float* max, float* sum, float* acc) {
  return model::accumulate(head_dim, tq, tk, q, q_positions, k, v, k_positions, causal, max, sum, acc,
                           Strides::contiguous(head_dim));
}

void finish(int head_dim, int tq, const float* max, const float* sum, const float* acc, float* out, float* lse) {
  finish_strided(head_dim, tq, max, sum, acc, out, head_dim, lse);
}

void backward_delta(int head_dim, int tq, const float* out, const float* dout, float* delta) {
  delta_strided(head_dim, tq, out, dout, head_dim, delta);
}

void accumulate_backward(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k,
                         const float* v, const int* k_positions, bool causal, const float* lse, const float* delta,
                         const float* dout, float* dq, float* dk, float* dv) {
  model::accumulate_backward(head_dim, tq, tk, q, q_positions, k, v, k_positions, causal, lse, delta, dout, dq, dk, dv,
                             Strides::contiguous(head_dim));
}

}  // namespace attention_block

namespace {

void check_shape(const AttentionShape& shape, std::span<const int> positions) {
  if (shape.batch < 0 || shape.heads <= 0 || shape.head_dim <= 0 || shape.tokens < 0)
    throw Error(ErrorKind::kInvalidArgument, str("attention: bad shape batch ", shape.batch, " heads ", shape.heads,
                                                 " head_dim ", shape.head_dim, " tokens ", shape.tokens));
  if (static_cast<int>(positions.size()) != shape.tokens)
    throw Error(ErrorKind::kInvalidArgument,
                str("attention: ", positions.size(), " positions for ", shape.tokens, " tokens"));
}

// Where the (sequence, head) blocks of the tensors lie: block (b, h) of q starts at
// q + b·batch + h·head, its tokens ld.q floats apart; likewise k, v and their gradients
// (ld.kv), out and dout (out_batch, out_head, ld.out).
struct Layout {
  std::ptrdiff_t batch, head, out_batch, out_head;
  Strides ld;
};

// attention.h's [batch][head][token][head_dim] tensors.
Layout heads_layout(const AttentionShape& s) {
  const std::ptrdiff_t block = static_cast<std::ptrdiff_t>(s.tokens) * s.head_dim;
  return {block * s.heads, block, block * s.heads, block, Strides::contiguous(s.head_dim)};
}

// The layers' token-major columns: qkv rows [q heads | k heads | v heads], out rows [heads].
Layout token_major_layout(const AttentionShape& s) {
  const std::ptrdiff_t width = static_cast<std::ptrdiff_t>(s.heads) * s.head_dim;
  return {3 * width * s.tokens, s.head_dim, width * s.tokens, s.head_dim, {3 * width, 3 * width, width}};
}

struct Inputs {
  const float *q, *k, *v;
};

// One (sequence, head) block gathered into contiguous tokens. The kernels can read the
// token-major columns in place (their strides allow it), but then a key tile spans 64
// columns 3·width floats apart; gathered, it is 64 consecutive head vectors. Side by side
// on the GPT step (d 128, T 256), 4 alternating pairs: gathering 0.5-5 % faster. A block
// (T × head_dim) stays in L2, and no global head-layout tensor is written.
struct BlockBuffers {
  AlignedVector<float> q, k, v, dout, dq, dk, dv;
};
BlockBuffers& block_buffers() {
  thread_local BlockBuffers b;
  return b;
}
const float* gather(int tokens, int d, const float* x, std::ptrdiff_t ld, AlignedVector<float>& to) {
  to.resize(static_cast<std::size_t>(tokens) * d);
  for (int t = 0; t < tokens; ++t) std::copy_n(x + ld * t, d, to.data() + static_cast<std::ptrdiff_t>(d) * t);
  return to.data();
}
void scatter(int tokens, int d, const AlignedVector<float>& from, float* x, std::ptrdiff_t ld) {
  for (int t = 0; t < tokens; ++t) std::copy_n(from.data() + static_cast<std::ptrdiff_t>(d) * t, d, x + ld * t);
}
float* zeroed(std::size_t floats, AlignedVector<float>& buffer) {
  buffer.assign(floats, 0.0f);
  return buffer.data();
}

void forward_in(const AttentionShape& shape, std::span<const int> positions, const Layout& at, Inputs in, float* out,
                float* lse) {
  const int T = shape.tokens, d = shape.head_dim;
  const bool spread = at.ld.q != d || at.ld.kv != d;
  const Strides ld{d, d, at.ld.out};  // the kernels read contiguous blocks
  AlignedVector<float> max(kQueryTile), sum(kQueryTile), acc(static_cast<std::size_t>(kQueryTile) * d);
  BlockBuffers& buffers = block_buffers();
  const int* pos = positions.data();
  for (int b = 0; b < shape.batch; ++b)
    for (int h = 0; h < shape.heads; ++h) {
      const std::ptrdiff_t x = b * at.batch + h * at.head;
      const float *Q = in.q + x, *K = in.k + x, *V = in.v + x;
      if (spread) {
        Q = gather(T, d, Q, at.ld.q, buffers.q);
        K = gather(T, d, K, at.ld.kv, buffers.k);
        V = gather(T, d, V, at.ld.kv, buffers.v);
      }
      float* O = out + b * at.out_batch + h * at.out_head;
      float* L = lse + (static_cast<std::ptrdiff_t>(b) * shape.heads + h) * T;
      for (int q0 = 0; q0 < T; q0 += kQueryTile) {
        const int tq = std::min(kQueryTile, T - q0);
        attention_block::start(d, tq, max.data(), sum.data(), acc.data());
        // Every key at once: the kernels tile them, and stop where the causal mask hides the rest.
        accumulate(d, tq, T, Q + static_cast<std::ptrdiff_t>(d) * q0, pos + q0, K, V, pos, shape.causal, max.data(),
                   sum.data(), acc.data(), ld);
        finish_strided(d, tq, max.data(), sum.data(), acc.data(), O + at.ld.out * q0, at.ld.out, L + q0);
      }
    }
}

// Writes dq, dk and dv where the blocks lie (every element of a block).
void backward_in(const AttentionShape& shape, std::span<const int> positions, const Layout& at, Inputs in,
                 const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  const int T = shape.tokens, d = shape.head_dim;
  const std::size_t block = static_cast<std::size_t>(T) * d;
  const bool spread = at.ld.q != d || at.ld.kv != d || at.ld.out != d;
  const Strides ld = Strides::contiguous(d);
  AlignedVector<float> delta(kQueryTile);
  BlockBuffers& buffers = block_buffers();
  const int* pos = positions.data();
  for (int b = 0; b < shape.batch; ++b)
    for (int h = 0; h < shape.heads; ++h) {
      const std::ptrdiff_t x = b * at.batch + h * at.head, o = b * at.out_batch + h * at.out_head;
      const float *Q = in.q + x, *K = in.k + x, *V = in.v + x, *dO = dout + o;
      float *dQ = dq + x, *dK = dk + x, *dV = dv + x;
      if (spread) {
        Q = gather(T, d, Q, at.ld.q, buffers.q);
        K = gather(T, d, K, at.ld.kv, buffers.k);
        V = gather(T, d, V, at.ld.kv, buffers.v);
        dO = gather(T, d, dO, at.ld.out, buffers.dout);
        dQ = zeroed(block, buffers.dq);
        dK = zeroed(block, buffers.dk);
        dV = zeroed(block, buffers.dv);
      } else {
        for (float* g : {dQ, dK, dV}) std::fill(g, g + block, 0.0f);
      }
      const float* L = lse + (static_cast<std::ptrdiff_t>(b) * shape.heads + h) * T;
      for (int q0 = 0; q0 < T; q0 += kQueryTile) {
        const int tq = std::min(kQueryTile, T - q0);
        const std::ptrdiff_t at_q = static_cast<std::ptrdiff_t>(d) * q0;
        delta_strided(d, tq, out + o + at.ld.out * q0, dout + o + at.ld.out * q0, at.ld.out, delta.data());
        accumulate_backward(d, tq, T, Q + at_q, pos + q0, K, V, pos, shape.causal, L + q0, delta.data(), dO + at_q,
                            dQ + at_q, dK, dV, ld);
      }
      if (spread) {
        scatter(T, d, buffers.dq, dq + x, at.ld.q);
        scatter(T, d, buffers.dk, dk + x, at.ld.kv);
        scatter(T, d, buffers.dv, dv + x, at.ld.kv);
      }
    }
}

// Head-layout copies of token-major tensors, for a core that computes on the heads layout.
struct HeadBuffers {
  AlignedVector<float> q, k, v, out, dout, dq, dk, dv;
};
HeadBuffers& head_buffers() {
  thread_local HeadBuffers b;
  return b;
}

}  // namespace

void AttentionCore::forward_qkv(const AttentionShape& shape, std::span<const int> positions, const float* qkv,
                                float* out, float* lse) {
  const std::size_t size = static_cast<std::size_t>(shape.elements());
  const int width = shape.heads * shape.head_dim;
  HeadBuffers& b = head_buffers();
  for (auto* x : {&b.q, &b.k, &b.v, &b.out}) x->resize(size);
  for (int part = 0; part < 3; ++part)
    layers::split_heads(shape.batch, shape.tokens, shape.heads, shape.head_dim, 3 * width, part * width, qkv,
                        (part == 0   ? b.q
                         : part == 1 ? b.k
                                     : b.v)
                            .data());
  forward(shape, positions, b.q.data(), b.k.data(), b.v.data(), b.out.data(), lse);
  layers::merge_heads(shape.batch, shape.tokens, shape.heads, shape.head_dim, width, 0, b.out.data(), out);
}

void AttentionCore::backward_qkv(const AttentionShape& shape, std::span<const int> positions, const float* qkv,
                                 const float* out, const float* lse, const float* dout, float* dqkv) {
  const std::size_t size = static_cast<std::size_t>(shape.elements());
  const int B = shape.batch, T = shape.tokens, H = shape.heads, d = shape.head_dim, width = H * d;
  HeadBuffers& b = head_buffers();
  for (auto* x : {&b.q, &b.k, &b.v, &b.out, &b.dout, &b.dq, &b.dk, &b.dv}) x->resize(size);
  layers::split_heads(B, T, H, d, 3 * width, 0, qkv, b.q.data());
  layers::split_heads(B, T, H, d, 3 * width, width, qkv, b.k.data());
  layers::split_heads(B, T, H, d, 3 * width, 2 * width, qkv, b.v.data());
  layers::split_heads(B, T, H, d, width, 0, out, b.out.data());
  layers::split_heads(B, T, H, d, width, 0, dout, b.dout.data());
  backward(shape, positions, b.q.data(), b.k.data(), b.v.data(), b.out.data(), lse, b.dout.data(), b.dq.data(),
           b.dk.data(), b.dv.data());
  layers::merge_heads(B, T, H, d, 3 * width, 0, b.dq.data(), dqkv);
  layers::merge_heads(B, T, H, d, 3 * width, width, b.dk.data(), dqkv);
  layers::merge_heads(B, T, H, d, 3 * width, 2 * width, b.dv.data(), dqkv);
}

void LocalAttention::forward(const AttentionShape& shape, std::span<const int> positions, const float* q,
                             const float* k, const float* v, float* out, float* lse) {
  check_shape(shape, positions);
  forward_in(shape, positions, heads_layout(shape), {q, k, v}, out, lse);
}

void LocalAttention::backward(const AttentionShape& shape, std::span<const int> positions, const float* q,
                              const float* k, const float* v, const float* out, const float* lse, const float* dout,
                              float* dq, float* dk, float* dv) {
  check_shape(shape, positions);
  backward_in(shape, positions, heads_layout(shape), {q, k, v}, out, lse, dout, dq, dk, dv);
}

void LocalAttention::forward_qkv(const AttentionShape& shape, std::span<const int> positions, const float* qkv,
                                 float* out, float* lse) {
  check_shape(shape, positions);
  const std::ptrdiff_t width = static_cast<std::ptrdiff_t>(shape.heads) * shape.head_dim;
  forward_in(shape, positions, token_major_layout(shape), {qkv, qkv + width, qkv + 2 * width}, out, lse);
}

void LocalAttention::backward_qkv(const AttentionShape& shape, std::span<const int> positions, const float* qkv,
                                  const float* out, const float* lse, const float* dout, float* dqkv) {
  check_shape(shape, positions);
  const std::ptrdiff_t width = static_cast<std::ptrdiff_t>(shape.heads) * shape.head_dim;
  backward_in(shape, positions, token_major_layout(shape), {qkv, qkv + width, qkv + 2 * width}, out, lse, dout, dqkv,
              dqkv + width, dqkv + 2 * width);
}

}  // namespace peertrain::model
