// The transformers as Tasks: the byte-level GPT on the fortunes text (validation bits per
// byte) and the patch transformer on Fashion-MNIST. With --sp or --pp above 1 the gradient
// comes from the pipeline engine's S·P worker threads; otherwise from the unsplit model,
// which the engine's tests hold it equal to.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <numeric>
#include <optional>

#include "peertrain/core/error.h"
#include "peertrain/model/device_model.h"
#include "peertrain/model/gradient_engine.h"
#include "peertrain/model/transformer.h"
#include "peertrain/parallel/pipeline.h"
#include "tasks.h"

namespace peertrain::train {
namespace {

model::TransformerConfig transformer_config(const TrainConfig& config) {
  model::TransformerConfig c = config.transformer;
  c.kind = config.model == ModelKind::kVit ? model::TransformerKind::kVit : model::TransformerKind::kGpt;
  model::validate(c);
  return c;
}

class TransformerTask final : public Task {
 public:
  TransformerTask(const TrainConfig& config, int peers, int rank)
      : model_(transformer_config(config)), batch_(config.batch), positions_(all_positions(model_.config().tokens())) {
    const auto& mc = model_.config();
    const int tokens = mc.tokens();
    if (language_model()) {
      corpus_ = load_fortunes(config.text_dir);
      tokenizer_ = config.tokenizer == TokenizerKind::kBytes
                       ? make_byte_tokenizer()
                       : make_sentencepiece_tokenizer(corpus_.train, mc.vocab, tokenizer_dir(config.out_dir));
      if (tokenizer_->vocab_size() != mc.vocab)
        throw Error(ErrorKind::kInvalidArgument, str("--vocab-size ", mc.vocab, ": the ", tokenizer_->describe(),
                                                     " tokenizer has ", tokenizer_->vocab_size(), " tokens"));
      const std::vector<std::int32_t> train_tokens = tokenizer_->encode(corpus_.train);
      train_tokens_ = static_cast<long long>(train_tokens.size());
      text_sampler_.emplace(train_tokens, peers, rank, batch_, tokens, config.seed + 1000003ULL * rank);
      std::vector<int> token_bytes(static_cast<std::size_t>(mc.vocab));
      for (int id = 0; id < mc.vocab; ++id) token_bytes[static_cast<std::size_t>(id)] = tokenizer_->token_bytes(id);
      validation_ =
          validation_windows(tokenizer_->encode(corpus_.validation), tokens, config.eval_windows, token_bytes);
      bytes_.resize(static_cast<std::size_t>(batch_) * tokens);
      targets_.resize(bytes_.size());
    } else {
      Shard shard = load_shard(config, peers, rank);
      if (shard.data.features != mc.image * mc.image)
        throw Error(ErrorKind::kInvalidArgument, str("vit: images of ", shard.data.features, " pixels, the model expects ",
                                                     mc.image, "×", mc.image));
      train_size_ = shard.full_size;
      shard_ = std::move(shard.data);
      test_ = load_fashion_mnist(config.data_dir, false);
      image_sampler_.emplace(shard_, all_positions(shard_.size()), batch_, config.seed + 1000003ULL * rank);
      pixels_.resize(static_cast<std::size_t>(batch_) * shard_.features);
      labels_.resize(batch_);
    }
    // Peers on one machine share its GPUs round-robin; two peers may share one GPU.
    const int devices = config.device == model::Device::kCuda ? std::max(1, model::cuda_device_count()) : 1;
    auto made = parallel::make_gradient_engine(
        model_, {.device = config.device,
                 .device_options = {.device = config.engine.sp > 1 ? 0 : rank % devices,
                                    .gemm = config.gemm,
                                    .sp = config.engine.sp,
                                    .zigzag = config.engine.split == parallel::SequenceSplit::kZigzag,
                                    .pp = config.engine.pp,
                                    .microbatches = config.engine.microbatches,
                                    .schedule = std::string(parallel::to_string(config.engine.schedule)),
                                    .stage_first_units = config.engine.stage_first_units,
                                    .timeout_s = config.engine.timeout_s},
                 .engine = config.engine,
                 .threads = config.threads});
    engine_ = std::move(made.engine);
    device_ = made.device;  // owned by the engine, which lives as long as this task
    engine_config_ = config.engine;
  }

  bool language_model() const override { return model_.config().kind == model::TransformerKind::kGpt; }

  std::string describe() const override {
    const auto& c = model_.config();
    std::string s =
        str(language_model() ? "gpt" : "vit", " d", c.d_model, " L", c.layers, " H", c.heads, " T", c.tokens(), ", ",
            engine_config_.stage_meshes.empty()
                ? str("sp ", engine_config_.sp, engine_config_.tp > 1 ? str(" tp ", engine_config_.tp) : "")
                : str("stage meshes ", parallel::to_string(engine_config_.stage_meshes), " (reshard ",
                      parallel::to_string(engine_config_.reshard), ")"),
            " pp ", engine_config_.pp);
    if (language_model() && tokenizer_->vocab_size() != 256) {
      char ratio[32];
      std::snprintf(ratio, sizeof ratio, "%.2f",
                    static_cast<double>(corpus_.train.size()) / static_cast<double>(std::max(train_tokens_, 1LL)));
      s += str(", ", tokenizer_->describe(), ", ", ratio, " bytes per token");
    }
    if (engine_config_.pp > 1)
      s += str(" (", parallel::to_string(engine_config_.schedule), ", ", engine_config_.microbatches, " micro-batches",
               engine_config_.vocab_parallel == parallel::VocabParallel::kNone
                   ? ""
                   : str(", vocabulary split ", parallel::to_string(engine_config_.vocab_parallel)),
               ")");
    s += ", on " + engine_->describe();
    return s;
  }
  std::size_t num_parameters() const override { return model_.num_parameters(); }
  void initialize(std::span<float> params, std::uint64_t seed) const override { model_.initialize(params, seed); }
  long long examples_per_epoch() const override {
    return language_model() ? train_tokens_ / model_.config().tokens() : train_size_;
  }
  double flops_per_step() const override { return model_.flops_per_step(batch_, model_.config().tokens()); }

  // One gossip part per unit (embedding, each block, head): every pipeline stage, a run of
  // consecutive units, then sends exactly the parts of its units. The parts do not follow
  // this peer's stages: peers may differ in --pp and --stages (the run id leaves them out),
  // and without --stages each peer picks its split from its own timing profile, while the
  // messages of a part must line up on every peer. The units are fixed by the model, which
  // the run id does include. The mix is elementwise, so the numbers do not depend on it.
  model::DeviceModel* device_model() override { return device_; }

  std::vector<std::pair<std::size_t, std::size_t>> gossip_parts() const override {
    std::vector<std::pair<std::size_t, std::size_t>> parts;
    std::size_t end = 0;
    for (int unit = 0; unit < model_.num_units(); ++unit) {
      const model::ParameterRange range = model_.unit_parameters(unit);
      PEERTRAIN_CHECK(range.offset == end, "unit ", unit, " starts at ", range.offset, ", the one before ends at ", end);
      if (range.size > 0) parts.emplace_back(range.offset, range.size);  // a unit without parameters sends nothing
      end = range.offset + range.size;
    }
    PEERTRAIN_CHECK(end == model_.num_parameters(), "the units cover ", end, " of ", model_.num_parameters(),
                    " parameters");
    return parts;
  }

  float compute_gradient(std::span<const float> params, std::span<float> grads) override {
    model::TokenBatch whole;
    whole.batch = batch_;
    whole.tokens = model_.config().tokens();
    whole.positions = positions_;
    if (language_model()) {
      text_sampler_->next(bytes_.data(), targets_.data());
      whole.bytes = bytes_;
      whole.targets = targets_;
      whole.loss_divisor = static_cast<double>(batch_) * whole.tokens;
    } else {
      image_sampler_->next(pixels_.data(), labels_.data());
      whole.pixels = pixels_;
      whole.targets = labels_;
      whole.loss_divisor = batch_;
    }
    return engine_->forward_backward(params, whole, grads);
  }

  TaskEvaluation evaluate(std::span<const float> params) override {
    constexpr int kChunk = 16;  // sequences or images per forward pass
    model::LossSums total;
    auto add = [&](const model::LossSums& s) {
      total.loss_sum += s.loss_sum;
      total.correct += s.correct;
      total.count += s.count;
    };
    model::TokenBatch b;
    b.tokens = model_.config().tokens();
    b.positions = positions_;
    if (language_model()) {
      const std::size_t seq = static_cast<std::size_t>(validation_.seq);
      for (int start = 0; start < validation_.count; start += kChunk) {
        b.batch = std::min(kChunk, validation_.count - start);
        b.bytes = std::span<const std::int32_t>(validation_.bytes).subspan(start * seq, b.batch * seq);
        b.targets = std::span<const std::int32_t>(validation_.targets).subspan(start * seq, b.batch * seq);
        add(engine_->evaluate(params, b, /*params_changed=*/start == 0));
      }
    } else {
      const std::size_t pixels = static_cast<std::size_t>(test_.features);
      for (int start = 0; start < test_.size(); start += 4 * kChunk) {
        b.batch = std::min(4 * kChunk, test_.size() - start);
        b.pixels = std::span<const float>(test_.inputs).subspan(start * pixels, b.batch * pixels);
        b.targets = std::span<const std::int32_t>(test_.labels).subspan(start, b.batch);
        add(engine_->evaluate(params, b, /*params_changed=*/start == 0));
      }
    }
    const double count = static_cast<double>(std::max<long long>(total.count, 1));
    const double loss = total.loss_sum / count;
    // Bits per byte: nats over the bytes the targets stand for (one each for bytes, so
    // this is loss / ln 2 there), which compares across vocabularies.
    const double bytes = language_model() ? std::max(validation_.target_bytes, 1.0) : 1.0;
    return {static_cast<double>(total.correct) / count, loss,
            language_model() ? total.loss_sum / bytes / std::numbers::ln2 : 0.0};
  }

  BatchSampler::State sampler_state() const override {
    if (language_model()) return {0, 0, text_sampler_->steps_drawn()};
    return image_sampler_->state();
  }
  void restore_sampler(const BatchSampler::State& state) override {
    if (language_model()) {
      text_sampler_->restore(state.batches_drawn);
    } else {
      image_sampler_->restore(state);
    }
  }

 private:
  model::Transformer model_;
  int batch_;
  std::vector<int> positions_;
  parallel::EngineConfig engine_config_;
  std::unique_ptr<model::GradientEngine> engine_;  // unsplit, pipelined, or on a GPU (--device cuda)
  model::DeviceModel* device_ = nullptr;           // the GPU model inside engine_, for --device cuda
  // gpt
  TextCorpus corpus_;
  std::unique_ptr<Tokenizer> tokenizer_;
  long long train_tokens_ = 0;
  std::optional<TextSampler> text_sampler_;
  TextWindows validation_;
  std::vector<std::int32_t> bytes_, targets_;
  // vit
  Dataset shard_, test_;
  int train_size_ = 0;
  std::optional<BatchSampler> image_sampler_;
  std::vector<float> pixels_;
  std::vector<std::int32_t> labels_;
};

}  // namespace

std::unique_ptr<Task> make_transformer_task(const TrainConfig& config, int peers, int rank) {
  return std::make_unique<TransformerTask>(config, peers, rank);
}

}  // namespace peertrain::train
