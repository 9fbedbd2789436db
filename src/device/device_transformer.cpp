#include "peertrain/device/device_transformer.h"

#include <array>
#include <cstring>
#include <optional>
#include <vector>

#include "device_block_ops.h"
#include "peertrain/comm/group.h"

namespace peertrain::device {
namespace {

using namespace detail;

class DeviceTransformer final : public model::DeviceModel {
 public:
  // sequence_group: null, or the group of sequence ranks this one belongs to (attention
  // then runs around its ring and the gradient is all-reduced over it).
  DeviceTransformer(const model::TransformerConfig& config, const model::DeviceOptions& options,
                    comm::Group* sequence_group)
      : config_(config), options_(options), layout_(model::transformer_layout(config)), group_(sequence_group) {
    kernels::set_device(options.device);
    stream_ = kernels::create_stream();
    if (group_ != nullptr && group_->size() > 1) ring_ = std::make_unique<DeviceRingAttention>(*group_, stream_);
    copy_stream_ = kernels::create_stream();
    for (std::size_t u = 0; u < layout_.units.size(); ++u) {
      params_ready_.push_back(kernels::create_event());
      grads_ready_.push_back(kernels::create_event());
    }
    blas_ = std::make_unique<kernels::Blas>(stream_, precision(options.gemm));
    const std::size_t size = layout_.total;
    params_.resize(size, "parameters");
    grads_.resize(size, "gradients");
    host_params_ = PinnedArray<float>(size, "parameters (pinned)");
    host_grads_ = PinnedArray<float>(size, "gradients (pinned)");
    saved_.resize(static_cast<std::size_t>(config.layers));
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
               options_.gemm == model::GemmMode::kBf16 ? " GEMM and attention" : " GEMM");
  }

  std::size_t peak_device_bytes() const override { return kernels::peak_allocated_bytes(); }

  float forward_backward(std::span<const float> params, const model::TokenBatch& batch,
                         std::span<float> grads) override {
    check_sizes(params.size(), grads.size());
    kernels::set_device(options_.device);  // the calling thread's device (a worker of a sequence group)
    upload_parameters(params);
    kernels::zero(grads_.data(), sizeof(float) * grads.size(), stream_);
    const model::LossSums sums = forward(batch, /*keep_gradient=*/true);
    if (rule_) ++update_steps_;
    backward(batch);  // whole sequences: each unit's gradient (or update) travels to host_grads_ as it finishes
    if (ring_) {      // a sequence rank: the gradient is the sum over the group's ranks
      kernels::synchronize(stream_);
      group_->all_reduce(grads_.span().first(grads.size()));
      kernels::copy_to_host(host_grads_.data(), grads_.data(), sizeof(float) * grads.size(), stream_);
      kernels::synchronize(stream_);
    }
    kernels::synchronize(copy_stream_);
    if (rule_)  // the update replaces what grads held
      std::memcpy(grads.data(), host_grads_.data(), sizeof(float) * grads.size());
    else
      for (std::size_t i = 0; i < grads.size(); ++i) grads[i] += host_grads_.data()[i];
    return static_cast<float>(sums.loss_sum / batch.loss_divisor);
  }

  bool set_update_rule(const model::DeviceUpdateRule& rule) override {
    if (ring_) return false;
    kernels::set_device(options_.device);
    const std::size_t size = layout_.total;
    first_moment_.resize(size, "optimizer momentum / first moment");
    kernels::zero(first_moment_.data(), sizeof(float) * size, stream_);
    if (rule.adam) {
      second_moment_.resize(size, "optimizer second moment");
      kernels::zero(second_moment_.data(), sizeof(float) * size, stream_);
    }
    update_.resize(size, "optimizer update");
    update_steps_ = 0;
    rule_ = rule;
    return true;
  }

  void set_update_learning_rate(float lr) override {
    PEERTRAIN_CHECK(rule_, "device transformer: a learning rate without an update rule");
    rule_->lr = lr;
  }

  std::vector<float> update_state() const override {
    PEERTRAIN_CHECK(rule_, "device transformer: no update rule, so no optimizer state");
    kernels::set_device(options_.device);
    const std::size_t size = layout_.total;
    std::vector<float> state(rule_->adam ? 2 * size + 1 : size);
    kernels::synchronize(stream_);
    kernels::copy_to_host(state.data(), first_moment_.data(), sizeof(float) * size, stream_);
    if (rule_->adam) {
      kernels::copy_to_host(state.data() + size, second_moment_.data(), sizeof(float) * size, stream_);
      state[2 * size] = static_cast<float>(update_steps_);
    }
    kernels::synchronize(stream_);
    return state;
  }

  void restore_update_state(std::span<const float> state) override {
    PEERTRAIN_CHECK(rule_, "device transformer: no update rule to restore the state of");
    const std::size_t size = layout_.total;
    if (state.size() != (rule_->adam ? 2 * size + 1 : size))
      throw Error(ErrorKind::kInvalidArgument,
                  str("optimizer state of ", state.size(), " floats; the device's ", rule_->adam ? "Adam" : "SGD",
                      " over ", size, " parameters holds ", rule_->adam ? 2 * size + 1 : size));
    kernels::set_device(options_.device);
    kernels::copy_to_device(first_moment_.data(), state.data(), sizeof(float) * size, stream_);
    if (rule_->adam) {
      kernels::copy_to_device(second_moment_.data(), state.data() + size, sizeof(float) * size, stream_);
      update_steps_ = static_cast<long long>(state[2 * size]);
    }
    kernels::synchronize(stream_);
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
    PEERTRAIN_CHECK(params == layout_.total && grads == params, "device transformer: params has ", params,
                    " and grads ", grads, " floats, the model ", layout_.total);
  }

  // Through the pinned buffer, unit by unit on the copy stream: block l's forward starts
  // as soon as its own parameters have arrived, while the later units' are still coming.
  // (The previous step's copies out of host_params_ have finished: forward waited on them.)
  void upload_parameters(std::span<const float> params) {
    std::memcpy(host_params_.data(), params.data(), sizeof(float) * params.size());
    for (std::size_t u = 0; u < layout_.units.size(); ++u) {
      const model::ParameterRange r = layout_.units[u];
      kernels::copy_to_device(params_.data() + r.offset, host_params_.data() + r.offset, sizeof(float) * r.size,
                              copy_stream_);
      kernels::record(params_ready_[u], copy_stream_);
    }
    last_params_ = params.data();
  }

  // The gradient of `unit` is final on the compute stream: send it to the host on the copy
  // stream while the compute stream goes on with the units below.
  // With an update rule, the optimizer runs over the unit first and its update u goes
  // instead (the parameters on the device are still x_k, as the host optimizer would see).
  void download_gradient(int unit) {
    if (ring_) return;  // the gradient is all-reduced first, then copied whole
    const model::ParameterRange r = layout_.units[static_cast<std::size_t>(unit)];
    const float* out = grads_.data() + r.offset;
    if (rule_) {
      float* u = update_.data() + r.offset;
      if (rule_->adam)
        kernels::adamw_update(stream_, r.size, params_.data() + r.offset, grads_.data() + r.offset,
                              first_moment_.data() + r.offset, second_moment_.data() + r.offset, u, rule_->lr,
                              rule_->beta1, rule_->beta2, rule_->eps, rule_->weight_decay,
                              static_cast<float>(update_steps_));
      else
        kernels::sgd_update(stream_, r.size, params_.data() + r.offset, grads_.data() + r.offset,
                            first_moment_.data() + r.offset, u, rule_->lr, rule_->momentum, rule_->weight_decay);
      out = u;
    }
    kernels::record(grads_ready_[static_cast<std::size_t>(unit)], stream_);
    kernels::wait(copy_stream_, grads_ready_[static_cast<std::size_t>(unit)]);
    kernels::copy_to_host(host_grads_.data() + r.offset, out, sizeof(float) * r.size, copy_stream_);
  }

  void upload_batch(const model::TokenBatch& batch) {
    // The CPU model's boundary checks: a bad byte must be an error, not an out-of-bounds
    // read on the device.
    model::check_batch(config_, batch);
    const std::size_t n = static_cast<std::size_t>(batch.batch) * batch.tokens;
    ids_.resize(n, "bytes");
    targets_.resize(n, "targets");
    positions_.resize(static_cast<std::size_t>(batch.tokens), "positions");
    kernels::copy_to_device(ids_.data(), batch.bytes.data(), sizeof(std::int32_t) * n, stream_);
    kernels::copy_to_device(targets_.data(), batch.targets.data(), sizeof(std::int32_t) * n, stream_);
    kernels::copy_to_device(positions_.data(), batch.positions.data(), sizeof(int) * batch.tokens, stream_);
  }

  kernels::AttentionDims attention_dims(const model::TokenBatch& batch) const {
    return detail::attention_dims(config_, batch, precision(options_.gemm));
  }

  DeviceBlockOps block_ops(const model::TokenBatch& batch) {
    return {stream_, *blas_, scratch_, delta_, ring_.get(), attention_dims(batch), positions_.data(), batch.batch};
  }

  model::LossSums forward(const model::TokenBatch& batch, bool keep_gradient) {
    upload_batch(batch);
    const int d = config_.d_model, n = batch.batch * batch.tokens;
    const std::size_t dn = static_cast<std::size_t>(d) * n;
    const float* p = params_.data();
    const model::BlockShape shape = model::block_shape(config_, batch);
    const std::size_t saved_floats = shape.saved().total;  // x_in first, at offset 0
    for (DeviceArray<float>& saved : saved_) saved.resize(saved_floats, "block activations");
    x_head_.resize(dn, "head input");
    float* x = config_.layers > 0 ? saved_[0].data() : x_head_.data();
    kernels::wait(stream_, params_ready_[0]);
    kernels::token_embedding_forward(stream_, d, batch.batch, batch.tokens, ids_.data(), positions_.data(),
                                     p + layout_.wte, p + layout_.wpe, x);
    DeviceBlockOps ops = block_ops(batch);
    for (std::size_t l = 0; l < saved_.size(); ++l) {
      float* out = l + 1 < saved_.size() ? saved_[l + 1].data() : x_head_.data();
      kernels::wait(stream_, params_ready_[l + 1]);
      model::block_forward(ops, shape, layout_.blocks[l], p, saved_[l].data(), saved_[l].data(), out);
    }
    kernels::wait(stream_, params_ready_.back());
    const float grad_scale = keep_gradient ? static_cast<float>(1.0 / batch.loss_divisor) : 0.0f;
    head_forward(ops, config_, head_tensors(config_, layout_, p, nullptr), p, x_head_.data(), n, targets_.data(),
                 grad_scale, head_);
    host_losses_.resize(static_cast<std::size_t>(n));
    host_correct_.resize(static_cast<std::size_t>(n));
    kernels::copy_to_host(host_losses_.data(), head_.losses.data(), sizeof(float) * n, stream_);
    kernels::copy_to_host(host_correct_.data(), head_.correct.data(), sizeof(int) * n, stream_);
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
    const int d = config_.d_model, n = batch.batch * batch.tokens;
    const std::size_t dn = static_cast<std::size_t>(d) * n;
    const float* p = params_.data();
    float* g = grads_.data();
    DeviceBlockOps ops = block_ops(batch);
    float* d_x = ensure(d_b_, dn);  // gradient w.r.t. the current unit's input
    head_backward(ops, config_, head_tensors(config_, layout_, p, g), p, x_head_.data(), n, head_, ensure(d_a_, dn),
                  d_x, g);
    download_gradient(config_.layers + 1);
    const model::BlockShape shape = model::block_shape(config_, batch);
    for (std::size_t l = saved_.size(); l-- > 0;) {
      model::block_backward(ops, shape, layout_.blocks[l], p, saved_[l].data(), d_x, d_x, g);
      download_gradient(static_cast<int>(l) + 1);
    }
    kernels::token_embedding_backward(stream_, d, batch.batch, batch.tokens, ids_.data(), positions_.data(), d_x,
                                      g + layout_.wte, g + layout_.wpe);
    download_gradient(0);  // last: a tied head adds into wte as well
  }

  template <typename T>
  static T* ensure(DeviceArray<T>& array, std::size_t count) {
    array.resize(count);
    return array.data();
  }

  model::TransformerConfig config_;
  model::DeviceOptions options_;
  model::TransformerLayout layout_;
  comm::Group* group_;
  std::unique_ptr<DeviceRingAttention> ring_;  // sequence-parallel: attention around the group's ring
  kernels::Stream stream_;       // compute
  kernels::Stream copy_stream_;  // parameters in, gradients out, beside the compute
  std::vector<kernels::Event> params_ready_, grads_ready_;  // one per unit
  std::unique_ptr<kernels::Blas> blas_;
  DeviceArray<float> params_, grads_;
  PinnedArray<float> host_params_, host_grads_;  // host_grads_ carries the update under a rule
  const float* last_params_ = nullptr;
  std::optional<model::DeviceUpdateRule> rule_;  // the optimizer on the device, if set
  DeviceArray<float> first_moment_, second_moment_, update_;
  long long update_steps_ = 0;  // Adam's step count (bias correction)
  DeviceArray<std::int32_t> ids_, targets_;
  DeviceArray<int> positions_;
  std::vector<DeviceArray<float>> saved_;      // each block's, in model::BlockSaved's layout
  std::array<DeviceArray<float>, 5> scratch_;  // the block composition's
  DeviceArray<float> delta_, x_head_, d_a_, d_b_;
  HeadBuffers head_;
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
  if (options.pp > 1) return make_device_pipeline(config, options);
  if (options.sp > 1) return make_sequence_parallel(config, options);
  return std::make_unique<DeviceTransformer>(config, options, nullptr);
}

model::DeviceBackend backend() { return {&kernels::device_count, &make_device_transformer}; }

}  // namespace peertrain::device
