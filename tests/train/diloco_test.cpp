// DiLoCo and Streaming DiLoCo (train/diloco.cpp) against their serial twins, on fresh
// random gradients:
//  - with H = 1, an outer learning rate of 1, no outer momentum and plain SGD inside, it
//    is the all-reduce run, step by step, over each of its three exchanges;
//  - every peer's x after every step is the dense recursion (inner SGD with momentum,
//    Δ = Θ − X, Δ̄ = W·Δ, Nesterov on Θ), with W = J/n for the all-reduce and the
//    topology's W for gossip;
//  - Streaming DiLoCo's fragments, overlap and mixing, and SparseLoCo's pseudo-gradients
//    with error feedback, are the same recursion with those written out;
//  - over gossip the local models are mixed, so the rows of Θ are pulled together (the
//    twin's Δ̄ = Θ − W(Θ − P); averaging P alone would differ once the rows of Θ do).
#include <gtest/gtest.h>

#include "peertrain/algo/quantize.h"
#include "peertrain/algo/sparse_code.h"
#include "step_harness.h"

namespace peertrain::train {
namespace {

using harness::relative;
using topology::Topology;

using harness::topology_from;

TrainConfig diloco(OuterExchange exchange, int inner_steps) {
  TrainConfig c;
  c.algorithm = Algorithm::kDiloco;
  c.sgd = {0.05f, 0.9f, 1e-4f};
  c.outer.inner_steps = inner_steps;
  c.outer.exchange = exchange;
  return c;
}

// The dense recursion: rows are peers. X takes torch's SGD step (v ← m·v + g + wd·x,
// x ← x − lr·v); after `done` steps fragment f begins when done ≡ ⌊(f + 1)·H/F⌋ (mod H):
// P = Θ − X + E (E the error-feedback residual, then the quantization error), and lands
// τ steps later (or at the last step): Δ̄ = W·P, B ← μB + Δ̄, Θ ← Θ − η(Δ̄ + μB), and X
// takes Θ in (replaced when nothing moved since, else αX + (1 − α)Θ).
std::vector<Eigen::MatrixXf> dense_twin(const Eigen::MatrixXf& w, const TrainConfig& c, const harness::Shape& shape,
                                        const std::vector<std::pair<std::size_t, std::size_t>>& fragments) {
  const int n = static_cast<int>(w.rows()), d = shape.dim;
  const OuterConfig& o = c.outer;
  Eigen::MatrixXf x = harness::initial_x(d).replicate(n, 1), velocity = Eigen::MatrixXf::Zero(n, d);
  Eigen::MatrixXf outer = x, momentum = Eigen::MatrixXf::Zero(n, d), pending = Eigen::MatrixXf::Zero(n, d);
  Eigen::MatrixXf residual = Eigen::MatrixXf::Zero(n, d);
  const int count = static_cast<int>(fragments.size());
  int in_flight = -1;
  long long sent_at = 0;
  std::vector<Eigen::MatrixXf> out;
  auto land = [&](int k) {
    const auto [offset, size] = fragments[static_cast<std::size_t>(in_flight)];
    const auto cols = Eigen::seqN(static_cast<Eigen::Index>(offset), static_cast<Eigen::Index>(size));
    // Δ̄ = Θ − W(Θ − P): W·P when the rows of Θ agree (the all-reduce), and over gossip
    // the mix of the local models, which pulls the rows of Θ together.
    const Eigen::MatrixXf average = outer(Eigen::all, cols) - w * (outer(Eigen::all, cols) - pending(Eigen::all, cols));
    momentum(Eigen::all, cols) = o.momentum * momentum(Eigen::all, cols) + average;
    outer(Eigen::all, cols) -= o.lr * (average + o.momentum * momentum(Eigen::all, cols));
    const float keep = k + 1 == sent_at ? 0.0f : o.mix;
    x(Eigen::all, cols) = keep * x(Eigen::all, cols) + (1 - keep) * outer(Eigen::all, cols);
    in_flight = -1;
  };
  for (int k = 0; k < shape.steps; ++k) {
    for (int i = 0; i < n; ++i) {
      const auto g = harness::gradient(i, k, d);
      for (int j = 0; j < d; ++j) {
        velocity(i, j) =
            c.sgd.momentum * velocity(i, j) + g[static_cast<std::size_t>(j)] + c.sgd.weight_decay * x(i, j);
        x(i, j) -= c.sgd.lr * velocity(i, j);
      }
    }
    const int done = k + 1;
    if (in_flight >= 0 && (done >= sent_at + o.overlap || done == shape.steps)) land(k);
    const int phase = done % o.inner_steps == 0 ? o.inner_steps : done % o.inner_steps;
    for (int f = 0; f < count && in_flight < 0; ++f) {
      if (phase != (f + 1) * o.inner_steps / count) continue;
      in_flight = f;
      sent_at = done;
      const auto [offset, size] = fragments[static_cast<std::size_t>(in_flight)];
      const auto cols = Eigen::seqN(static_cast<Eigen::Index>(offset), static_cast<Eigen::Index>(size));
      pending(Eigen::all, cols) = outer(Eigen::all, cols) - x(Eigen::all, cols) + residual(Eigen::all, cols);
      for (int i = 0; i < n; ++i) {  // the wire's values, and what they leave out
        std::vector<float> v(size), read_back(size);
        for (std::size_t j = 0; j < size; ++j) v[j] = pending(i, static_cast<Eigen::Index>(offset + j));
        std::vector<std::byte> bytes;
        if (o.sparse > 0)
          bytes = algo::sparse_encode(o.sparse, v, read_back);
        else
          algo::quantize(o.compression, v, bytes, read_back);
        for (std::size_t j = 0; j < size; ++j) {
          residual(i, static_cast<Eigen::Index>(offset + j)) = v[j] - read_back[j];
          pending(i, static_cast<Eigen::Index>(offset + j)) = read_back[j];
        }
      }
      if (o.overlap == 0 || done == shape.steps) land(k);
    }
    out.push_back(x);
  }
  return out;
}

Eigen::MatrixXf averaging(int n) { return Eigen::MatrixXf::Constant(n, n, 1.0f / static_cast<float>(n)); }

double worst(const std::vector<Eigen::MatrixXf>& got, const std::vector<Eigen::MatrixXf>& want) {
  double e = 0;
  for (std::size_t k = 0; k < want.size(); ++k) e = std::max(e, relative(got[k], want[k]));
  return e;
}

TEST(Diloco, WithOneInnerStepIsTheAllreduceRunStepByStep) {
  const Topology t = topology_from("graph: {generator: complete, n: 4}");  // Metropolis: W = J/4
  const harness::Shape shape{5, 257, {}};
  TrainConfig allreduce;
  allreduce.algorithm = Algorithm::kAllreduce;
  allreduce.sgd = {0.05f, 0.0f, 1e-4f};
  const auto reference = harness::run_steps(t, allreduce, shape);
  for (OuterExchange exchange : {OuterExchange::kAllreduce, OuterExchange::kPs, OuterExchange::kGossip}) {
    SCOPED_TRACE(std::string(to_string(exchange)));
    TrainConfig c = diloco(exchange, 1);
    c.sgd.momentum = 0;
    c.outer.lr = 1;
    c.outer.momentum = 0;
    EXPECT_LT(worst(harness::run_steps(t, c, shape), reference), 1e-5);
    c.outer.momentum = 0.9f;  // the outer momentum is not the all-reduce's step
    EXPECT_GT(relative(harness::run_steps(t, c, shape).back(), reference.back()), 1e-3);
  }
}

TEST(Diloco, EqualsItsDenseRecursionOverTheAllreduceTheServerAndGossip) {
  const Topology t = topology_from("graph: {generator: ring, n: 6}");
  const harness::Shape shape{13, 257, {}};  // three syncs, and a last step between them
  const std::vector<std::pair<std::size_t, std::size_t>> whole = {{0, 257}};
  for (OuterExchange exchange : {OuterExchange::kAllreduce, OuterExchange::kPs, OuterExchange::kGossip}) {
    SCOPED_TRACE(std::string(to_string(exchange)));
    const TrainConfig c = diloco(exchange, 4);
    const Eigen::MatrixXf w =
        exchange == OuterExchange::kGossip ? Eigen::MatrixXf(Eigen::MatrixXd(t.mixing).cast<float>()) : averaging(6);
    EXPECT_LT(worst(harness::run_steps(t, c, shape), dense_twin(w, c, shape, whole)), 1e-5);
  }
}

TEST(Diloco, GossipIsNotTheAllreduce) {
  // On the ring W·Δ is not the mean: the twin above would pass a gossip that averaged exactly.
  const Topology t = topology_from("graph: {generator: ring, n: 6}");
  const harness::Shape shape{8, 257, {}};
  const auto gossip = harness::run_steps(t, diloco(OuterExchange::kGossip, 4), shape);
  const auto allreduce = harness::run_steps(t, diloco(OuterExchange::kAllreduce, 4), shape);
  EXPECT_GT(relative(gossip.back(), allreduce.back()), 1e-3);
}

TEST(StreamingDiloco, FragmentsOverlapAndMixingAreTheirRecursion) {
  const Topology t = topology_from("graph: {generator: ring, n: 5}");
  const std::vector<std::pair<std::size_t, std::size_t>> layers = {{0, 60}, {60, 70}, {130, 50}, {180, 40}, {220, 37}};
  const harness::Shape shape{30, 257, layers};  // the last exchange lands early, at the last step
  for (OuterExchange exchange : {OuterExchange::kAllreduce, OuterExchange::kGossip}) {
    for (const auto& [fragments, overlap] : {std::pair{1, 0}, std::pair{2, 1}, std::pair{3, 2}, std::pair{5, 1}}) {
      SCOPED_TRACE(str(to_string(exchange), " F ", fragments, " tau ", overlap));
      TrainConfig c = diloco(exchange, 12);
      c.outer.fragments = fragments;
      c.outer.overlap = overlap;
      const Eigen::MatrixXf w =
          exchange == OuterExchange::kGossip ? Eigen::MatrixXf(Eigen::MatrixXd(t.mixing).cast<float>()) : averaging(5);
      const auto got = harness::run_steps(t, c, shape);
      EXPECT_LT(worst(got, dense_twin(w, c, shape, group_fragments(layers, fragments))), 1e-5);
    }
  }
}

TEST(StreamingDiloco, OneFragmentWithoutOverlapIsPlainDiloco) {
  const Topology t = topology_from("graph: {generator: ring, n: 4}");
  const harness::Shape plain_shape{12, 257, {}};
  const harness::Shape layered{12, 257, {{0, 100}, {100, 157}}};
  TrainConfig streaming = diloco(OuterExchange::kAllreduce, 4);
  streaming.outer.mix = 0.3f;  // unused without overlap
  EXPECT_EQ(harness::run_steps(t, streaming, layered).back(),
            harness::run_steps(t, diloco(OuterExchange::kAllreduce, 4), plain_shape).back());
}

TEST(DilocoCompression, QuantizedRingStaysCloseToTheExactRun) {
  // int8, fp8 and int4 over the ring (whose residuals hold exactly what each sum lost:
  // RingReduction's own test) against the fp32 run: close, and not equal.
  const Topology t = topology_from("graph: {generator: ring, n: 6}");
  const harness::Shape shape{12, 1100, {}};  // blocks of 512, and a short one
  const TrainConfig exact = diloco(OuterExchange::kAllreduce, 3);
  const auto uncompressed = harness::run_steps(t, exact, shape);
  for (const auto& [format, bound] :
       {std::pair{algo::QuantFormat::kInt8, 0.02}, std::pair{algo::QuantFormat::kFp8, 0.05},
        std::pair{algo::QuantFormat::kInt4, 0.2}}) {
    SCOPED_TRACE(std::string(algo::to_string(format)));
    TrainConfig c = exact;
    c.outer.compression = format;
    const double gap = relative(harness::run_steps(t, c, shape).back(), uncompressed.back());
    EXPECT_LT(gap, bound);
    EXPECT_GT(gap, 1e-6);
  }
}

TEST(DilocoCompression, SparseLoCoIsItsHandWrittenErrorFeedbackRecursion) {
  // Over the all-gather: Δ̄ = (1/n) Σ_i S(Δ_i + E_i), E_i ← Δ_i + E_i − S(Δ_i + E_i), S the
  // top 2 % of each chunk at 2 bits. The dropped 98 % wait in E for later rounds.
  const Topology t = topology_from("graph: {generator: ring, n: 5}");
  const harness::Shape shape{12, 5000, {}};  // a chunk of 4096 and a short one
  const std::vector<std::pair<std::size_t, std::size_t>> whole = {{0, 5000}};
  TrainConfig c = diloco(OuterExchange::kAllreduce, 3);
  c.outer.sparse = 0.02;
  const auto got = harness::run_steps(t, c, shape);
  const double to_twin = worst(got, dense_twin(averaging(5), c, shape, whole));
  EXPECT_LT(to_twin, 1e-4);
  EXPECT_GT(relative(got.back(), harness::run_steps(t, diloco(OuterExchange::kAllreduce, 3), shape).back()),
            20 * to_twin);
}

TEST(Diloco, FragmentsGroupWholeLayersOfAboutEqualSize) {
  const std::vector<std::pair<std::size_t, std::size_t>> layers = {{0, 10}, {10, 40}, {50, 10}, {60, 10}, {70, 30}};
  EXPECT_EQ(group_fragments(layers, 1), (std::vector<std::pair<std::size_t, std::size_t>>{{0, 100}}));
  EXPECT_EQ(group_fragments(layers, 2), (std::vector<std::pair<std::size_t, std::size_t>>{{0, 50}, {50, 50}}));
  EXPECT_EQ(group_fragments(layers, 5), layers);
  EXPECT_THROW(group_fragments(layers, 6), Error);
}

}  // namespace
}  // namespace peertrain::train
