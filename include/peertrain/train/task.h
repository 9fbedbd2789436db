// What a peer trains: a model together with its data. The trainer loop, the algorithms
// and the checkpoints see only this interface and the flat parameter vector, so the MLP
// on Fashion-MNIST, the patch transformer on Fashion-MNIST and the byte-level GPT on the
// fortunes text run through the same D-PSGD, baselines, fault handling and files.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "peertrain/train/data.h"

namespace peertrain::model {
class DeviceModel;
}

namespace peertrain::train {

struct TrainConfig;

struct TaskEvaluation {
  double accuracy = 0;       // classification accuracy; for gpt, next-byte accuracy
  double loss = 0;           // mean cross-entropy, nats
  double bits_per_byte = 0;  // gpt: loss / ln 2; 0 for the classifiers
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string describe() const = 0;  // for the log: "gpt d128 L4 H4 T256 sp 2 pp 2 (1f1b, 4 micro-batches)"
  virtual bool language_model() const { return false; }
  virtual std::size_t num_parameters() const = 0;
  // The same parameters on every peer for one seed.
  virtual void initialize(std::span<float> params, std::uint64_t seed) const = 0;
  // Training examples of all peers' shards together: an epoch is one pass over them.
  virtual long long examples_per_epoch() const = 0;
  // Draws this peer's next batch and writes the gradient of its mean loss at params into
  // grads (overwriting it); returns the loss.
  virtual float compute_gradient(std::span<const float> params, std::span<float> grads) = 0;
  // On this peer's copy of the held-out data (the whole test set, or the validation text).
  virtual TaskEvaluation evaluate(std::span<const float> params) = 0;
  // FLOPs of one compute_gradient (GEMMs and attention), for GFLOP/s figures.
  virtual double flops_per_step() const = 0;
  // Where the batch sampler stands, for checkpoints.
  virtual BatchSampler::State sampler_state() const = 0;
  virtual void restore_sampler(const BatchSampler::State& state) = 0;
  // The contiguous ranges (offset, size) of the parameter vector that gossip sends as
  // separate messages (algo::Gossip::set_parts), in order, covering it. They must be the
  // same on every peer of a run, so they may depend only on what the run id fixes (the
  // model), never on a peer's own --sp, --pp or profile. Default: one part, the whole vector.
  virtual std::vector<std::pair<std::size_t, std::size_t>> gossip_parts() const { return {{0, num_parameters()}}; }
  // The model's layers as contiguous ranges (offset, size), in order, covering the vector:
  // what Streaming DiLoCo groups into fragments. Default: gossip_parts().
  virtual std::vector<std::pair<std::size_t, std::size_t>> layer_ranges() const { return gossip_parts(); }
  // The GPU model behind compute_gradient (--device cuda), or null; train::DeviceUpdate
  // moves the optimizer onto it.
  virtual model::DeviceModel* device_model() { return nullptr; }
};

// Builds the task the configuration names for peer `rank` of `peers`, loading its data.
std::unique_ptr<Task> make_task(const TrainConfig& config, int peers, int rank);

}  // namespace peertrain::train
