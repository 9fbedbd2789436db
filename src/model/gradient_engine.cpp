#include "peertrain/model/gradient_engine.h"

#include <algorithm>

namespace peertrain::model {
namespace {

class Unsplit final : public GradientEngine {
 public:
  explicit Unsplit(Transformer& model) : model_(model) {}
  std::string describe() const override { return "the CPU"; }
  float forward_backward(std::span<const float> params, const TokenBatch& batch, std::span<float> grads) override {
    std::fill(grads.begin(), grads.end(), 0.0f);  // the model adds into grads
    return model_.forward_backward(params, batch, grads);
  }
  LossSums evaluate(std::span<const float> params, const TokenBatch& batch, bool) override {
    return model_.evaluate(params, batch);
  }

 private:
  Transformer& model_;
};

class OnDevice final : public GradientEngine {
 public:
  explicit OnDevice(std::unique_ptr<DeviceModel> device) : device_(std::move(device)) {}
  std::string describe() const override { return device_->describe(); }
  float forward_backward(std::span<const float> params, const TokenBatch& batch, std::span<float> grads) override {
    std::fill(grads.begin(), grads.end(), 0.0f);  // the device model adds into grads
    return device_->forward_backward(params, batch, grads);
  }
  LossSums evaluate(std::span<const float> params, const TokenBatch& batch, bool params_changed) override {
    return device_->evaluate(params, batch, params_changed);
  }

 private:
  std::unique_ptr<DeviceModel> device_;
};

}  // namespace

std::unique_ptr<GradientEngine> make_unsplit_engine(Transformer& model) { return std::make_unique<Unsplit>(model); }

std::unique_ptr<GradientEngine> make_device_engine(std::unique_ptr<DeviceModel> device) {
  return std::make_unique<OnDevice>(std::move(device));
}

}  // namespace peertrain::model
