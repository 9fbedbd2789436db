// Every kernel against its CPU twin (model/layers.h, model/attention.h, train/optimizer.h)
// by normalized error ‖gpu − cpu‖ / ‖cpu‖ on fresh random inputs, with the tolerance that
// kernels/NOTES.md states for the op. The file is built twice: against the CPU emulator
// (kernels_emulated_test, runs everywhere, CI included) and against the CUDA build
// (kernels_cuda_test, skipped where there is no GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "test_support/normalized_error.h"
#include "../../src/model/layers.h"
#include "peertrain/kernels/device.h"
#include "peertrain/kernels/ops.h"
#include "peertrain/core/error.h"
#include "peertrain/model/attention.h"
#include "peertrain/train/optimizer.h"

namespace peertrain::kernels {
namespace {

#define REQUIRE_DEVICE() \
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device"

std::vector<float> random_floats(std::size_t count, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(count);
  for (float& x : v) x = normal(rng);
  return v;
}

// A device copy of a host vector, and back.
template <typename T>
DeviceArray<T> upload(const std::vector<T>& host) {
  DeviceArray<T> device(host.size());
  copy_to_device(device.data(), host.data(), sizeof(T) * host.size(), {});
  return device;
}
template <typename T>
std::vector<T> download(const DeviceArray<T>& device, std::size_t count) {
  std::vector<T> host(count);
  copy_to_host(host.data(), device.data(), sizeof(T) * count, {});
  synchronize({});
  return host;
}

// Tolerances (normalized error), kernels/NOTES.md.
constexpr double kExactTolerance = 1e-6;     // element-wise float32, no reduction order change
constexpr double kReduceTolerance = 1e-5;    // float32 with reductions in another order
constexpr double kTf32Tolerance = 5e-3;      // TF32 rounds inputs to 10 mantissa bits
constexpr double kBf16Tolerance = 2e-2;      // BF16 rounds inputs to 7 mantissa bits
constexpr double kBf16AttentionTolerance = 1e-2;  // Q, K, V and P in BF16, sums in FP32

TEST(Kernels, GemmMatchesTheCpuGemmForEveryTransposeAndPrecision) {
  REQUIRE_DEVICE();
  const int m = 37, n = 29, k = 53;
  model::Gemm cpu;
  for (GemmPrecision precision : {GemmPrecision::kFp32, GemmPrecision::kTf32, GemmPrecision::kBf16}) {
    Blas blas({}, precision);
    const double tolerance = emulated() || precision == GemmPrecision::kFp32 ? kReduceTolerance
                             : precision == GemmPrecision::kTf32           ? kTf32Tolerance
                                                                           : kBf16Tolerance;
    for (int variant = 0; variant < 8; ++variant) {
      const bool ta = variant & 1, tb = variant & 2, accumulate = variant & 4;
      SCOPED_TRACE(::testing::Message() << "precision " << int(precision) << " ta " << ta << " tb " << tb
                                        << " accumulate " << accumulate);
      const auto a = random_floats(std::size_t(m) * k, 1 + variant), b = random_floats(std::size_t(k) * n, 11 + variant);
      auto c = random_floats(std::size_t(m) * n, 21 + variant);
      auto da = upload(a), db = upload(b), dc = upload(c);
      blas.gemm(ta, tb, m, n, k, da.data(), db.data(), dc.data(), accumulate);
      cpu.run(ta, tb, m, n, k, a.data(), b.data(), c.data(), accumulate);
      EXPECT_LT(normalized_error(download(dc, c.size()), c), tolerance);
    }
  }
}

TEST(Kernels, BiasRowSumsAndAddMatchTheCpu) {
  REQUIRE_DEVICE();
  const int rows = 300, cols = 70;  // two blocks of rows, three chunks of columns
  const auto bias = random_floats(rows, 1), x = random_floats(std::size_t(rows) * cols, 2);
  auto y = random_floats(x.size(), 3), sums = random_floats(rows, 4);
  auto dbias = upload(bias), dx = upload(x), dy = upload(y), dsums = upload(sums);
  add_bias({}, rows, cols, dbias.data(), dy.data());
  add_row_sums({}, rows, cols, dx.data(), dsums.data());
  for (int c = 0; c < cols; ++c)
    for (int r = 0; r < rows; ++r) y[std::size_t(c) * rows + r] += bias[r];
  model::layers::add_row_sums(rows, cols, x.data(), sums.data());
  EXPECT_LT(normalized_error(download(dy, y.size()), y), kExactTolerance);
  EXPECT_LT(normalized_error(download(dsums, sums.size()), sums), kReduceTolerance);
  add({}, x.size(), dx.data(), dy.data());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] += x[i];
  EXPECT_LT(normalized_error(download(dy, y.size()), y), kExactTolerance);
}

TEST(Kernels, GeluForwardAndBackwardMatchTheCpu) {
  REQUIRE_DEVICE();
  const std::size_t count = 10007;
  const auto x = random_floats(count, 5, 2.0f), dy = random_floats(count, 6);
  std::vector<float> y(count), dx(count);
  auto dx_in = upload(x), ddy = upload(dy);
  DeviceArray<float> dyout(count), ddx(count);
  gelu_forward({}, count, dx_in.data(), dyout.data());
  gelu_backward({}, count, dx_in.data(), ddy.data(), ddx.data());
  model::layers::gelu_forward(count, x.data(), y.data());
  model::layers::gelu_backward(count, x.data(), dy.data(), dx.data());
  EXPECT_LT(normalized_error(download(dyout, count), y), kReduceTolerance);
  EXPECT_LT(normalized_error(download(ddx, count), dx), kReduceTolerance);
}

TEST(Kernels, LayerNormForwardAndBackwardMatchTheCpu) {
  REQUIRE_DEVICE();
  for (int d : {32, 100, 128}) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    const int n = 301;
    const auto x = random_floats(std::size_t(d) * n, 7, 3.0f), gamma = random_floats(d, 8),
               beta = random_floats(d, 9), dy = random_floats(std::size_t(d) * n, 10),
               residual = random_floats(std::size_t(d) * n, 11);
    std::vector<float> y(x.size()), mean(n), rstd(n), dx(x.size());
    auto dgamma = random_floats(d, 12), dbeta = random_floats(d, 13);  // backward adds into these
    auto gx = upload(x), gg = upload(gamma), gb = upload(beta), gdy = upload(dy), gres = upload(residual),
         gdgamma = upload(dgamma), gdbeta = upload(dbeta);
    DeviceArray<float> gy(x.size()), gmean(n), grstd(n), gdx(x.size());
    layernorm_forward({}, d, n, gx.data(), gg.data(), gb.data(), gy.data(), gmean.data(), grstd.data());
    layernorm_backward({}, d, n, gx.data(), gmean.data(), grstd.data(), gg.data(), gdy.data(), gres.data(), gdx.data(),
                       gdgamma.data(), gdbeta.data());
    model::layers::layernorm_forward(d, n, x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data());
    model::layers::layernorm_backward(d, n, x.data(), mean.data(), rstd.data(), gamma.data(), dy.data(),
                                      residual.data(), dx.data(), dgamma.data(), dbeta.data());
    EXPECT_LT(normalized_error(download(gy, y.size()), y), kReduceTolerance);
    EXPECT_LT(normalized_error(download(gmean, n), mean), kReduceTolerance);
    EXPECT_LT(normalized_error(download(grstd, n), rstd), kReduceTolerance);
    EXPECT_LT(normalized_error(download(gdx, dx.size()), dx), kReduceTolerance);
    EXPECT_LT(normalized_error(download(gdgamma, d), dgamma), kReduceTolerance);
    EXPECT_LT(normalized_error(download(gdbeta, d), dbeta), kReduceTolerance);
  }
}

TEST(Kernels, EmbeddingForwardAndBackwardMatchTheCpu) {
  REQUIRE_DEVICE();
  const int d = 48, vocab = 256, seq = 40, batch = 5, tokens = 24;
  std::mt19937 rng(14);
  std::vector<std::int32_t> ids(std::size_t(batch) * tokens);
  for (auto& id : ids) id = static_cast<std::int32_t>(rng() % 20);  // few distinct bytes: the atomics collide
  std::vector<int> positions(tokens);
  for (int t = 0; t < tokens; ++t) positions[t] = 3 + t;  // a chunk of the sequence, not from 0
  const auto wte = random_floats(std::size_t(d) * vocab, 15), wpe = random_floats(std::size_t(d) * seq, 16),
             dout = random_floats(std::size_t(d) * batch * tokens, 17);
  auto dwte = random_floats(wte.size(), 18), dwpe = random_floats(wpe.size(), 19);
  std::vector<float> out(dout.size());
  auto gids = upload(ids);
  auto gpos = upload(positions);
  auto gwte = upload(wte), gwpe = upload(wpe), gdout = upload(dout), gdwte = upload(dwte), gdwpe = upload(dwpe);
  DeviceArray<float> gout(out.size());
  token_embedding_forward({}, d, batch, tokens, gids.data(), gpos.data(), gwte.data(), gwpe.data(), gout.data());
  token_embedding_backward({}, d, batch, tokens, gids.data(), gpos.data(), gdout.data(), gdwte.data(), gdwpe.data());
  model::layers::token_embedding_forward(d, batch, tokens, ids.data(), positions.data(), wte.data(), wpe.data(),
                                         out.data());
  model::layers::token_embedding_backward(d, batch, tokens, ids.data(), positions.data(), dout.data(), dwte.data(),
                                          dwpe.data());
  EXPECT_LT(normalized_error(download(gout, out.size()), out), kExactTolerance);
  EXPECT_LT(normalized_error(download(gdwte, dwte.size()), dwte), kReduceTolerance);
  EXPECT_LT(normalized_error(download(gdwpe, dwpe.size()), dwpe), kReduceTolerance);
}

TEST(Kernels, SplitAndMergeHeadsMoveEveryElement) {
  REQUIRE_DEVICE();
  const int batch = 3, tokens = 10, heads = 4, head_dim = 8, d = heads * head_dim, rows = 3 * d;
  const auto x = random_floats(std::size_t(rows) * batch * tokens, 20);
  const std::size_t per_part = std::size_t(d) * batch * tokens;
  auto gx = upload(x);
  DeviceArray<float> gheads(per_part), gback(x.size());
  zero(gback.data(), sizeof(float) * x.size(), {});
  std::vector<float> heads_cpu(per_part), back(x.size(), 0.0f);
  for (int part = 0; part < 3; ++part) {
    split_heads({}, batch, tokens, heads, head_dim, rows, part * d, gx.data(), gheads.data());
    model::layers::split_heads(batch, tokens, heads, head_dim, rows, part * d, x.data(), heads_cpu.data());
    EXPECT_EQ(download(gheads, per_part), heads_cpu) << "part " << part;
    merge_heads({}, batch, tokens, heads, head_dim, rows, part * d, gheads.data(), gback.data());
  }
  EXPECT_EQ(download(gback, x.size()), x);
}

TEST(Kernels, SoftmaxCrossEntropyMatchesTheCpu) {
  REQUIRE_DEVICE();
  const int classes = 256, n = 77;
  auto logits = random_floats(std::size_t(classes) * n, 21, 3.0f);
  std::mt19937 rng(22);
  std::vector<std::int32_t> targets(n);
  for (auto& t : targets) t = static_cast<std::int32_t>(rng() % classes);
  // Make some columns predict their target, so that `correct` is not trivially zero.
  for (int j = 0; j < n; j += 3) logits[std::size_t(j) * classes + targets[j]] += 20.0f;
  auto glogits = upload(logits);
  auto gtargets = upload(targets);
  DeviceArray<float> gloss(n);
  DeviceArray<int> gcorrect(n);
  const float grad_scale = 1.0f / 300;
  softmax_cross_entropy({}, classes, n, glogits.data(), gtargets.data(), grad_scale, gloss.data(), gcorrect.data());
  long long correct = 0;
  const double loss = model::layers::softmax_cross_entropy(classes, n, logits.data(), targets.data(), grad_scale,
                                                           &correct);
  const auto losses = download(gloss, n);
  const auto corrects = download(gcorrect, n);
  const double gpu_loss = std::accumulate(losses.begin(), losses.end(), 0.0);
  EXPECT_NEAR(gpu_loss, loss, kReduceTolerance * loss);
  EXPECT_EQ(std::accumulate(corrects.begin(), corrects.end(), 0LL), correct);
  EXPECT_GE(correct, n / 3);
  EXPECT_LT(normalized_error(download(glogits, logits.size()), logits), kReduceTolerance);
}

struct AttentionCase {
  int rows, tokens, head_dim;
  bool causal;
};

// The serial twin: model::LocalAttention over whole sequences, forward and backward.
struct LocalReference {
  std::vector<float> out, lse, dq, dk, dv;
};
LocalReference local_reference(const AttentionCase& c, const std::vector<int>& positions, const std::vector<float>& q,
                               const std::vector<float>& k, const std::vector<float>& v,
                               const std::vector<float>& dout) {
  const model::AttentionShape shape{
      .batch = c.rows, .heads = 1, .head_dim = c.head_dim, .tokens = c.tokens, .causal = c.causal};
  LocalReference r{std::vector<float>(q.size()), std::vector<float>(std::size_t(c.rows) * c.tokens),
                   std::vector<float>(q.size()), std::vector<float>(q.size()), std::vector<float>(q.size())};
  model::LocalAttention local;
  local.forward(shape, positions, q.data(), k.data(), v.data(), r.out.data(), r.lse.data());
  local.backward(shape, positions, q.data(), k.data(), v.data(), r.out.data(), r.lse.data(), dout.data(), r.dq.data(),
                 r.dk.data(), r.dv.data());
  return r;
}

// Whole-sequence attention, forward and backward, against model::LocalAttention.
TEST(Kernels, AttentionMatchesLocalAttention) {
  REQUIRE_DEVICE();
  for (const AttentionCase& c : {AttentionCase{3, 100, 32, true}, AttentionCase{2, 130, 16, false},
                                 AttentionCase{2, 64, 64, true}, AttentionCase{1, 7, 32, true}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " T " << c.tokens << " head_dim " << c.head_dim
                                      << " causal " << c.causal);
    const std::size_t size = std::size_t(c.rows) * c.tokens * c.head_dim;
    const auto q = random_floats(size, 30), k = random_floats(size, 31), v = random_floats(size, 32),
               dout = random_floats(size, 33);
    std::vector<int> positions(c.tokens);
    std::iota(positions.begin(), positions.end(), 0);
    const auto [out, lse, dq, dk, dv] = local_reference(c, positions, q, k, v, dout);

    auto gq = upload(q), gk = upload(k), gv = upload(v), gdout = upload(dout);
    auto gpos = upload(positions);
    DeviceArray<float> gout(size), glse(lse.size()), gdelta(lse.size()), gdq(size), gdk(size), gdv(size);
    const AttentionDims dims{.rows = c.rows, .tq = c.tokens, .tk = c.tokens, .head_dim = c.head_dim,
                             .causal = c.causal};
    attention_forward({}, dims, gq.data(), gpos.data(), gk.data(), gv.data(), gpos.data(), gout.data(), glse.data());
    EXPECT_LT(normalized_error(download(gout, size), out), kReduceTolerance);
    EXPECT_LT(normalized_error(download(glse, lse.size()), lse), kReduceTolerance);
    for (auto* g : {&gdq, &gdk, &gdv}) zero(g->data(), sizeof(float) * size, {});
    attention_backward_delta({}, c.rows, c.tokens, c.head_dim, gout.data(), gdout.data(), gdelta.data());
    attention_backward({}, dims, gq.data(), gpos.data(), gk.data(), gv.data(), gpos.data(), glse.data(),
                       gdelta.data(), gdout.data(), gdq.data(), gdk.data(), gdv.data());
    EXPECT_LT(normalized_error(download(gdq, size), dq), kReduceTolerance);
    EXPECT_LT(normalized_error(download(gdk, size), dk), kReduceTolerance);
    EXPECT_LT(normalized_error(download(gdv, size), dv), kReduceTolerance);
  }
}

// The tensor-core forward (BF16 operands, FP32 sums) with tiling `tiling` against
// model::LocalAttention in FP32: every output written (the buffers start as NaN); the FP32
// backward then runs on its lse.
void check_tensor_core_forward(const AttentionCase& c, std::size_t tiling) {
  SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " T " << c.tokens << " head_dim " << c.head_dim
                                    << " causal " << c.causal << " tiling " << tiling);
  const std::size_t size = std::size_t(c.rows) * c.tokens * c.head_dim;
  const auto q = random_floats(size, 1000 + tiling), k = random_floats(size, 131), v = random_floats(size, 132),
             dout = random_floats(size, 133);
  std::vector<int> positions(c.tokens);
  std::iota(positions.begin(), positions.end(), 0);
  const auto [out, lse, dq, dk, dv] = local_reference(c, positions, q, k, v, dout);

  auto gq = upload(q), gk = upload(k), gv = upload(v), gdout = upload(dout);
  auto gpos = upload(positions);
  auto gout = upload(std::vector<float>(size, NAN)), glse = upload(std::vector<float>(lse.size(), NAN));
  DeviceArray<float> gdelta(lse.size()), gdq(size), gdk(size), gdv(size);
  const AttentionDims dims{.rows = c.rows,
                           .tq = c.tokens,
                           .tk = c.tokens,
                           .head_dim = c.head_dim,
                           .causal = c.causal,
                           .precision = AttentionPrecision::kBf16};
  if (tiling == attention_default_tiling())  // what attention_forward runs
    attention_forward({}, dims, gq.data(), gpos.data(), gk.data(), gv.data(), gpos.data(), gout.data(), glse.data());
  else
    attention_forward_tiled({}, dims, tiling, false, gq.data(), gpos.data(), gk.data(), gv.data(), gpos.data(),
                            gout.data(), glse.data());
  const double out_error = normalized_error(download(gout, size), out);
  EXPECT_LT(out_error, kBf16AttentionTolerance);
  EXPECT_GT(out_error, 1e-5) << "BF16 rounding leaves a trace: is the FP32 kernel running instead?";
  EXPECT_LT(normalized_error(download(glse, lse.size()), lse), kBf16AttentionTolerance);
  for (auto* g : {&gdq, &gdk, &gdv}) zero(g->data(), sizeof(float) * size, {});
  attention_backward_delta({}, c.rows, c.tokens, c.head_dim, gout.data(), gdout.data(), gdelta.data());
  attention_backward({}, dims, gq.data(), gpos.data(), gk.data(), gv.data(), gpos.data(), glse.data(), gdelta.data(),
                     gdout.data(), gdq.data(), gdk.data(), gdv.data());
  EXPECT_LT(normalized_error(download(gdq, size), dq), kBf16AttentionTolerance);
  EXPECT_LT(normalized_error(download(gdk, size), dk), kBf16AttentionTolerance);
  EXPECT_LT(normalized_error(download(gdv, size), dv), kBf16AttentionTolerance);
}

// Partial query and key tiles, causal and not, every head_dim.
TEST(Kernels, TensorCoreAttentionMatchesLocalAttentionToBf16Rounding) {
  REQUIRE_DEVICE();
  for (const AttentionCase& c :
       {AttentionCase{3, 100, 32, true}, AttentionCase{2, 130, 16, false}, AttentionCase{2, 200, 64, true},
        AttentionCase{1, 7, 32, true}, AttentionCase{1, 300, 64, false}})
    check_tensor_core_forward(c, attention_default_tiling());
}

// Every tiling kernels_bench compares, mma.sync and wgmma (the emulator models both; a GPU
// runs wgmma where it is of compute capability 9.0), with partial query and key tiles.
TEST(Kernels, EveryTensorCoreTilingMatchesLocalAttention) {
  REQUIRE_DEVICE();
  ASSERT_GE(attention_tilings().size(), 2u);
  // The default is a wgmma tiling exactly where the device runs wgmma.
  const bool has_wgmma = attention_tilings()[attention_default_tiling()].instruction == TensorCoreInstruction::kWgmma;
  for (std::size_t tiling = 0; tiling < attention_tilings().size(); ++tiling) {
    if (attention_tilings()[tiling].instruction == TensorCoreInstruction::kWgmma && !has_wgmma) continue;
    for (const AttentionCase& c :
         {AttentionCase{2, 200, 64, true}, AttentionCase{1, 150, 32, false}, AttentionCase{1, 70, 16, true}})
      check_tensor_core_forward(c, tiling);
  }
}

// Causal, every key after every query (a ring block from later in the sequence): no query
// sees a key, so every tiling must write out 0 and lse −inf everywhere, never NaN.
TEST(Kernels, EveryTensorCoreTilingLeavesQueriesThatSeeNoKeyEmpty) {
  REQUIRE_DEVICE();
  const bool has_wgmma = attention_tilings()[attention_default_tiling()].instruction == TensorCoreInstruction::kWgmma;
  const int rows = 2, tq = 150, tk = 90, head_dim = 32;
  const auto q = random_floats(std::size_t(rows) * tq * head_dim, 60),
             k = random_floats(std::size_t(rows) * tk * head_dim, 61),
             v = random_floats(std::size_t(rows) * tk * head_dim, 62);
  std::vector<int> q_positions(tq), k_positions(tk);
  std::iota(q_positions.begin(), q_positions.end(), 0);
  std::iota(k_positions.begin(), k_positions.end(), 1000);
  auto gq = upload(q), gk = upload(k), gv = upload(v);
  auto gqp = upload(q_positions), gkp = upload(k_positions);
  const AttentionDims dims{.rows = rows, .tq = tq, .tk = tk, .head_dim = head_dim, .causal = true};
  for (std::size_t tiling = 0; tiling < attention_tilings().size(); ++tiling) {
    if (attention_tilings()[tiling].instruction == TensorCoreInstruction::kWgmma && !has_wgmma) continue;
    SCOPED_TRACE(::testing::Message() << "tiling " << tiling);
    auto gout = upload(std::vector<float>(std::size_t(rows) * tq * head_dim, NAN)),
         glse = upload(std::vector<float>(std::size_t(rows) * tq, NAN));
    attention_forward_tiled({}, dims, tiling, false, gq.data(), gqp.data(), gk.data(), gv.data(), gkp.data(),
                            gout.data(), glse.data());
    const auto out = download(gout, std::size_t(rows) * tq * head_dim), lse = download(glse, std::size_t(rows) * tq);
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return x == 0.0f; }));
    EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), [](float x) { return std::isinf(x) && x < 0; }));
  }
}

TEST(Kernels, TensorCoreTilingOutsideTheCompiledSetIsRefused) {
  REQUIRE_DEVICE();
  const AttentionDims dims{.rows = 1, .tq = 8, .tk = 8, .head_dim = 64, .causal = true};
  DeviceArray<float> x(8 * 64), out(8 * 64), lse(8);
  DeviceArray<int> pos(8);
  try {
    attention_forward_tiled({}, dims, attention_tilings().size(), false, x.data(), pos.data(), x.data(), x.data(),
                            pos.data(), out.data(), lse.data());
    FAIL() << "an unknown tiling ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tiling"), std::string::npos) << e.what();
  }
}

// Ring attention's use: the keys arrive in two chunks (the zigzag halves of a sequence),
// each block's (out, lse) is merged by log-sum-exp, and each block's backward adds its
// share. The result must equal whole-sequence attention.
TEST(Kernels, AttentionBlocksMergedByLogSumExpEqualTheWholeSequence) {
  REQUIRE_DEVICE();
  const int rows = 2, tokens = 96, head_dim = 32;
  for (const AttentionPrecision precision : {AttentionPrecision::kFp32, AttentionPrecision::kBf16})
    for (bool causal : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "causal " << causal << " bf16 " << (precision == AttentionPrecision::kBf16));
      const double tolerance = precision == AttentionPrecision::kBf16 ? kBf16AttentionTolerance : kReduceTolerance;
      const std::size_t size = std::size_t(rows) * tokens * head_dim;
      const auto q = random_floats(size, 40), k = random_floats(size, 41), v = random_floats(size, 42),
                 dout = random_floats(size, 43);
      std::vector<int> positions(tokens);
      std::iota(positions.begin(), positions.end(), 0);
      const auto [out, lse, dq, dk, dv] = local_reference({rows, tokens, head_dim, causal}, positions, q, k, v, dout);

      // Key chunk a: positions 0..23 and 72..95 (zigzag of rank 0 of 2), chunk b: 24..71.
      std::vector<int> chunk_a, chunk_b;
      for (int t = 0; t < tokens; ++t) (t < 24 || t >= 72 ? chunk_a : chunk_b).push_back(t);
      auto gather = [&](const std::vector<float>& x, const std::vector<int>& chunk) {
        std::vector<float> part(std::size_t(rows) * chunk.size() * head_dim);
        for (int r = 0; r < rows; ++r)
          for (std::size_t t = 0; t < chunk.size(); ++t)
            for (int e = 0; e < head_dim; ++e)
              part[(r * chunk.size() + t) * head_dim + e] = x[(std::size_t(r) * tokens + chunk[t]) * head_dim + e];
        return part;
      };
      auto gq = upload(q), gdout = upload(dout);
      auto gpos = upload(positions);
      DeviceArray<float> gout(size), glse(lse.size()), bout(size), blse(lse.size()), gdelta(lse.size()), gdq(size);
      zero(gdq.data(), sizeof(float) * size, {});
      struct Chunk {
        DeviceArray<float> k, v, dk, dv;
        DeviceArray<int> pos;
        int tokens;
      };
      std::vector<Chunk> chunks;
      for (const auto* chunk : {&chunk_a, &chunk_b}) {
        Chunk ch{upload(gather(k, *chunk)),
                 upload(gather(v, *chunk)),
                 DeviceArray<float>(size),
                 DeviceArray<float>(size),
                 upload(*chunk),
                 static_cast<int>(chunk->size())};
        zero(ch.dk.data(), sizeof(float) * size, {});
        zero(ch.dv.data(), sizeof(float) * size, {});
        chunks.push_back(std::move(ch));
      }
      for (std::size_t i = 0; i < chunks.size(); ++i) {
        const AttentionDims dims{.rows = rows,
                                 .tq = tokens,
                                 .tk = chunks[i].tokens,
                                 .head_dim = head_dim,
                                 .causal = causal,
                                 .precision = precision};
        float* target_out = i == 0 ? gout.data() : bout.data();
        float* target_lse = i == 0 ? glse.data() : blse.data();
        attention_forward({}, dims, gq.data(), gpos.data(), chunks[i].k.data(), chunks[i].v.data(),
                          chunks[i].pos.data(), target_out, target_lse);
      }
      attention_merge({}, rows, tokens, head_dim, gout.data(), glse.data(), bout.data(), blse.data());
      EXPECT_LT(normalized_error(download(gout, size), out), tolerance);
      EXPECT_LT(normalized_error(download(glse, lse.size()), lse), tolerance);

      attention_backward_delta({}, rows, tokens, head_dim, gout.data(), gdout.data(), gdelta.data());
      for (Chunk& ch : chunks) {
        const AttentionDims dims{.rows = rows, .tq = tokens, .tk = ch.tokens, .head_dim = head_dim, .causal = causal};
        attention_backward({}, dims, gq.data(), gpos.data(), ch.k.data(), ch.v.data(), ch.pos.data(), glse.data(),
                           gdelta.data(), gdout.data(), gdq.data(), ch.dk.data(), ch.dv.data());
      }
      EXPECT_LT(normalized_error(download(gdq, size), dq), tolerance);
      const std::vector<int>* chunk_list[] = {&chunk_a, &chunk_b};
      for (std::size_t i = 0; i < chunks.size(); ++i) {
        const std::size_t part = std::size_t(rows) * chunks[i].tokens * head_dim;
        EXPECT_LT(normalized_error(download(chunks[i].dk, part), gather(dk, *chunk_list[i])), tolerance);
        EXPECT_LT(normalized_error(download(chunks[i].dv, part), gather(dv, *chunk_list[i])), tolerance);
      }
    }
}

TEST(Kernels, AttentionRejectsAHeadDimItHasNoKernelFor) {
  REQUIRE_DEVICE();
  const AttentionDims dims{.rows = 1, .tq = 4, .tk = 4, .head_dim = 48, .causal = true};
  try {
    attention_forward({}, dims, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    FAIL() << "head_dim 48 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("head_dim 48"), std::string::npos) << e.what();
  }
}

TEST(Kernels, SgdAndAdamWUpdatesFollowTheCpuOptimizers) {
  REQUIRE_DEVICE();
  const std::size_t count = 5003;
  auto params = random_floats(count, 50);
  const train::SgdConfig sgd_config{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-3f};
  const train::AdamConfig adam_config{.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  train::Sgd sgd(count, sgd_config);
  train::Adam adam(count, adam_config);
  auto gparams = upload(params);
  DeviceArray<float> gvelocity(count), gm(count), gv(count), gupdate(count), ggrads(count);
  for (auto* g : {&gvelocity, &gm, &gv}) zero(g->data(), sizeof(float) * count, {});
  std::vector<float> update(count);
  for (int step = 1; step <= 3; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const auto grads = random_floats(count, 60 + step);
    copy_to_device(ggrads.data(), grads.data(), sizeof(float) * count, {});
    sgd.compute_update(params, grads, update);
    sgd_update({}, count, gparams.data(), ggrads.data(), gvelocity.data(), gupdate.data(), sgd_config.lr,
               sgd_config.momentum, sgd_config.weight_decay);
    EXPECT_LT(normalized_error(download(gupdate, count), update), kExactTolerance);
    adam.compute_update(params, grads, update);
    adamw_update({}, count, gparams.data(), ggrads.data(), gm.data(), gv.data(), gupdate.data(), adam_config.lr,
                 adam_config.beta1, adam_config.beta2, adam_config.eps, adam_config.weight_decay, float(step));
    EXPECT_LT(normalized_error(download(gupdate, count), update), kReduceTolerance);
  }
  // In place: p −= update.
  const auto grads = random_floats(count, 70);
  copy_to_device(ggrads.data(), grads.data(), sizeof(float) * count, {});
  sgd.step(params, grads);
  sgd_update({}, count, gparams.data(), ggrads.data(), gvelocity.data(), nullptr, sgd_config.lr, sgd_config.momentum,
             sgd_config.weight_decay);
  EXPECT_LT(normalized_error(download(gparams, count), params), kExactTolerance);
}

TEST(Kernels, GossipMixEqualsTheWeightedSum) {
  REQUIRE_DEVICE();
  const std::size_t count = 4099;
  const int inputs = 3;
  std::vector<std::vector<float>> host;
  std::vector<DeviceArray<float>> device;
  for (int j = 0; j < inputs; ++j) {
    host.push_back(random_floats(count, 80 + j));
    device.push_back(upload(host.back()));
  }
  const float weights[inputs] = {0.5f, 0.25f, 0.25f};
  std::vector<float> want(count, 0.0f);
  for (int j = 0; j < inputs; ++j)
    for (std::size_t i = 0; i < count; ++i) want[i] += weights[j] * host[j][i];
  const float* pointers[inputs] = {device[0].data(), device[1].data(), device[2].data()};
  gossip_mix({}, device[0].data(), pointers, weights, inputs, count);  // x is its own first input
  EXPECT_LT(normalized_error(download(device[0], count), want), kExactTolerance);
  EXPECT_THROW(gossip_mix({}, device[0].data(), pointers, weights, 0, count), Error);
}

TEST(Kernels, AllocationsAreCountedForThePeakMemoryFigure) {
  REQUIRE_DEVICE();
  const std::size_t before = allocated_bytes();
  reset_peak_allocated_bytes();
  {
    DeviceArray<float> a(1 << 20);
    EXPECT_EQ(allocated_bytes(), before + (4u << 20));
  }
  EXPECT_EQ(allocated_bytes(), before);
  EXPECT_GE(peak_allocated_bytes(), before + (4u << 20));
}

}  // namespace
}  // namespace peertrain::kernels
