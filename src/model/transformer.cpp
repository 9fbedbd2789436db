// The transformer assembled from the kernels of layers.h, unit by unit.
//
// The parameter layout is model/transformer_layout.h's.
//
// What a unit keeps for its backward (UnitActivations::buffer, N = batch·tokens columns):
//   embedding  gpt: nothing (the TokenBatch holds the bytes); vit: the gathered patches
//   block      x_in, ln1(x), mean1, rstd1, q, k, v, attention out (head layout), lse,
//              x_mid = x + attn, ln2(x_mid), mean2, rstd2, fc pre-activation, GELU output
//   head       x_in, ln_f(x), mean, rstd; gpt: d loss/d logits; vit: pooled, d loss/d logits
// Temporaries live in a per-thread workspace (UnitActivations::scratch is left empty), and
// the model itself is read-only after construction, so threads may call one Transformer
// concurrently as long as each passes its own UnitActivations and gradient ranges that no
// other thread adds to at the same time (the tied head adds into the embedding's range).
//
// Sequence parallelism in vit's head: the pooled vector is the all-reduced sum of every
// rank's tokens over the all-reduced token count, so each rank of the group holds the same
// logits. Each rank then reports loss / group size (so the ranks' losses add up to the
// loss), and scales the gradients of head.weight and head.bias — the same on every rank —
// by 1 / group size, because the gradient all-reduce over the group sums them. Everything
// below the pooling is per token, and its per-rank gradients add up without scaling. The
// vit loss_divisor counts each image once (not once per sequence rank).
#include "peertrain/model/transformer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>

#include "gemm_avx512.h"
#include "layers.h"
#include "peertrain/model/block_composition.h"
#include "peertrain/model/tensor_shard.h"
#include "peertrain/model/transformer_layout.h"
#include "peertrain/comm/group.h"
#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"

namespace peertrain::model {
namespace {

// Offsets of what the head saves: columns is N for gpt's logits and batch for vit's.
struct HeadSaved {
  std::size_t x_in, y, mean, rstd, pooled, dlogits, total;
};

}  // namespace

void validate(const TransformerConfig& c) {
  auto positive = [](const char* flag, int value) {
    if (value <= 0) throw Error(ErrorKind::kInvalidArgument, str("transformer: ", flag, " (", value, ") must be positive"));
  };
  positive("d_model", c.d_model);
  positive("layers", c.layers);
  positive("heads", c.heads);
  positive("mlp_ratio", c.mlp_ratio);
  if (c.d_model % c.heads != 0)
    throw Error(ErrorKind::kInvalidArgument,
                str("transformer: heads (--heads ", c.heads, ") must divide d_model (--d-model ", c.d_model, ")"));
  if (c.kind == TransformerKind::kGpt) {
    positive("seq", c.seq);
    positive("vocab", c.vocab);
  } else {
    positive("image", c.image);
    positive("patch", c.patch);
    positive("classes", c.classes);
    if (c.image % c.patch != 0)
      throw Error(ErrorKind::kInvalidArgument,
                  str("transformer: patch (--patch ", c.patch, ") must divide the ", c.image, "-pixel image side"));
  }
}

namespace {

// Temporaries of one unit's forward or backward, and forward_backward's and evaluate's own
// activations: per thread, grown on demand and reused, so that threads (pipeline stages,
// sequence ranks) may call one Transformer concurrently, each with its own UnitActivations.
struct ThreadWorkspace {
  layers::Gemm gemm;
  AlignedVector<float> slots[5];
  AlignedVector<float> shard_params, shard_grads;  // tensor parallelism: this rank's block
  // Each block's shard for (width, heads, MLP ratio, tp, rank), built once: its runs are a
  // few hundred entries, every pass of every micro-batch would otherwise rebuild them.
  std::map<std::array<std::size_t, 6>, TensorShard> shards;
  std::vector<UnitActivations> saved;
  AlignedVector<float> act_a, act_b;
};

ThreadWorkspace& thread_workspace() {
  thread_local ThreadWorkspace workspace;
  return workspace;
}

// The CPU backend of block_composition.h: the kernels of layers.h on the calling thread's
// workspace, attention through the unit's AttentionCore.
struct CpuBlockOps {
  ThreadWorkspace& w;
  AttentionCore& attention;
  AttentionShape shape;
  std::span<const int> positions;
  comm::Group* tensor_group = nullptr;
  double timeout_s = 60;

  float* scratch(int slot, std::size_t floats) {
    AlignedVector<float>& v = w.slots[slot];
    if (v.size() < floats) v.resize(floats);
    return v.data();
  }
  void copy(float* dst, const float* src, std::size_t floats) { std::memcpy(dst, src, sizeof(float) * floats); }
  template <class... A>
  void layernorm_forward(A... a) {
    layers::layernorm_forward(a...);
  }
  template <class... A>
  void layernorm_backward(A... a) {
    layers::layernorm_backward(a...);
  }
  template <class... A>
  void linear_forward(A... a) {
    layers::linear_forward(w.gemm, a...);
  }
  template <class... A>
  void linear_residual_forward(A... a) {
    layers::linear_residual_forward(w.gemm, a...);
  }
  template <class... A>
  void linear_backward(A... a) {
    layers::linear_backward(w.gemm, a...);
  }
  template <class... A>
  void linear_gelu_forward(A... a) {
    layers::linear_gelu_forward(w.gemm, a...);
  }
  template <class... A>
  void linear_gelu_backward(A... a) {
    layers::linear_gelu_backward(w.gemm, a...);
  }
  void all_reduce(float* x, std::size_t floats) { tensor_group->all_reduce({x, floats}, timeout_s); }
  void attention_forward(const float* qkv, float* out, float* lse) {
    attention.forward_qkv(shape, positions, qkv, out, lse);
  }
  void attention_backward(const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv) {
    attention.backward_qkv(shape, positions, qkv, out, lse, dout, dqkv);
  }
};

}  // namespace

// The layout, and what the units share at run time.
struct Transformer::Impl : TransformerLayout {
  LocalAttention local_attention;  // stateless; its scratch is per thread

  layers::Gemm& gemm() { return thread_workspace().gemm; }
  float* workspace(int slot, std::size_t size) {
    AlignedVector<float>& w = thread_workspace().slots[slot];
    if (w.size() < size) w.resize(size);
    return w.data();
  }
};

Transformer::Transformer(TransformerConfig config) : config_(config), impl_(std::make_unique<Impl>()) {
  validate(config_);
  if (config_.kind == TransformerKind::kVit) config_.seq = config_.tokens();
  static_cast<TransformerLayout&>(*impl_) = transformer_layout(config_);
}

Transformer::~Transformer() = default;
Transformer::Transformer(Transformer&&) noexcept = default;
Transformer& Transformer::operator=(Transformer&&) noexcept = default;

std::size_t Transformer::num_parameters() const { return impl_->total; }
const TransformerLayout& Transformer::layout() const { return *impl_; }

ParameterRange Transformer::unit_parameters(int unit) const {
  if (unit < 0 || unit >= num_units())
    throw Error(ErrorKind::kInvalidArgument, str("transformer: unit ", unit, " outside [0, ", num_units(), ")"));
  return impl_->units[static_cast<std::size_t>(unit)];
}

std::string Transformer::unit_name(int unit) const {
  unit_parameters(unit);  // range check
  if (unit == 0) return "embedding";
  if (unit == num_units() - 1) return "head";
  return str("block ", unit - 1);
}

void Transformer::register_parameters(ParameterStore& store) const {
  for (const TensorSpec& t : impl_->tensors) {
    const std::size_t index = store.add(t.name, t.rows, t.cols);
    PEERTRAIN_CHECK(store.slice(index).offset - store.slice(0).offset == t.offset, "tensor ", t.name,
                    " is at offset ", store.slice(index).offset, " in the store, ", t.offset, " in the model");
  }
}

void Transformer::initialize(std::span<float> params, std::uint64_t seed) const {
  PEERTRAIN_CHECK(params.size() == num_parameters(), "params has ", params.size(), " floats, the transformer ",
                  num_parameters());
  Rng rng(seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * config_.layers);
  // Embeddings N(0, 1), PyTorch's nn.Embedding default, not GPT-2's 0.02: with small
  // embeddings the token is a faint signal in the residual stream at first, and the byte
  // model spends its first few hundred steps finding it (measured on the fortunes text:
  // loss 3.0 against 2.6 after 200 steps). A tied head reads wte as its weight, so there
  // the scale is 1/√d_model, which keeps the first logits at unit variance.
  const double embedding_std = config_.tied_head ? 1.0 / std::sqrt(static_cast<double>(config_.d_model)) : 1.0;
  for (const TensorSpec& t : impl_->tensors) {
    float* p = params.data() + t.offset;
    const std::size_t size = static_cast<std::size_t>(t.rows) * t.cols;
    for (std::size_t i = 0; i < size; ++i) {
      switch (t.init) {
        case TensorInit::kNormal:
          p[i] = static_cast<float>(0.02 * rng.normal());
          break;
        case TensorInit::kResidual:
          p[i] = static_cast<float>(residual_std * rng.normal());
          break;
        case TensorInit::kEmbedding:
          p[i] = static_cast<float>(embedding_std * rng.normal());
          break;
        case TensorInit::kOne:
          p[i] = 1.0f;
          break;
        case TensorInit::kZero:
          p[i] = 0.0f;
          break;
      }
    }
  }
}

void check_batch(const TransformerConfig& c, const TokenBatch& batch) {
  auto fail = [](const std::string& what) { throw Error(ErrorKind::kInvalidArgument, "transformer batch: " + what); };
  if (batch.batch <= 0 || batch.tokens <= 0)
    fail(str("batch (", batch.batch, ") and tokens (", batch.tokens, ") must be positive"));
  if (static_cast<int>(batch.positions.size()) != batch.tokens)
    fail(str(batch.positions.size(), " positions for ", batch.tokens, " tokens"));
  for (int t = 0; t < batch.tokens; ++t) {
    const int p = batch.positions[t];
    if (p < 0 || p >= c.seq) fail(str("position ", p, " of token ", t, " is outside [0, ", c.seq, ")"));
    if (t > 0 && p <= batch.positions[t - 1]) fail(str("positions are not ascending at token ", t));
  }
  if (!(batch.loss_divisor > 0)) fail(str("loss_divisor ", batch.loss_divisor, " must be positive"));
  const std::size_t n = static_cast<std::size_t>(batch.batch) * batch.tokens;
  auto check_ids = [&](const char* field, std::span<const std::int32_t> ids, std::size_t size, int bound) {
    if (ids.size() != size) fail(str(field, " has ", ids.size(), " entries, expected ", size));
    for (std::size_t i = 0; i < size; ++i)
      if (ids[i] < 0 || ids[i] >= bound) fail(str(field, "[", i, "] = ", ids[i], " is outside [0, ", bound, ")"));
  };
  if (c.kind == TransformerKind::kGpt) {
    check_ids("bytes", batch.bytes, n, c.vocab);
    check_ids("targets", batch.targets, n, c.vocab);
  } else {
    const std::size_t pixels = static_cast<std::size_t>(batch.batch) * c.image * c.image;
    if (batch.pixels.size() != pixels) fail(str("pixels has ", batch.pixels.size(), " values, expected ", pixels));
    check_ids("targets (labels)", batch.targets, static_cast<std::size_t>(batch.batch), c.classes);
  }
}

namespace {

int group_size(const UnitContext& context) {
  return context.sequence_group == nullptr ? 1 : context.sequence_group->size();
}

// The embedding, blocks and head, one micro-batch each. Forward saves into `saved`; the
// head's forward also leaves its loss sums in *sums when given (evaluate). A template on
// Impl only so that it may name the private Transformer::Impl.
template <typename Impl>
struct TransformerKernels {
  static void embedding_forward(const TransformerConfig& c, Impl& m, const float* p, const TokenBatch& batch,
                                const float* in, float* out, UnitActivations& saved, const UnitContext& context) {
    const int d = c.d_model, n = batch.batch * batch.tokens;
    if (c.kind == TransformerKind::kGpt && context.vocabulary_outside) {
      saved.buffer.resize(0);
      // wte[:, id] + wpe[:, t] as token_embedding_forward adds them, bit for bit.
      if (out != in) std::memcpy(out, in, sizeof(float) * static_cast<std::size_t>(d) * n);
      layers::add_positions(d, batch.batch, batch.tokens, batch.positions.data(), p + m.wpe, out);
      return;
    }
    if (c.kind == TransformerKind::kGpt) {
      saved.buffer.resize(0);
      layers::token_embedding_forward(d, batch.batch, batch.tokens, batch.bytes.data(), batch.positions.data(),
                                      p + m.wte, p + m.wpe, out);
      return;
    }
    const int pp = c.patch * c.patch;
    saved.buffer.resize(static_cast<std::size_t>(pp) * n);
    layers::gather_patches(c.image, c.patch, batch.batch, batch.tokens, batch.positions.data(), batch.pixels.data(),
                           saved.buffer.data());
    layers::linear_forward(m.gemm(), pp, d, n, p + m.patch_w, p + m.patch_b, saved.buffer.data(), out);
    layers::add_positions(d, batch.batch, batch.tokens, batch.positions.data(), p + m.wpe, out);
  }

  static void embedding_backward(const TransformerConfig& c, Impl& m, const float* p, const TokenBatch& batch,
                                 const float* dout, const UnitActivations& saved, float* g,
                                 const UnitContext& context) {
    const int d = c.d_model, n = batch.batch * batch.tokens;
    if (c.kind == TransformerKind::kGpt && context.vocabulary_outside) {
      layers::add_positions_backward(d, batch.batch, batch.tokens, batch.positions.data(), dout, g + m.wpe);
      return;
    }
    if (c.kind == TransformerKind::kGpt) {
      layers::token_embedding_backward(d, batch.batch, batch.tokens, batch.bytes.data(), batch.positions.data(), dout,
                                       g + m.wte, g + m.wpe);
      return;
    }
    const int pp = c.patch * c.patch;
    PEERTRAIN_CHECK(saved.buffer.size() == static_cast<std::size_t>(pp) * n, "embedding backward without forward");
    layers::linear_backward(m.gemm(), pp, d, n, p + m.patch_w, saved.buffer.data(), dout, g + m.patch_w,
                            g + m.patch_b, nullptr);
    layers::add_positions_backward(d, batch.batch, batch.tokens, batch.positions.data(), dout, g + m.wpe);
  }

  // The block as this rank runs it: whole, or under tensor parallelism its shard, gathered
  // into the thread's workspace (tensor_shard.h), with a gradient buffer of the shard's
  // size that finish() adds back into the flat layout.
  struct BlockRun {
    BlockShape shape;
    BlockOffsets offsets;
    const float* params;
    float* grads;  // null when the pass adds no gradient
    CpuBlockOps ops;

    BlockRun(const TransformerConfig& c, const BlockOffsets& o, const float* p, float* g, const TokenBatch& batch,
             AttentionCore& attention, const UnitContext& context)
        : shape(block_shape(c, batch, tensor_size(context), tensor_rank(context))),
          offsets(o),
          params(p),
          grads(g),
          ops{thread_workspace(), attention, {}, batch.positions, context.tensor_group, context.timeout_s} {
      ops.shape = {.batch = batch.batch,
                   .heads = shape.heads,
                   .head_dim = shape.head_dim,
                   .tokens = batch.tokens,
                   .causal = c.kind == TransformerKind::kGpt};
      if (shape.tp_size == 1) return;
      const std::array<std::size_t, 6> key{o.ln1_w,
                                           static_cast<std::size_t>(c.d_model),
                                           static_cast<std::size_t>(c.heads),
                                           static_cast<std::size_t>(c.mlp_ratio),
                                           static_cast<std::size_t>(shape.tp_size),
                                           static_cast<std::size_t>(shape.tp_rank)};
      auto it = ops.w.shards.find(key);
      if (it == ops.w.shards.end())
        it = ops.w.shards.emplace(key, tensor_shard(c, o, shape.tp_size, shape.tp_rank)).first;
      shard = &it->second;
      offsets = shard->offsets;
      ops.w.shard_params.resize(shard->floats);
      gather_shard(*shard, p, ops.w.shard_params.data());
      params = ops.w.shard_params.data();
      if (g != nullptr) {
        ops.w.shard_grads.assign(shard->floats, 0.0f);
        grads = ops.w.shard_grads.data();
        full_grads = g;
      }
    }
    // Adds the shard's gradient into the flat layout.
    void finish() {
      if (full_grads != nullptr) add_shard(*shard, grads, full_grads);
    }

   private:
    static int tensor_size(const UnitContext& context) {
      return context.tensor_group == nullptr ? 1 : context.tensor_group->size();
    }
    static int tensor_rank(const UnitContext& context) {
      return context.tensor_group == nullptr ? 0 : context.tensor_group->rank();
    }
    const TensorShard* shard = nullptr;
    float* full_grads = nullptr;
  };

  static void block_forward(const TransformerConfig& c, const BlockOffsets& o, const float* p, const TokenBatch& batch,
                            const float* in, float* out, UnitActivations& saved, AttentionCore& attention,
                            const UnitContext& context) {
    BlockRun run(c, o, p, nullptr, batch, attention, context);
    saved.buffer.resize(run.shape.saved().total);
    model::block_forward(run.ops, run.shape, run.offsets, run.params, in, saved.buffer.data(), out);
  }

  // dout and din may be the same buffer.
  static void block_backward(const TransformerConfig& c, const BlockOffsets& o, const float* p, const TokenBatch& batch,
                             const float* dout, float* din, const UnitActivations& saved, float* g,
                             AttentionCore& attention, const UnitContext& context) {
    BlockRun run(c, o, p, g, batch, attention, context);
    PEERTRAIN_CHECK(saved.buffer.size() == run.shape.saved().total, "block backward: saved activations hold ",
                    saved.buffer.size(), " floats, this micro-batch needs ", run.shape.saved().total);
    model::block_backward(run.ops, run.shape, run.offsets, run.params, saved.buffer.data(), dout, din, run.grads);
    run.finish();
  }

  // The split backward of the embedding: B has no input gradient to give, so it only keeps
  // dout; W is the fused backward on it.
  static void embedding_backward_input(const TransformerConfig& c, const TokenBatch& batch, const float* dout,
                                       UnitActivations& saved) {
    const std::size_t dn = static_cast<std::size_t>(c.d_model) * batch.batch * batch.tokens;
    saved.stash.resize(dn);
    std::memcpy(saved.stash.data(), dout, sizeof(float) * dn);
  }

  static void block_backward_input(const TransformerConfig& c, const BlockOffsets& o, const float* p,
                                   const TokenBatch& batch, const float* dout, float* din, UnitActivations& saved,
                                   AttentionCore& attention, const UnitContext& context) {
    BlockRun run(c, o, p, nullptr, batch, attention, context);
    PEERTRAIN_CHECK(saved.buffer.size() == run.shape.saved().total, "block backward: saved activations hold ",
                    saved.buffer.size(), " floats, this micro-batch needs ", run.shape.saved().total);
    saved.stash.resize(block_stash(run.shape).total);
    model::block_backward_input(run.ops, run.shape, run.offsets, run.params, saved.buffer.data(), dout, din,
                                saved.stash.data());
  }

  static void block_backward_weight(const TransformerConfig& c, const BlockOffsets& o, const float* p,
                                    const TokenBatch& batch, const UnitActivations& saved, float* g,
                                    AttentionCore& attention, const UnitContext& context) {
    BlockRun run(c, o, p, g, batch, attention, context);
    PEERTRAIN_CHECK(saved.stash.size() == block_stash(run.shape).total, "block W pass before its B pass");
    model::block_backward_weight(run.ops, run.shape, run.offsets, run.params, saved.buffer.data(), saved.stash.data(),
                                 run.grads);
    run.finish();
  }

  // The head's B: the gradient w.r.t. ln_f's output (kept), then ln_f's input gradient.
  static void head_backward_input(const TransformerConfig& c, Impl& m, const float* p, const TokenBatch& batch,
                                  const float* dout, float* din, UnitActivations& saved, const UnitContext& context) {
    const int d = c.d_model, n = batch.batch * batch.tokens;
    const bool outside = c.kind == TransformerKind::kGpt && context.vocabulary_outside;
    const HeadSaved at = head_saved(c, batch.batch, n, outside);
    PEERTRAIN_CHECK(saved.buffer.size() == at.total, "head backward: saved activations hold ", saved.buffer.size(),
                    " floats, this micro-batch needs ", at.total);
    const float* s = saved.buffer.data();
    saved.stash.resize(static_cast<std::size_t>(d) * n);
    float* dy = saved.stash.data();
    if (outside) {
      std::memcpy(dy, dout, sizeof(float) * static_cast<std::size_t>(d) * n);
    } else if (c.kind == TransformerKind::kGpt) {
      if (c.tied_head)
        m.gemm().run(false, false, d, n, c.vocab, p + m.wte, s + at.dlogits, dy, false);
      else
        layers::linear_backward(m.gemm(), d, c.vocab, n, p + m.head_w, nullptr, s + at.dlogits, nullptr, nullptr, dy);
    } else {
      const float tokens_total = s[at.pooled + static_cast<std::size_t>(d) * batch.batch];
      float* dpooled = m.workspace(2, static_cast<std::size_t>(d) * batch.batch);
      layers::linear_backward(m.gemm(), d, c.classes, batch.batch, p + m.head_w, nullptr, s + at.dlogits, nullptr,
                              nullptr, dpooled);
      layers::sum_pool_backward(d, batch.batch, batch.tokens, dpooled, 1.0f / tokens_total, dy);
    }
    layers::layernorm_backward(d, n, s + at.x_in, s + at.mean, s + at.rstd, p + m.lnf_w, dy, nullptr, din, nullptr,
                               nullptr);
  }

  static void head_backward_weight(const TransformerConfig& c, Impl& m, const float* p, const TokenBatch& batch,
                                   const UnitActivations& saved, float* g, const UnitContext& context) {
    const int d = c.d_model, n = batch.batch * batch.tokens;
    const bool outside = c.kind == TransformerKind::kGpt && context.vocabulary_outside;
    const HeadSaved at = head_saved(c, batch.batch, n, outside);
    PEERTRAIN_CHECK(saved.stash.size() == static_cast<std::size_t>(d) * n, "head W pass before its B pass");
    const float* s = saved.buffer.data();
    if (outside) {
      // The projection's gradient is the vocabulary-parallel output layer's.
    } else if (c.kind == TransformerKind::kGpt) {
      if (c.tied_head)
        m.gemm().run(false, true, d, c.vocab, n, s + at.y, s + at.dlogits, g + m.wte, true);
      else
        layers::linear_backward(m.gemm(), d, c.vocab, n, nullptr, s + at.y, s + at.dlogits, g + m.head_w, nullptr,
                                nullptr);
    } else {
      const int ranks = group_size(context);
      const std::size_t head_size = static_cast<std::size_t>(c.classes) * (d + 1);
      float* head_grad = m.workspace(1, head_size);
      std::fill(head_grad, head_grad + head_size, 0.0f);
      layers::linear_backward(m.gemm(), d, c.classes, batch.batch, nullptr, s + at.pooled, s + at.dlogits, head_grad,
                              head_grad + static_cast<std::size_t>(c.classes) * d, nullptr);
      Eigen::Map<Eigen::ArrayXf>(g + m.head_w, static_cast<Eigen::Index>(head_size)) +=
          Eigen::Map<const Eigen::ArrayXf>(head_grad, static_cast<Eigen::Index>(head_size)) * (1.0f / ranks);
    }
    layers::layernorm_backward(d, n, s + at.x_in, s + at.mean, s + at.rstd, p + m.lnf_w, saved.stash.data(), nullptr,
                               nullptr, g + m.lnf_w, g + m.lnf_b);
  }

  // Floats that `unit` keeps for its backward; the blocks and the head keep their input first.
  static std::size_t saved_floats(const TransformerConfig& c, int unit, const TokenBatch& batch, bool outside) {
    const std::size_t n = static_cast<std::size_t>(batch.batch) * batch.tokens;
    if (unit == 0) return c.kind == TransformerKind::kGpt ? 0 : static_cast<std::size_t>(c.patch) * c.patch * n;
    if (unit == c.layers + 1) return head_saved(c, batch.batch, n, outside).total;
    return block_saved(c.d_model, c.d_model, c.mlp_ratio * c.d_model, c.heads, n).total;
  }

  // outside: vocabulary parallelism keeps the logits elsewhere (UnitContext::vocabulary_outside).
  static HeadSaved head_saved(const TransformerConfig& c, int batch, std::size_t n, bool outside = false) {
    const std::size_t d = c.d_model;
    HeadSaved s{};
    s.x_in = 0;
    s.y = d * n;
    s.mean = s.y + d * n;
    s.rstd = s.mean + n;
    s.pooled = s.rstd + n;
    const bool vit = c.kind == TransformerKind::kVit;
    // vit keeps the pooled vectors and, after them, the all-reduced token count.
    s.dlogits = s.pooled + (vit ? d * batch + 1 : 0);
    s.total = s.dlogits + (vit       ? static_cast<std::size_t>(c.classes) * batch
                           : outside ? 0
                                     : static_cast<std::size_t>(c.vocab) * n);
    return s;
  }

  static float head_forward(const TransformerConfig& c, Impl& m, const float* p, const TokenBatch& batch,
                            const float* in, float* out, UnitActivations& saved, const UnitContext& context,
                            LossSums* sums) {
    const int d = c.d_model, n = batch.batch * batch.tokens;
    const std::size_t dn = static_cast<std::size_t>(d) * n;
    const bool outside = c.kind == TransformerKind::kGpt && context.vocabulary_outside;
    const HeadSaved at = head_saved(c, batch.batch, n, outside);
    saved.buffer.resize(at.total);
    float* s = saved.buffer.data();
    if (in != s + at.x_in) std::memcpy(s + at.x_in, in, sizeof(float) * dn);
    layers::layernorm_forward(d, n, s + at.x_in, p + m.lnf_w, p + m.lnf_b, s + at.y, s + at.mean, s + at.rstd);
    if (outside) {
      std::memcpy(out, s + at.y, sizeof(float) * dn);
      return 0;
    }
    const float grad_scale = static_cast<float>(1.0 / batch.loss_divisor);
    long long correct = 0;
    double loss_sum = 0;
    if (c.kind == TransformerKind::kGpt) {
      float* logits = s + at.dlogits;
      if (c.tied_head)
        m.gemm().run(true, false, c.vocab, n, d, p + m.wte, s + at.y, logits, false);
      else
        layers::linear_forward(m.gemm(), d, c.vocab, n, p + m.head_w, nullptr, s + at.y, logits);
      loss_sum = layers::softmax_cross_entropy(c.vocab, n, logits, batch.targets.data(), grad_scale, &correct);
      if (sums != nullptr) *sums = {loss_sum, correct, n};
      return static_cast<float>(loss_sum / batch.loss_divisor);
    }
    // vit: mean over every token of each image, over the sequence group when there is one.
    float* pooled = s + at.pooled;
    layers::sum_pool_forward(d, batch.batch, batch.tokens, s + at.y, pooled);
    const std::size_t pooled_size = static_cast<std::size_t>(d) * batch.batch;
    pooled[pooled_size] = static_cast<float>(batch.tokens);
    const int ranks = group_size(context);
    if (ranks > 1) context.sequence_group->all_reduce({pooled, pooled_size + 1}, context.timeout_s);
    Eigen::Map<Eigen::ArrayXf>(pooled, static_cast<Eigen::Index>(pooled_size)) *= 1.0f / pooled[pooled_size];
    float* logits = s + at.dlogits;
    layers::linear_forward(m.gemm(), d, c.classes, batch.batch, p + m.head_w, p + m.head_b, pooled, logits);
    loss_sum = layers::softmax_cross_entropy(c.classes, batch.batch, logits, batch.targets.data(), grad_scale, &correct);
    if (sums != nullptr) *sums = {loss_sum, correct, batch.batch};
    return static_cast<float>(loss_sum / batch.loss_divisor / ranks);
  }

  static void head_backward(const TransformerConfig& c, Impl& m, const float* p, const TokenBatch& batch,
                            const float* dout, float* din, const UnitActivations& saved, float* g,
                            const UnitContext& context) {
    const int d = c.d_model, n = batch.batch * batch.tokens;
    const bool outside = c.kind == TransformerKind::kGpt && context.vocabulary_outside;
    const HeadSaved at = head_saved(c, batch.batch, n, outside);
    PEERTRAIN_CHECK(saved.buffer.size() == at.total, "head backward: saved activations hold ", saved.buffer.size(),
                    " floats, this micro-batch needs ", at.total);
    const float* s = saved.buffer.data();
    float* dy = m.workspace(0, static_cast<std::size_t>(d) * n);
    if (outside) {
      std::memcpy(dy, dout, sizeof(float) * static_cast<std::size_t>(d) * n);
    } else if (c.kind == TransformerKind::kGpt) {
      const float* dlogits = s + at.dlogits;
      if (c.tied_head) {
        m.gemm().run(false, true, d, c.vocab, n, s + at.y, dlogits, g + m.wte, true);
        m.gemm().run(false, false, d, n, c.vocab, p + m.wte, dlogits, dy, false);
      } else {
        layers::linear_backward(m.gemm(), d, c.vocab, n, p + m.head_w, s + at.y, dlogits, g + m.head_w, nullptr, dy);
      }
    } else {
      const float* dlogits = s + at.dlogits;
      const float* pooled = s + at.pooled;
      const float tokens_total = pooled[static_cast<std::size_t>(d) * batch.batch];
      // head.weight and head.bias see the same pooled vectors on every sequence rank, and
      // the group's gradient all-reduce sums them: each rank adds 1/ranks of its gradient.
      const int ranks = group_size(context);
      const std::size_t head_size = static_cast<std::size_t>(c.classes) * (d + 1);
      float* head_grad = m.workspace(1, head_size);
      std::fill(head_grad, head_grad + head_size, 0.0f);
      float* dpooled = m.workspace(2, static_cast<std::size_t>(d) * batch.batch);
      layers::linear_backward(m.gemm(), d, c.classes, batch.batch, p + m.head_w, pooled, dlogits, head_grad,
                              head_grad + static_cast<std::size_t>(c.classes) * d, dpooled);
      PEERTRAIN_CHECK(m.head_b == m.head_w + static_cast<std::size_t>(c.classes) * d, "head bias follows its weight");
      Eigen::Map<Eigen::ArrayXf>(g + m.head_w, static_cast<Eigen::Index>(head_size)) +=
          Eigen::Map<const Eigen::ArrayXf>(head_grad, static_cast<Eigen::Index>(head_size)) * (1.0f / ranks);
      layers::sum_pool_backward(d, batch.batch, batch.tokens, dpooled, 1.0f / tokens_total, dy);
    }
    layers::layernorm_backward(d, n, s + at.x_in, s + at.mean, s + at.rstd, p + m.lnf_w, dy, nullptr, din,
                               g + m.lnf_w, g + m.lnf_b);
  }
};

}  // namespace

float Transformer::forward(int unit, std::span<const float> params, const TokenBatch& batch, const float* in,
                           float* out, UnitActivations& saved, const UnitContext& context) {
  unit_parameters(unit);
  PEERTRAIN_CHECK(params.size() == num_parameters(), "params has ", params.size(), " floats, the transformer ",
                  num_parameters());
  check_batch(config_, batch);
  Impl& m = *impl_;
  AttentionCore& attention = context.attention != nullptr ? *context.attention : m.local_attention;
  if (unit == 0) {
    TransformerKernels<Impl>::embedding_forward(config_, m, params.data(), batch, in, out, saved, context);
    return 0;
  }
  if (unit == num_units() - 1)
    return TransformerKernels<Impl>::head_forward(config_, m, params.data(), batch, in, out, saved, context, nullptr);
  TransformerKernels<Impl>::block_forward(config_, m.blocks[static_cast<std::size_t>(unit - 1)], params.data(), batch,
                                          in, out, saved, attention, context);
  return 0;
}

void Transformer::backward(int unit, std::span<const float> params, const TokenBatch& batch, const float* dout,
                           float* din, UnitActivations& saved, std::span<float> grads, const UnitContext& context) {
  unit_parameters(unit);
  PEERTRAIN_CHECK(params.size() == num_parameters() && grads.size() == num_parameters(), "params has ",
                  params.size(), " and grads ", grads.size(), " floats, the transformer ", num_parameters());
  Impl& m = *impl_;
  AttentionCore& attention = context.attention != nullptr ? *context.attention : m.local_attention;
  if (unit == 0)
    TransformerKernels<Impl>::embedding_backward(config_, m, params.data(), batch, dout, saved, grads.data(), context);
  else if (unit == num_units() - 1)
    TransformerKernels<Impl>::head_backward(config_, m, params.data(), batch, dout, din, saved, grads.data(), context);
  else
    TransformerKernels<Impl>::block_backward(config_, m.blocks[static_cast<std::size_t>(unit - 1)], params.data(),
                                             batch, dout, din, saved, grads.data(), attention, context);
}

void Transformer::backward_input(int unit, std::span<const float> params, const TokenBatch& batch, const float* dout,
                                 float* din, UnitActivations& saved, const UnitContext& context) {
  unit_parameters(unit);
  PEERTRAIN_CHECK(params.size() == num_parameters(), "params has ", params.size(), " floats, the transformer ",
                  num_parameters());
  Impl& m = *impl_;
  AttentionCore& attention = context.attention != nullptr ? *context.attention : m.local_attention;
  if (unit == 0)
    TransformerKernels<Impl>::embedding_backward_input(config_, batch, dout, saved);
  else if (unit == num_units() - 1)
    TransformerKernels<Impl>::head_backward_input(config_, m, params.data(), batch, dout, din, saved, context);
  else
    TransformerKernels<Impl>::block_backward_input(config_, m.blocks[static_cast<std::size_t>(unit - 1)], params.data(),
                                                   batch, dout, din, saved, attention, context);
}

void Transformer::backward_weight(int unit, std::span<const float> params, const TokenBatch& batch,
                                  UnitActivations& saved, std::span<float> grads, const UnitContext& context) {
  unit_parameters(unit);
  PEERTRAIN_CHECK(params.size() == num_parameters() && grads.size() == num_parameters(), "params has ", params.size(),
                  " and grads ", grads.size(), " floats, the transformer ", num_parameters());
  Impl& m = *impl_;
  AttentionCore& attention = context.attention != nullptr ? *context.attention : m.local_attention;
  if (unit == 0) {
    PEERTRAIN_CHECK(!saved.stash.empty(), "embedding W pass before its B pass");
    TransformerKernels<Impl>::embedding_backward(config_, m, params.data(), batch, saved.stash.data(), saved,
                                                 grads.data(), context);
  } else if (unit == num_units() - 1) {
    TransformerKernels<Impl>::head_backward_weight(config_, m, params.data(), batch, saved, grads.data(), context);
  } else {
    TransformerKernels<Impl>::block_backward_weight(config_, m.blocks[static_cast<std::size_t>(unit - 1)],
                                                    params.data(), batch, saved, grads.data(), attention, context);
  }
  saved.stash.clear();  // the micro-batch is done with; the capacity stays for the next
}

float Transformer::forward_backward(std::span<const float> params, const TokenBatch& batch, std::span<float> grads,
                                    const UnitContext& context) {
  check_batch(config_, batch);
  ThreadWorkspace& m = thread_workspace();
  if (m.saved.size() < static_cast<std::size_t>(num_units())) m.saved.resize(static_cast<std::size_t>(num_units()));
  m.act_a.resize(static_cast<std::size_t>(config_.d_model) * batch.batch * batch.tokens);
  // Each unit writes its output straight into the next unit's saved input (offset 0 of its
  // buffer, sized here), which saves the next unit a copy.
  const float* x = nullptr;
  float loss = 0;
  for (int u = 0; u < num_units(); ++u) {
    float* out = nullptr;
    if (u + 1 < num_units()) {
      UnitActivations& next = m.saved[static_cast<std::size_t>(u + 1)];
      next.buffer.resize(TransformerKernels<Impl>::saved_floats(config_, u + 1, batch, context.vocabulary_outside));
      out = next.buffer.data();
    }
    loss += forward(u, params, batch, x, out, m.saved[static_cast<std::size_t>(u)], context);
    x = out;
  }
  // Backward in place: each unit reads its output gradient from and writes its input
  // gradient to the same buffer.
  float* d = m.act_a.data();
  for (int u = num_units(); u-- > 0;)
    backward(u, params, batch, d, d, m.saved[static_cast<std::size_t>(u)], grads, context);
  return loss;
}

LossSums Transformer::evaluate(std::span<const float> params, const TokenBatch& batch) {
  ThreadWorkspace& m = thread_workspace();
  if (m.saved.empty()) m.saved.resize(1);
  PEERTRAIN_CHECK(params.size() == num_parameters(), "params has ", params.size(), " floats, the transformer ",
                  num_parameters());
  check_batch(config_, batch);
  const std::size_t dn = static_cast<std::size_t>(config_.d_model) * batch.batch * batch.tokens;
  m.act_a.resize(dn);
  m.act_b.resize(dn);
  float* x = m.act_a.data();
  float* y = m.act_b.data();
  // No backward follows, so every unit reuses the first unit's saved buffer.
  UnitActivations& saved = m.saved[0];
  const UnitContext local;
  for (int u = 0; u + 1 < num_units(); ++u) {
    forward(u, params, batch, x, y, saved, local);
    std::swap(x, y);
  }
  LossSums sums;
  TransformerKernels<Impl>::head_forward(config_, *impl_, params.data(), batch, x, nullptr, saved, local, &sums);
  return sums;
}

double Transformer::flops_per_step(int batch, int tokens) const {
  const double n = static_cast<double>(batch) * tokens, d = config_.d_model, f = config_.mlp_ratio * d;
  // Each Linear: forward, weight gradient and input gradient, 2·in·out per column each.
  const double block_linear = 3 * 2 * n * (3 * d * d + d * d + 2 * d * f);
  // Attention per sequence and head: QKᵀ and PV forward (2·T²·head_dim each), twice that
  // backward; over every head that is 12·T²·d per sequence.
  const double attention = 12.0 * batch * static_cast<double>(tokens) * tokens * d *
                           (config_.kind == TransformerKind::kGpt ? 0.5 : 1.0);
  double flops = config_.layers * (block_linear + attention);
  if (config_.kind == TransformerKind::kGpt) {
    flops += 3 * 2 * n * d * config_.vocab;
  } else {
    flops += 2 * 2 * n * d * config_.patch * config_.patch;  // the patch embedding has no input gradient
    flops += 3 * 2.0 * batch * d * config_.classes;
  }
  return flops;
}

double Transformer::other_bytes_per_step(int batch, int tokens, bool fused_epilogues) const {
  // In units of one d × n activation (dn floats), from block_composition.h's order (tp 1),
  // with [what fused epilogues remove]:
  //   forward  LN1 2, [qkv bias fill 3], attention gathers q k v 3 and writes out 1, proj's
  //            residual read 1 [+ its fill's write 1 + bias], LN2 2, [fc bias fill 4],
  //            GELU writes g 4 [+ reads h 4], fc2's residual read 1 [+ write 1]  = 14 [+ 13 = 27]
  //   backward [fc2 bias grad 1 + zero fill 4], GELU' reads h 4 [+ reads and writes dg 8],
  //            [fc bias grad 4 + zero fill 1], LN2' 4, [proj bias grad 1 + zero fill 1],
  //            attention gathers q k v dout 4, reads out and dout for delta 2, scatters dq
  //            dk dv 3, [qkv bias grad 3 + zero fill 1], LN1' 4            = 21 [+ 24 = 45]
  // (with fused epilogues the bias gradients are summed as the weight gradients' GEMMs pack
  // dy, and the GELU runs in the GEMMs' stores).
  const double n = static_cast<double>(batch) * tokens, d = config_.d_model, f = config_.mlp_ratio * d;
  const double dn = d * n, r = f / d;  // the MLP's width in units of d
  const double fills = fused_epilogues ? 0 : 1;
  const double forward = 2 + 3 + 1 + 1 + 2 + r + 1 + fills * (3 + 1 + r + r + 1);
  const double bias_grads = 1 + r + 1 + 3;
  const double backward = r + 4 + 9 + 4 + fills * (bias_grads + r + 2 * r + 1 + 1 + 1);
  double floats = config_.layers * (forward + backward) * dn;
  // ln_f forward 2 and backward 4; the embedding's write 1 and its gradient's read 1.
  floats += 8 * dn;
  if (config_.kind == TransformerKind::kGpt)  // the loss reads and writes the logits [after their zero fill]
    floats += (4 + fills) * n * config_.vocab;
  return 4.0 * floats;
}

bool gemm_fuses_epilogues() { return avx512_gemm::available(); }

}  // namespace peertrain::model
