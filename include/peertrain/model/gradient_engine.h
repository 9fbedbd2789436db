// One interface for everything that computes the transformer's gradient: the unsplit
// model on the CPU, the pipeline engine's S·P worker threads (parallel::
// make_pipeline_gradient_engine) and the model on a GPU (a DeviceModel). The training
// task picks one at start and never asks which it has.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "peertrain/model/device_model.h"
#include "peertrain/model/transformer.h"

namespace peertrain::model {

class GradientEngine {
 public:
  virtual ~GradientEngine() = default;
  // Where it computes: "the CPU", or the device and its GEMM precision.
  virtual std::string describe() const = 0;
  // The batch's loss; grads is overwritten with its gradient (the flat layout).
  virtual float forward_backward(std::span<const float> params, const TokenBatch& batch, std::span<float> grads) = 0;
  // Forward only, sums for loss / accuracy / bits per byte. `params_changed` false lets an
  // engine reuse what it made of the same params on the previous call (a device copy).
  virtual LossSums evaluate(std::span<const float> params, const TokenBatch& batch, bool params_changed) = 0;
};

// The unsplit model, on this thread (it keeps a reference to `model`).
std::unique_ptr<GradientEngine> make_unsplit_engine(Transformer& model);
// The unsplit model over `threads` threads (--threads N with --sp 1 --pp 1): the batch's
// sequences (or images) cut into `threads` contiguous runs, each run's forward and
// backward on its own thread with its own workspace and gradient buffer, the gradients
// summed after. Equal to the unsplit engine up to the order of that sum. It sets Eigen
// to one thread: the GPT's GEMMs (d 128) are too small for Eigen to split (its two
// threads ran the step at 0.93× one thread, docs/performance.md).
std::unique_ptr<GradientEngine> make_batch_parallel_engine(Transformer& model, int threads);
// The model on a GPU.
std::unique_ptr<GradientEngine> make_device_engine(std::unique_ptr<DeviceModel> device);

}  // namespace peertrain::model
