// Tensor parallelism (--tp) of a transformer block against the unsplit block, T = 1, 2, 3
// and 4 threads over a group (12 heads): every rank's output and input gradient equal the
// serial ones, and the ranks' gradient buffers sum to the serial gradient — with the fused
// backward and with the split one (B, then W), on fresh random parameters and data.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <numeric>
#include <thread>
#include <vector>

#include "test_support/normalized_error.h"
#include "peertrain/comm/thread_group.h"
#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "peertrain/model/tensor_shard.h"
#include "peertrain/model/transformer.h"

namespace {

using namespace peertrain;
using namespace peertrain::model;

std::vector<float> random_vector(Rng& rng, std::size_t n, double scale = 1) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

struct BlockResult {
  std::vector<float> out, din, grads;
};

TransformerConfig block_config() {
  return {.kind = TransformerKind::kGpt, .d_model = 48, .layers = 1, .heads = 12, .seq = 12, .vocab = 32};
}

// Block 0 (unit 1) forward and backward on `tp` ranks; out and din from rank `tp` − 1,
// the gradient summed over the ranks.
BlockResult run_block(int tp, bool split, const std::vector<float>& params, const std::vector<float>& x,
                      const std::vector<float>& dout, const TokenBatch& batch) {
  Transformer model(block_config());
  comm::ThreadGroup group(tp, "tensor group");
  std::vector<BlockResult> ranks(static_cast<std::size_t>(tp));
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r)
    threads.emplace_back([&, r] {
      BlockResult& mine = ranks[static_cast<std::size_t>(r)];
      UnitContext context;
      context.tensor_group = tp > 1 ? &group.member(r) : nullptr;
      UnitActivations saved;
      mine.out.resize(x.size());
      mine.din.resize(x.size());
      mine.grads.assign(model.num_parameters(), 0.0f);
      model.forward(1, params, batch, x.data(), mine.out.data(), saved, context);
      if (split) {
        model.backward_input(1, params, batch, dout.data(), mine.din.data(), saved, context);
        model.backward_weight(1, params, batch, saved, mine.grads, context);
      } else {
        model.backward(1, params, batch, dout.data(), mine.din.data(), saved, mine.grads, context);
      }
    });
  for (auto& t : threads) t.join();
  BlockResult sum = ranks.back();
  for (int r = 0; r + 1 < tp; ++r)
    for (std::size_t i = 0; i < sum.grads.size(); ++i) sum.grads[i] += ranks[static_cast<std::size_t>(r)].grads[i];
  for (const auto& mine : ranks) {  // every rank holds the whole output and input gradient
    EXPECT_LT(normalized_error(mine.out, sum.out), 1e-6);
    EXPECT_LT(normalized_error(mine.din, sum.din), 1e-6);
  }
  return sum;
}

TEST(TensorParallel, BlockMatchesTheUnsplitBlock) {
  const TransformerConfig c = block_config();
  const Transformer model(c);
  Rng rng(16);
  const int batch_size = 2, tokens = c.seq;
  std::vector<int> positions(static_cast<std::size_t>(tokens));
  std::iota(positions.begin(), positions.end(), 0);
  const std::size_t n = static_cast<std::size_t>(batch_size) * tokens;
  std::vector<std::int32_t> ids(n, 1);
  const TokenBatch batch{
      .batch = batch_size, .tokens = tokens, .positions = positions, .bytes = ids, .pixels = {}, .targets = ids};
  for (bool split : {false, true}) {
    // Fresh random parameters (LayerNorms and biases included) and data for each case.
    const auto params = random_vector(rng, model.num_parameters(), 0.3);
    const auto x = random_vector(rng, c.d_model * n), dout = random_vector(rng, c.d_model * n);
    const BlockResult serial = run_block(1, split, params, x, dout, batch);
    const auto block = model.unit_parameters(1);
    const std::span<const float> want_grads(serial.grads.data() + block.offset, block.size);
    for (int tp : {2, 3, 4}) {
      SCOPED_TRACE(str(split ? "B then W" : "fused backward", ", tp ", tp));
      const BlockResult got = run_block(tp, split, params, x, dout, batch);
      EXPECT_LT(normalized_error(got.out, serial.out), 1e-5);
      EXPECT_LT(normalized_error(got.din, serial.din), 1e-5);
      EXPECT_LT(normalized_error(std::span<const float>(got.grads.data() + block.offset, block.size), want_grads),
                1e-5);
      // Nothing outside the block.
      for (std::size_t i = 0; i < got.grads.size(); ++i) {
        const bool outside = i < block.offset || i >= block.offset + block.size;
        ASSERT_TRUE(!outside || got.grads[i] == 0.0f) << "at " << i;
      }
    }
  }
}

TEST(TensorParallel, ShardsCoverTheBlockOnceApartFromTheWholeTensors) {
  const TransformerConfig c = block_config();
  const Transformer model(c);
  const auto block = model.unit_parameters(1);
  for (int tp : {1, 2, 3, 4}) {
    std::vector<int> count(block.size, 0);
    for (int r = 0; r < tp; ++r)
      for (const auto& run : tensor_shard(c, model.layout().blocks[0], tp, r).runs)
        for (std::size_t i = 0; i < run.count; ++i) ++count[run.from + i - block.offset];
    const auto& o = model.layout().blocks[0];
    const std::size_t d = c.d_model;
    for (std::size_t i = 0; i < block.size; ++i) {
      const std::size_t at = block.offset + i;
      const bool whole = at < o.qkv_w || (at >= o.proj_b && at < o.fc_w) || at >= o.fc2_b;
      ASSERT_EQ(count[i], whole ? tp : 1) << "tp " << tp << " offset " << at << " (d " << d << ")";
    }
  }
}

TEST(TensorParallel, DegreeThatDoesNotDivideTheHeadsIsRefusedNamingTheFlag) {
  const TransformerConfig c = block_config();  // 12 heads, MLP width 192
  try {
    check_tensor_parallel(c, 5, "--stage-mesh stage 1");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("--stage-mesh stage 1 tp=5 does not divide the 12 attention heads"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(check_tensor_parallel(c, 0), Error);
  EXPECT_NO_THROW(check_tensor_parallel(c, 6));
}

}  // namespace
