// The kernels, each beside its CPU twin in src/model/layers.h under the same name and with
// the same layout (llm.c's arrangement): activations are features × columns, column-major,
// one token per column; attention tensors are [batch·head][token][head_dim]. Every pointer
// is device memory; every call is asynchronous on `stream`. Backward kernels ADD parameter
// gradients and overwrite input gradients, as the CPU layers do. Tolerances against the
// CPU path are stated in kernels/NOTES.md and enforced by tests/kernels/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "peertrain/kernels/device.h"

namespace peertrain::kernels {

// --- GEMM (cuBLAS; a plain loop in the emulator) ----------------------------------------
// kFp32 is exact float32 arithmetic; kTf32 and kBf16 round the inputs to TF32 (10-bit
// mantissa) or BF16 (7-bit) inside the tensor cores and accumulate in float32.
enum class GemmPrecision { kFp32, kTf32, kBf16 };

// C (m×n) ← op(A)·op(B) (+ C when accumulate), column-major, like model::Gemm::run.
class Blas {
 public:
  explicit Blas(Stream stream, GemmPrecision precision = GemmPrecision::kFp32);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, const float* b, float* c, bool accumulate);
  Stream stream() const { return stream_; }
  GemmPrecision precision() const { return precision_; }

 private:
  Stream stream_;
  GemmPrecision precision_;
  void* handle_ = nullptr;  // cublasHandle_t
};

// --- element-wise and per-row --------------------------------------------------------
// y[r, c] += bias[r] for a rows × cols matrix.
void add_bias(Stream stream, int rows, int cols, const float* bias, float* y);
// sums[r] += Σ_c x[r, c]: the bias gradient.
void add_row_sums(Stream stream, int rows, int cols, const float* x, float* sums);
// y += x, element-wise.
void add(Stream stream, std::size_t count, const float* x, float* y);
void gelu_forward(Stream stream, std::size_t count, const float* x, float* y);
void gelu_backward(Stream stream, std::size_t count, const float* x, const float* dy, float* dx);

// --- LayerNorm (biased variance, eps 1e-5, like torch.nn.LayerNorm) --------------------
void layernorm_forward(Stream stream, int d, int n, const float* x, const float* gamma, const float* beta, float* y,
                       float* mean, float* rstd);
// dx = residual + the LayerNorm input gradient (residual may be null, or dx itself);
// dgamma and dbeta accumulate. dx may not alias dy.
void layernorm_backward(Stream stream, int d, int n, const float* x, const float* mean, const float* rstd,
                        const float* gamma, const float* dy, const float* residual, float* dx, float* dgamma,
                        float* dbeta);

// --- token embedding ---------------------------------------------------------------------
// out[:, b·tokens + t] = wte[:, ids[b·tokens + t]] + wpe[:, positions[t]].
void token_embedding_forward(Stream stream, int d, int batch, int tokens, const std::int32_t* ids, const int* positions,
                             const float* wte, const float* wpe, float* out);
// dwte and dwpe accumulate (atomically: columns that share a byte or a position add up).
void token_embedding_backward(Stream stream, int d, int batch, int tokens, const std::int32_t* ids,
                              const int* positions, const float* dout, float* dwte, float* dwpe);

// --- heads -----------------------------------------------------------------------------
// Between the token layout (rows × batch·tokens, head h at row_offset + h·head_dim) and
// the attention layout [batch][head][token][head_dim].
void split_heads(Stream stream, int batch, int tokens, int heads, int head_dim, int rows, int row_offset,
                 const float* x, float* heads_out);
void merge_heads(Stream stream, int batch, int tokens, int heads, int head_dim, int rows, int row_offset,
                 const float* heads_in, float* x);

// --- softmax cross-entropy -------------------------------------------------------------
// Over the columns of logits (classes × n), in place: each column becomes (softmax −
// onehot(target))·grad_scale; loss[j] = −log softmax[target] and correct[j] = 1 when the
// first largest logit is the target's. The caller sums loss and correct (on the host).
void softmax_cross_entropy(Stream stream, int classes, int n, float* logits, const std::int32_t* targets,
                           float grad_scale, float* loss, int* correct);

// --- attention block (flash-style, online softmax) -------------------------------------
// One query chunk of tq tokens against one key/value chunk of tk tokens, for each of
// `rows` (batch·heads) independent (sequence, head) pairs. q: [rows][tq][head_dim],
// k, v: [rows][tk][head_dim]; positions are global and ascending, and a causal query at
// position i sees keys at positions ≤ i. head_dim must be 16, 32 or 64.
// kFp32: CUDA cores, FP32 throughout (the reference). kBf16: the forward on the tensor
// cores, Q, K, V and the probabilities rounded to BF16, sums in FP32 (FlashAttention-2's
// numerics); the backward stays FP32 and recomputes the scores from the saved lse.
enum class AttentionPrecision { kFp32, kBf16 };
struct AttentionDims {
  int rows = 1;
  int tq = 1;
  int tk = 1;
  int head_dim = 32;
  bool causal = true;
  AttentionPrecision precision = AttentionPrecision::kFp32;
};
bool attention_supports(int head_dim);
// out and lse of this block alone: a query that sees no key gets out 0, lse −inf.
void attention_forward(Stream stream, const AttentionDims& dims, const float* q, const int* q_positions, const float* k,
                       const float* v, const int* k_positions, float* out, float* lse);
// The tensor-core forward's tilings: which matrix instruction (mma.sync, any GPU from
// Ampere on, or Hopper's warpgroup wgmma, compute capability 9.0 only), warps and queries
// per block, keys per shared tile. attention_forward with AttentionPrecision::kBf16 uses
// attention_default_tiling() (the wgmma kernel where the device runs it); kernels_bench compares them all and the tests
// check each.
enum class TensorCoreInstruction { kMmaSync, kWgmma };
struct AttentionTiling {
  TensorCoreInstruction instruction;
  int warps;
  int queries;
  int key_tile;
};
std::span<const AttentionTiling> attention_tilings();
std::size_t attention_default_tiling();
// attention_forward on the tensor cores (dims.precision is ignored) with tiling
// attention_tilings()[tiling] (a wgmma tiling where the device has no wgmma is refused);
// with operands_only, only its first pass (FP32 → BF16
// operands) runs, so that a benchmark can time the two passes apart.
void attention_forward_tiled(Stream stream, const AttentionDims& dims, std::size_t tiling, bool operands_only,
                             const float* q, const int* q_positions, const float* k, const float* v,
                             const int* k_positions, float* out, float* lse);
// Merges a block's (out, lse) into the running (out, lse) by log-sum-exp, the
// ring-flash-attention merge: out ← out·e^(lse−l) + block·e^(block_lse−l), l = log(e^lse + e^block_lse).
void attention_merge(Stream stream, int rows, int tq, int head_dim, float* out, float* lse, const float* block_out,
                     const float* block_lse);
// delta[r] = Σ_d dout·out over each query row (rows·tq of them).
void attention_backward_delta(Stream stream, int rows, int tq, int head_dim, const float* out, const float* dout,
                              float* delta);
// Adds this key/value block's share to dq, dk and dv, recomputing the scores from the
// saved (whole-sequence) lse; they are not cleared.
void attention_backward(Stream stream, const AttentionDims& dims, const float* q, const int* q_positions,
                        const float* k, const float* v, const int* k_positions, const float* lse, const float* delta,
                        const float* dout, float* dq, float* dk, float* dv);

// --- optimizer updates (train/optimizer.h's rules) ------------------------------------
// v ← momentum·v + (g + wd·p); update = lr·v, or p −= lr·v when update is null.
void sgd_update(Stream stream, std::size_t count, float* params, const float* grads, float* velocity, float* update,
                float lr, float momentum, float weight_decay);
// AdamW with bias correction at step `step` (1-based): m, v updated; update = lr·(wd·p +
// m̂/(√v̂ + eps)), or p −= that when update is null.
void adamw_update(Stream stream, std::size_t count, float* params, const float* grads, float* m, float* v,
                  float* update, float lr, float beta1, float beta2, float eps, float weight_decay, float step);

// --- gossip ----------------------------------------------------------------------------
// x ← Σ_j weights[j]·inputs[j] (x may be one of the inputs), up to 64 inputs.
inline constexpr int kMaxMixInputs = 64;
void gossip_mix(Stream stream, float* x, const float* const* inputs, const float* weights, int num_inputs,
                std::size_t count);

}  // namespace peertrain::kernels
