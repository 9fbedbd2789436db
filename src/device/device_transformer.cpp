#include "device_transformer.h"

#include "device_ring_attention.h"

#include <cstring>
#include <vector>

#include "kernels/device.h"
#include "kernels/ops.h"
#include "peertrain/comm/group.h"
#include "peertrain/core/error.h"
#include "peertrain/core/parameter_store.h"

namespace peertrain::device {
namespace {

using kernels::DeviceArray;
using kernels::PinnedArray;

kernels::GemmPrecision precision(model::GemmMode mode) {
  switch (mode) {
    case model::GemmMode::kTf32: return kernels::GemmPrecision::kTf32;
    case model::GemmMode::kBf16: return kernels::GemmPrecision::kBf16;
    case model::GemmMode::kFp32: break;
  }
  return kernels::GemmPrecision::kFp32;
}

const char* gemm_name(model::GemmMode mode) {
  return mode == model::GemmMode::kTf32 ? "tf32" : mode == model::GemmMode::kBf16 ? "bf16" : "fp32";
}

// Offsets of one block's tensors in the flat parameter buffer.
struct BlockParams {
  std::size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fc2_w, fc2_b;
};

// What a block keeps from forward for backward, as in the CPU model.
struct BlockActivations {
  DeviceArray<float> x_in, ln1, mean1, rstd1, q, k, v, att, lse, x_mid, ln2, mean2, rstd2, h, g;
};

class DeviceTransformer final : public model::DeviceModel {
 public:
  // sequence_group: null, or the group of sequence ranks this one belongs to (attention
  // then runs around its ring and the gradient is all-reduced over it).
  DeviceTransformer(const model::TransformerConfig& config, const model::DeviceOptions& options,
                    comm::Group* sequence_group)
      : config_(config), options_(options), cpu_model_(config), group_(sequence_group) {
    kernels::set_device(options.device);
    stream_ = kernels::create_stream();
    if (group_ != nullptr && group_->size() > 1) ring_ = std::make_unique<DeviceRingAttention>(*group_, stream_);
    copy_stream_ = kernels::create_stream();
    for (int u = 0; u < cpu_model_.num_units(); ++u) {
      units_.push_back(cpu_model_.unit_parameters(u));
      params_ready_.push_back(kernels::create_event());
      grads_ready_.push_back(kernels::create_event());
    }
    blas_ = std::make_unique<kernels::Blas>(stream_, precision(options.gemm));
    ParameterStore store;
    cpu_model_.register_parameters(store);
    auto at = [&](const std::string& name) { return store.slice(store.index_of(name)).offset - store.slice(0).offset; };
    wte_ = at("wte");
    wpe_ = at("wpe");
    for (int l = 0; l < config.layers; ++l) {
      const std::string p = str("h", l, ".");
      blocks_.push_back({at(p + "ln1.weight"), at(p + "ln1.bias"), at(p + "attn.qkv.weight"), at(p + "attn.qkv.bias"),
                         at(p + "attn.proj.weight"), at(p + "attn.proj.bias"), at(p + "ln2.weight"),
                         at(p + "ln2.bias"), at(p + "mlp.fc.weight"), at(p + "mlp.fc.bias"),
                         at(p + "mlp.proj.weight"), at(p + "mlp.proj.bias")});
    }
    lnf_w_ = at("ln_f.weight");
    lnf_b_ = at("ln_f.bias");
    if (!config.tied_head) head_w_ = at("lm_head.weight");
    const std::size_t size = cpu_model_.num_parameters();
    params_.resize(size, "parameters");
    grads_.resize(size, "gradients");
    host_params_ = PinnedArray<float>(size, "parameters (pinned)");
    host_grads_ = PinnedArray<float>(size, "gradients (pinned)");
    activations_.resize(static_cast<std::size_t>(config.layers));
  }

  ~DeviceTransformer() override {
    blas_.reset();
    for (kernels::Event e : params_ready_) kernels::destroy_event(e);
    for (kernels::Event e : grads_ready_) kernels::destroy_event(e);
    kernels::destroy_stream(copy_stream_);
    kernels::destroy_stream(stream_);
  }

  std::string describe() const override {
    return str(kernels::device_name(options_.device), " (device ", options_.device, "), ", gemm_name(options_.gemm),
               " GEMM");
  }

  std::size_t peak_device_bytes() const override { return kernels::peak_allocated_bytes(); }

  float forward_backward(std::span<const float> params, const model::TokenBatch& batch,
                         std::span<float> grads) override {
    check_sizes(params.size(), grads.size());
    kernels::set_device(options_.device);  // the calling thread's device (a worker of a sequence group)
    upload_parameters(params);
    kernels::zero(grads_.data(), sizeof(float) * grads.size(), stream_);
    const model::LossSums sums = forward(batch, /*keep_gradient=*/true);
    backward(batch);  // whole sequences: each unit's gradient travels to host_grads_ as it finishes
    if (ring_) {      // a sequence rank: the gradient is the sum over the group's ranks
      kernels::synchronize(stream_);
      group_->all_reduce(grads_.span().first(grads.size()));
      kernels::copy_to_host(host_grads_.data(), grads_.data(), sizeof(float) * grads.size(), stream_);
      kernels::synchronize(stream_);
    }
    kernels::synchronize(copy_stream_);
    for (std::size_t i = 0; i < grads.size(); ++i) grads[i] += host_grads_.data()[i];
    return static_cast<float>(sums.loss_sum / batch.loss_divisor);
  }

  model::LossSums evaluate(std::span<const float> params, const model::TokenBatch& batch,
                           bool params_changed) override {
    check_sizes(params.size(), params.size());
    PEERTRAIN_CHECK(!ring_, "evaluate runs on a model that holds whole sequences");
    kernels::set_device(options_.device);
    if (params_changed || params.data() != last_params_) upload_parameters(params);
    return forward(batch, /*keep_gradient=*/false);
  }

 private:
  void check_sizes(std::size_t params, std::size_t grads) const {
    PEERTRAIN_CHECK(params == cpu_model_.num_parameters() && grads == params, "device transformer: params has ",
                    params, " and grads ", grads, " floats, the model ", cpu_model_.num_parameters());
  }

  // Through the pinned buffer, unit by unit on the copy stream: block l's forward starts
  // as soon as its own parameters have arrived, while the later units' are still coming.
  // (The previous step's copies out of host_params_ have finished: forward waited on them.)
  void upload_parameters(std::span<const float> params) {
    std::memcpy(host_params_.data(), params.data(), sizeof(float) * params.size());
    for (std::size_t u = 0; u < units_.size(); ++u) {
      const model::ParameterRange r = units_[u];
      kernels::copy_to_device(params_.data() + r.offset, host_params_.data() + r.offset, sizeof(float) * r.size,
                              copy_stream_);
      kernels::record(params_ready_[u], copy_stream_);
    }
    last_params_ = params.data();
  }

  // The gradient of `unit` is final on the compute stream: send it to the host on the copy
  // stream while the compute stream goes on with the units below.
  void download_gradient(int unit) {
    if (ring_) return;  // the gradient is all-reduced first, then copied whole
    const model::ParameterRange r = units_[static_cast<std::size_t>(unit)];
    kernels::record(grads_ready_[static_cast<std::size_t>(unit)], stream_);
    kernels::wait(copy_stream_, grads_ready_[static_cast<std::size_t>(unit)]);
    kernels::copy_to_host(host_grads_.data() + r.offset, grads_.data() + r.offset, sizeof(float) * r.size,
                          copy_stream_);
  }

  void upload_batch(const model::TokenBatch& batch) {
    // The CPU model's boundary checks (ids in range, positions ascending) run here too:
    // a bad byte must be an error, not an out-of-bounds read on the device.
    const std::size_t n = static_cast<std::size_t>(batch.batch) * batch.tokens;
    for (std::size_t i = 0; i < n; ++i)
      if (batch.bytes[i] < 0 || batch.bytes[i] >= config_.vocab || batch.targets[i] < 0 ||
          batch.targets[i] >= config_.vocab)
        throw Error(ErrorKind::kInvalidArgument, str("device transformer batch: byte or target ", i,
                                                     " is outside [0, ", config_.vocab, ")"));
    PEERTRAIN_CHECK(batch.positions.size() == static_cast<std::size_t>(batch.tokens), "positions for ",
                    batch.tokens, " tokens");
    for (int t = 0; t < batch.tokens; ++t)
      if (batch.positions[t] < 0 || batch.positions[t] >= config_.seq || (t > 0 && batch.positions[t] <= batch.positions[t - 1]))
        throw Error(ErrorKind::kInvalidArgument,
                    str("device transformer batch: position ", batch.positions[t], " of token ", t,
                        " is outside [0, ", config_.seq, ") or not ascending"));
    ids_.resize(n, "bytes");
    targets_.resize(n, "targets");
    positions_.resize(static_cast<std::size_t>(batch.tokens), "positions");
    kernels::copy_to_device(ids_.data(), batch.bytes.data(), sizeof(std::int32_t) * n, stream_);
    kernels::copy_to_device(targets_.data(), batch.targets.data(), sizeof(std::int32_t) * n, stream_);
    kernels::copy_to_device(positions_.data(), batch.positions.data(), sizeof(int) * batch.tokens, stream_);
  }

  kernels::AttentionDims attention_dims(const model::TokenBatch& batch) const {
    return {.rows = batch.batch * config_.heads,
            .tq = batch.tokens,
            .tk = batch.tokens,
            .head_dim = config_.d_model / config_.heads,
            .causal = true};
  }

  // y (out×n) = W·x + b, and the same on a residual branch: y = residual + W·x + b.
  void linear(int in, int out, int n, const float* w, const float* b, const float* x, float* y,
              const float* residual = nullptr) {
    if (residual != nullptr) kernels::copy_on_device(y, residual, sizeof(float) * out * n, stream_);
    blas_->gemm(false, false, out, n, in, w, x, y, residual != nullptr);
    if (b != nullptr) kernels::add_bias(stream_, out, n, b, y);
  }
  // dW += dy·xᵀ, db += row sums of dy, dx = Wᵀ·dy.
  void linear_backward(int in, int out, int n, const float* w, const float* x, const float* dy, float* dw, float* db,
                       float* dx) {
    blas_->gemm(false, true, out, in, n, dy, x, dw, true);
    if (db != nullptr) kernels::add_row_sums(stream_, out, n, dy, db);
    if (dx != nullptr) blas_->gemm(true, false, in, n, out, w, dy, dx, false);
  }

  model::LossSums forward(const model::TokenBatch& batch, bool keep_gradient) {
    PEERTRAIN_CHECK(batch.batch > 0 && batch.tokens > 0 && batch.loss_divisor > 0, "device transformer: empty batch");
    upload_batch(batch);
    const int d = config_.d_model, f = config_.mlp_ratio * d, n = batch.batch * batch.tokens;
    const int hd = d / config_.heads;
    const std::size_t dn = static_cast<std::size_t>(d) * n;
    const float* p = params_.data();
    x_head_.resize(dn, "head input");
    float* x = config_.layers > 0 ? ensure(activations_[0].x_in, dn) : x_head_.data();
    kernels::wait(stream_, params_ready_[0]);
    kernels::token_embedding_forward(stream_, d, batch.batch, batch.tokens, ids_.data(), positions_.data(), p + wte_,
                                     p + wpe_, x);
    qkv_.resize(3 * dn, "qkv");
    merged_.resize(dn, "merged heads");
    for (int l = 0; l < config_.layers; ++l) {
      const BlockParams& o = blocks_[static_cast<std::size_t>(l)];
      BlockActivations& a = activations_[static_cast<std::size_t>(l)];
      float* out = l + 1 < config_.layers ? ensure(activations_[static_cast<std::size_t>(l) + 1].x_in, dn)
                                          : x_head_.data();
      kernels::wait(stream_, params_ready_[static_cast<std::size_t>(l) + 1]);
      kernels::layernorm_forward(stream_, d, n, a.x_in.data(), p + o.ln1_w, p + o.ln1_b, ensure(a.ln1, dn),
                                 ensure(a.mean1, n), ensure(a.rstd1, n));
      linear(d, 3 * d, n, p + o.qkv_w, p + o.qkv_b, a.ln1.data(), qkv_.data());
      kernels::split_heads(stream_, batch.batch, batch.tokens, config_.heads, hd, 3 * d, 0, qkv_.data(), ensure(a.q, dn));
      kernels::split_heads(stream_, batch.batch, batch.tokens, config_.heads, hd, 3 * d, d, qkv_.data(), ensure(a.k, dn));
      kernels::split_heads(stream_, batch.batch, batch.tokens, config_.heads, hd, 3 * d, 2 * d, qkv_.data(),
                           ensure(a.v, dn));
      float* att = ensure(a.att, dn);
      float* lse = ensure(a.lse, static_cast<std::size_t>(config_.heads) * n);
      if (ring_)
        ring_->forward(attention_dims(batch), positions_.data(), a.q.data(), a.k.data(), a.v.data(), att, lse);
      else
        kernels::attention_forward(stream_, attention_dims(batch), a.q.data(), positions_.data(), a.k.data(),
                                   a.v.data(), positions_.data(), att, lse);
      kernels::merge_heads(stream_, batch.batch, batch.tokens, config_.heads, hd, d, 0, a.att.data(), merged_.data());
      linear(d, d, n, p + o.proj_w, p + o.proj_b, merged_.data(), ensure(a.x_mid, dn), a.x_in.data());
      kernels::layernorm_forward(stream_, d, n, a.x_mid.data(), p + o.ln2_w, p + o.ln2_b, ensure(a.ln2, dn),
                                 ensure(a.mean2, n), ensure(a.rstd2, n));
      linear(d, f, n, p + o.fc_w, p + o.fc_b, a.ln2.data(), ensure(a.h, static_cast<std::size_t>(f) * n));
      kernels::gelu_forward(stream_, static_cast<std::size_t>(f) * n, a.h.data(),
                            ensure(a.g, static_cast<std::size_t>(f) * n));
      linear(f, d, n, p + o.fc2_w, p + o.fc2_b, a.g.data(), out, a.x_mid.data());
    }
    // Head: final LayerNorm, logits, softmax cross-entropy (logits become their gradient).
    kernels::wait(stream_, params_ready_.back());
    kernels::layernorm_forward(stream_, d, n, x_head_.data(), p + lnf_w_, p + lnf_b_, ensure(y_head_, dn),
                               ensure(mean_head_, n), ensure(rstd_head_, n));
    const std::size_t vn = static_cast<std::size_t>(config_.vocab) * n;
    float* logits = ensure(logits_, vn);
    if (config_.tied_head)
      blas_->gemm(true, false, config_.vocab, n, d, p + wte_, y_head_.data(), logits, false);
    else
      blas_->gemm(false, false, config_.vocab, n, d, p + head_w_, y_head_.data(), logits, false);
    const float grad_scale = keep_gradient ? static_cast<float>(1.0 / batch.loss_divisor) : 0.0f;
    kernels::softmax_cross_entropy(stream_, config_.vocab, n, logits, targets_.data(), grad_scale,
                                   ensure(losses_, static_cast<std::size_t>(n)), ensure(correct_, static_cast<std::size_t>(n)));
    host_losses_.resize(static_cast<std::size_t>(n));
    host_correct_.resize(static_cast<std::size_t>(n));
    kernels::copy_to_host(host_losses_.data(), losses_.data(), sizeof(float) * n, stream_);
    kernels::copy_to_host(host_correct_.data(), correct_.data(), sizeof(int) * n, stream_);
    kernels::synchronize(stream_);
    model::LossSums sums;
    for (int j = 0; j < n; ++j) {
      sums.loss_sum += host_losses_[static_cast<std::size_t>(j)];
      sums.correct += host_correct_[static_cast<std::size_t>(j)];
    }
    sums.count = n;
    return sums;
  }

  void backward(const model::TokenBatch& batch) {
    const int d = config_.d_model, f = config_.mlp_ratio * d, n = batch.batch * batch.tokens;
    const int hd = d / config_.heads;
    const std::size_t dn = static_cast<std::size_t>(d) * n;
    const float* p = params_.data();
    float* g = grads_.data();
    float* dy = ensure(d_a_, dn);
    if (config_.tied_head) {
      blas_->gemm(false, true, d, config_.vocab, n, y_head_.data(), logits_.data(), g + wte_, true);
      blas_->gemm(false, false, d, n, config_.vocab, p + wte_, logits_.data(), dy, false);
    } else {
      linear_backward(d, config_.vocab, n, p + head_w_, y_head_.data(), logits_.data(), g + head_w_, nullptr, dy);
    }
    float* d_x = ensure(d_b_, dn);  // gradient w.r.t. the current unit's input
    kernels::layernorm_backward(stream_, d, n, x_head_.data(), mean_head_.data(), rstd_head_.data(), p + lnf_w_, dy,
                                nullptr, d_x, g + lnf_w_, g + lnf_b_);
    download_gradient(config_.layers + 1);
    float* d_hidden = ensure(d_hidden_, static_cast<std::size_t>(std::max(f, 3 * d)) * n);
    float* d_ln = ensure(d_ln_, dn);
    float* d_mid = ensure(d_mid_, dn);
    float* d_heads = ensure(d_heads_, 3 * dn);
    float* delta = ensure(delta_, static_cast<std::size_t>(config_.heads) * n);
    for (int l = config_.layers; l-- > 0;) {
      const BlockParams& o = blocks_[static_cast<std::size_t>(l)];
      const BlockActivations& a = activations_[static_cast<std::size_t>(l)];
      const float* dout = d_x;
      // MLP branch.
      linear_backward(f, d, n, p + o.fc2_w, a.g.data(), dout, g + o.fc2_w, g + o.fc2_b, d_hidden);
      kernels::gelu_backward(stream_, static_cast<std::size_t>(f) * n, a.h.data(), d_hidden, d_hidden);
      linear_backward(d, f, n, p + o.fc_w, a.ln2.data(), d_hidden, g + o.fc_w, g + o.fc_b, d_ln);
      kernels::layernorm_backward(stream_, d, n, a.x_mid.data(), a.mean2.data(), a.rstd2.data(), p + o.ln2_w, d_ln,
                                  dout, d_mid, g + o.ln2_w, g + o.ln2_b);
      // Attention branch.
      kernels::merge_heads(stream_, batch.batch, batch.tokens, config_.heads, hd, d, 0, a.att.data(), merged_.data());
      linear_backward(d, d, n, p + o.proj_w, merged_.data(), d_mid, g + o.proj_w, g + o.proj_b, d_ln);
      float* d_att = merged_.data();  // merged is no longer needed
      kernels::split_heads(stream_, batch.batch, batch.tokens, config_.heads, hd, d, 0, d_ln, d_att);
      if (ring_) {
        ring_->backward(attention_dims(batch), positions_.data(), a.q.data(), a.k.data(), a.v.data(), a.att.data(),
                        a.lse.data(), d_att, d_heads, d_heads + dn, d_heads + 2 * dn);
      } else {
        kernels::attention_backward_delta(stream_, batch.batch * config_.heads, batch.tokens, hd, a.att.data(), d_att,
                                          delta);
        kernels::zero(d_heads, sizeof(float) * 3 * dn, stream_);
        kernels::attention_backward(stream_, attention_dims(batch), a.q.data(), positions_.data(), a.k.data(),
                                    a.v.data(), positions_.data(), a.lse.data(), delta, d_att, d_heads, d_heads + dn,
                                    d_heads + 2 * dn);
      }
      for (int part = 0; part < 3; ++part)
        kernels::merge_heads(stream_, batch.batch, batch.tokens, config_.heads, hd, 3 * d, part * d,
                             d_heads + part * dn, d_hidden);
      linear_backward(d, 3 * d, n, p + o.qkv_w, a.ln1.data(), d_hidden, g + o.qkv_w, g + o.qkv_b, d_ln);
      // d_x (this block's output gradient) was last read above; it now takes the input's.
      kernels::layernorm_backward(stream_, d, n, a.x_in.data(), a.mean1.data(), a.rstd1.data(), p + o.ln1_w, d_ln,
                                  d_mid, d_x, g + o.ln1_w, g + o.ln1_b);
      download_gradient(l + 1);
    }
    kernels::token_embedding_backward(stream_, d, batch.batch, batch.tokens, ids_.data(), positions_.data(), d_x,
                                      g + wte_, g + wpe_);
    download_gradient(0);  // last: a tied head adds into wte as well
  }

  template <typename T>
  static T* ensure(DeviceArray<T>& array, std::size_t count) {
    array.resize(count);
    return array.data();
  }

  model::TransformerConfig config_;
  model::DeviceOptions options_;
  model::Transformer cpu_model_;  // the layout (offsets by name) and the parameter count
  comm::Group* group_;
  std::unique_ptr<DeviceRingAttention> ring_;  // sequence-parallel: attention around the group's ring
  kernels::Stream stream_;       // compute
  kernels::Stream copy_stream_;  // parameters in, gradients out, beside the compute
  std::vector<model::ParameterRange> units_;
  std::vector<kernels::Event> params_ready_, grads_ready_;  // one per unit
  std::unique_ptr<kernels::Blas> blas_;
  std::size_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0, head_w_ = 0;
  std::vector<BlockParams> blocks_;
  DeviceArray<float> params_, grads_;
  PinnedArray<float> host_params_, host_grads_;
  const float* last_params_ = nullptr;
  DeviceArray<std::int32_t> ids_, targets_;
  DeviceArray<int> positions_;
  std::vector<BlockActivations> activations_;
  DeviceArray<float> qkv_, merged_, x_head_, y_head_, mean_head_, rstd_head_, logits_, losses_;
  DeviceArray<int> correct_;
  DeviceArray<float> d_a_, d_b_, d_hidden_, d_ln_, d_mid_, d_heads_, delta_;
  std::vector<float> host_losses_;
  std::vector<int> host_correct_;
};

}  // namespace

void check_runs_on_device(const model::TransformerConfig& config) {
  model::validate(config);
  if (config.kind != model::TransformerKind::kGpt)
    throw Error(ErrorKind::kInvalidArgument, "--device cuda runs --model gpt; vit runs on --device cpu");
  const int head_dim = config.d_model / config.heads;
  if (!kernels::attention_supports(head_dim))
    throw Error(ErrorKind::kInvalidArgument,
                str("--device cuda: head_dim ", head_dim, " (--d-model ", config.d_model, " / --heads ", config.heads,
                    ") has no attention kernel; use 16, 32 or 64"));
}

std::unique_ptr<model::DeviceModel> make_sequence_rank(const model::TransformerConfig& config,
                                                       const model::DeviceOptions& options,
                                                       comm::Group* sequence_group) {
  check_runs_on_device(config);
  return std::make_unique<DeviceTransformer>(config, options, sequence_group);
}

std::unique_ptr<model::DeviceModel> make_device_transformer(const model::TransformerConfig& config,
                                                            const model::DeviceOptions& options) {
  check_runs_on_device(config);
  if (options.sp > 1) return make_sequence_parallel(config, options);
  return std::make_unique<DeviceTransformer>(config, options, nullptr);
}

model::DeviceBackend backend() { return {&kernels::device_count, &make_device_transformer}; }

}  // namespace peertrain::device
