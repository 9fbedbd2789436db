// A pre-norm transformer (GPT-2 style) with hand-written forward and backward passes in
// Eigen, float32, reading its parameters from the flat buffer that gossip mixes:
//   gpt: byte embedding + learned positions → L blocks → final LayerNorm → LM head
//        (tied to the byte embedding or not) → softmax cross-entropy on the next byte;
//   vit: patches of a 28×28 image → linear patch embedding + learned positions → L blocks
//        → final LayerNorm → mean pooling over the patches → classifier → cross-entropy.
// A block is x + Attn(LN1(x)), then x + MLP(LN2(x)) with MLP = Linear(d,4d) → GELU(tanh)
// → Linear(4d,d); attention is causal for gpt and not for vit.
//
// The model is a chain of units — unit 0 the embedding, units 1..L the blocks, unit L+1
// the final norm, head and loss — each with its parameters in one contiguous range of the
// flat buffer, so a pipeline stage (a run of units) owns a contiguous range. Activations
// between units are d_model × N column-major, one held token per column, N = batch ·
// tokens, sequence-major (column b·tokens + t).
//
// Sequence parallelism: a rank may hold only some tokens of each sequence (TokenBatch::
// positions); every layer but attention is per token, attention goes through the
// AttentionCore (LocalAttention, or parallel::RingAttention over the sequence group), and
// vit's mean pooling sums over the group. Losses are sums over the held targets divided by
// TokenBatch::loss_divisor, so the gradients of the micro-batches and sequence ranks of a
// step add up to the gradient of the step's mean loss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "peertrain/core/aligned.h"
#include "peertrain/core/parameter_store.h"
#include "peertrain/model/attention.h"

namespace peertrain::comm {
class Group;
}

namespace peertrain::model {

struct TransformerLayout;  // model/transformer_layout.h

enum class TransformerKind { kGpt, kVit };

struct TransformerConfig {
  TransformerKind kind = TransformerKind::kGpt;
  int d_model = 128;
  int layers = 4;
  int heads = 4;
  int seq = 256;          // gpt: context length (positions); vit: set from the patch size
  int vocab = 256;        // gpt
  bool tied_head = false; // gpt: the LM head reuses the byte embedding
  int image = 28;         // vit: square images, image × image pixels
  int patch = 7;          // vit: 7 → 16 tokens, 4 → 49 tokens
  int classes = 10;       // vit
  int mlp_ratio = 4;
  int tokens() const { return kind == TransformerKind::kVit ? (image / patch) * (image / patch) : seq; }
};

// Throws Error(kInvalidArgument) naming the flag: heads must divide d_model, patch must
// divide image, sizes positive.
void validate(const TransformerConfig& config);

// One micro-batch as one rank sees it.
struct TokenBatch {
  int batch = 0;                       // sequences (gpt) or images (vit)
  int tokens = 0;                      // tokens of each sequence held by this rank
  std::span<const int> positions;      // [tokens]: global positions, ascending
  std::span<const std::int32_t> bytes; // gpt: [batch × tokens] input bytes, sequence-major
  std::span<const float> pixels;       // vit: [batch × image²] normalised images (whole images)
  // gpt: [batch × tokens] the next byte of each held token; vit: [batch] class labels.
  std::span<const std::int32_t> targets;
  double loss_divisor = 1;  // the number of targets of the whole step, over every rank and micro-batch
};

// Bad input at the model's boundary (the CPU and the device models both call it): throws
// kInvalidArgument naming the field, the index and the expected range.
void check_batch(const TransformerConfig& config, const TokenBatch& batch);

// What one unit keeps from forward for its backward, for one micro-batch. Reused between
// micro-batches without reallocation once large enough.
struct UnitActivations {
  AlignedVector<float> buffer;   // at Eigen's alignment: see core/aligned.h
  AlignedVector<float> scratch;  // not needed after forward; excluded from activation_bytes()
  // Kept by backward_input for backward_weight (the output gradients of the unit's layers).
  AlignedVector<float> stash;
  std::size_t activation_bytes() const { return (buffer.size() + stash.size()) * sizeof(float); }
};

// Where the units reach their collaborators.
struct UnitContext {
  AttentionCore* attention = nullptr;     // null: a LocalAttention owned by the model
  comm::Group* sequence_group = nullptr;  // null or size 1: this rank holds whole sequences
  // Tensor parallelism (model/tensor_shard.h): a block runs on this rank's shard of its
  // heads and MLP width, with one all-reduce over the group per sub-layer each way. The
  // embedding and the head are whole on every rank, which compute them alike; keep one
  // rank's gradient of them (the pipeline engine keeps rank 0's). Null or size 1: whole.
  comm::Group* tensor_group = nullptr;
  double timeout_s = 60;
  // gpt under vocabulary parallelism (parallel/vocab_parallel.h): the token lookup and the
  // output layer with its loss run outside, split over the pipeline's stages. Unit 0's
  // forward then reads the looked-up token vectors from `in` and adds the positions, and
  // its backward gives only wpe's gradient; the last unit stops at ln_f, writing its
  // output y to `out` and returning 0, and its backward starts from dout = ∂loss/∂y.
  bool vocabulary_outside = false;
};

struct ParameterRange {
  std::size_t offset = 0;
  std::size_t size = 0;
};

// Sums over the examples of an evaluate() call, so calls over shards add up.
struct LossSums {
  double loss_sum = 0;    // nats, summed over targets
  long long correct = 0;  // vit: correctly classified images; gpt: correctly predicted bytes
  long long count = 0;    // targets
};

class Transformer {
 public:
  explicit Transformer(TransformerConfig config);
  ~Transformer();
  Transformer(Transformer&&) noexcept;
  Transformer& operator=(Transformer&&) noexcept;

  const TransformerConfig& config() const { return config_; }
  std::size_t num_parameters() const;
  int num_units() const { return config_.layers + 2; }
  ParameterRange unit_parameters(int unit) const;
  std::string unit_name(int unit) const;  // "embedding", "block 3", "head"
  // Where each tensor lives in the flat buffer (model/transformer_layout.h).
  const TransformerLayout& layout() const;

  // Names and shapes in buffer order, e.g. "wte" (d × vocab), "wpe" (d × seq),
  // "h0.ln1.weight" (d × 1), "h0.attn.qkv.weight" (3d × d), … — documented in the .cpp and
  // matched by tests/make_transformer_reference.py.
  void register_parameters(ParameterStore& store) const;
  // GPT-2's initialisation (N(0, 0.02), residual projections scaled by 1/√(2L), LayerNorm
  // 1 and 0, biases 0) except the embeddings, N(0, 1) (N(0, 1/d_model) when the head is
  // tied), drawn in buffer order from peertrain::Rng(seed).
  void initialize(std::span<float> params, std::uint64_t seed) const;

  // One unit, one micro-batch. `in`: d × N (ignored by unit 0), `out`: d × N (ignored by
  // the last unit). Returns the unit's loss contribution (the last unit; 0 for the others).
  float forward(int unit, std::span<const float> params, const TokenBatch& batch, const float* in, float* out,
                UnitActivations& saved, const UnitContext& context);
  // dout: d × N gradient of the loss w.r.t. this unit's output (ignored by the last unit,
  // which starts from its loss). Writes din (d × N; ignored for unit 0) and ADDS the unit's
  // parameter gradients into grads (the flat layout). The tied head adds into the
  // embedding's range as well.
  void backward(int unit, std::span<const float> params, const TokenBatch& batch, const float* dout, float* din,
                UnitActivations& saved, std::span<float> grads, const UnitContext& context);

  // The backward split in two, for the zero-bubble schedules (Qi et al., ICLR 2024):
  // backward_input (B) writes din as backward does and keeps in saved.stash what the
  // weight gradient needs; backward_weight (W), later, ADDS the unit's parameter gradients.
  // B then W gives backward's numbers bit for bit. Between them saved holds both the
  // activations and the stash (activation_bytes() counts it).
  void backward_input(int unit, std::span<const float> params, const TokenBatch& batch, const float* dout, float* din,
                      UnitActivations& saved, const UnitContext& context);
  void backward_weight(int unit, std::span<const float> params, const TokenBatch& batch, UnitActivations& saved,
                       std::span<float> grads, const UnitContext& context);

  // Every unit on one rank: returns the loss and ADDS its gradient into grads.
  float forward_backward(std::span<const float> params, const TokenBatch& batch, std::span<float> grads,
                         const UnitContext& context = {});
  // Forward only, whole sequences, no gradients; sums for loss / accuracy / bits per byte.
  LossSums evaluate(std::span<const float> params, const TokenBatch& batch);

  // FLOPs of one forward+backward over batch·tokens tokens (GEMMs and attention; the
  // causal mask halves the attention's).
  double flops_per_step(int batch, int tokens) const;

  // Bytes one forward+backward moves through memory outside the GEMMs and the attention's
  // arithmetic: every other operator reading its inputs and writing its outputs once
  // (LayerNorms, GELU, bias gradients, the attention's gathers and scatters, the loss, the
  // residuals the GEMMs add), the optimizer not included. Without fused epilogues (see
  // gemm_fuses_epilogues) it adds the bias and residual fills the GEMMs accumulate onto, the
  // zero fills of the GEMMs that overwrite, the GELU's own passes over its input, and the bias
  // gradients' passes over dy. Activations of these sizes do not stay in
  // cache between operators, so bytes / memory bandwidth is a floor on the time the step
  // spends outside its FLOPs (docs/performance.md).
  double other_bytes_per_step(int batch, int tokens, bool fused_epilogues) const;

 private:
  struct Impl;
  TransformerConfig config_;
  std::unique_ptr<Impl> impl_;
};

// Whether a CPU step on one thread runs the GEMM of our own (an AVX-512 build), whose
// stores add the bias and the residual, overwrite without a zero fill and apply the GELU;
// with more threads, or without AVX-512, Eigen's GEMM runs and those are passes of their own.
bool gemm_fuses_epilogues();

}  // namespace peertrain::model
