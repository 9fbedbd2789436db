// The compressors against their definitions on fresh random vectors: what decompress_add
// reconstructs is what each operator keeps, each is a contraction, the wire sizes are
// the compact ones, and malformed messages and flags are refused naming the place.
#include "peertrain/algo/compression.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "peertrain/core/error.h"

namespace peertrain::algo {
namespace {

std::vector<float> random_vector(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.normal());
  return v;
}

std::vector<float> decoded(const Compression& c, std::span<const float> v, std::uint64_t seed = 9) {
  Rng rng(seed);
  const auto bytes = compress(c, v, rng);
  std::vector<float> out(v.size(), 0.0f);
  decompress_add(c, bytes, 1.0f, out, "test");
  return out;
}

double sq_norm(std::span<const float> v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return s;
}

double sq_distance(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return s;
}

TEST(Compression, NoneIsTheIdentityBitForBit) {
  const auto v = random_vector(1001, 1);
  EXPECT_EQ(decoded(parse_compression("none"), v), v);
}

TEST(Compression, TopKKeepsExactlyTheLargestEntries) {
  const auto v = random_vector(10007, 2);
  const Compression c = parse_compression("top-k:0.01");
  const auto q = decoded(c, v);
  const std::size_t k = c.kept(v.size());
  EXPECT_EQ(k, 101u);
  std::vector<float> mags(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) mags[i] = std::fabs(v[i]);
  std::sort(mags.rbegin(), mags.rend());
  std::size_t nonzero = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (q[i] == 0) continue;
    ++nonzero;
    EXPECT_EQ(q[i], v[i]) << i;
    EXPECT_GE(std::fabs(v[i]), mags[k - 1]) << i;
  }
  EXPECT_EQ(nonzero, k);
}

TEST(Compression, RandomKKeepsKEntriesTheReceiverFindsFromTheSeed) {
  const auto v = random_vector(5000, 3);
  const Compression c = parse_compression("random-k:0.1");
  const auto q = decoded(c, v);
  std::size_t kept = 0;
  for (std::size_t i = 0; i < v.size(); ++i)
    if (q[i] != 0) {
      ++kept;
      EXPECT_EQ(q[i], v[i]) << i;
    }
  EXPECT_EQ(kept, 500u);
  EXPECT_NE(decoded(c, v, 1), decoded(c, v, 2)) << "another seed, other indices";
}

// E‖Q(v) − v‖² ≤ (1 − δ)‖v‖² with δ > 0 for every compressor; QSGD is unbiased up to its
// 1/τ scaling, so τ·Q(v) averages to v over many draws.
TEST(Compression, EveryCompressorIsAContraction) {
  const auto v = random_vector(4096, 4);
  for (const char* spec : {"none", "top-k:0.01", "top-k:0.5", "random-k:0.05", "qsgd:2", "qsgd:4", "qsgd:8", "sign"}) {
    SCOPED_TRACE(spec);
    const Compression c = parse_compression(spec);
    double err = 0;
    for (int draw = 0; draw < 8; ++draw) err += sq_distance(decoded(c, v, 100 + draw), v);
    const double ratio = err / 8 / sq_norm(v);
    EXPECT_LT(ratio, 1.0 - 1e-3);
    if (c.kind == CompressionKind::kSign) {
      EXPECT_NEAR(ratio, 1 - 2 / M_PI, 0.02);  // Gaussian entries
    }
  }
  const Compression q = parse_compression("qsgd:4");
  const double tau = 1.0 / q.default_gossip_step();
  std::vector<double> mean(v.size(), 0.0);
  const int draws = 400;
  for (int draw = 0; draw < draws; ++draw) {
    const auto d = decoded(q, v, 1000 + draw);
    for (std::size_t i = 0; i < v.size(); ++i) mean[i] += tau * d[i] / draws;
  }
  double err = 0;
  for (std::size_t i = 0; i < v.size(); ++i) err += (mean[i] - v[i]) * (mean[i] - v[i]);
  EXPECT_LT(std::sqrt(err / sq_norm(v)), 0.1) << "τ·Q(v) is an unbiased estimate of v";
}

// The wire sizes: top-k:0.01 at most 3 % of the raw floats (the target for
// bytes_sent), random-k only the values and a seed, qsgd BITS per element and a norm per
// bucket, sign one bit.
TEST(Compression, MessagesAreCompactAndSizedAsDeclared) {
  const std::size_t n = 669706;  // the MLP 784-512-512-10
  const auto v = random_vector(n, 5);
  const double raw = 4.0 * n;
  for (const char* spec : {"none", "top-k:0.01", "random-k:0.01", "qsgd:4", "qsgd:8", "sign"}) {
    SCOPED_TRACE(spec);
    const Compression c = parse_compression(spec);
    Rng rng(1);
    const auto bytes = compress(c, v, rng);
    EXPECT_LE(bytes.size(), c.max_bytes(n));
    if (c.kind != CompressionKind::kTopK) {
      EXPECT_EQ(bytes.size(), c.max_bytes(n));
    }
    if (c.kind == CompressionKind::kTopK) {
      EXPECT_LT(bytes.size(), 0.03 * raw) << bytes.size() << " bytes";
    }
    if (c.kind == CompressionKind::kRandomK) {
      EXPECT_LT(bytes.size(), 0.0101 * raw);
    }
    if (c.kind == CompressionKind::kSign) {
      EXPECT_LT(bytes.size(), raw / 32 * 1.07);
    }
  }
}

TEST(Compression, EmptyAndTinyVectors) {
  for (const char* spec : {"none", "top-k:0.3", "random-k:0.3", "qsgd:3", "sign"}) {
    SCOPED_TRACE(spec);
    const Compression c = parse_compression(spec);
    EXPECT_TRUE(decoded(c, std::vector<float>{}).empty());
    const std::vector<float> one = {-2.5f};
    EXPECT_EQ(decoded(c, one).size(), 1u);
    if (c.kind != CompressionKind::kQsgd) {
      EXPECT_FLOAT_EQ(decoded(c, one)[0], -2.5f);
    }
  }
}

void expect_parse_error(const Compression& c, std::vector<std::byte> bytes, std::size_t n, const std::string& part) {
  std::vector<float> out(n);
  try {
    decompress_add(c, bytes, 1.0f, out, "peer 3");
    FAIL() << "accepted a bad message";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kParse);
    EXPECT_NE(std::string(e.what()).find("peer 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(Compression, MalformedMessagesAreRefusedNamingTheSender) {
  const auto v = random_vector(1000, 6);
  Rng rng(1);
  const Compression top = parse_compression("top-k:0.05");
  const auto good = compress(top, v, rng);
  expect_parse_error(top, good, 999, "expected");                              // another length
  expect_parse_error(parse_compression("top-k:0.1"), good, 1000, "entries");   // another k
  expect_parse_error(parse_compression("sign"), good, 1000, "kind");           // another kind
  expect_parse_error(top, {good.begin(), good.end() - 1}, 1000, "truncated");  // cut short
  auto longer = good;
  longer.push_back(std::byte{0});
  expect_parse_error(top, longer, 1000, "past the end");
  auto far = good;
  far[10] = std::byte{0x7f};  // the first gap: 127 more, and the later ones run off the end
  far[11] = std::byte{0x7f};
  for (int i = 12; i < 60; ++i) far[static_cast<std::size_t>(i)] = std::byte{0x7f};
  expect_parse_error(top, far, 1000, "outside");
  const Compression q = parse_compression("qsgd:4");
  auto bad_scale = compress(q, v, rng);
  const float nan = std::nanf("");
  std::memcpy(bad_scale.data() + 6, &nan, 4);
  expect_parse_error(q, bad_scale, 1000, "scale");
}

TEST(Compression, FlagsAreParsedAndBadOnesNamed) {
  EXPECT_EQ(parse_compression("top-k:0.01").describe(), "top-k:0.01");
  EXPECT_EQ(parse_compression("qsgd:8").bits, 8);
  EXPECT_EQ(parse_compression("random-k:1").kept(10), 10u);
  for (const auto& [spec, part] : std::vector<std::pair<std::string, std::string>>{{"top-k:0", "outside (0, 1]"},
                                                                                   {"top-k:1.5", "outside (0, 1]"},
                                                                                   {"random-k:-0.1", "outside (0, 1]"},
                                                                                   {"top-k", "needs the fraction"},
                                                                                   {"qsgd:0", "0 bits"},
                                                                                   {"qsgd:1", "1 bits"},
                                                                                   {"qsgd:x", "needs the bits"},
                                                                                   {"sign:2", "takes no parameter"},
                                                                                   {"gzip", "not one of"}}) {
    try {
      parse_compression(spec);
      FAIL() << spec;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--compression '" + spec + "'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace peertrain::algo
