// The pipeline engine's serial twin, shared by its tests: small models, fresh random data,
// the unsplit Transformer::forward_backward over the whole batch, and a check of one
// engine step's loss and gradient against it by normalized error.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "test_support/normalized_error.h"
#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "peertrain/parallel/partitioner.h"
#include "peertrain/parallel/pipeline.h"

namespace peertrain::pipeline_twin {

using namespace peertrain::parallel;
using model::TransformerKind;

constexpr double kTolerance = 1e-5;  // float accumulation in a different order

inline model::TransformerConfig small_gpt(bool tied = false) {
  model::TransformerConfig c;
  c.kind = TransformerKind::kGpt;
  c.d_model = 32;
  c.layers = 4;
  c.heads = 2;
  c.seq = 16;
  c.tied_head = tied;
  return c;
}

inline model::TransformerConfig small_vit() {
  model::TransformerConfig c;
  c.kind = TransformerKind::kVit;
  c.d_model = 32;
  c.layers = 2;  // 4 units, so 4 stages still hold one each
  c.heads = 2;
  c.image = 28;
  c.patch = 7;  // 16 tokens
  return c;
}

// A step's data, owned.
struct Data {
  int batch = 0;
  std::vector<std::int32_t> bytes, targets, labels;
  std::vector<float> pixels;
  GlobalBatch view() const {
    GlobalBatch g;
    g.batch = batch;
    g.bytes = bytes;
    g.targets = targets;
    g.pixels = pixels;
    g.labels = labels;
    return g;
  }
};

inline Data random_step_data(const model::TransformerConfig& c, int batch, std::uint64_t seed) {
  Rng rng(seed);
  Data d;
  d.batch = batch;
  if (c.kind == TransformerKind::kGpt) {
    const std::size_t n = static_cast<std::size_t>(batch) * c.seq;
    for (std::size_t i = 0; i < n; ++i) d.bytes.push_back(static_cast<std::int32_t>(rng.uniform_below(c.vocab)));
    for (std::size_t i = 0; i < n; ++i) d.targets.push_back(static_cast<std::int32_t>(rng.uniform_below(c.vocab)));
  } else {
    const std::size_t n = static_cast<std::size_t>(batch) * c.image * c.image;
    for (std::size_t i = 0; i < n; ++i) d.pixels.push_back(static_cast<float>(rng.normal()));
    for (int i = 0; i < batch; ++i) d.labels.push_back(static_cast<std::int32_t>(rng.uniform_below(c.classes)));
  }
  return d;
}

struct Reference {
  float loss = 0;
  std::vector<float> grads;
};

// The unsplit model over the whole batch: the serial twin.
inline Reference unsplit(const model::TransformerConfig& c, std::span<const float> params, const Data& d) {
  model::Transformer model(c);
  std::vector<int> positions(c.tokens());
  std::iota(positions.begin(), positions.end(), 0);
  model::TokenBatch tb;
  tb.batch = d.batch;
  tb.tokens = c.tokens();
  tb.positions = positions;
  if (c.kind == TransformerKind::kGpt) {
    tb.bytes = d.bytes;
    tb.targets = d.targets;
    tb.loss_divisor = static_cast<double>(d.batch) * c.seq;
  } else {
    tb.pixels = d.pixels;
    tb.targets = d.labels;
    tb.loss_divisor = d.batch;
  }
  Reference ref;
  ref.grads.assign(model.num_parameters(), 0.0f);
  ref.loss = model.forward_backward(params, tb, ref.grads);
  return ref;
}

struct Case {
  model::TransformerConfig model;
  EngineConfig engine;
  int batch = 8;
  std::uint64_t seed = 1;
};

inline std::string describe(const Case& k) {
  return str(k.model.kind == TransformerKind::kGpt ? (k.model.tied_head ? "gpt tied" : "gpt") : "vit", " sp ",
             k.engine.sp, " tp ", k.engine.tp, " pp ", k.engine.pp, " meshes '", to_string(k.engine.stage_meshes),
             "' m ", k.engine.microbatches, " ", to_string(k.engine.schedule), " vocab ",
             to_string(k.engine.vocab_parallel), " reshard ", to_string(k.engine.reshard),
             k.engine.links ? " emulated links" : "");
}

// Runs one step of the engine and checks it against the unsplit model; returns the engine
// so callers can look at its statistics.
inline void expect_matches_unsplit(const Case& k, StepStats* stats = nullptr, std::vector<int>* first_units = nullptr) {
  SCOPED_TRACE(describe(k));
  model::Transformer model(k.model);
  std::vector<float> params(model.num_parameters());
  model.initialize(params, k.seed);
  const Data data = random_step_data(k.model, k.batch, k.seed + 100);
  const Reference ref = unsplit(k.model, params, data);

  PipelineEngine engine(model, k.engine);
  // Poison: the step must overwrite every gradient, not add to it.
  std::vector<float> grads(model.num_parameters(), 1e3f);
  const float loss = engine.step(params, data.view(), grads);
  EXPECT_NEAR(loss, ref.loss, kTolerance * std::abs(ref.loss));
  EXPECT_LE(normalized_error(grads, ref.grads), kTolerance);
  // Every unit's own range, so an error in a small one is not drowned by the large ones.
  for (int u = 0; u < model.num_units(); ++u) {
    const auto r = model.unit_parameters(u);
    EXPECT_LE(normalized_error(std::span<const float>(grads).subspan(r.offset, r.size),
                               std::span<const float>(ref.grads).subspan(r.offset, r.size)),
              kTolerance)
        << model.unit_name(u);
  }
  const int virtual_stages = engine.schedule_shape().virtual_stages();
  ASSERT_EQ(static_cast<int>(engine.stage_first_units().size()), virtual_stages);
  EXPECT_NO_THROW(validate_first_units(engine.stage_first_units(), model.num_units(), virtual_stages));
  if (stats) *stats = engine.last_stats();
  if (first_units) *first_units = engine.stage_first_units();
}

}  // namespace peertrain::pipeline_twin
