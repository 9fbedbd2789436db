// One pre-norm transformer block, x + Attn(LN1(x)) then x + MLP(LN2(x)), forward and
// backward, written once over a backend of operations. The CPU model (Eigen, layers.h) and
// the device model (CUDA kernels, or their CPU emulator) each supply a backend, so the
// order of the operations, what is saved and the scratch they share exist in one
// place and the two models are serial twins by construction.
//
// A backend `Ops` provides, every matrix column-major with one column per held token
// (n = batch·tokens):
//   float* scratch(int slot, std::size_t floats)   slots 0..2, reused between calls
//   void copy(float* dst, const float* src, std::size_t floats)
//   void layernorm_forward(d, n, x, gamma, beta, y, mean, rstd)
//   void layernorm_backward(d, n, x, mean, rstd, gamma, dy, dresidual_or_null, dx, dgamma, dbeta)
//   void linear_forward(in, out, n, w, b, x, y)                  y = W·x + b
//   void linear_residual_forward(in, out, n, w, b, x, r, y)      y = r + W·x + b
//   void linear_backward(in, out, n, w, x, dy, dw, db, dx)       dW += dy·xᵀ, db += Σ dy, dx = Wᵀ·dy
//   void linear_gelu_forward(in, out, n, w, b, x, h, g)          h = W·x + b, g = GELU(h)
//   void linear_gelu_backward(in, out, n, w, x, dy, dw, db, h, dx)
//                              linear_backward whose dx is (Wᵀ·dy) ⊙ GELU'(h): x = GELU(h)
//   void attention_forward(qkv, out, lse)                for the batch it was made for: qkv
//                                                        (3a × n: q, k, v rows), out a × n
//   void attention_backward(qkv, out, lse, dout, dqkv)   overwrites dqkv (3a × n)
//   void all_reduce(float* x, std::size_t floats)                sum over the tensor-parallel
//                                                                ranks (called only when tp > 1)
// The split backward (block_backward_input, block_backward_weight) also passes null for
// the pieces of linear_backward and layernorm_backward a pass does not compute.
//
// Tensor parallelism (Megatron, Shoeybi et al. 2019) is the same code on a shard of the
// block: rank r of T holds heads/T heads (their q, k and v rows of qkv, their columns of the
// output projection) and hidden/T rows of fc with the matching columns of fc2, `p` and `g`
// pointing at that shard laid out as a smaller block (model/tensor_shard.h). The two
// row-parallel layers (proj, fc2) give partial sums that one all_reduce completes in the
// forward (Megatron's g); the two column-parallel layers' input gradients are completed
// by one all_reduce each in the backward (Megatron's f). The LayerNorms and the
// row-parallel biases are whole on every rank: rank 0 adds their gradients, the others
// pass null, so the ranks' gradients sum to the unsplit block's.
#pragma once

#include <algorithm>
#include <cstddef>

#include "peertrain/model/transformer_layout.h"

namespace peertrain::model {

struct BlockShape {
  int batch = 0;   // sequences (or images)
  int tokens = 0;  // held tokens of each
  int heads = 0;   // held heads: config.heads / tp_size
  int head_dim = 0;
  int d_model = 0;
  int hidden = 0;  // held MLP width: mlp_ratio·d_model / tp_size
  int tp_rank = 0, tp_size = 1;
  std::size_t columns() const { return static_cast<std::size_t>(batch) * tokens; }
  int attention_width() const { return heads * head_dim; }  // d_model / tp_size
  bool owns_replicated() const { return tp_rank == 0; }     // adds the whole tensors' gradients
  BlockSaved saved() const { return block_saved(d_model, attention_width(), hidden, heads, columns()); }
};

// tp_size must divide the heads and the MLP width (model/tensor_shard.h checks it).
inline BlockShape block_shape(const TransformerConfig& config, const TokenBatch& batch, int tp_size = 1,
                              int tp_rank = 0) {
  return {.batch = batch.batch,
          .tokens = batch.tokens,
          .heads = config.heads / tp_size,
          .head_dim = config.d_model / config.heads,
          .d_model = config.d_model,
          .hidden = config.mlp_ratio * config.d_model / tp_size,
          .tp_rank = tp_rank,
          .tp_size = tp_size};
}

// A row-parallel Linear on the residual branch: y = r + Σ_ranks W_r·x_r + b, the residual
// and the bias added once (by rank 0), the partial sums completed by one all-reduce.
template <class Ops>
void row_parallel_residual_forward(Ops& ops, const BlockShape& shape, int in, int out, int n, const float* w,
                                   const float* b, const float* x, const float* r, float* y) {
  if (shape.owns_replicated())
    ops.linear_residual_forward(in, out, n, w, b, x, r, y);
  else
    ops.linear_forward(in, out, n, w, nullptr, x, y);
  if (shape.tp_size > 1) ops.all_reduce(y, static_cast<std::size_t>(out) * n);
}

// The gradient pointer of a tensor every tensor-parallel rank holds whole: rank 0's only.
inline float* replicated(const BlockShape& shape, float* g) { return shape.owns_replicated() ? g : nullptr; }

// in: d × n (may be saved + x_in, which saves the copy). saved: saved().total floats.
template <class Ops>
void block_forward(Ops& ops, const BlockShape& shape, const BlockOffsets& o, const float* p, const float* in,
                   float* saved, float* out) {
  const int d = shape.d_model, f = shape.hidden, n = static_cast<int>(shape.columns());
  const int a = shape.attention_width();
  const std::size_t dn = static_cast<std::size_t>(d) * n;
  const BlockSaved at = shape.saved();
  float* s = saved;
  if (in != s + at.x_in) ops.copy(s + at.x_in, in, dn);
  ops.layernorm_forward(d, n, s + at.x_in, p + o.ln1_w, p + o.ln1_b, s + at.ln1, s + at.mean1, s + at.rstd1);
  // The attention reads q, k and v where the projection wrote them and writes its output
  // where proj reads it: no copy of a head on either side.
  ops.linear_forward(d, 3 * a, n, p + o.qkv_w, p + o.qkv_b, s + at.ln1, s + at.qkv);
  ops.attention_forward(s + at.qkv, s + at.att, s + at.lse);
  row_parallel_residual_forward(ops, shape, a, d, n, p + o.proj_w, p + o.proj_b, s + at.att, s + at.x_in, s + at.x_mid);
  ops.layernorm_forward(d, n, s + at.x_mid, p + o.ln2_w, p + o.ln2_b, s + at.ln2, s + at.mean2, s + at.rstd2);
  ops.linear_gelu_forward(d, f, n, p + o.fc_w, p + o.fc_b, s + at.ln2, s + at.h, s + at.g);
  row_parallel_residual_forward(ops, shape, f, d, n, p + o.fc2_w, p + o.fc2_b, s + at.g, s + at.x_mid, out);
}

// What the input-gradient pass (B) keeps for the weight-gradient pass (W), as offsets into
// one buffer: the output gradient of every layer with weights (fc2: the block's dout; fc:
// after GELU; ln2; proj: d_mid; qkv; ln1). 11·d·n floats with mlp_ratio 4 and tp 1.
struct BlockStash {
  std::size_t dout, d_hidden, d_ln2, d_mid, d_qkv, d_ln1, total;
};
inline BlockStash block_stash(const BlockShape& shape) {
  const std::size_t dn = static_cast<std::size_t>(shape.d_model) * shape.columns();
  const std::size_t an = static_cast<std::size_t>(shape.attention_width()) * shape.columns();
  BlockStash k{};
  k.dout = 0;
  k.d_hidden = dn;
  k.d_ln2 = k.d_hidden + static_cast<std::size_t>(shape.hidden) * shape.columns();
  k.d_mid = k.d_ln2 + dn;
  k.d_qkv = k.d_mid + dn;
  k.d_ln1 = k.d_qkv + 3 * an;
  k.total = k.d_ln1 + dn;
  return k;
}

// ADDS the block's parameter gradients into g and writes din. dout and din may be the same
// buffer: dout is last read before din is first written.
template <class Ops>
void block_backward(Ops& ops, const BlockShape& shape, const BlockOffsets& o, const float* p, const float* saved,
                    const float* dout, float* din, float* g) {
  const int d = shape.d_model, f = shape.hidden, n = static_cast<int>(shape.columns());
  const int a = shape.attention_width();
  const std::size_t dn = static_cast<std::size_t>(d) * n;
  const BlockSaved at = shape.saved();
  const float* s = saved;
  // MLP branch.
  float* d_hidden = ops.scratch(0, static_cast<std::size_t>(std::max(f, 3 * a)) * n);
  ops.linear_gelu_backward(f, d, n, p + o.fc2_w, s + at.g, dout, g + o.fc2_w, replicated(shape, g + o.fc2_b), s + at.h,
                           d_hidden);
  float* d_ln = ops.scratch(1, dn);
  ops.linear_backward(d, f, n, p + o.fc_w, s + at.ln2, d_hidden, g + o.fc_w, g + o.fc_b, d_ln);
  if (shape.tp_size > 1) ops.all_reduce(d_ln, dn);
  float* d_mid = ops.scratch(2, dn);
  ops.layernorm_backward(d, n, s + at.x_mid, s + at.mean2, s + at.rstd2, p + o.ln2_w, d_ln, dout, d_mid,
                         replicated(shape, g + o.ln2_w), replicated(shape, g + o.ln2_b));
  // Attention branch.
  ops.linear_backward(a, d, n, p + o.proj_w, s + at.att, d_mid, g + o.proj_w, replicated(shape, g + o.proj_b), d_ln);
  float* d_qkv = d_hidden;
  ops.attention_backward(s + at.qkv, s + at.att, s + at.lse, d_ln, d_qkv);
  ops.linear_backward(d, 3 * a, n, p + o.qkv_w, s + at.ln1, d_qkv, g + o.qkv_w, g + o.qkv_b, d_ln);
  if (shape.tp_size > 1) ops.all_reduce(d_ln, dn);
  ops.layernorm_backward(d, n, s + at.x_in, s + at.mean1, s + at.rstd1, p + o.ln1_w, d_ln, d_mid, din,
                         replicated(shape, g + o.ln1_w), replicated(shape, g + o.ln1_b));
}

// B: the input gradient alone. Writes din (which may be dout) and fills `stash`
// (block_stash(shape).total floats) for block_backward_weight. The same operations as
// block_backward, in the same order, so B then W gives its numbers bit for bit. Under
// tensor parallelism B holds both all-reduces; W needs nothing from the other ranks.
template <class Ops>
void block_backward_input(Ops& ops, const BlockShape& shape, const BlockOffsets& o, const float* p, const float* saved,
                          const float* dout, float* din, float* stash) {
  const int d = shape.d_model, f = shape.hidden, n = static_cast<int>(shape.columns());
  const int a = shape.attention_width();
  const std::size_t dn = static_cast<std::size_t>(d) * n;
  const BlockSaved at = shape.saved();
  const BlockStash k = block_stash(shape);
  const float* s = saved;
  ops.copy(stash + k.dout, dout, dn);  // fc2's W reads it; din may overwrite dout below
  // MLP branch.
  ops.linear_gelu_backward(f, d, n, p + o.fc2_w, nullptr, dout, nullptr, nullptr, s + at.h, stash + k.d_hidden);
  ops.linear_backward(d, f, n, p + o.fc_w, nullptr, stash + k.d_hidden, nullptr, nullptr, stash + k.d_ln2);
  if (shape.tp_size > 1) ops.all_reduce(stash + k.d_ln2, dn);
  ops.layernorm_backward(d, n, s + at.x_mid, s + at.mean2, s + at.rstd2, p + o.ln2_w, stash + k.d_ln2, stash + k.dout,
                         stash + k.d_mid, nullptr, nullptr);
  // Attention branch.
  float* d_ln = ops.scratch(1, dn);
  ops.linear_backward(a, d, n, p + o.proj_w, nullptr, stash + k.d_mid, nullptr, nullptr, d_ln);
  ops.attention_backward(s + at.qkv, s + at.att, s + at.lse, d_ln, stash + k.d_qkv);
  ops.linear_backward(d, 3 * a, n, p + o.qkv_w, nullptr, stash + k.d_qkv, nullptr, nullptr, stash + k.d_ln1);
  if (shape.tp_size > 1) ops.all_reduce(stash + k.d_ln1, dn);
  ops.layernorm_backward(d, n, s + at.x_in, s + at.mean1, s + at.rstd1, p + o.ln1_w, stash + k.d_ln1, stash + k.d_mid,
                         din, nullptr, nullptr);
}

// W: ADDS the block's parameter gradients into g from what B stashed. Nothing waits for
// it, which is what lets a zero-bubble schedule put it into the pipeline's idle time.
template <class Ops>
void block_backward_weight(Ops& ops, const BlockShape& shape, const BlockOffsets& o, const float* p, const float* saved,
                           const float* stash, float* g) {
  const int d = shape.d_model, f = shape.hidden, n = static_cast<int>(shape.columns());
  const int a = shape.attention_width();
  const BlockSaved at = shape.saved();
  const BlockStash k = block_stash(shape);
  const float* s = saved;
  const bool owner = shape.owns_replicated();
  ops.linear_backward(f, d, n, nullptr, s + at.g, stash + k.dout, g + o.fc2_w, replicated(shape, g + o.fc2_b), nullptr);
  ops.linear_backward(d, f, n, nullptr, s + at.ln2, stash + k.d_hidden, g + o.fc_w, g + o.fc_b, nullptr);
  if (owner)
    ops.layernorm_backward(d, n, s + at.x_mid, s + at.mean2, s + at.rstd2, p + o.ln2_w, stash + k.d_ln2, nullptr,
                           nullptr, g + o.ln2_w, g + o.ln2_b);
  ops.linear_backward(a, d, n, nullptr, s + at.att, stash + k.d_mid, g + o.proj_w, replicated(shape, g + o.proj_b),
                      nullptr);
  ops.linear_backward(d, 3 * a, n, nullptr, s + at.ln1, stash + k.d_qkv, g + o.qkv_w, g + o.qkv_b, nullptr);
  if (owner)
    ops.layernorm_backward(d, n, s + at.x_in, s + at.mean1, s + at.rstd1, p + o.ln1_w, stash + k.d_ln1, nullptr,
                           nullptr, g + o.ln1_w, g + o.ln1_b);
}

}  // namespace peertrain::model
