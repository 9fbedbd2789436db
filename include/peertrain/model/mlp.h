// A multi-layer perceptron classifier (Linear → ReLU → … → Linear, softmax cross-entropy)
// with explicit forward and backward passes in Eigen, float32. Its parameters are not
// owned: every call reads them from a flat buffer (the ParameterStore layout below), so the
// same buffer is what gossip mixes and what the optimizer updates.
//
// Activations are column-major, features × batch (one example per column), which is also
// the example-major order data sets store, so a batch is a plain copy. The forward GEMM is
// then W·X with the wide output dimension as its rows, the shape Eigen's kernel runs fastest:
// measured single-threaded with AVX-512 at batch 128, 784→512 runs at ~160 GFLOP/s this way
// against ~113 batch-major (Xᵀ·Wᵀ); the weight and input gradients (D·Xᵀ, Wᵀ·D) run at
// ~155. `peertrain bench step` times the whole step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "peertrain/core/parameter_store.h"

namespace peertrain::model {

class Gemm;  // a GEMM with packing buffers that persist between calls (src/model/gemm.h)

struct MlpConfig {
  int inputs = 784;
  std::vector<int> hidden = {512, 512};
  int classes = 10;
};

// Sums over the examples of one evaluate() call, so calls over shards add up.
struct EvalResult {
  double loss_sum = 0;
  long long correct = 0;
  long long count = 0;
};

class Mlp {
 public:
  explicit Mlp(MlpConfig config);
  ~Mlp();
  Mlp(Mlp&&) noexcept;
  Mlp& operator=(Mlp&&) noexcept;

  const MlpConfig& config() const { return config_; }
  std::size_t num_parameters() const { return num_parameters_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }

  // Layout of the flat buffer, in order: for layer l = 0..L-1, "fc{l}.weight" (out × in,
  // column-major), then "fc{l}.bias" (out).
  void register_parameters(ParameterStore& store) const;

  // PyTorch's nn.Linear default: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)), drawn in
  // buffer order from peertrain::Rng(seed), so a seed gives the same model everywhere.
  void initialize(std::span<float> params, std::uint64_t seed) const;

  // One batch: inputs is inputs × batch column-major, labels in [0, classes). Writes
  // d(mean loss)/d(params) into grads (the same layout) and returns the mean loss.
  // Allocates only when the batch grows past every earlier one; not thread-safe.
  float forward_backward(std::span<const float> params, const float* inputs, const std::int32_t* labels, int batch,
                         std::span<float> grads);

  EvalResult evaluate(std::span<const float> params, const float* inputs, const std::int32_t* labels, int batch);

  // FLOPs of the GEMMs of one forward+backward (2·m·n·k each): forward, weight gradient,
  // and the input gradient of every layer but the first.
  double flops_per_step(int batch) const;

 private:
  struct Layer {
    int in = 0;
    int out = 0;
    std::size_t weight_offset = 0;
    std::size_t bias_offset = 0;
  };

  void check_call(std::span<const float> params, const std::int32_t* labels, int batch) const;
  void reserve(int batch);
  // Leaves every layer's output in activations_, the logits in the last.
  void forward(std::span<const float> params, const float* inputs, int batch);

  MlpConfig config_;
  std::vector<Layer> layers_;
  std::size_t num_parameters_ = 0;
  int max_width_ = 0;  // the widest hidden layer: the size of the backward buffers

  // Workspace, sized for capacity_ columns: each layer's output, and two buffers that the
  // backward pass alternates between for the gradient flowing into a layer.
  int capacity_ = 0;
  std::vector<std::vector<float>> activations_;
  std::vector<float> delta_a_;
  std::vector<float> delta_b_;
  std::unique_ptr<Gemm> gemm_;
};

}  // namespace peertrain::model
