// PipelineEngine behind model::GradientEngine.
#include "peertrain/parallel/pipeline.h"

namespace peertrain::parallel {
namespace {

class Pipelined final : public model::GradientEngine {
 public:
  Pipelined(model::Transformer& model, EngineConfig config) : model_(model), engine_(model, config) {}
  std::string describe() const override { return "the CPU"; }
  float forward_backward(std::span<const float> params, const model::TokenBatch& batch,
                         std::span<float> grads) override {
    GlobalBatch global;
    global.batch = batch.batch;
    if (!batch.bytes.empty()) {  // gpt
      global.bytes = batch.bytes;
      global.targets = batch.targets;
    } else {  // vit: a TokenBatch carries the labels as its targets
      global.pixels = batch.pixels;
      global.labels = batch.targets;
    }
    return engine_.step(params, global, grads);  // overwrites grads
  }
  model::LossSums evaluate(std::span<const float> params, const model::TokenBatch& batch, bool) override {
    return model_.evaluate(params, batch);
  }

 private:
  model::Transformer& model_;
  PipelineEngine engine_;
};

}  // namespace

std::unique_ptr<model::GradientEngine> make_pipeline_gradient_engine(model::Transformer& model, EngineConfig config) {
  return std::make_unique<Pipelined>(model, std::move(config));
}

GradientEngineMade make_gradient_engine(model::Transformer& model, const GradientEngineChoice& choice) {
  GradientEngineMade made;
  if (choice.device == model::Device::kCuda) {
    auto device = model::make_device_model(model.config(), choice.device_options);
    made.device = device.get();  // owned by the engine
    made.engine = model::make_device_engine(std::move(device));
  } else if (choice.engine.workers() > 1) {
    made.engine = make_pipeline_gradient_engine(model, choice.engine);
  } else if (choice.threads > 1) {
    made.engine = model::make_batch_parallel_engine(model, choice.threads);
  } else {
    made.engine = model::make_unsplit_engine(model);
  }
  return made;
}

}  // namespace peertrain::parallel
