// The shared micro-batch slicer and layout against brute force: every sliced token is the
// one at (sequence, index) of the source, and the layout's offsets are the parameter
// store's.
#include "peertrain/model/batch_slice.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "peertrain/core/error.h"
#include "peertrain/core/parameter_store.h"
#include "peertrain/core/rng.h"
#include "peertrain/model/transformer_layout.h"

namespace peertrain::model {
namespace {

TEST(BatchSlice, GptSequencesAndTokensAreTheSourcesAtThoseIndices) {
  TransformerConfig c;
  c.seq = 12;
  c.vocab = 50;
  const int batch = 5;
  std::vector<int> positions(c.seq);
  std::iota(positions.begin(), positions.end(), 0);
  Rng rng(7);
  std::vector<std::int32_t> bytes(batch * c.seq), targets(bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<std::int32_t>(rng.uniform_below(50));
    targets[i] = static_cast<std::int32_t>(rng.uniform_below(50));
  }
  const TokenBatch source{.batch = batch,
                          .tokens = c.seq,
                          .positions = positions,
                          .bytes = bytes,
                          .pixels = {},
                          .targets = targets,
                          .loss_divisor = 60};
  const std::vector<int> tokens = {1, 4, 5, 10};
  BatchSlice slice;
  slice_batch(c, source, 2, 3, tokens, slice);
  EXPECT_EQ(slice.batch.batch, 3);
  EXPECT_EQ(slice.batch.tokens, 4);
  EXPECT_EQ(slice.batch.loss_divisor, 60);
  for (int s = 0; s < 3; ++s)
    for (int t = 0; t < 4; ++t) {
      const std::size_t from = static_cast<std::size_t>(2 + s) * c.seq + tokens[t], to = s * 4 + t;
      EXPECT_EQ(slice.batch.bytes[to], bytes[from]);
      EXPECT_EQ(slice.batch.targets[to], targets[from]);
      EXPECT_EQ(slice.batch.positions[t], tokens[t]);
    }
  // Every token: a view of the source, no copy.
  slice_batch(c, source, 1, 2, {}, slice);
  EXPECT_EQ(slice.batch.bytes.data(), bytes.data() + c.seq);
  EXPECT_EQ(slice.batch.bytes.size(), 2u * c.seq);
  EXPECT_EQ(slice.batch.tokens, c.seq);
}

TEST(BatchSlice, VitKeepsWholeImagesAndTheirLabels) {
  TransformerConfig c;
  c.kind = TransformerKind::kVit;
  const int batch = 4, pixels = c.image * c.image;
  std::vector<int> positions(c.tokens());
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<float> images(static_cast<std::size_t>(batch) * pixels);
  std::iota(images.begin(), images.end(), 0.0f);
  const std::vector<std::int32_t> labels = {3, 1, 4, 1};
  const TokenBatch source{.batch = batch,
                          .tokens = c.tokens(),
                          .positions = positions,
                          .bytes = {},
                          .pixels = images,
                          .targets = labels,
                          .loss_divisor = batch};
  BatchSlice slice;
  const std::vector<int> tokens = {0, 7, 15};
  slice_batch(c, source, 1, 2, tokens, slice);
  EXPECT_EQ(slice.batch.pixels.data(), images.data() + pixels);
  EXPECT_EQ(slice.batch.pixels.size(), 2u * pixels);
  ASSERT_EQ(slice.batch.targets.size(), 2u);
  EXPECT_EQ(slice.batch.targets[0], 1);
  EXPECT_EQ(slice.batch.targets[1], 4);
  EXPECT_EQ(std::vector<int>(slice.batch.positions.begin(), slice.batch.positions.end()), tokens);
}

TEST(BatchSlice, SequencesOutsideTheBatchAreAnError) {
  TransformerConfig c;
  c.seq = 4;
  std::vector<int> positions = {0, 1, 2, 3};
  std::vector<std::int32_t> bytes(8), targets(8);
  const TokenBatch source{.batch = 2,
                          .tokens = 4,
                          .positions = positions,
                          .bytes = bytes,
                          .pixels = {},
                          .targets = targets,
                          .loss_divisor = 8};
  BatchSlice slice;
  EXPECT_THROW(slice_batch(c, source, 1, 2, {}, slice), Error);
  const std::vector<int> bad = {4};
  EXPECT_THROW(slice_batch(c, source, 0, 1, bad, slice), Error);
}

TEST(TransformerLayout, OffsetsAreTheParameterStoresAndUnitsTileTheBuffer) {
  for (bool tied : {false, true}) {
    TransformerConfig c;
    c.d_model = 16;
    c.layers = 3;
    c.heads = 2;
    c.seq = 8;
    c.tied_head = tied;
    const TransformerLayout layout = transformer_layout(c);
    ParameterStore store;
    Transformer(c).register_parameters(store);
    auto at = [&](const std::string& name) { return store.slice(store.index_of(name)).offset - store.slice(0).offset; };
    EXPECT_EQ(layout.wte, at("wte"));
    EXPECT_EQ(layout.wpe, at("wpe"));
    for (int l = 0; l < c.layers; ++l) {
      const BlockOffsets& b = layout.blocks[static_cast<std::size_t>(l)];
      EXPECT_EQ(b.qkv_w, at(str("h", l, ".attn.qkv.weight")));
      EXPECT_EQ(b.fc2_b, at(str("h", l, ".mlp.proj.bias")));
    }
    EXPECT_EQ(layout.lnf_w, at("ln_f.weight"));
    if (!tied) {
      EXPECT_EQ(layout.head_w, at("lm_head.weight"));
    }
    std::size_t next = 0;
    for (const ParameterRange& u : layout.units) {
      EXPECT_EQ(u.offset, next);
      next += u.size;
    }
    EXPECT_EQ(next, layout.total);
    EXPECT_EQ(layout.total, store.size());
  }
}

}  // namespace
}  // namespace peertrain::model
