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

}  // namespace peertrain::parallel
