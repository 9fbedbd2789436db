// Internal to the device module: the device backend of model/block_composition.h
// (kernels/ops.h on one stream) and the GPT's head over it, shared by the whole-model
// DeviceTransformer (device_transformer.cpp) and the pipeline's stages
// (device_pipeline.cpp), so the two compose the same kernels in the same order.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "peertrain/device/device_ring_attention.h"
#include "peertrain/kernels/device.h"
#include "peertrain/kernels/ops.h"
#include "peertrain/core/error.h"
#include "peertrain/model/block_composition.h"
#include "peertrain/model/device_model.h"
#include "peertrain/model/transformer_layout.h"

namespace peertrain::device::detail {

using kernels::DeviceArray;
using kernels::PinnedArray;

inline kernels::GemmPrecision precision(model::GemmMode mode) {
  switch (mode) {
    case model::GemmMode::kTf32:
      return kernels::GemmPrecision::kTf32;
    case model::GemmMode::kBf16:
      return kernels::GemmPrecision::kBf16;
    case model::GemmMode::kFp32:
      break;
  }
  return kernels::GemmPrecision::kFp32;
}

inline const char* gemm_name(model::GemmMode mode) {
  return mode == model::GemmMode::kTf32 ? "tf32" : mode == model::GemmMode::kBf16 ? "bf16" : "fp32";
}

// The device backend of model/block_composition.h: kernels/ops.h on the compute stream,
// attention around the sequence group's ring when there is one.
struct DeviceBlockOps {
  kernels::Stream stream;
  kernels::Blas& blas;
  std::span<DeviceArray<float>, 5> slots;
  DeviceArray<float>& delta;  // the attention backward's row sums of dout·out
  DeviceRingAttention* ring;  // null: whole sequences
  kernels::AttentionDims dims;
  const int* positions;  // device
  int batch;             // sequences

  float* scratch(int slot, std::size_t floats) {
    slots[static_cast<std::size_t>(slot)].resize(floats, "block scratch");
    return slots[static_cast<std::size_t>(slot)].data();
  }
  void copy(float* dst, const float* src, std::size_t floats) {
    kernels::copy_on_device(dst, src, sizeof(float) * floats, stream);
  }
  template <class... A>
  void layernorm_forward(A... a) {
    kernels::layernorm_forward(stream, a...);
  }
  template <class... A>
  void layernorm_backward(A... a) {
    kernels::layernorm_backward(stream, a...);
  }
  void linear_forward(int in, int out, int n, const float* w, const float* b, const float* x, float* y) {
    blas.gemm(false, false, out, n, in, w, x, y, false);
    if (b != nullptr) kernels::add_bias(stream, out, n, b, y);
  }
  void linear_residual_forward(int in, int out, int n, const float* w, const float* b, const float* x,
                               const float* residual, float* y) {
    kernels::copy_on_device(y, residual, sizeof(float) * out * n, stream);
    blas.gemm(false, false, out, n, in, w, x, y, true);
    if (b != nullptr) kernels::add_bias(stream, out, n, b, y);
  }
  void linear_backward(int in, int out, int n, const float* w, const float* x, const float* dy, float* dw, float* db,
                       float* dx) {
    blas.gemm(false, true, out, in, n, dy, x, dw, true);
    if (db != nullptr) kernels::add_row_sums(stream, out, n, dy, db);
    if (dx != nullptr) blas.gemm(true, false, in, n, out, w, dy, dx, false);
  }
  // The GELU is a kernel of its own after the GEMM here (cuBLAS has no such epilogue).
  void linear_gelu_forward(int in, int out, int n, const float* w, const float* b, const float* x, float* h, float* g) {
    linear_forward(in, out, n, w, b, x, h);
    kernels::gelu_forward(stream, static_cast<std::size_t>(out) * n, h, g);
  }
  void linear_gelu_backward(int in, int out, int n, const float* w, const float* x, const float* dy, float* dw,
                            float* db, const float* h, float* dx) {
    linear_backward(in, out, n, w, x, dy, dw, db, dx);
    if (dx != nullptr) kernels::gelu_backward(stream, static_cast<std::size_t>(in) * n, h, dx, dx);
  }
  // The device model splits no block over tensor-parallel ranks (block_shape's tp is 1).
  void all_reduce(float*, std::size_t) { PEERTRAIN_CHECK(false, "device model: no tensor parallelism"); }
  // The composition hands attention the token-major qkv and wants the token-major output;
  // the device kernels compute on the [batch][head][token][head_dim] layout, so the heads
  // are split out into slots 3 and 4 (which the composition leaves free) and merged back.
  int heads() const { return dims.rows / batch; }
  std::size_t head_floats() const { return static_cast<std::size_t>(dims.rows) * dims.tq * dims.head_dim; }
  void split(const float* x, int rows, int offset, float* heads_out) {
    kernels::split_heads(stream, batch, dims.tq, heads(), dims.head_dim, rows, offset, x, heads_out);
  }
  void merge(const float* heads_in, int rows, int offset, float* x) {
    kernels::merge_heads(stream, batch, dims.tq, heads(), dims.head_dim, rows, offset, heads_in, x);
  }
  void attention_forward(const float* qkv, float* out, float* lse) {
    const std::size_t an = head_floats();
    const int a = heads() * dims.head_dim;
    float* h = scratch(3, 4 * an);  // q, k, v, out
    for (int part = 0; part < 3; ++part) split(qkv, 3 * a, part * a, h + part * an);
    if (ring != nullptr)
      ring->forward(dims, positions, h, h + an, h + 2 * an, h + 3 * an, lse);
    else
      kernels::attention_forward(stream, dims, h, positions, h + an, h + 2 * an, positions, h + 3 * an, lse);
    merge(h + 3 * an, a, 0, out);
  }
  void attention_backward(const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv) {
    const std::size_t an = head_floats();
    const int a = heads() * dims.head_dim;
    float* h = scratch(3, 5 * an);   // q, k, v, out, dout
    float* dh = scratch(4, 3 * an);  // dq, dk, dv
    for (int part = 0; part < 3; ++part) split(qkv, 3 * a, part * a, h + part * an);
    split(out, a, 0, h + 3 * an);
    split(dout, a, 0, h + 4 * an);
    const float *q = h, *k = h + an, *v = h + 2 * an, *o = h + 3 * an, *dO = h + 4 * an;
    float *dq = dh, *dk = dh + an, *dv = dh + 2 * an;
    if (ring != nullptr) {
      ring->backward(dims, positions, q, k, v, o, lse, dO, dq, dk, dv);
    } else {
      delta.resize(static_cast<std::size_t>(dims.rows) * dims.tq, "attention delta");
      kernels::attention_backward_delta(stream, dims.rows, dims.tq, dims.head_dim, o, dO, delta.data());
      for (float* d : {dq, dk, dv}) kernels::zero(d, sizeof(float) * an, stream);
      kernels::attention_backward(stream, dims, q, positions, k, v, positions, lse, delta.data(), dO, dq, dk, dv);
    }
    for (int part = 0; part < 3; ++part) merge(dh + part * an, 3 * a, part * a, dqkv);
  }
};

// Whole-sequence causal attention over a batch of the GPT, as both device models run it:
// --gemm-precision bf16 puts its forward on the tensor cores as well.
inline kernels::AttentionDims attention_dims(const model::TransformerConfig& config, const model::TokenBatch& batch,
                                             kernels::GemmPrecision gemm) {
  return {.rows = batch.batch * config.heads,
          .tq = batch.tokens,
          .tk = batch.tokens,
          .head_dim = config.d_model / config.heads,
          .causal = true,
          .precision = gemm == kernels::GemmPrecision::kBf16 ? kernels::AttentionPrecision::kBf16
                                                             : kernels::AttentionPrecision::kFp32};
}

// The head's buffers for one batch: ln_f's output and statistics, the logits (which
// become their gradient), each column's loss and whether its prediction was right.
struct HeadBuffers {
  DeviceArray<float> y, mean, rstd, logits, losses;
  DeviceArray<int> correct;
};

// Where the head's tensors are, in one buffer of parameters and its twin of gradients:
// ln_f's weight and bias, and the output matrix — wte (d × vocab, the logits are wteᵀ·y)
// for a tied head, lm_head (vocab × d) otherwise. A pipeline stage keeps wte apart.
struct HeadTensors {
  std::size_t lnf_w = 0, lnf_b = 0;
  const float* out = nullptr;  // wte or lm_head
  float* d_out = nullptr;      // its gradient
};
inline HeadTensors head_tensors(const model::TransformerConfig& config, const model::TransformerLayout& layout,
                                const float* p, float* g) {
  const std::size_t out = config.tied_head ? layout.wte : layout.head_w;
  return {layout.lnf_w, layout.lnf_b, p + out, g != nullptr ? g + out : nullptr};
}

// The head over x (d × n): final LayerNorm, logits, softmax cross-entropy with the
// targets; the logits become their gradient times grad_scale (0: evaluation). p holds
// ln_f at t's offsets.
inline void head_forward(DeviceBlockOps& ops, const model::TransformerConfig& config, const HeadTensors& t,
                         const float* p, const float* x, int n, const std::int32_t* targets, float grad_scale,
                         HeadBuffers& h) {
  const int d = config.d_model;
  const std::size_t dn = static_cast<std::size_t>(d) * n, vn = static_cast<std::size_t>(config.vocab) * n;
  h.y.resize(dn, "head: ln_f output");
  h.mean.resize(static_cast<std::size_t>(n), "head: ln_f mean");
  h.rstd.resize(static_cast<std::size_t>(n), "head: ln_f 1/sigma");
  h.logits.resize(vn, "logits");
  h.losses.resize(static_cast<std::size_t>(n), "losses");
  h.correct.resize(static_cast<std::size_t>(n), "correct");
  kernels::layernorm_forward(ops.stream, d, n, x, p + t.lnf_w, p + t.lnf_b, h.y.data(), h.mean.data(), h.rstd.data());
  if (config.tied_head)
    ops.blas.gemm(true, false, config.vocab, n, d, t.out, h.y.data(), h.logits.data(), false);
  else
    ops.blas.gemm(false, false, config.vocab, n, d, t.out, h.y.data(), h.logits.data(), false);
  kernels::softmax_cross_entropy(ops.stream, config.vocab, n, h.logits.data(), targets, grad_scale, h.losses.data(),
                                 h.correct.data());
}

// The head's backward from the logits' gradient that head_forward left: adds into
// t.d_out the output matrix's gradient and into g (at t's offsets) ln_f's; writes dx, the
// gradient of its input x. dy: d × n scratch (LayerNorm's backward may not write where it
// reads).
inline void head_backward(DeviceBlockOps& ops, const model::TransformerConfig& config, const HeadTensors& t,
                          const float* p, const float* x, int n, const HeadBuffers& h, float* dy, float* dx, float* g) {
  const int d = config.d_model;
  if (config.tied_head) {
    ops.blas.gemm(false, true, d, config.vocab, n, h.y.data(), h.logits.data(), t.d_out, true);
    ops.blas.gemm(false, false, d, n, config.vocab, t.out, h.logits.data(), dy, false);
  } else {
    ops.linear_backward(d, config.vocab, n, t.out, h.y.data(), h.logits.data(), t.d_out, nullptr, dy);
  }
  kernels::layernorm_backward(ops.stream, d, n, x, h.mean.data(), h.rstd.data(), p + t.lnf_w, dy, nullptr, dx,
                              g + t.lnf_w, g + t.lnf_b);
}

}  // namespace peertrain::device::detail
