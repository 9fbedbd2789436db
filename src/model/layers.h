// The transformer's layer kernels, each a forward and a hand-written backward on raw
// float32 buffers (internal to the model module; the tests call them one by one).
//
// Every activation is features × columns, column-major, one token (or image) per column,
// the column of token t of sequence b at b·tokens + t. Weights are d_out × d_in column-major
// slices of the flat parameter buffer, so a Linear is one GEMM W·X over every column.
// Backward functions ADD parameter gradients (the flat gradient buffer accumulates over
// micro-batches); input gradients are overwritten unless the function says otherwise.
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>

#include "gemm.h"

namespace peertrain::model::layers {

// The Linear layers' GEMM (gemm.h); transformer.cpp and the tests name it layers::Gemm.
using model::Gemm;

// y (out×n) = W·x + b.
void linear_forward(Gemm& gemm, int in, int out, int n, const float* w, const float* b, const float* x, float* y);
// y (out×n) = residual + W·x + b: a Linear on a residual branch (y may not alias x).
void linear_residual_forward(Gemm& gemm, int in, int out, int n, const float* w, const float* b, const float* x,
                             const float* residual, float* y);
// dW += dy·xᵀ, db += row sums of dy, dx = Wᵀ·dy. Any of dw, db and dx may be null, and is
// then not computed: the input gradient alone is a zero-bubble schedule's B pass, dW and db
// alone its W pass (x is then unused by B, w by W).
void linear_backward(Gemm& gemm, int in, int out, int n, const float* w, const float* x, const float* dy, float* dw,
                     float* db, float* dx);

inline constexpr float kLayerNormEps = 1e-5f;  // torch.nn.LayerNorm's default

// y = (x − mean)·rstd·gamma + beta per column (biased variance, like PyTorch); mean and
// rstd (n each) are kept for the backward.
void layernorm_forward(int d, int n, const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd);
// dgamma += Σ dy·x̂, dbeta += Σ dy, and dx = residual + rstd·(dy·γ − mean(dy·γ) −
// x̂·mean(dy·γ·x̂)): residual is the gradient arriving through the skip connection (null:
// none; it may be dx itself). dx may not alias dy. dx null: only the parameter gradients
// (W); dgamma and dbeta null: only dx (B).
void layernorm_backward(int d, int n, const float* x, const float* mean, const float* rstd, const float* gamma,
                        const float* dy, const float* residual, float* dx, float* dgamma, float* dbeta);

// h = W·x + b and g = GELU(h), in one pass over h (the GELU in the GEMM's stores).
void linear_gelu_forward(Gemm& gemm, int in, int out, int n, const float* w, const float* b, const float* x, float* h,
                         float* g);
// linear_backward for a layer whose input is GELU(h): dW += dy·xᵀ, db += Σ dy, and
// dx = (Wᵀ·dy) ⊙ GELU'(h), the GELU's backward in the GEMM's stores.
void linear_gelu_backward(Gemm& gemm, int in, int out, int n, const float* w, const float* x, const float* dy,
                          float* dw, float* db, const float* h, float* dx);

// GELU with the tanh approximation (GPT-2; torch's approximate='tanh').
void gelu_forward(std::size_t count, const float* x, float* y);
// dx = dy · gelu'(x).
void gelu_backward(std::size_t count, const float* x, const float* dy, float* dx);

// Between the token layout (rows × batch·tokens, the head's block of rows at row_offset +
// h·head_dim) and the attention layout [batch][head][token][head_dim].
void split_heads(int batch, int tokens, int heads, int head_dim, int rows, int row_offset, const float* x,
                 float* heads_out);
void merge_heads(int batch, int tokens, int heads, int head_dim, int rows, int row_offset, const float* heads_in,
                 float* x);

// out[:, b·tokens + t] = wte[:, ids[b·tokens + t]] + wpe[:, positions[t]]; wte is d × vocab.
void token_embedding_forward(int d, int batch, int tokens, const std::int32_t* ids, const int* positions,
                             const float* wte, const float* wpe, float* out);
void token_embedding_backward(int d, int batch, int tokens, const std::int32_t* ids, const int* positions,
                              const float* dout, float* dwte, float* dwpe);

// The held patches of whole images: column b·tokens + t is patch positions[t] of image b
// (patches numbered row by row), its patch² pixels row by row. pixels: batch × image².
void gather_patches(int image, int patch, int batch, int tokens, const int* positions, const float* pixels,
                    float* out);
// out[:, b·tokens + t] += wpe[:, positions[t]], and its backward dwpe += Σ_b dout.
void add_positions(int d, int batch, int tokens, const int* positions, const float* wpe, float* out);
void add_positions_backward(int d, int batch, int tokens, const int* positions, const float* dout, float* dwpe);

// pooled (d × batch) = Σ_t x[:, b·tokens + t] (the sum; the caller divides, possibly after an
// all-reduce over sequence ranks), and dx[:, b·tokens + t] = scale · dpooled[:, b].
void sum_pool_forward(int d, int batch, int tokens, const float* x, float* pooled);
void sum_pool_backward(int d, int batch, int tokens, const float* dpooled, float scale, float* dx);

// Softmax cross-entropy over the columns of logits (classes × n), in place: each column
// becomes (softmax − onehot(target))·grad_scale. Returns Σ −log softmax[target] in double
// and adds the columns whose argmax is the target to *correct.
double softmax_cross_entropy(int classes, int n, float* logits, const std::int32_t* targets, float grad_scale,
                             long long* correct);

// Row sums of x (rows × n) added into sums (gemm.h's, which the GEMM's Eigen path uses too).
using model::add_row_sums;

}  // namespace peertrain::model::layers
