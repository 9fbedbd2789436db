// Scaled dot-product attention over the tokens one rank holds, computed block by block with
// the online softmax of FlashAttention / Ring Attention (Milakov & Gimelshein 2018; Liu et
// al. 2023): a running maximum and sum of exponentials per query, so that no full T×T score
// matrix is ever held; the backward pass recomputes the scores from the saved log-sum-exp.
//
// Layout: a tensor is [batch][head][token][head_dim], contiguous, so the block of sequence
// b and head h is a head_dim × tokens column-major matrix (one token per column) starting
// at ((b·heads + h)·tokens)·head_dim. The log-sum-exp is [batch][head][token].
//
// Causal masking is by position, not by index: positions[t] is the place in the whole
// sequence of the t-th token this rank holds, so the same code serves the whole sequence,
// a contiguous chunk of it, or the two zigzag chunks of a sequence-parallel rank. A query
// at position i sees the keys at positions j ≤ i.
#pragma once

#include <span>

namespace peertrain::model {

struct AttentionShape {
  int batch = 1;
  int heads = 1;
  int head_dim = 1;
  int tokens = 1;  // held by this rank, per sequence
  bool causal = true;
  long long elements() const { return static_cast<long long>(batch) * heads * tokens * head_dim; }
  long long rows() const { return static_cast<long long>(batch) * heads * tokens; }  // lse entries
};

// How the attention layer reaches the sequence: LocalAttention when one rank holds it all,
// parallel::RingAttention when it is split over a group.
class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  // out = softmax(QKᵀ/√head_dim, masked) V over the whole sequence; lse saved for backward.
  virtual void forward(const AttentionShape& shape, std::span<const int> positions, const float* q, const float* k,
                       const float* v, float* out, float* lse) = 0;
  // Overwrites dq, dk, dv with the gradients of the loss, given dout and what forward saved.
  virtual void backward(const AttentionShape& shape, std::span<const int> positions, const float* q,
                        const float* k, const float* v, const float* out, const float* lse, const float* dout,
                        float* dq, float* dk, float* dv) = 0;

  // The same on the layers' token-major tensors, one column per token, sequence after
  // sequence: qkv is the qkv projection's output (3·heads·head_dim rows: every head's q,
  // then every head's k, then v), out and dout have heads·head_dim rows, dqkv is written
  // like qkv. The default copies the heads out into the layout above and back;
  // LocalAttention reads and writes the columns in place.
  virtual void forward_qkv(const AttentionShape& shape, std::span<const int> positions, const float* qkv, float* out,
                           float* lse);
  virtual void backward_qkv(const AttentionShape& shape, std::span<const int> positions, const float* qkv,
                            const float* out, const float* lse, const float* dout, float* dqkv);
};

class LocalAttention final : public AttentionCore {
 public:
  void forward(const AttentionShape& shape, std::span<const int> positions, const float* q, const float* k,
               const float* v, float* out, float* lse) override;
  void backward(const AttentionShape& shape, std::span<const int> positions, const float* q, const float* k,
                const float* v, const float* out, const float* lse, const float* dout, float* dq, float* dk,
                float* dv) override;
  void forward_qkv(const AttentionShape& shape, std::span<const int> positions, const float* qkv, float* out,
                   float* lse) override;
  void backward_qkv(const AttentionShape& shape, std::span<const int> positions, const float* qkv, const float* out,
                    const float* lse, const float* dout, float* dqkv) override;
};

// The block kernels both cores are built from, for one (sequence, head): a query block of
// tq tokens against a key/value block of tk tokens. Matrices are head_dim × tokens.
namespace attention_block {

// Running state of the queries of one block: max[tq], sum[tq] (of exp(score − max)), and
// the unnormalised output acc (head_dim × tq). start() sets max = −inf, sum = 0, acc = 0.
void start(int head_dim, int tq, float* max, float* sum, float* acc);
// Folds one key/value block into the running state. Returns false when the causal mask hid
// every key of the block from every query (nothing was computed).
bool accumulate(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k,
                const float* v, const int* k_positions, bool causal, float* max, float* sum, float* acc);
// out = acc / sum, lse = max + log(sum). A query that saw no key gets out = 0, lse = −inf.
void finish(int head_dim, int tq, const float* max, const float* sum, const float* acc, float* out, float* lse);

// delta[t] = Σ_d dout[d,t]·out[d,t]: the softmax backward's row term, once per query block.
void backward_delta(int head_dim, int tq, const float* out, const float* dout, float* delta);
// Adds this key/value block's share: dq += …, dk += …, dv += … (they are not cleared).
void accumulate_backward(int head_dim, int tq, int tk, const float* q, const int* q_positions, const float* k,
                         const float* v, const int* k_positions, bool causal, const float* lse, const float* delta,
                         const float* dout, float* dq, float* dk, float* dv);

}  // namespace attention_block
}  // namespace peertrain::model
