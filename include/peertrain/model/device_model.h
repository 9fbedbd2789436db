// The transformer on a GPU, as the CPU code sees it: parameters and gradients stay in the
// host's flat buffer (what gossip mixes and checkpoints save), and a DeviceModel moves them
// through page-locked memory to the device and back around each step.
//
// The CUDA implementation lives in its own library (src/device/, built with the kernels)
// and registers its factory at start-up, so that this library — and every CPU-only build —
// never links CUDA. Without a registered factory, make_device_model throws an error that
// says the build has no CUDA.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "peertrain/model/transformer.h"

namespace peertrain::model {

enum class Device { kCpu, kCuda };
Device parse_device(const std::string& name);  // "cpu" | "cuda"; names the flag when wrong
const char* device_name(Device device);

enum class GemmMode { kFp32, kTf32, kBf16 };
GemmMode parse_gemm_mode(const std::string& name);  // "fp32" | "tf32" | "bf16"

struct DeviceOptions {
  int device = 0;                  // CUDA device index (sp 1)
  GemmMode gemm = GemmMode::kTf32; // the GEMMs' tensor-core precision
  int sp = 1;                      // sequence ranks, one GPU each (devices 0 … sp−1)
  bool zigzag = true;              // the sequence split over them (else contiguous)
  // --pp P: the units cut into P stages, stage s on device + s mod the visible devices, over
  // `microbatches` micro-batches a step in the order of `schedule` (gpipe, 1f1b or
  // eager-1f1b: parallel/schedule.h). stage_first_units: the first unit of each stage
  // (--stages); empty: split by each unit's FLOPs.
  int pp = 1;
  int microbatches = 1;
  std::string schedule = "1f1b";
  std::vector<int> stage_first_units{};
  double timeout_s = 60;  // a stage's wait for another's tensor (--worker-timeout)
};

// The optimizer's rule, for the update computed on the device (DeviceModel::set_update_rule):
// train::Sgd's (momentum, weight decay) or train::Adam's (AdamW), term for term.
struct DeviceUpdateRule {
  bool adam = false;
  float lr = 0.05f;
  float momentum = 0.0f;                            // SGD
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // Adam
  float weight_decay = 0.0f;
};

class DeviceModel {
 public:
  virtual ~DeviceModel() = default;
  virtual std::string describe() const = 0;  // "NVIDIA H100 80GB HBM3 (device 0), tf32 GEMM"
  // One step: copies params in, ADDS the gradient of the batch's loss into grads (copied
  // back), returns the loss. Same contract as Transformer::forward_backward. With an update
  // rule set, it WRITES into grads the optimizer's update u instead (the step is x − u).
  virtual float forward_backward(std::span<const float> params, const TokenBatch& batch, std::span<float> grads) = 0;

  // The optimizer on the device: from the next forward_backward on, each unit's update u is
  // computed from its gradient on the device as soon as that gradient is final, with the
  // optimizer's state (SGD's momentum, Adam's moments and step count) kept there, and only
  // u crosses to the host: the gradient and the host's optimizer pass drop out of the step.
  // Returns false where this model cannot (sequence ranks: their gradient is all-reduced
  // first), and the host's optimizer stays. train::DeviceUpdate is the optimizer that uses it.
  virtual bool set_update_rule(const DeviceUpdateRule& rule) {
    (void)rule;
    return false;
  }
  virtual void set_update_learning_rate(float lr) { (void)lr; }
  // The optimizer's state in train::Sgd's layout (the momentum) or train::Adam's (m, v,
  // then the step count), for checkpoints; restore_update_state takes it back.
  virtual std::vector<float> update_state() const { return {}; }
  virtual void restore_update_state(std::span<const float> state) { (void)state; }
  // Forward only. Copies params in when they differ from the last call's pointer or
  // `params_changed` is set, so an evaluation over many chunks copies them once.
  virtual LossSums evaluate(std::span<const float> params, const TokenBatch& batch, bool params_changed) = 0;
  // Most device memory this process has held (kernels::peak_allocated_bytes).
  virtual std::size_t peak_device_bytes() const = 0;
};

struct DeviceBackend {
  int (*device_count)() = nullptr;
  std::unique_ptr<DeviceModel> (*make)(const TransformerConfig& config, const DeviceOptions& options) = nullptr;
};

// Called once by a program linked with the CUDA library (the peertrain command).
void register_device_backend(DeviceBackend backend);
// Usable devices: 0 when no backend is registered or there is no GPU.
int cuda_device_count();
// The device count, or an error saying why --device cuda cannot run (no CUDA in this
// build, no GPU visible).
int require_cuda_device();
std::unique_ptr<DeviceModel> make_device_model(const TransformerConfig& config, const DeviceOptions& options);

}  // namespace peertrain::model
