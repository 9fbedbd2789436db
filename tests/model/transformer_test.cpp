// The transformer against finite differences (each unit, the whole model) and for the
// contracts the pipeline and sequence parallelism rely on: units chain to forward_backward,
// backward adds, micro-batches add up through loss_divisor, positions drive the position
// embedding, sequence ranks add up to the whole sequence, threads may share one model.
// PyTorch's values are checked in transformer_reference_test.cpp, the kernels in
// transformer_layers_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "peertrain/comm/thread_group.h"
#include "peertrain/core/error.h"
#include "peertrain/core/parameter_store.h"
#include "transformer_test_util.h"

namespace peertrain::model {
namespace {

using namespace test;

// Finite differences through one unit use the kernels' step and tolerance
// (transformer_test_util.h): measured ~3e-5 through a whole block, up to 6e-4 through the
// head, whose loss is a float mean.

TEST(Transformer, LayoutUnitsAndNames) {
  const TransformerConfig c{.kind = TransformerKind::kGpt, .d_model = 8, .layers = 3, .heads = 2, .seq = 5, .vocab = 7};
  Transformer model(c);
  const std::size_t d = 8, block = 4 * d + 3 * d * d + 3 * d + d * d + d + 4 * d * d * 2 + 4 * d + d;
  EXPECT_EQ(model.num_parameters(), d * 7 + d * 5 + 3 * block + 2 * d + 7 * d);
  EXPECT_EQ(model.num_units(), 5);
  std::size_t next = 0;
  for (int u = 0; u < model.num_units(); ++u) {
    const ParameterRange r = model.unit_parameters(u);
    EXPECT_EQ(r.offset, next) << "unit " << u;
    EXPECT_GT(r.size, 0u);
    next = r.offset + r.size;
  }
  EXPECT_EQ(next, model.num_parameters());
  EXPECT_EQ(model.unit_parameters(2).size, block);
  EXPECT_EQ(model.unit_name(0), "embedding");
  EXPECT_EQ(model.unit_name(3), "block 2");
  EXPECT_EQ(model.unit_name(4), "head");
  EXPECT_THROW(model.unit_parameters(5), Error);

  ParameterStore store;
  model.register_parameters(store);
  store.finalize();
  EXPECT_EQ(store.size(), model.num_parameters());
  EXPECT_EQ(store.slices()[0].name, "wte");
  EXPECT_EQ(store.slices()[0].rows, 8);
  EXPECT_EQ(store.slices()[0].cols, 7);
  const ParameterSlice& qkv = store.slice(store.index_of("h1.attn.qkv.weight"));
  EXPECT_EQ(qkv.rows, 24);
  EXPECT_EQ(qkv.cols, 8);
  EXPECT_GE(qkv.offset, model.unit_parameters(2).offset);
  EXPECT_EQ(store.slices().back().name, "lm_head.weight");
  EXPECT_EQ(store.slice(store.index_of("h2.mlp.proj.bias")).offset + d, model.unit_parameters(4).offset);

  // Tied: the head unit is only the final LayerNorm.
  Transformer tied({.kind = TransformerKind::kGpt, .d_model = 8, .layers = 1, .heads = 2, .seq = 5, .vocab = 7,
                    .tied_head = true});
  EXPECT_EQ(tied.unit_parameters(2).size, 2 * d);
  Transformer vit(tiny_vit());
  EXPECT_EQ(vit.config().seq, 4);
  EXPECT_EQ(vit.unit_parameters(0).size, d * 16 + d + d * 4);
  EXPECT_EQ(vit.unit_parameters(3).size, 2 * d + 3 * d + 3);
}

TEST(Transformer, InitializationFollowsGpt2ButForTheEmbeddings) {
  const TransformerConfig c{.kind = TransformerKind::kGpt, .d_model = 64, .layers = 2, .heads = 2, .seq = 64};
  Transformer model(c);
  std::vector<float> a(model.num_parameters()), b(a.size()), other(a.size());
  model.initialize(a, 7);
  model.initialize(b, 7);
  model.initialize(other, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);
  ParameterStore store;
  model.register_parameters(store);
  store.finalize();
  auto stats = [&](const std::string& name) {
    const ParameterSlice& s = store.slice(store.index_of(name));
    double sum = 0, sq = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
      sum += a[s.offset + i];
      sq += a[s.offset + i] * a[s.offset + i];
    }
    return std::pair{sum / s.size(), std::sqrt(sq / s.size())};
  };
  EXPECT_NEAR(stats("wte").second, 1.0, 0.02);  // embeddings N(0, 1): see initialize()
  EXPECT_NEAR(stats("wpe").second, 1.0, 0.02);
  EXPECT_NEAR(stats("h0.mlp.fc.weight").second, 0.02, 0.001);
  EXPECT_NEAR(stats("h1.mlp.proj.weight").second, 0.02 / 2, 0.001);  // 1/√(2L), L = 2
  EXPECT_NEAR(stats("h1.attn.proj.weight").second, 0.02 / 2, 0.001);
  EXPECT_EQ(stats("h0.ln1.weight"), std::pair(1.0, 1.0));
  EXPECT_EQ(stats("h0.attn.qkv.bias"), std::pair(0.0, 0.0));
  TransformerConfig tied = c;
  tied.tied_head = true;
  Transformer tied_model(tied);
  std::vector<float> t(tied_model.num_parameters());
  tied_model.initialize(t, 7);
  const ParameterSlice& wte = store.slice(store.index_of("wte"));  // first in both layouts
  double sq = 0;
  for (std::size_t i = 0; i < wte.size(); ++i) sq += t[wte.offset + i] * t[wte.offset + i];
  EXPECT_NEAR(std::sqrt(sq / wte.size()), 1.0 / 8, 0.005) << "a tied head's wte is N(0, 1/d_model)";
}

TEST(Transformer, BadConfigAndBatchAreReported) {
  auto message_of = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message_of([] { Transformer({.d_model = 10, .heads = 4}); }).find("heads (--heads 4) must divide d_model (--d-model 10)"),
            std::string::npos);
  EXPECT_NE(message_of([] { Transformer({.kind = TransformerKind::kVit, .patch = 5}); }).find("patch (--patch 5)"),
            std::string::npos);
  EXPECT_THROW(validate({.layers = 0}), Error);

  Transformer model(tiny_gpt(false));
  std::vector<float> params = random_params(model, 1), grads(params.size());
  Batch b = make_batch(model.config(), 2, {0, 1, 2}, 2);
  b.bytes[4] = 11;
  EXPECT_NE(message_of([&] { model.forward_backward(params, b.view, grads); }).find("bytes[4] = 11"),
            std::string::npos);
  b = make_batch(model.config(), 2, {0, 2, 1}, 2);
  EXPECT_NE(message_of([&] { model.evaluate(params, b.view); }).find("not ascending"), std::string::npos);
  b = make_batch(model.config(), 2, {0, 7}, 2);
  EXPECT_NE(message_of([&] { model.evaluate(params, b.view); }).find("position 7"), std::string::npos);
}

// The whole model against central differences of its loss, every parameter. The step is
// 3e-3 on parameters of scale 0.3; measured normalized errors are ~3e-4 (float32
// rounding of the loss dominates); the tolerance is 2e-3.
void expect_model_gradient_matches_finite_differences(const TransformerConfig& config, std::vector<int> positions) {
  Transformer model(config);
  std::vector<float> params = random_params(model, 61), grads(params.size());
  const Batch b = make_batch(config, 2, std::move(positions), 62);
  model.forward_backward(params, b.view, grads);
  auto loss = [&] { return model.evaluate(params, b.view).loss_sum / b.view.loss_divisor; };
  const auto numeric = numeric_gradient(params, loss, 3e-3f);
  const double error = normalized_error(grads, numeric);
  EXPECT_LT(error, 2e-3);
  // Each unit on its own, so that a wrong unit cannot hide in the total.
  for (int u = 0; u < model.num_units(); ++u) {
    const ParameterRange r = model.unit_parameters(u);
    const std::vector<float> g(grads.begin() + r.offset, grads.begin() + r.offset + r.size);
    const std::vector<double> n(numeric.begin() + r.offset, numeric.begin() + r.offset + r.size);
    EXPECT_LT(normalized_error(g, n), 2e-3) << model.unit_name(u);
  }
  std::cout << "finite differences: normalized error " << error << "\n";
}

TEST(Transformer, GptGradientMatchesFiniteDifferences) {
  expect_model_gradient_matches_finite_differences(tiny_gpt(false), all_positions(7));
}
TEST(Transformer, TiedGptGradientMatchesFiniteDifferencesOnHeldPositions) {
  expect_model_gradient_matches_finite_differences(tiny_gpt(true), {1, 2, 4, 6});
}
TEST(Transformer, VitGradientMatchesFiniteDifferences) {
  expect_model_gradient_matches_finite_differences(tiny_vit(), all_positions(4));
}

// Each unit's input gradient (din) against central differences of Σ r·out (a block) or of
// the loss (the head), on fresh random inputs: the block's attention wrapper (qkv split into
// heads, the core, the merge, the projection) and both residual paths, causal or not.
void expect_unit_input_gradients_match(const TransformerConfig& config, std::vector<int> positions) {
  Transformer model(config);
  const std::vector<float> params = random_params(model, 121);
  const Batch b = make_batch(config, 2, std::move(positions), 122);
  const std::size_t dn = static_cast<std::size_t>(config.d_model) * 2 * b.view.tokens;
  for (int unit = 1; unit < model.num_units(); ++unit) {
    const bool head = unit == model.num_units() - 1;
    std::vector<float> in = normal_vector(dn, 123 + unit), out(dn), din(dn), grads(params.size());
    const auto r = normal_vector(dn, 130 + unit);
    UnitActivations saved;
    auto loss = [&] {
      UnitActivations scratch;
      const float unit_loss = model.forward(unit, params, b.view, in.data(), out.data(), scratch, {});
      return head ? static_cast<double>(unit_loss) : project(out, r);
    };
    model.forward(unit, params, b.view, in.data(), out.data(), saved, {});
    model.backward(unit, params, b.view, r.data(), din.data(), saved, grads, {});
    const double error = normalized_error(din, numeric_gradient(in, loss, kLayerStep));
    EXPECT_LT(error, kLayerTolerance) << model.unit_name(unit);
    std::cout << model.unit_name(unit) << " input gradient: normalized error " << error << "\n";
  }
}

TEST(Transformer, GptUnitInputGradientsMatchFiniteDifferences) {
  expect_unit_input_gradients_match(tiny_gpt(false), {0, 2, 3, 5, 6});
}
TEST(Transformer, VitUnitInputGradientsMatchFiniteDifferences) {
  expect_unit_input_gradients_match(tiny_vit(), all_positions(4));
}

// Units chained by hand, as a pipeline runs them, give forward_backward's loss and gradient
// exactly; backward adds into the gradient.
void expect_units_chain_to_forward_backward(const TransformerConfig& config) {
  Transformer model(config);
  const int n_units = model.num_units();
  const std::vector<float> params = random_params(model, 71);
  const Batch b = make_batch(config, 3, all_positions(model.config().tokens()), 72);
  std::vector<float> whole(params.size());
  const float loss = model.forward_backward(params, b.view, whole);

  const std::size_t dn = static_cast<std::size_t>(config.d_model) * 3 * model.config().tokens();
  std::vector<std::vector<float>> acts(n_units + 1, std::vector<float>(dn));
  std::vector<UnitActivations> saved(n_units);
  float unit_loss = 0;
  for (int u = 0; u < n_units; ++u)
    unit_loss += model.forward(u, params, b.view, acts[u].data(), acts[u + 1].data(), saved[u], {});
  EXPECT_EQ(unit_loss, loss);
  EXPECT_GT(saved[1].activation_bytes(), dn * sizeof(float));
  std::vector<float> grads(params.size());
  std::vector<float> dout(dn), din(dn);
  for (int u = n_units; u-- > 0;) {
    model.backward(u, params, b.view, dout.data(), din.data(), saved[u], grads, {});
    std::swap(dout, din);
  }
  EXPECT_EQ(grads, whole);

  // Backward adds: a second pass, by units and by forward_backward, doubles the gradient.
  for (int u = 0; u < n_units; ++u)
    model.forward(u, params, b.view, acts[u].data(), acts[u + 1].data(), saved[u], {});
  for (int u = n_units; u-- > 0;) {
    model.backward(u, params, b.view, dout.data(), din.data(), saved[u], grads, {});
    std::swap(dout, din);
  }
  std::vector<float> twice = whole;
  model.forward_backward(params, b.view, twice);
  std::vector<float> doubled(whole.size());
  for (std::size_t i = 0; i < whole.size(); ++i) doubled[i] = 2 * whole[i];
  EXPECT_LT(normalized_error(grads, doubled), 1e-6);
  EXPECT_LT(normalized_error(twice, doubled), 1e-6);
}

TEST(Transformer, GptUnitsChainToForwardBackward) { expect_units_chain_to_forward_backward(tiny_gpt(false)); }
TEST(Transformer, TiedGptUnitsChainToForwardBackward) { expect_units_chain_to_forward_backward(tiny_gpt(true)); }
TEST(Transformer, VitUnitsChainToForwardBackward) { expect_units_chain_to_forward_backward(tiny_vit()); }

// Threads sharing one Transformer (pipeline stages, sequence ranks) each get their own
// workspace: concurrent forward_backward calls give exactly the serial results.
TEST(Transformer, ThreadsMayShareOneModel) {
  Transformer model(tiny_gpt(false));
  const std::vector<float> params = random_params(model, 141);
  std::vector<Batch> batches;
  for (int i = 0; i < 3; ++i) batches.push_back(make_batch(model.config(), 2 + i, all_positions(7 - i), 142 + i));
  std::vector<std::vector<float>> serial(3, std::vector<float>(params.size())), parallel = serial;
  std::vector<float> serial_loss(3), parallel_loss(3);
  for (int i = 0; i < 3; ++i) serial_loss[i] = model.forward_backward(params, batches[i].view, serial[i]);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i)
    threads.emplace_back([&, i] {
      for (int repeat = 0; repeat < 20; ++repeat) {
        std::fill(parallel[i].begin(), parallel[i].end(), 0.0f);
        parallel_loss[i] = model.forward_backward(params, batches[i].view, parallel[i]);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(parallel_loss, serial_loss);
  EXPECT_EQ(parallel, serial);
}

// Two micro-batches whose loss_divisor is the whole batch's target count add up to the
// gradient and loss of the whole batch.
void expect_micro_batches_add_up(const TransformerConfig& config) {
  Transformer model(config);
  const std::vector<float> params = random_params(model, 81);
  const int tokens = model.config().tokens();
  const Batch whole = make_batch(config, 4, all_positions(tokens), 82);
  std::vector<float> g_whole(params.size()), g_split(params.size());
  const float loss_whole = model.forward_backward(params, whole.view, g_whole);
  const std::size_t per_seq_targets = whole.targets.size() / 4;
  float loss_split = 0;
  for (int half = 0; half < 2; ++half) {
    TokenBatch part = whole.view;
    part.batch = 2;
    if (config.kind == TransformerKind::kGpt)
      part.bytes = part.bytes.subspan(half * 2 * tokens, 2 * tokens);
    else
      part.pixels = part.pixels.subspan(half * 2 * config.image * config.image, 2 * config.image * config.image);
    part.targets = part.targets.subspan(half * 2 * per_seq_targets, 2 * per_seq_targets);
    loss_split += model.forward_backward(params, part, g_split);
  }
  EXPECT_NEAR(loss_split, loss_whole, 1e-6 * loss_whole);
  EXPECT_LT(normalized_error(g_split, g_whole), 1e-5);
}

TEST(Transformer, GptMicroBatchesAddUpThroughLossDivisor) { expect_micro_batches_add_up(tiny_gpt(false)); }
TEST(Transformer, VitMicroBatchesAddUpThroughLossDivisor) { expect_micro_batches_add_up(tiny_vit()); }

// The held positions select the columns of wpe: a batch at positions P gives exactly what a
// model whose wpe columns 0..|P|-1 are wpe's columns P gives at positions 0..|P|-1 (the
// causal mask compares positions, so it keeps the same shape), and its wpe gradient lands in
// the columns P.
TEST(Transformer, PositionsDriveThePositionEmbedding) {
  const TransformerConfig config = tiny_gpt(false);
  Transformer model(config);
  ParameterStore store;
  model.register_parameters(store);
  store.finalize();
  const ParameterSlice& wpe = store.slice(store.index_of("wpe"));
  const std::vector<float> params = random_params(model, 91);
  const std::vector<int> held = {1, 3, 4, 6};
  Batch at_held = make_batch(config, 2, held, 92);
  Batch at_start = make_batch(config, 2, all_positions(4), 92);
  std::vector<float> moved = params;
  for (int t = 0; t < 4; ++t)
    std::memcpy(&moved[wpe.offset + t * 8], &params[wpe.offset + held[t] * 8], 8 * sizeof(float));

  std::vector<float> g_held(params.size()), g_moved(params.size()), g_plain(params.size());
  const float loss_held = model.forward_backward(params, at_held.view, g_held);
  const float loss_moved = model.forward_backward(moved, at_start.view, g_moved);
  const float loss_plain = model.forward_backward(params, at_start.view, g_plain);
  EXPECT_EQ(loss_held, loss_moved);
  EXPECT_GT(std::abs(loss_held - loss_plain), 1e-4f) << "the positions made no difference";
  for (int p = 0; p < config.seq; ++p) {
    const auto it = std::find(held.begin(), held.end(), p);
    for (int i = 0; i < 8; ++i) {
      const float g = g_held[wpe.offset + p * 8 + i];
      if (it == held.end()) {
        EXPECT_EQ(g, 0.0f) << "position " << p << " is not held";
      } else {
        EXPECT_EQ(g, g_moved[wpe.offset + (it - held.begin()) * 8 + i]) << "position " << p;
        EXPECT_NE(g, 0.0f);
      }
    }
  }
  // vit: the positions pick the patches as well: token t of the embedding is patch
  // positions[t]'s pixels through the patch Linear, plus wpe[:, positions[t]].
  const TransformerConfig vc = tiny_vit();
  Transformer vit(vc);
  const std::vector<float> vp = random_params(vit, 93);
  const Batch vb = make_batch(vc, 2, {1, 2}, 94);
  std::vector<float> out(8 * 2 * 2);
  UnitActivations saved;
  vit.forward(0, vp, vb.view, nullptr, out.data(), saved, {});
  const float* w = vp.data();  // patch.weight (8 × 16), patch.bias (8), wpe (8 × 4)
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 2; ++t) {
      const int patch = vb.positions[t], row = patch / 2, col = patch % 2;
      for (int i = 0; i < 8; ++i) {
        double want = w[8 * 16 + i] + w[8 * 16 + 8 + patch * 8 + i];
        for (int y = 0; y < 4; ++y)
          for (int x = 0; x < 4; ++x)
            want += w[(y * 4 + x) * 8 + i] * vb.pixels[b * 64 + (row * 4 + y) * 8 + col * 4 + x];
        EXPECT_NEAR(out[(b * 2 + t) * 8 + i], want, 1e-5) << "image " << b << " token " << t << " row " << i;
      }
    }
}

TEST(Transformer, EvaluateCountsTargetsAndCorrectPredictions) {
  Transformer model(tiny_gpt(false));
  std::vector<float> params = random_params(model, 101), grads(params.size());
  const Batch b = make_batch(model.config(), 3, all_positions(7), 102);
  const LossSums sums = model.evaluate(params, b.view);
  EXPECT_EQ(sums.count, 21);
  const float loss = model.forward_backward(params, b.view, grads);
  EXPECT_NEAR(sums.loss_sum / 21, loss, 1e-6 * loss);
  // Make byte 5 win everywhere: lm_head row 5 large along ln_f's bias, others zero.
  ParameterStore store;
  model.register_parameters(store);
  store.finalize();
  const ParameterSlice& head = store.slice(store.index_of("lm_head.weight"));
  const ParameterSlice& lnf_w = store.slice(store.index_of("ln_f.weight"));
  const ParameterSlice& lnf_b = store.slice(store.index_of("ln_f.bias"));
  for (std::size_t i = 0; i < head.size(); ++i) params[head.offset + i] = 0;
  for (int i = 0; i < 8; ++i) {
    params[lnf_w.offset + i] = 0;
    params[lnf_b.offset + i] = 1;
    params[head.offset + i * 11 + 5] = 1;  // column-major vocab × d: element (5, i)
  }
  long long fives = 0;
  for (auto t : b.targets) fives += t == 5;
  const LossSums rigged = model.evaluate(params, b.view);
  EXPECT_EQ(rigged.correct, fives);
  // logits: 8 for byte 5, 0 for the ten others.
  const double nats = std::log(10.0 + std::exp(8.0));
  EXPECT_NEAR(rigged.loss_sum, fives * (nats - 8) + (21 - fives) * nats, 1e-4);
}

TEST(Transformer, FlopsPerStepCountsGemmsAndHalfTheCausalAttention) {
  Transformer model({.kind = TransformerKind::kGpt, .d_model = 128, .layers = 4, .heads = 4, .seq = 256});
  const double n = 8 * 256, d = 128;
  const double linear = 4 * 3 * 2 * n * 12 * d * d, head = 3 * 2 * n * d * 256;
  const double attention = 4 * 12.0 * 8 * 256 * 256 * d / 2;
  EXPECT_DOUBLE_EQ(model.flops_per_step(8, 256), linear + head + attention);
}

// The bytes outside the GEMMs: 72 activations of d × n floats a block (27 forward, 45
// backward, with the MLP 4·d wide), 8 for ln_f and the embedding, 5 logits matrices; with
// fused epilogues no fills, and the GELU and bias gradients in the GEMMs: 35 a block and 4
// logits matrices. Linear in the tokens, and a
// wider MLP moves more.
TEST(Transformer, OtherBytesPerStepCountsTheActivationPasses) {
  const TransformerConfig config{.kind = TransformerKind::kGpt, .d_model = 128, .layers = 4, .heads = 4, .seq = 256};
  const Transformer model(config);
  const double n = 8 * 256, dn = 128 * n;
  EXPECT_DOUBLE_EQ(model.other_bytes_per_step(8, 256, false), 4 * (4 * 72 * dn + 8 * dn + 5 * n * 256));
  EXPECT_DOUBLE_EQ(model.other_bytes_per_step(8, 256, true), 4 * (4 * 35 * dn + 8 * dn + 4 * n * 256));
  EXPECT_DOUBLE_EQ(model.other_bytes_per_step(16, 256, true), 2 * model.other_bytes_per_step(8, 256, true));
  TransformerConfig wider = config;
  wider.mlp_ratio = 8;
  EXPECT_GT(Transformer(wider).other_bytes_per_step(8, 256, true), model.other_bytes_per_step(8, 256, true));
}

// ---------------------------------------------------------------------------------------
// Sequence parallelism: ranks of a ThreadGroup each hold a contiguous chunk of every
// sequence. The attention core below is the serial twin of ring attention: it all-gathers
// q, k, v (and dout) and runs LocalAttention over the whole sequence, keeping its own rows.
// The ranks' losses and gradients must add up to the single-rank model's.

class GatheringAttention final : public AttentionCore {
 public:
  explicit GatheringAttention(comm::Group& group) : group_(group) {}

  void forward(const AttentionShape& shape, std::span<const int>, const float* q, const float* k, const float* v,
               float* out, float* lse) override {
    const AttentionShape whole = whole_shape(shape);
    const auto fq = gather(shape, q), fk = gather(shape, k), fv = gather(shape, v);
    std::vector<float> fo(fq.size()), flse(whole.rows());
    local_.forward(whole, whole_positions(whole), fq.data(), fk.data(), fv.data(), fo.data(), flse.data());
    keep_own(shape, fo.data(), out, shape.head_dim);
    keep_own(shape, flse.data(), lse, 1);
  }

  void backward(const AttentionShape& shape, std::span<const int>, const float* q, const float* k, const float* v,
                const float*, const float*, const float* dout, float* dq, float* dk, float* dv) override {
    const AttentionShape whole = whole_shape(shape);
    const auto fq = gather(shape, q), fk = gather(shape, k), fv = gather(shape, v), fdo = gather(shape, dout);
    std::vector<float> fo(fq.size()), flse(whole.rows()), fdq(fq.size()), fdk(fq.size()), fdv(fq.size());
    const std::vector<int> positions = whole_positions(whole);
    local_.forward(whole, positions, fq.data(), fk.data(), fv.data(), fo.data(), flse.data());
    local_.backward(whole, positions, fq.data(), fk.data(), fv.data(), fo.data(), flse.data(), fdo.data(),
                    fdq.data(), fdk.data(), fdv.data());
    keep_own(shape, fdq.data(), dq, shape.head_dim);
    keep_own(shape, fdk.data(), dk, shape.head_dim);
    keep_own(shape, fdv.data(), dv, shape.head_dim);
  }

 private:
  AttentionShape whole_shape(AttentionShape shape) const {
    shape.tokens *= group_.size();
    return shape;
  }
  static std::vector<int> whole_positions(const AttentionShape& whole) { return all_positions(whole.tokens); }

  // [rank][b][h][t][hd] from the all-gather → [b][h][rank·T + t][hd].
  std::vector<float> gather(const AttentionShape& shape, const float* mine) {
    const std::size_t n = shape.elements(), g = group_.size();
    std::vector<float> all(n * g), whole(n * g);
    group_.all_gather({mine, n}, all);
    const std::size_t row = shape.tokens * shape.head_dim;
    for (std::size_t r = 0; r < g; ++r)
      for (std::size_t bh = 0; bh < static_cast<std::size_t>(shape.batch * shape.heads); ++bh)
        std::memcpy(&whole[(bh * g + r) * row], &all[r * n + bh * row], row * sizeof(float));
    return whole;
  }
  void keep_own(const AttentionShape& shape, const float* whole, float* mine, int width) const {
    const std::size_t row = static_cast<std::size_t>(shape.tokens) * width, g = group_.size();
    for (std::size_t bh = 0; bh < static_cast<std::size_t>(shape.batch * shape.heads); ++bh)
      std::memcpy(mine + bh * row, whole + (bh * g + group_.rank()) * row, row * sizeof(float));
  }

  comm::Group& group_;
  LocalAttention local_;
};

void expect_sequence_ranks_add_up(const TransformerConfig& config, int ranks) {
  Transformer reference(config);
  const std::vector<float> params = random_params(reference, 111);
  const int batch = 2, tokens = reference.config().tokens(), chunk = tokens / ranks;
  ASSERT_EQ(chunk * ranks, tokens);
  const Batch whole = make_batch(config, batch, all_positions(tokens), 112);
  std::vector<float> g_whole(params.size());
  const float loss_whole = reference.forward_backward(params, whole.view, g_whole);

  comm::ThreadGroup group(ranks, "test sequence group");
  std::vector<std::vector<float>> grads(ranks, std::vector<float>(params.size()));
  std::vector<float> losses(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      Transformer model(config);
      std::vector<int> positions(chunk);
      std::iota(positions.begin(), positions.end(), r * chunk);
      std::vector<std::int32_t> bytes, targets = whole.targets;
      if (config.kind == TransformerKind::kGpt) {
        targets.clear();
        for (int b = 0; b < batch; ++b)
          for (int t = r * chunk; t < (r + 1) * chunk; ++t) {
            bytes.push_back(whole.bytes[b * tokens + t]);
            targets.push_back(whole.targets[b * tokens + t]);
          }
      }
      // vit: whole images and their labels on every rank; the divisor counts each image once.
      const TokenBatch mine{.batch = batch, .tokens = chunk, .positions = positions, .bytes = bytes,
                            .pixels = whole.pixels, .targets = targets, .loss_divisor = whole.view.loss_divisor};
      GatheringAttention attention(group.member(r));
      const UnitContext context{.attention = &attention, .sequence_group = &group.member(r)};
      losses[r] = model.forward_backward(params, mine, grads[r], context);
    });
  for (auto& t : threads) t.join();
  std::vector<float> summed(params.size());
  float loss_sum = 0;
  for (int r = 0; r < ranks; ++r) {
    loss_sum += losses[r];
    for (std::size_t i = 0; i < summed.size(); ++i) summed[i] += grads[r][i];
  }
  EXPECT_NEAR(loss_sum, loss_whole, 1e-5 * loss_whole);
  EXPECT_LT(normalized_error(summed, g_whole), 1e-5);
}

TEST(Transformer, GptSequenceRanksAddUpToTheWholeSequence) { expect_sequence_ranks_add_up(tiny_gpt(true), 7); }
TEST(Transformer, VitSequenceRanksAddUpToTheWholeImage) {
  expect_sequence_ranks_add_up(tiny_vit(), 2);
  expect_sequence_ranks_add_up(tiny_vit(), 4);
}


}  // namespace
}  // namespace peertrain::model
