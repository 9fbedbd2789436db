// The GPT on the device against the CPU model, its serial twin: loss, every gradient and
// the evaluation sums on fresh random parameters and bytes. Built against the emulator
// (runs everywhere) and against CUDA (skipped without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "test_support/normalized_error.h"
#include "peertrain/device/device_transformer.h"
#include "peertrain/kernels/device.h"
#include "peertrain/core/error.h"
#include "peertrain/model/transformer.h"
#include "peertrain/train/device_update.h"

namespace peertrain::device {
namespace {

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

// The small GPT most tests here use: d 32, 2 heads (head_dim 16).
model::TransformerConfig small_gpt(int seq, int layers = 2, bool tied = false) {
  model::TransformerConfig config;
  config.d_model = 32;
  config.layers = layers;
  config.heads = 2;
  config.seq = seq;
  config.tied_head = tied;
  return config;
}

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

// The optimizer on the device (train::DeviceUpdate): over three steps, each on fresh
// bytes and carrying its state, the update u the device hands back equals the host
// optimizer's update from the CPU model's gradient; its state equals the host's, and a
// state restored from the host carries on as the host does.
TEST(DeviceTransformer, TheOptimizerOnTheDeviceGivesTheHostOptimizersUpdate) {
  if (kernels::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const model::TransformerConfig config = small_gpt(40);
  model::Transformer cpu(config);
  for (const train::OptimizerKind kind : {train::OptimizerKind::kSgd, train::OptimizerKind::kAdam}) {
    SCOPED_TRACE(::testing::Message() << (kind == train::OptimizerKind::kAdam ? "adam" : "sgd"));
    train::TrainConfig train_config;
    train_config.algorithm = train::Algorithm::kDpsgd;
    train_config.optimizer = kind;
    train_config.sgd = {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-3f};
    train_config.adam.lr = 1e-2f;
    train_config.adam.weight_decay = 0.1f;
    const auto gpu = make_device_transformer(config, {.device = 0, .gemm = model::GemmMode::kFp32});
    const std::size_t size = cpu.num_parameters();
    const auto device_update = train::make_device_update(gpu.get(), size, train_config);
    ASSERT_NE(device_update, nullptr);
    const auto host = train::make_optimizer(kind, size, train_config.sgd, train_config.adam);
    std::vector<float> params = Problem(cpu, 2, 32, 11).params;
    for (int step = 0; step < 3; ++step) {
      if (step == 2) device_update->restore_state(host->state());  // what a resumed run does
      const Problem fresh(cpu, 2, 32, 20 + step);
      std::vector<float> g(size, 0.0f), u_host(size), u_device(size, NAN), got(size);
      cpu.forward_backward(params, fresh.batch, g);
      host->compute_update(params, g, u_host);
      gpu->forward_backward(params, fresh.batch, u_device);
      device_update->compute_update(params, u_device, got);
      EXPECT_LT(normalized_error(got, u_host), 1e-4) << "step " << step;
      const std::span<const float> want_state = host->state(), got_state = device_update->state();
      ASSERT_EQ(got_state.size(), want_state.size());
      EXPECT_LT(normalized_error(std::vector<float>(got_state.begin(), got_state.end()),
                                 std::vector<float>(want_state.begin(), want_state.end())),
                1e-4);
      for (std::size_t i = 0; i < size; ++i) params[i] -= u_host[i];
    }
    device_update->set_learning_rate(0.0f);  // the schedule reaches the device's rule
    std::vector<float> u(size, NAN);
    gpu->forward_backward(params, Problem(cpu, 2, 32, 30).batch, u);
    EXPECT_EQ(*std::max_element(u.begin(), u.end()), 0.0f);
    EXPECT_THROW(device_update->restore_state(std::vector<float>(3)), Error);
  }
  // Where the device's u is not the host's, the host's optimizer stays.
  train::TrainConfig allreduce;
  allreduce.algorithm = train::Algorithm::kAllreduce;
  const auto gpu = make_device_transformer(config, {.device = 0});
  EXPECT_EQ(train::make_device_update(gpu.get(), cpu.num_parameters(), allreduce), nullptr);
}

// --sp S on the device: S ranks around a ring (a ThreadGroup on the emulator, NCCL on
// GPUs), each holding a zigzag or contiguous share of every sequence, against the CPU model.
TEST(DeviceTransformer, SequenceParallelMatchesTheCpuModel) {
  for (int sp : {2, 3})
    for (bool zigzag : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "sp " << sp << " zigzag " << zigzag);
      if (!kernels::emulated() && kernels::device_count() < sp) GTEST_SKIP() << "needs " << sp << " GPUs";
      const model::TransformerConfig config = small_gpt(48);
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

// --pp P on the device: the units cut into P stages, one thread each (all on device 0
// with one GPU, and on the emulator), over M micro-batches in the order of gpipe, 1f1b
// and eager-1f1b, against the CPU model. A tied head puts wte's gradient on two stages;
// the splits put the embedding or the head alone on a stage, and two steps on fresh
// parameters and bytes reuse the stages' activation slots and message buffers.
TEST(DeviceTransformer, PipelineMatchesTheCpuModel) {
  if (kernels::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  struct PipeCase {
    int pp, microbatches;
    const char* schedule;
    bool tied;
    std::vector<int> stages;  // first units; empty: the FLOP-balanced split
  };
  for (const PipeCase& c : {PipeCase{2, 1, "1f1b", false, {}}, PipeCase{2, 4, "1f1b", true, {}},
                            PipeCase{3, 2, "gpipe", false, {}}, PipeCase{4, 4, "eager-1f1b", true, {}},
                            PipeCase{3, 4, "1f1b", true, {0, 1, 3}}, PipeCase{2, 2, "gpipe", false, {0, 3}}}) {
    SCOPED_TRACE(::testing::Message() << "pp " << c.pp << " m " << c.microbatches << " " << c.schedule << " tied "
                                      << c.tied << " stages " << c.stages.size());
    const model::TransformerConfig config = small_gpt(32, 2, c.tied);
    model::Transformer cpu(config);
    const auto gpu = make_device_transformer(config, {.device = 0,
                                                      .gemm = model::GemmMode::kFp32,
                                                      .pp = c.pp,
                                                      .microbatches = c.microbatches,
                                                      .schedule = c.schedule,
                                                      .stage_first_units = c.stages});
    for (unsigned step = 0; step < 2; ++step) {
      const Problem problem(cpu, 4, 24, 13 + 10 * step);
      std::vector<float> want(problem.params.size(), 0.0f), got(problem.params.size(), 0.0f);
      const float want_loss = cpu.forward_backward(problem.params, problem.batch, want);
      const float got_loss = gpu->forward_backward(problem.params, problem.batch, got);
      EXPECT_NEAR(got_loss, want_loss, 1e-5 * want_loss) << "step " << step;
      const double error = normalized_error(got, want);
      EXPECT_LT(error, 1e-4) << "step " << step;
      std::printf("device %s: loss %.7f vs CPU %.7f, gradient normalized error %.2e\n", gpu->describe().c_str(),
                  got_loss, want_loss, error);
      const model::LossSums sums = gpu->evaluate(problem.params, problem.batch, true);
      const model::LossSums cpu_sums = cpu.evaluate(problem.params, problem.batch);
      EXPECT_NEAR(sums.loss_sum, cpu_sums.loss_sum, 1e-5 * cpu_sums.loss_sum);
      EXPECT_EQ(sums.count, cpu_sums.count);
    }
  }
}

// A stage holds its own units' parameters and gradient, not the whole model's: over the
// stages they add up to the model once (and a tied head's wte twice, on the first stage
// and apart on the last), whatever the number of stages.
TEST(DeviceTransformer, PipelineStagesSplitTheParameters) {
  if (kernels::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const bool tied : {false, true}) {
    const model::TransformerConfig config = small_gpt(16, 4, tied);
    const std::size_t total = model::Transformer(config).num_parameters();
    const std::size_t wte = std::size_t(config.vocab) * config.d_model;
    for (const int pp : {2, 3, 6}) {
      const std::size_t before = kernels::allocated_bytes();
      const auto gpu = make_device_transformer(config, {.pp = pp});
      const std::size_t floats = (kernels::allocated_bytes() - before) / sizeof(float);
      EXPECT_EQ(floats, 2 * (total + (tied ? wte : 0))) << "pp " << pp << " tied " << tied;
    }
  }
}

// A step that fails inside a stage (an asynchronous device error, or a launch that fails
// at once and stops that stage mid-schedule; injected on the emulator at several points)
// is reported, the waiting stages give up instead of hanging, and the next step runs and matches the CPU model: nothing of the
// failed step (micro-batches in flight, buffers never taken) is left behind.
TEST(DeviceTransformer, APipelineStepThatFailsLeavesThePipelineUsable) {
  if (!kernels::emulated()) GTEST_SKIP() << "injected failures are the emulator's";
  const model::TransformerConfig config = small_gpt(16, 2, true);
  model::Transformer cpu(config);
  const auto gpu = make_device_transformer(config, {.pp = 3, .microbatches = 2, .timeout_s = 5});
  const Problem problem(cpu, 4, 16, 5);
  std::vector<float> want(problem.params.size(), 0.0f);
  const float want_loss = cpu.forward_backward(problem.params, problem.batch, want);
  for (const bool at_launch : {false, true})
    for (const int after : {1, 7, 40}) {
      SCOPED_TRACE(::testing::Message() << "failure at queued operation " << after << (at_launch ? ", at launch" : ""));
      kernels::inject_failure_after(after, "injected device fault", at_launch);
      std::vector<float> scratch(problem.params.size(), 0.0f);
      try {
        gpu->forward_backward(problem.params, problem.batch, scratch);
        FAIL() << "the injected fault was not reported";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("injected device fault"), std::string::npos) << e.what();
      }
      std::vector<float> got(problem.params.size(), 0.0f);
      const float got_loss = gpu->forward_backward(problem.params, problem.batch, got);
      EXPECT_NEAR(got_loss, want_loss, 1e-5 * want_loss);
      EXPECT_LT(normalized_error(got, want), 1e-4);
    }
}

TEST(DeviceTransformer, PipelineRejectsWhatItCannotRun) {
  if (kernels::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const model::TransformerConfig config = small_gpt(16);
  const auto message_of = [&](model::DeviceOptions options) {
    try {
      make_device_transformer(config, options);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message_of({.pp = 5}).find("--pp 5 needs at least as many units (4"), std::string::npos);
  EXPECT_NE(message_of({.pp = 2, .schedule = "zb-h1"}).find("not 'zb-h1'"), std::string::npos);
  EXPECT_NE(message_of({.pp = 2, .schedule = "pipe"}).find("--schedule"), std::string::npos);
  EXPECT_NE(message_of({.sp = 2, .pp = 2}).find("--sp 1"), std::string::npos);
  EXPECT_NE(message_of({.pp = 2, .stage_first_units = {0, 4}}).find("--stages"), std::string::npos);
  // Micro-batches must divide the batch; a bad byte is named before any stage starts.
  const auto gpu = make_device_transformer(config, {.pp = 2, .microbatches = 3});
  model::Transformer cpu(config);
  Problem problem(cpu, 4, 16, 3);
  std::vector<float> grads(problem.params.size());
  try {
    gpu->forward_backward(problem.params, problem.batch, grads);
    FAIL() << "3 micro-batches of 4 sequences accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--microbatches 3 must divide the batch of 4"), std::string::npos) << e.what();
  }
  const auto two = make_device_transformer(config, {.pp = 2, .microbatches = 2});
  problem.bytes[5] = 300;
  EXPECT_THROW(two->forward_backward(problem.params, problem.batch, grads), Error);
  problem.bytes[5] = 5;  // and the pipeline still runs after a refused step
  EXPECT_GT(two->forward_backward(problem.params, problem.batch, grads), 0.0f);
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
