// The MLP classifier on Fashion-MNIST (the paper's experiments) as a Task.
#include <algorithm>
#include <numeric>

#include "peertrain/core/error.h"
#include "peertrain/model/mlp.h"
#include "tasks.h"

namespace peertrain::train {

Shard load_shard(const TrainConfig& config, int peers, int rank) {
  const IdxBytes full = read_fashion_mnist(config.data_dir, true);
  const auto shards = config.partition == Partition::kIid
                          ? partition_iid(full.size(), peers, config.seed)
                          : partition_dirichlet(full.labels, full.classes, peers, config.alpha, config.seed,
                                                static_cast<std::size_t>(config.batch));
  // Only this peer's examples become floats: a peer of 8 converts an eighth of the set.
  return Shard{to_dataset(full, shards[rank]), full.size()};
}

namespace {

class MlpTask final : public Task {
 public:
  MlpTask(const TrainConfig& config, int peers, int rank)
      : shard_(load_shard(config, peers, rank)),
        test_(shared_fashion_mnist_test(config.data_dir)),
        // The sampler shuffles positions in the shard: the same batches as over the full set.
        sampler_(shard_.data, all_positions(shard_.data.size()), config.batch, config.seed + 1000003ULL * rank),
        mlp_({shard_.data.features, config.hidden, shard_.data.classes}),
        batch_(config.batch),
        inputs_(static_cast<std::size_t>(shard_.data.features) * config.batch),
        labels_(config.batch) {}

  std::string describe() const override {
    std::string text = "mlp";
    for (std::size_t i = 0; i < mlp_.config().hidden.size(); ++i) text += str(i ? "," : " ", mlp_.config().hidden[i]);
    return text;
  }
  std::size_t num_parameters() const override { return mlp_.num_parameters(); }
  // Each layer's weight, then its bias (model::Mlp's layout).
  std::vector<std::pair<std::size_t, std::size_t>> layer_ranges() const override {
    std::vector<std::pair<std::size_t, std::size_t>> ranges;
    const model::MlpConfig& m = mlp_.config();
    std::size_t offset = 0;
    int in = m.inputs;
    for (std::size_t l = 0; l <= m.hidden.size(); ++l) {
      const int out = l < m.hidden.size() ? m.hidden[l] : m.classes;
      const auto size = static_cast<std::size_t>(in) * static_cast<std::size_t>(out) + static_cast<std::size_t>(out);
      ranges.emplace_back(offset, size);
      offset += size;
      in = out;
    }
    PEERTRAIN_CHECK(offset == mlp_.num_parameters(), "the layers cover ", offset, " of ", mlp_.num_parameters());
    return ranges;
  }
  void initialize(std::span<float> params, std::uint64_t seed) const override { mlp_.initialize(params, seed); }
  long long examples_per_epoch() const override { return shard_.full_size; }
  double flops_per_step() const override { return mlp_.flops_per_step(batch_); }

  float compute_gradient(std::span<const float> params, std::span<float> grads) override {
    sampler_.next(inputs_.data(), labels_.data());
    return mlp_.forward_backward(params, inputs_.data(), labels_.data(), batch_, grads);
  }

  TaskEvaluation evaluate(std::span<const float> params) override {
    constexpr int kChunk = 1000;
    model::EvalResult total;
    const Dataset& test = *test_;
    for (int start = 0; start < test.size(); start += kChunk) {
      const int count = std::min(kChunk, test.size() - start);
      const auto r = mlp_.evaluate(params, test.inputs.data() + static_cast<std::size_t>(start) * test.features,
                                   test.labels.data() + start, count);
      total.loss_sum += r.loss_sum;
      total.correct += r.correct;
      total.count += r.count;
    }
    const double count = static_cast<double>(std::max<long long>(total.count, 1));
    return {static_cast<double>(total.correct) / count, total.loss_sum / count, 0.0};
  }

  BatchSampler::State sampler_state() const override { return sampler_.state(); }
  void restore_sampler(const BatchSampler::State& state) override { sampler_.restore(state); }

 private:
  Shard shard_;
  std::shared_ptr<const Dataset> test_;  // shared by the peers of one process
  BatchSampler sampler_;
  model::Mlp mlp_;
  int batch_;
  std::vector<float> inputs_;
  std::vector<std::int32_t> labels_;
};

}  // namespace

std::unique_ptr<Task> make_mlp_task(const TrainConfig& config, int peers, int rank) {
  return std::make_unique<MlpTask>(config, peers, rank);
}

std::unique_ptr<Task> make_task(const TrainConfig& config, int peers, int rank) {
  if (config.model == ModelKind::kMlp) return make_mlp_task(config, peers, rank);
  return make_transformer_task(config, peers, rank);
}

std::string_view to_string(ModelKind model) {
  switch (model) {
    case ModelKind::kMlp: return "mlp";
    case ModelKind::kGpt: return "gpt";
    case ModelKind::kVit: return "vit";
  }
  return "?";
}

ModelKind parse_model(std::string_view name) {
  for (auto m : {ModelKind::kMlp, ModelKind::kGpt, ModelKind::kVit})
    if (to_string(m) == name) return m;
  throw Error(ErrorKind::kInvalidArgument, str("--model '", name, "' is not one of mlp, gpt, vit"));
}

}  // namespace peertrain::train
