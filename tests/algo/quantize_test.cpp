// The outer exchange's low-precision vectors (algo/quantize.h) against their dense twins,
// and the ring all-reduce that advances when asked (algo/ring_reduction.h) against the
// blocking ring: bitwise without quantization, and with it every peer's same sum, whose
// loss the residuals hold exactly.
#include "peertrain/algo/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <thread>

#include "peertrain/algo/collectives.h"
#include "peertrain/algo/ring_reduction.h"
#include "peertrain/algo/sparse_code.h"
#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "peertrain/net/loopback.h"
#include "test_support/cluster.h"

namespace peertrain::algo {
namespace {

std::vector<float> normal_vector(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = scale * static_cast<float>(rng.normal());
  return v;
}

TEST(Quantize, E4m3CodesAreTheStandardOnes) {
  EXPECT_EQ(to_e4m3(0.0f), 0x00);
  EXPECT_EQ(to_e4m3(1.0f), 0x38);
  EXPECT_EQ(to_e4m3(-1.0f), 0xB8);
  EXPECT_EQ(to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(to_e4m3(std::ldexp(1.0f, -9)), 0x01);  // the smallest subnormal
  EXPECT_EQ(to_e4m3(1.0625f), 0x38);               // halfway to 1.125 rounds to the nearer even code here
  EXPECT_EQ(to_e4m3(1.07f), 0x39);
  for (int code = 0; code < 127; ++code) EXPECT_EQ(to_e4m3(from_e4m3(static_cast<unsigned char>(code))), code);
}

// Each value within half a level of the block's scale (int8, int4) or half an e4m3 step
// (fp8, relative 2⁻⁴ of the value, or the subnormal step near 0); the values quantize()
// reports are the ones dequantize() reads, bit for bit; the size is the one promised.
TEST(Quantize, EachFormatIsWithinHalfAStepOfTheDenseVector) {
  for (QuantFormat format : {QuantFormat::kNone, QuantFormat::kInt8, QuantFormat::kFp8, QuantFormat::kInt4}) {
    SCOPED_TRACE(std::string(to_string(format)));
    for (std::size_t n : {0u, 1u, 511u, 512u, 1300u}) {
      std::vector<float> v = normal_vector(n, 11 + n, 0.01f);
      if (n > 600) v[600] = 0;  // a zero in a block
      std::vector<std::byte> bytes;
      std::vector<float> reported(n), read(n, 5.0f);
      quantize(format, v, bytes, reported);
      EXPECT_EQ(bytes.size(), quantized_bytes(format, n));
      dequantize(format, bytes, read, false, "peer 1");
      EXPECT_EQ(read, reported);
      for (std::size_t begin = 0; begin < n; begin += kQuantBlock) {
        const std::size_t end = std::min(n, begin + kQuantBlock);
        float largest = 0;
        for (std::size_t i = begin; i < end; ++i) largest = std::max(largest, std::abs(v[i]));
        for (std::size_t i = begin; i < end; ++i) {
          double bound = 0;
          if (format == QuantFormat::kInt8) bound = 0.5 * largest / 127;
          if (format == QuantFormat::kInt4) bound = 0.5 * largest / 7;
          if (format == QuantFormat::kFp8) bound = std::max(std::abs(v[i]) / 16.0, largest / 448.0 * 0x1p-10);
          EXPECT_LE(std::abs(read[i] - v[i]), bound * (1 + 1e-5)) << i;
        }
      }
      std::vector<float> added(n, 1.0f);
      dequantize(format, bytes, added, true, "peer 1");
      for (std::size_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(added[i], 1.0f + read[i]);  // (may be fused)
    }
  }
  EXPECT_EQ(quantized_bytes(QuantFormat::kInt8, 1024), 2 * (4 + 512));
  EXPECT_EQ(quantized_bytes(QuantFormat::kInt4, 513), (4 + 256) + (4 + 1));
}

TEST(Quantize, AMessageOfAnotherSizeIsAnErrorNamingTheSender) {
  std::vector<std::byte> bytes;
  quantize(QuantFormat::kInt8, normal_vector(100, 1), bytes);
  std::vector<float> out(99);
  try {
    dequantize(QuantFormat::kInt8, bytes, out, false, "peer 3 (10.0.0.3:29503)");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kParse);
    EXPECT_NE(std::string(e.what()).find("peer 3 (10.0.0.3:29503) sent"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_quant_format("int2"), Error);
}

// SparseLoCo's code against its dense twin: per chunk exactly the ⌈F·size⌉ largest
// magnitudes survive, each at the nearest of −m, −m/3, m/3, m (m the largest kept); the
// reported values are the decoded ones; the size is the one promised; a bad index is named.
TEST(SparseCode, KeepsTheLargestOfEachChunkAtTwoBits) {
  for (std::size_t n : {1u, 4096u, 9000u}) {
    SCOPED_TRACE(n);
    const double fraction = 0.01;
    const std::vector<float> v = normal_vector(n, 70 + n);
    std::vector<float> reported(n), decoded(n, 0.0f);
    const auto bytes = sparse_encode(fraction, v, reported);
    EXPECT_EQ(bytes.size(), sparse_bytes(fraction, n));
    sparse_decode_add(fraction, bytes, 1.0f, decoded, "peer 2");
    EXPECT_EQ(decoded, reported);
    for (std::size_t begin = 0; begin < n; begin += kSparseChunk) {
      const std::size_t end = std::min(n, begin + kSparseChunk), k = sparse_kept(fraction, end - begin);
      std::vector<float> magnitudes;
      for (std::size_t i = begin; i < end; ++i) magnitudes.push_back(std::abs(v[i]));
      std::sort(magnitudes.rbegin(), magnitudes.rend());
      const float m = magnitudes[0], threshold = magnitudes[k - 1];
      std::size_t kept = 0;
      for (std::size_t i = begin; i < end; ++i) {
        if (decoded[i] == 0) continue;
        ++kept;
        EXPECT_GE(std::abs(v[i]), threshold) << i;
        float nearest = 0, best = 1e30f;
        for (float level : {-m, -m / 3, m / 3, m})
          if (std::abs(v[i] - level) < best) best = std::abs(v[i] - level), nearest = level;
        EXPECT_NEAR(decoded[i], nearest, 1e-6f * m) << i;
      }
      EXPECT_EQ(kept, k);
    }
  }
  std::vector<float> v = normal_vector(100, 5), reported(100), out(100);
  auto bytes = sparse_encode(0.1, v, reported);
  bytes[4] = std::byte{200};  // the first index past the chunk of 100
  EXPECT_THROW(sparse_decode_add(0.1, bytes, 1.0f, out, "peer 2"), Error);
  bytes.pop_back();
  EXPECT_THROW(sparse_decode_add(0.1, bytes, 1.0f, out, "peer 2"), Error);
}

// n peers in threads on loopback links; each runs `body(rank, network)`.
template <typename Body>
void on_loopback(int n, Body body) {
  net::LoopbackOptions options{n, {}, 10};
  for (int i = 0; i < n; ++i) {
    std::vector<int> all;
    for (int j = 0; j < n; ++j)
      if (j != i) all.push_back(j);
    options.links.push_back(all);
  }
  net::LoopbackFabric fabric(options);
  peertrain::testing::run_peers(n, [&](int rank) {
    auto network = fabric.transport(rank);
    body(rank, *network);
    network->close();
  });
}

TEST(RingReduction, AdvancedOnlyByProgressItIsTheBlockingRingBitForBit) {
  for (int n : {2, 3, 5}) {
    SCOPED_TRACE(n);
    std::vector<int> ring(static_cast<std::size_t>(n));
    std::iota(ring.begin(), ring.end(), 0);
    std::vector<std::vector<float>> stepwise(static_cast<std::size_t>(n)), blocking(stepwise);
    on_loopback(n, [&](int rank, net::Transport& network) {
      std::vector<float> a = normal_vector(1001, 100 + static_cast<std::uint64_t>(rank)), b = a;
      RingReduction reduction(network, ring, 7, a);
      int calls = 0;
      while (!reduction.progress()) {
        ++calls;
        std::this_thread::yield();
      }
      ring_allreduce(network, ring, 8, b);
      stepwise[static_cast<std::size_t>(rank)] = a;
      blocking[static_cast<std::size_t>(rank)] = b;
    });
    EXPECT_EQ(stepwise, blocking);
  }
}

TEST(RingReduction, QuantizedEveryPeerHasTheSameSumAndTheResidualsHoldWhatItLost) {
  constexpr int n = 4;
  constexpr std::size_t size = 2100;
  std::vector<int> ring = {0, 1, 2, 3};
  std::vector<std::vector<float>> inputs, sums(n), residuals(n);
  for (int r = 0; r < n; ++r) inputs.push_back(normal_vector(size, 40 + static_cast<std::uint64_t>(r)));
  for (QuantFormat format : {QuantFormat::kInt8, QuantFormat::kFp8, QuantFormat::kInt4}) {
    SCOPED_TRACE(std::string(to_string(format)));
    on_loopback(n, [&](int rank, net::Transport& network) {
      std::vector<float> data = inputs[static_cast<std::size_t>(rank)], residual(size, 0.0f);
      RingReduction reduction(network, ring, 3, data, format, residual);
      reduction.finish();
      sums[static_cast<std::size_t>(rank)] = data;
      residuals[static_cast<std::size_t>(rank)] = residual;
    });
    double lost = 0, exact_norm = 0, error = 0;
    for (std::size_t i = 0; i < size; ++i) {
      double exact = 0, held = 0;
      for (int r = 0; r < n; ++r) {
        exact += inputs[static_cast<std::size_t>(r)][i];
        held += residuals[static_cast<std::size_t>(r)][i];
      }
      // Σ inputs = the sum everyone got + Σ residuals, to float rounding.
      lost = std::max(lost, std::abs(exact - sums[0][i] - held));
      exact_norm += exact * exact;
      error += (exact - sums[0][i]) * (exact - sums[0][i]);
    }
    for (int r = 1; r < n; ++r) EXPECT_EQ(sums[static_cast<std::size_t>(r)], sums[0]);
    EXPECT_LT(lost, 1e-5);
    const double relative = std::sqrt(error / exact_norm);
    EXPECT_LT(relative, format == QuantFormat::kInt4 ? 0.3 : 0.05);
    EXPECT_GT(relative, 1e-4);  // it did quantize
  }
}

}  // namespace
}  // namespace peertrain::algo
