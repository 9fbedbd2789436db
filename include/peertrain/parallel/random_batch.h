// Random data for one transformer step, for what times the engine rather than trains it
// (bench step and pipeline, the planner's profiles and calibrations): gpt's token ids and
// next ids, or vit's normal pixels and class labels.
#pragma once

#include <cstdint>
#include <vector>

#include "peertrain/core/rng.h"
#include "peertrain/model/transformer.h"
#include "peertrain/parallel/pipeline.h"

namespace peertrain::parallel {

struct RandomBatch {
  std::vector<std::int32_t> bytes, targets;  // gpt: batch × tokens each; vit: targets are the labels
  std::vector<float> pixels;                 // vit: batch × image²
};

inline RandomBatch random_batch(const model::TransformerConfig& config, int batch, Rng& rng) {
  RandomBatch r;
  if (config.kind == model::TransformerKind::kGpt) {
    for (long long i = 0; i < static_cast<long long>(batch) * config.tokens(); ++i) {
      r.bytes.push_back(static_cast<std::int32_t>(rng.uniform_below(config.vocab)));
      r.targets.push_back(static_cast<std::int32_t>(rng.uniform_below(config.vocab)));
    }
  } else {
    for (long long i = 0; i < static_cast<long long>(batch) * config.image * config.image; ++i)
      r.pixels.push_back(static_cast<float>(rng.normal()));
    for (int i = 0; i < batch; ++i) r.targets.push_back(static_cast<std::int32_t>(rng.uniform_below(config.classes)));
  }
  return r;
}

// The pipeline engine's view of it: gpt's bytes and next bytes, or vit's pixels and labels.
inline GlobalBatch global_batch(const RandomBatch& data, const model::TransformerConfig& config, int batch) {
  GlobalBatch global;
  global.batch = batch;
  if (config.kind == model::TransformerKind::kGpt) {
    global.bytes = data.bytes;
    global.targets = data.targets;
  } else {
    global.pixels = data.pixels;
    global.labels = data.targets;
  }
  return global;
}

}  // namespace peertrain::parallel
