// The transformer against PyTorch's values in tests/data (made by
// tests/make_transformer_reference.py): logits, loss, every gradient, ten SGD steps.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "../../src/model/layers.h"
#include "peertrain/core/error.h"
#include "peertrain/core/parameter_store.h"
#include "transformer_test_util.h"

namespace peertrain::model {
namespace {

using namespace test;

struct TorchReference {
  std::map<std::string, std::vector<double>> sections;
  const std::vector<double>& operator[](const std::string& name) const {
    const auto it = sections.find(name);
    if (it == sections.end()) throw Error(ErrorKind::kParse, "reference: no section " + name);
    return it->second;
  }
};

TorchReference read_reference(const std::string& name) {
  const std::string path = std::string(PEERTRAIN_SOURCE_DIR) + "/tests/data/" + name;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kIo, str(path, ": cannot open"));
  TorchReference r;
  for (std::uint32_t length; in.read(reinterpret_cast<char*>(&length), 4);) {
    std::string section(length, '\0');
    std::uint8_t type = 0;
    std::uint64_t count = 0;
    in.read(section.data(), length);
    in.read(reinterpret_cast<char*>(&type), 1);
    in.read(reinterpret_cast<char*>(&count), 8);
    std::vector<double>& values = r.sections[section];
    values.resize(count);
    for (auto& v : values) {
      if (type == 0) {
        float f;
        in.read(reinterpret_cast<char*>(&f), 4);
        v = f;
      } else if (type == 1) {
        std::int32_t i;
        in.read(reinterpret_cast<char*>(&i), 4);
        v = i;
      } else {
        in.read(reinterpret_cast<char*>(&v), 8);
      }
    }
    if (!in) throw Error(ErrorKind::kParse, str(path, ": section ", section, " is truncated"));
  }
  return r;
}

// The float32 model against PyTorch's float64 computation from the same float32 values:
// logits, loss (1e-5 relative), each parameter tensor's gradient (normalized error 1e-5),
// and the losses of ten SGD steps (1e-5 relative).
void expect_matches_pytorch(const std::string& file) {
  const TorchReference ref = read_reference(file);
  const auto& c = ref["config"];
  ASSERT_EQ(c.size(), 13u);
  TransformerConfig config{.kind = c[0] == 0 ? TransformerKind::kGpt : TransformerKind::kVit,
                           .d_model = int(c[1]), .layers = int(c[2]), .heads = int(c[3]), .seq = int(c[4]),
                           .vocab = int(c[5]), .tied_head = c[6] != 0, .image = int(c[7]), .patch = int(c[8]),
                           .classes = int(c[9]), .mlp_ratio = int(c[12])};
  const int batch = int(c[10]), tokens = int(c[11]);
  Transformer model(config);
  ASSERT_EQ(model.config().tokens(), tokens);
  std::vector<float> params(ref["params"].begin(), ref["params"].end());
  ASSERT_EQ(params.size(), model.num_parameters());
  const std::vector<int> positions = all_positions(tokens);
  std::vector<std::int32_t> bytes, targets(ref["targets"].begin(), ref["targets"].end());
  std::vector<float> pixels;
  if (config.kind == TransformerKind::kGpt)
    bytes.assign(ref["inputs"].begin(), ref["inputs"].end());
  else
    pixels.assign(ref["inputs"].begin(), ref["inputs"].end());
  const TokenBatch b{.batch = batch, .tokens = tokens, .positions = positions, .bytes = bytes, .pixels = pixels,
                     .targets = targets, .loss_divisor = static_cast<double>(targets.size())};

  // Logits: the units up to the head, then ln_f and the projection from the kernels.
  const int d = config.d_model, n = batch * tokens;
  std::vector<float> x(static_cast<std::size_t>(d) * n), y(x.size()), mean(n), rstd(n);
  UnitActivations saved;
  for (int u = 0; u + 1 < model.num_units(); ++u) {
    model.forward(u, params, b, x.data(), y.data(), saved, {});
    std::swap(x, y);
  }
  ParameterStore store;
  model.register_parameters(store);
  store.finalize();
  auto at = [&](const char* name) { return params.data() + store.slice(store.index_of(name)).offset; };
  layers::layernorm_forward(d, n, x.data(), at("ln_f.weight"), at("ln_f.bias"), y.data(), mean.data(), rstd.data());
  layers::Gemm gemm;
  std::vector<float> logits;
  if (config.kind == TransformerKind::kVit) {
    std::vector<float> pooled(static_cast<std::size_t>(d) * batch);
    layers::sum_pool_forward(d, batch, tokens, y.data(), pooled.data());
    for (auto& p : pooled) p /= static_cast<float>(tokens);
    logits.resize(static_cast<std::size_t>(config.classes) * batch);
    layers::linear_forward(gemm, d, config.classes, batch, at("head.weight"), at("head.bias"), pooled.data(),
                           logits.data());
  } else {
    logits.resize(static_cast<std::size_t>(config.vocab) * n);
    if (config.tied_head)
      gemm.run(true, false, config.vocab, n, d, at("wte"), y.data(), logits.data(), false);
    else
      layers::linear_forward(gemm, d, config.vocab, n, at("lm_head.weight"), nullptr, y.data(), logits.data());
  }
  const double logits_error = normalized_error(logits, ref["logits"]);
  EXPECT_LT(logits_error, 1e-5) << "logits";

  std::vector<float> grads(params.size());
  const float loss = model.forward_backward(params, b, grads);
  EXPECT_NEAR(loss, ref["loss"][0], 1e-5 * ref["loss"][0]);
  double worst = 0;
  for (const ParameterSlice& s : store.slices()) {
    const std::vector<float> got(grads.begin() + s.offset, grads.begin() + s.offset + s.size());
    const std::vector<double> want(ref["grads"].begin() + s.offset, ref["grads"].begin() + s.offset + s.size());
    const double error = normalized_error(got, want);
    worst = std::max(worst, error);
    EXPECT_LT(error, 1e-5) << s.name;
  }
  std::cout << file << ": logits error " << logits_error << ", loss " << loss << " (PyTorch " << ref["loss"][0]
            << "), worst gradient error " << worst << "\n";

  const double lr = ref["lr"][0];
  const auto& sgd = ref["sgd_losses"];
  double worst_step = 0;
  for (std::size_t step = 0; step < sgd.size(); ++step) {
    std::fill(grads.begin(), grads.end(), 0.0f);
    const float step_loss = model.forward_backward(params, b, grads);
    EXPECT_NEAR(step_loss, sgd[step], 1e-5 * sgd[step]) << "SGD step " << step;
    worst_step = std::max(worst_step, std::abs(step_loss - sgd[step]) / sgd[step]);
    for (std::size_t i = 0; i < params.size(); ++i) params[i] -= static_cast<float>(lr) * grads[i];
  }
  std::cout << file << ": " << sgd.size() << " SGD steps, loss " << sgd.front() << " → " << sgd.back()
            << ", worst relative loss error " << worst_step << "\n";
}

// Both GEMM paths: one thread (Eigen's driver with the model's packing buffers) and two
// (Eigen's parallel product).
class TransformerPyTorch : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    threads_ = Eigen::nbThreads();
    Eigen::setNbThreads(GetParam());
  }
  void TearDown() override { Eigen::setNbThreads(threads_); }
  int threads_ = 1;
};

TEST_P(TransformerPyTorch, GptMatches) { expect_matches_pytorch("transformer_gpt.bin"); }
TEST_P(TransformerPyTorch, TiedGptMatches) { expect_matches_pytorch("transformer_gpt_tied.bin"); }
TEST_P(TransformerPyTorch, VitMatches) { expect_matches_pytorch("transformer_vit.bin"); }
INSTANTIATE_TEST_SUITE_P(Threads, TransformerPyTorch, ::testing::Values(1, 2));

}  // namespace
}  // namespace peertrain::model
