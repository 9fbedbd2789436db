// The GPT on the device against the CPU model, its serial twin: loss, every gradient and
// the evaluation sums on fresh random parameters and bytes. Built against the emulator
// (runs everywhere) and against CUDA (skipped without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "peertrain/device/device_transformer.h"
#include "peertrain/kernels/device.h"
#include "peertrain/core/error.h"
#include "peertrain/model/transformer.h"

namespace peertrain::device {
namespace {

double normalized_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  EXPECT_GT(norm, 0);
  return std::sqrt(diff / std::max(norm, 1e-30));
}

// Parameters perturbed away from the initialisation (which leaves LayerNorm at 1/0 and
// biases at 0, special points for a gradient check) and a batch of random bytes.
struct Problem {
  std::vector<float> params;
  std::vector<int> positions;
  std::vector<std::int32_t> bytes, targets;
  model::TokenBatch batch;
  Problem(const model::Transformer& cpu, int batch_size, int tokens, unsigned seed)
      : params(cpu.num_parameters()), positions(tokens) {
    cpu.initialize(params, seed);
    std::mt19937 rng(seed + 1);
    std::normal_distribution<float> noise(0.0f, 0.05f);
    for (float& p : params) p += noise(rng);
    std::iota(positions.begin(), positions.end(), 0);
    bytes.resize(std::size_t(batch_size) * tokens);
    targets.resize(bytes.size());
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<std::int32_t>(rng() % 256);
      targets[i] = static_cast<std::int32_t>(rng() % 256);
    }
    batch = {.batch = batch_size, .tokens = tokens, .positions = positions, .bytes = bytes, .pixels = {},
             .targets = targets, .loss_divisor = double(batch_size * tokens)};
  }
};

struct Case {
  bool tied;
  int heads;
  model::GemmMode gemm;
  double tolerance;  // normalized error of the gradient
};

TEST(DeviceTransformer, MatchesTheCpuModel) {
  if (kernels::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  // fp32 GEMMs: float32 throughout, only the reduction order differs. TF32 rounds the GEMM
  // inputs to 10 mantissa bits (emulated: no rounding, so the tight tolerance holds there).
  const bool device = !kernels::emulated();
  for (const Case& c : {Case{false, 2, model::GemmMode::kFp32, 1e-4}, Case{true, 4, model::GemmMode::kFp32, 1e-4},
                        Case{false, 2, model::GemmMode::kTf32, device ? 2e-2 : 1e-4}}) {
    SCOPED_TRACE(::testing::Message() << "tied " << c.tied << " heads " << c.heads << " gemm " << int(c.gemm));
    model::TransformerConfig config;
    config.d_model = 32 * c.heads / 2;  // head_dim 16
    config.layers = 2;
    config.heads = c.heads;
    config.seq = 48;
    config.tied_head = c.tied;
    model::Transformer cpu(config);
    const Problem problem(cpu, 3, 40, 7);
    const std::vector<float>& params = problem.params;
    const model::TokenBatch& b = problem.batch;
    std::vector<float> want(params.size(), 0.0f), got(params.size(), 0.0f);
    const float want_loss = cpu.forward_backward(params, b, want);
    const auto gpu = make_device_transformer(config, {.device = 0, .gemm = c.gemm});
    const float got_loss = gpu->forward_backward(params, b, got);
    EXPECT_NEAR(got_loss, want_loss, 1e-5 * want_loss);
    const double error = normalized_error(got, want);
    EXPECT_LT(error, c.tolerance);
    std::printf("device %s, gemm %d, tied %d: loss %.7f vs CPU %.7f, gradient normalized error %.2e\n",
                kernels::device_name(0).c_str(), int(c.gemm), int(c.tied), got_loss, want_loss, error);
    // Per tensor too: a wrong small tensor (a bias, a LayerNorm) hides in the whole.
    ParameterStore store;
    cpu.register_parameters(store);
    for (const ParameterSlice& s : store.slices()) {
      const std::size_t at = s.offset - store.slice(0).offset;
      const std::vector<float> g(got.begin() + at, got.begin() + at + s.size()),
          w(want.begin() + at, want.begin() + at + s.size());
      EXPECT_LT(normalized_error(g, w), 10 * c.tolerance) << s.name;
    }
    const model::LossSums cpu_sums = cpu.evaluate(params, b);
    const model::LossSums gpu_sums = gpu->evaluate(params, b, true);
    EXPECT_NEAR(gpu_sums.loss_sum, cpu_sums.loss_sum, 1e-5 * cpu_sums.loss_sum);
    EXPECT_EQ(gpu_sums.count, cpu_sums.count);
    EXPECT_NEAR(double(gpu_sums.correct), double(cpu_sums.correct), 1.0);  // a near-tie may flip
  }
}

// --sp S on the device: S ranks around a ring (a ThreadGroup on the emulator, NCCL on
// GPUs), each holding a zigzag or contiguous share of every sequence, against the CPU model.
TEST(DeviceTransformer, SequenceParallelMatchesTheCpuModel) {
  for (int sp : {2, 3})
    for (bool zigzag : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "sp " << sp << " zigzag " << zigzag);
      if (!kernels::emulated() && kernels::device_count() < sp) GTEST_SKIP() << "needs " << sp << " GPUs";
      model::TransformerConfig config;
      config.d_model = 32;
      config.layers = 2;
      config.heads = 2;
      config.seq = 48;
      model::Transformer cpu(config);
      const Problem problem(cpu, 2, 48, 9);
      const std::vector<float>& params = problem.params;
      const model::TokenBatch& b = problem.batch;
      std::vector<float> want(params.size(), 0.0f), got(params.size(), 0.0f);
      const float want_loss = cpu.forward_backward(params, b, want);
      const auto gpu = make_device_transformer(
          config, {.device = 0, .gemm = model::GemmMode::kFp32, .sp = sp, .zigzag = zigzag});
      const float got_loss = gpu->forward_backward(params, b, got);
      EXPECT_NEAR(got_loss, want_loss, 1e-5 * want_loss);
      const double error = normalized_error(got, want);
      EXPECT_LT(error, 1e-4);
      std::printf("device sp %d %s: loss %.7f vs CPU %.7f, gradient normalized error %.2e\n", sp,
                  zigzag ? "zigzag" : "contiguous", got_loss, want_loss, error);
      const model::LossSums sums = gpu->evaluate(params, b, true);
      EXPECT_NEAR(sums.loss_sum, cpu.evaluate(params, b).loss_sum, 1e-5 * sums.loss_sum);
    }
}

TEST(DeviceTransformer, RejectsWhatItCannotRun) {
  if (kernels::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  model::TransformerConfig vit;
  vit.kind = model::TransformerKind::kVit;
  EXPECT_THROW(make_device_transformer(vit, {}), Error);
  model::TransformerConfig wide;
  wide.d_model = 96;
  wide.heads = 2;  // head_dim 48
  try {
    make_device_transformer(wide, {});
    FAIL() << "head_dim 48 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 48"), std::string::npos) << e.what();
  }
  model::TransformerConfig small;
  small.d_model = 32;
  small.heads = 2;
  small.seq = 8;
  const auto gpu = make_device_transformer(small, {});
  std::vector<float> params(model::Transformer(small).num_parameters(), 0.01f), grads(params.size());
  std::vector<int> positions = {0, 1, 2, 3};
  std::vector<std::int32_t> bytes = {1, 2, 300, 4}, targets = {1, 2, 3, 4};
  model::TokenBatch b{.batch = 1, .tokens = 4, .positions = positions, .bytes = bytes, .pixels = {},
                      .targets = targets, .loss_divisor = 4};
  EXPECT_THROW(gpu->forward_backward(params, b, grads), Error);  // byte 300 is outside the vocabulary
}

}  // namespace
}  // namespace peertrain::device
