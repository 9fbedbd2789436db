// The model's GEMM (src/model/gemm.h) against a double-precision triple loop: every
// transpose, shapes on each side of the AVX-512 kernel's register tile (32 × 12) and its
// cache blocks (an inner dimension over 384, rows over 480, a B block of 128 Ki floats), and
// each epilogue term (bias, residual, ReLU, GELU and its derivative). It runs once on one
// thread and once on two (our kernel where the build has AVX-512, on two ranges of C's
// rows or columns with two threads; else Eigen's product, whose epilogue is separate passes), so
// the paths the models take are held to the same oracle, and our kernel's two-thread
// result to its one-thread bits.
#include <gtest/gtest.h>
#include <omp.h>

#include <Eigen/Core>
#include <cmath>
#include <string>
#include <vector>

#include "test_support/normalized_error.h"
#include "../../src/model/gemm.h"
#include "transformer_test_util.h"

namespace peertrain::model {
namespace {

using test::normal_vector;

struct Shape {
  int m, n, k;
};

struct Case {
  bool trans_a, trans_b, accumulate, bias, addend, relu, gelu_forward = false, gelu_backward = false;
};

// GPT-2's GELU (tanh approximation) and its derivative, in double.
double gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
double gelu_grad(double x) {
  const double u = std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x), t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * x * x);
}

// C as the epilogue defines it, in double: op(A)·op(B) + [C] + bias + addend, then ReLU,
// or times GELU'(h); GELU(C) into `activation` for the GELU forward.
std::vector<double> oracle(const Shape& s, const Case& c, const std::vector<float>& a, const std::vector<float>& b,
                           const std::vector<float>& c0, const std::vector<float>& bias,
                           const std::vector<float>& addend, const std::vector<float>& h = {},
                           std::vector<double>* activation = nullptr) {
  if (activation != nullptr) activation->assign(static_cast<std::size_t>(s.m) * s.n, 0.0);
  std::vector<double> out(static_cast<std::size_t>(s.m) * s.n);
  for (int j = 0; j < s.n; ++j)
    for (int i = 0; i < s.m; ++i) {
      double sum = 0;
      for (int p = 0; p < s.k; ++p) {
        const double x =
            c.trans_a ? a[p + static_cast<std::size_t>(i) * s.k] : a[i + static_cast<std::size_t>(p) * s.m];
        const double y =
            c.trans_b ? b[j + static_cast<std::size_t>(p) * s.n] : b[p + static_cast<std::size_t>(j) * s.k];
        sum += x * y;
      }
      const std::size_t at = i + static_cast<std::size_t>(j) * s.m;
      if (c.accumulate) sum += c0[at];
      if (c.bias) sum += bias[i];
      if (c.addend) sum += addend[at];
      out[at] = c.relu ? std::max(sum, 0.0) : sum;
      if (c.gelu_backward) out[at] *= gelu_grad(h[at]);
      if (c.gelu_forward && activation != nullptr) (*activation)[at] = gelu(sum);
    }
  return out;
}

std::string name(const Shape& s, const Case& c) {
  return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + (c.trans_a ? " Aᵀ" : "") +
         (c.trans_b ? " Bᵀ" : "") + (c.accumulate ? " +C" : "") + (c.bias ? " +bias" : "") +
         (c.addend ? " +addend" : "") + (c.relu ? " relu" : "") + (c.gelu_forward ? " gelu" : "") +
         (c.gelu_backward ? " gelu'" : "");
}

// Every transpose × every epilogue term alone and all together, on each shape.
void check_all(const std::vector<Shape>& shapes) {
  const Case terms[] = {{false, false, false, false, false, false},
                        {false, false, true, false, false, false},
                        {false, false, false, true, false, false},
                        {false, false, false, false, true, false},
                        {false, false, false, false, false, true},
                        {false, false, true, true, true, true},
                        {false, false, false, true, false, false, true},
                        {false, false, false, false, false, false, false, true},
                        {false, false, true, false, false, false, false, true}};
  Gemm gemm;
  std::uint64_t seed = 1;
  for (const Shape& s : shapes)
    for (int t = 0; t < 4; ++t)
      for (Case c : terms) {
        c.trans_a = t & 1;
        c.trans_b = t & 2;
        const auto a = normal_vector(static_cast<std::size_t>(s.m) * s.k, seed++);
        const auto b = normal_vector(static_cast<std::size_t>(s.k) * s.n, seed++);
        const auto c0 = normal_vector(static_cast<std::size_t>(s.m) * s.n, seed++);
        const auto bias = normal_vector(s.m, seed++);
        const auto addend = normal_vector(static_cast<std::size_t>(s.m) * s.n, seed++);
        const auto h = normal_vector(static_cast<std::size_t>(s.m) * s.n, seed++);
        std::vector<float> got = c0, activation(static_cast<std::size_t>(s.m) * s.n);
        gemm.run(c.trans_a, c.trans_b, s.m, s.n, s.k, a.data(), b.data(), got.data(), c.accumulate,
                 {.row_bias = c.bias ? bias.data() : nullptr,
                  .addend = c.addend ? addend.data() : nullptr,
                  .relu = c.relu,
                  .gelu_out = c.gelu_forward ? activation.data() : nullptr,
                  .gelu_grad_at = c.gelu_backward ? h.data() : nullptr});
        std::vector<double> want_activation;
        // float32 sums over k terms of unit size: ~1e-7·√k relative; a wrong term is O(1).
        EXPECT_LT(normalized_or_absolute_error(got, oracle(s, c, a, b, c0, bias, addend, h, &want_activation)), 1e-5)
            << name(s, c);
        if (c.gelu_forward) {
          EXPECT_LT(normalized_or_absolute_error(activation, want_activation), 1e-5) << name(s, c);
        }
      }
}

const std::vector<Shape> kEdges = {{1, 1, 1},    {15, 11, 7},  {16, 12, 16}, {17, 13, 17},
                                   {31, 23, 33}, {32, 24, 64}, {33, 25, 65}, {64, 36, 100}};
// Past the kernel's blocks: k over 384 (two inner blocks; the ReLU waits for the last), m
// over 480 (two row blocks), n × k over a B block (two column blocks); and k a multiple of
// 64 with n past 48, where a transposed B is packed four panels at a time and the rest
// (13 columns) row by row.
const std::vector<Shape> kBlocks = {{40, 30, 800}, {500, 13, 20}, {33, 700, 390}, {33, 61, 128}};

TEST(Gemm, OneThreadMatchesTheOracleAtTheTileEdges) {
  Eigen::setNbThreads(1);
  check_all(kEdges);
}

TEST(Gemm, OneThreadMatchesTheOracleAcrossCacheBlocks) {
  Eigen::setNbThreads(1);
  check_all(kBlocks);
}

TEST(Gemm, TwoThreadsMatchTheOracle) {
  Eigen::setNbThreads(2);
  check_all(kEdges);
  check_all(kBlocks);
  Eigen::setNbThreads(1);
}

// Our kernel on 2 and 3 threads gives the one-thread bits, every term included: each takes
// a range of C's rows or columns, and an element's sums do not depend on the ranges.
TEST(Gemm, MoreThreadsGiveTheOneThreadBits) {
  if (!avx512_gemm::available()) GTEST_SKIP() << "no AVX-512 kernel in this build";
  const Case all_terms{false, false, true, true, true, true};
  const Case gelu_back{false, false, true, false, false, false, false, true};
  const Case gelu_forward{false, false, false, true, false, false, true, false};
  std::uint64_t seed = 900;
  // Columns split (n ≥ m), then rows (m > n): whole ranges, ranges whose last panel is
  // ragged (1000 rows: 31 panels of 32 and one of 8), an inner dimension of three blocks
  // (first store, later adds, last store's activation), and 100 × 64, whose 100 rows give
  // one range and its 64 columns two.
  for (const Shape& s : {Shape{64, 100, 100}, Shape{33, 700, 390}, Shape{40, 49, 800}, Shape{500, 61, 128},
                         Shape{1000, 130, 77}, Shape{200, 24, 300}, Shape{500, 61, 800}, Shape{100, 64, 50}})
    for (int t = 0; t < 4; ++t)
      for (Case c : {all_terms, gelu_back, gelu_forward}) {
        c.trans_a = t & 1;
        c.trans_b = t & 2;
        const auto a = normal_vector(static_cast<std::size_t>(s.m) * s.k, seed++);
        const auto b = normal_vector(static_cast<std::size_t>(s.k) * s.n, seed++);
        const auto c0 = normal_vector(static_cast<std::size_t>(s.m) * s.n, seed++);
        const auto bias = normal_vector(s.m, seed++), h = normal_vector(static_cast<std::size_t>(s.m) * s.n, seed++);
        const auto addend = normal_vector(static_cast<std::size_t>(s.m) * s.n, seed++);
        std::vector<std::vector<float>> outs, sums, activations;
        const int limit = omp_get_max_threads();  // the GEMM takes the smaller of it and Eigen's count
        for (int threads : {1, 2, 3}) {
          Eigen::setNbThreads(threads);
          omp_set_num_threads(threads);  // 3 ranges on a 2-core machine too
          Gemm gemm;
          std::vector<float> out = c0, row_sums(static_cast<std::size_t>(s.m), 1.0f);
          std::vector<float> activation(static_cast<std::size_t>(s.m) * s.n, -1.0f);
          gemm.run(c.trans_a, c.trans_b, s.m, s.n, s.k, a.data(), b.data(), out.data(), c.accumulate,
                   {.row_bias = c.bias ? bias.data() : nullptr,
                    .addend = c.addend ? addend.data() : nullptr,
                    .relu = c.relu,
                    .gelu_out = c.gelu_forward ? activation.data() : nullptr,
                    .gelu_grad_at = c.gelu_backward ? h.data() : nullptr,
                    .a_row_sums = c.trans_a ? nullptr : row_sums.data()});
          outs.push_back(out);
          sums.push_back(row_sums);
          activations.push_back(activation);
        }
        Eigen::setNbThreads(1);
        omp_set_num_threads(limit);
        EXPECT_EQ(outs[1], outs[0]) << name(s, c) << ", 2 threads";
        EXPECT_EQ(outs[2], outs[0]) << name(s, c) << ", 3 threads";
        EXPECT_EQ(sums[1], sums[0]) << name(s, c) << ", A's row sums, 2 threads";
        EXPECT_EQ(sums[2], sums[0]) << name(s, c) << ", A's row sums, 3 threads";
        EXPECT_EQ(activations[1], activations[0]) << name(s, c) << ", GELU(C), 2 threads";
        EXPECT_EQ(activations[2], activations[0]) << name(s, c) << ", GELU(C), 3 threads";
      }
}

// A's row sums (a Linear's bias gradient, taken as the weight gradient's GEMM packs dy) are
// added to what the vector holds, once each, however many blocks A is packed in.
void check_row_sums() {
  Gemm gemm;
  std::uint64_t seed = 500;
  for (const std::vector<Shape>& shapes : {kEdges, kBlocks})
    for (const Shape& s : shapes)
      for (bool trans_b : {false, true}) {
        const auto a = normal_vector(static_cast<std::size_t>(s.m) * s.k, seed++);
        const auto b = normal_vector(static_cast<std::size_t>(s.k) * s.n, seed++);
        const auto sums0 = normal_vector(s.m, seed++);
        std::vector<float> sums = sums0, c(static_cast<std::size_t>(s.m) * s.n);
        gemm.run(false, trans_b, s.m, s.n, s.k, a.data(), b.data(), c.data(), false, {.a_row_sums = sums.data()});
        std::vector<double> want(sums0.begin(), sums0.end());
        for (int p = 0; p < s.k; ++p)
          for (int i = 0; i < s.m; ++i) want[i] += a[i + static_cast<std::size_t>(p) * s.m];
        EXPECT_LT(normalized_or_absolute_error(sums, want), 1e-5)
            << name(s, {false, trans_b, false, false, false, false});
        EXPECT_LT(
            normalized_or_absolute_error(c, oracle(s, {false, trans_b, false, false, false, false}, a, b, c, {}, {})),
            1e-5);
      }
}

TEST(Gemm, RowSumsOfAComeWithThePackingOnBothPaths) {
  Eigen::setNbThreads(1);
  check_row_sums();
  Eigen::setNbThreads(2);
  check_row_sums();
  Eigen::setNbThreads(1);
}

// The residual may be C itself: y ← W·x + b + y, as linear_residual_forward allows.
TEST(Gemm, TheAddendMayBeTheOutput) {
  Eigen::setNbThreads(1);
  const Shape s{70, 29, 401};
  const Case c{false, false, false, true, true, false};
  const auto a = normal_vector(static_cast<std::size_t>(s.m) * s.k, 91), b = normal_vector(s.k * s.n, 92);
  const auto bias = normal_vector(s.m, 93), y0 = normal_vector(static_cast<std::size_t>(s.m) * s.n, 94);
  std::vector<float> y = y0;
  Gemm gemm;
  gemm.run(false, false, s.m, s.n, s.k, a.data(), b.data(), y.data(), false,
           {.row_bias = bias.data(), .addend = y.data()});
  EXPECT_LT(normalized_or_absolute_error(y, oracle(s, c, a, b, y0, bias, y0)), 1e-5);
}

// The models take our kernel on one thread wherever the build can run it.
TEST(Gemm, TheOwnKernelIsInTheBuildWhereverAvx512Is) {
#if defined(__AVX512F__)
  EXPECT_TRUE(avx512_gemm::available());
#else
  EXPECT_FALSE(avx512_gemm::available());
#endif
}

}  // namespace
}  // namespace peertrain::model
