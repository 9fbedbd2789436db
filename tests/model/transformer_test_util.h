// Helpers shared by the transformer tests: random inputs, normalized error, central
// differences, and tiny models with their batches.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

#include "test_support/normalized_error.h"
#include "peertrain/core/rng.h"
#include "peertrain/model/transformer.h"

namespace peertrain::model::test {

using peertrain::normalized_error;  // test::normalized_error, as the tests of this folder call it

// Finite differences through one unit: each kernel's output is contracted with a fixed
// random r; the float32 forward limits the differences to ~1e-7·|loss|/step, so the step
// is 1e-2 on O(1) inputs and the tolerance 2e-3 normalized error. A missing term or a
// wrong transpose shows up as an error of order 1e-1 and above.
constexpr float kLayerStep = 1e-2f;
constexpr double kLayerTolerance = 2e-3;

inline std::vector<float> normal_vector(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

inline std::vector<std::int32_t> random_ids(std::size_t n, int bound, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = static_cast<std::int32_t>(rng.uniform_below(bound));
  return v;
}

// Central differences of loss() with respect to every element of x, in double from float
// perturbations (the step actually taken, x+h − (x−h) in float, is the denominator).
inline std::vector<double> numeric_gradient(std::vector<float>& x, const std::function<double()>& loss, float step) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    const float up = keep + step, down = keep - step;
    x[i] = up;
    const double l_up = loss();
    x[i] = down;
    const double l_down = loss();
    x[i] = keep;
    g[i] = (l_up - l_down) / (static_cast<double>(up) - static_cast<double>(down));
  }
  return g;
}

// Σ r·y in double: a scalar whose gradient with respect to y is r.
inline double project(const std::vector<float>& y, const std::vector<float>& r) {
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * r[i];
  return s;
}


inline TransformerConfig tiny_gpt(bool tied) {
  return {.kind = TransformerKind::kGpt, .d_model = 8, .layers = 2, .heads = 2, .seq = 7, .vocab = 11,
          .tied_head = tied};
}

inline TransformerConfig tiny_vit() {
  return {.kind = TransformerKind::kVit, .d_model = 8, .layers = 2, .heads = 2, .image = 8, .patch = 4, .classes = 3};
}

// A batch with its storage.
struct Batch {
  std::vector<int> positions;
  std::vector<std::int32_t> bytes, targets;
  std::vector<float> pixels;
  TokenBatch view;
};

inline Batch make_batch(const TransformerConfig& c, int batch, std::vector<int> positions, std::uint64_t seed) {
  Batch b;
  b.positions = std::move(positions);
  const int tokens = static_cast<int>(b.positions.size());
  if (c.kind == TransformerKind::kGpt) {
    b.bytes = random_ids(static_cast<std::size_t>(batch) * tokens, c.vocab, seed);
    b.targets = random_ids(static_cast<std::size_t>(batch) * tokens, c.vocab, seed + 1);
  } else {
    b.pixels = normal_vector(static_cast<std::size_t>(batch) * c.image * c.image, seed);
    b.targets = random_ids(batch, c.classes, seed + 1);
  }
  b.view = {.batch = batch, .tokens = tokens, .positions = b.positions, .bytes = b.bytes, .pixels = b.pixels,
            .targets = b.targets, .loss_divisor = static_cast<double>(b.targets.size())};
  return b;
}

inline std::vector<int> all_positions(int n) {
  std::vector<int> p(n);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

// Parameters wider than GPT-2's init, every bias and LayerNorm affine non-zero, so that every
// path of the gradient carries signal.
inline std::vector<float> random_params(const Transformer& model, std::uint64_t seed) {
  return normal_vector(model.num_parameters(), seed, 0.3);
}


}  // namespace peertrain::model::test
