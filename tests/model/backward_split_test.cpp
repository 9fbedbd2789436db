// The backward split into B (input gradient) and W (weight gradient), as zero-bubble
// pipeline schedules run it, against the fused backward: for every unit of gpt (untied and
// tied head) and vit, B's input gradient and B-then-W's parameter gradient equal the fused
// backward's bit for bit, and over the whole model they give forward_backward's gradient.
#include <gtest/gtest.h>

#include <vector>

#include "peertrain/core/error.h"
#include "transformer_test_util.h"

namespace peertrain::model {
namespace {

using namespace test;

void expect_split_backward_equals_fused(const TransformerConfig& config) {
  Transformer model(config);
  const int n_units = model.num_units();
  const std::vector<float> params = random_params(model, 81);
  const Batch b = make_batch(config, 3, all_positions(model.config().tokens()), 82);
  const std::size_t dn = static_cast<std::size_t>(config.d_model) * 3 * model.config().tokens();
  std::vector<std::vector<float>> acts(n_units + 1, std::vector<float>(dn));
  std::vector<UnitActivations> saved(n_units);
  for (int u = 0; u < n_units; ++u) model.forward(u, params, b.view, acts[u].data(), acts[u + 1].data(), saved[u], {});

  // Each unit alone, fed the same fresh random output gradient: fused against B then W.
  for (int u = 0; u < n_units; ++u) {
    SCOPED_TRACE(model.unit_name(u));
    const std::vector<float> dout = normal_vector(dn, 100 + u);
    std::vector<float> din_fused(dn, 0.0f), din_split(dn, 0.0f);
    std::vector<float> fused(params.size(), 0.0f), split(params.size(), 0.0f);
    model.backward(u, params, b.view, dout.data(), din_fused.data(), saved[u], fused, {});
    model.backward_input(u, params, b.view, dout.data(), din_split.data(), saved[u], {});
    EXPECT_TRUE(din_split == din_fused) << "input gradient";
    EXPECT_TRUE(std::all_of(split.begin(), split.end(), [](float x) { return x == 0.0f; })) << "B touched the grads";
    EXPECT_GT(saved[u].activation_bytes(), saved[u].buffer.size() * sizeof(float)) << "B kept nothing for W";
    model.backward_weight(u, params, b.view, saved[u], split, {});
    EXPECT_TRUE(split == fused) << "parameter gradient";
    EXPECT_GT(normalized_error(fused, std::vector<float>(fused.size(), 0.0f)), 0.0);
    EXPECT_EQ(saved[u].activation_bytes(), saved[u].buffer.size() * sizeof(float)) << "W left its stash";
  }

  // The whole model: every B in reverse, then every W, gives forward_backward's gradient.
  std::vector<float> whole(params.size(), 0.0f);
  model.forward_backward(params, b.view, whole);
  std::vector<float> grads(params.size(), 0.0f), dout(dn), din(dn);
  for (int u = n_units; u-- > 0;) {
    model.backward_input(u, params, b.view, dout.data(), din.data(), saved[u], {});
    std::swap(dout, din);
  }
  // W's in the fused order (head first): a tied head and the embedding both add into wte,
  // and float addition is not associative.
  for (int u = n_units; u-- > 0;) model.backward_weight(u, params, b.view, saved[u], grads, {});
  EXPECT_TRUE(grads == whole);
}

TEST(BackwardSplit, GptUnitsAndModel) { expect_split_backward_equals_fused(tiny_gpt(false)); }
TEST(BackwardSplit, TiedGptUnitsAndModel) { expect_split_backward_equals_fused(tiny_gpt(true)); }
TEST(BackwardSplit, VitUnitsAndModel) { expect_split_backward_equals_fused(tiny_vit()); }

TEST(BackwardSplit, WeightBeforeInputIsAnError) {
  const TransformerConfig config = tiny_gpt(false);
  Transformer model(config);
  const std::vector<float> params = random_params(model, 5);
  const Batch b = make_batch(config, 2, all_positions(config.seq), 6);
  const std::size_t dn = static_cast<std::size_t>(config.d_model) * 2 * config.seq;
  std::vector<float> x(dn), y(dn), grads(params.size());
  UnitActivations saved;
  model.forward(1, params, b.view, x.data(), y.data(), saved, {});
  EXPECT_THROW(model.backward_weight(1, params, b.view, saved, grads, {}), Error);
}

}  // namespace
}  // namespace peertrain::model
