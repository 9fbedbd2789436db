// The evaluation report's codec and the consensus distance, against their definitions on
// fresh random data.
#include "../../src/train/recorder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "peertrain/core/error.h"

namespace peertrain::train {
namespace {

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& f : v) f = d(rng);
  return v;
}

TEST(Report, RoundTripsEveryFieldAndTheParameters) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-1e6, 1e6);
  Report r{u(rng), u(rng), u(rng), u(rng), u(rng), u(rng), u(rng), u(rng), u(rng), u(rng), u(rng)};
  const auto x = random_floats(1001, rng);
  std::vector<double> sent_to(7);
  for (double& v : sent_to) v = std::floor(u(rng) + 1e6);
  const auto bytes = encode_report(r, sent_to, x);
  EXPECT_EQ(bytes.size(), (kReportDoubles + sent_to.size()) * sizeof(double) + x.size() * sizeof(float));
  EXPECT_EQ(bytes.size(), report_payload_bytes(7, x.size()));
  std::span<const float> got;
  std::vector<double> sent_back;
  const Report back = decode_report(bytes, 7, x.size(), "peer 3", sent_back, got);
  EXPECT_EQ(sent_back, sent_to);
  const double* a = &r.step;
  const double* b = &back.step;
  for (std::size_t i = 0; i < kReportDoubles; ++i) EXPECT_EQ(a[i], b[i]) << "field " << i;
  ASSERT_EQ(got.size(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], x[i]) << i;
}

TEST(Report, AWrongSizeIsAParseErrorNamingTheSender) {
  std::mt19937 rng(8);
  const auto x = random_floats(10, rng);
  const std::vector<double> sent_to(4, 1.0);
  auto bytes = encode_report(Report{}, sent_to, x);
  std::span<const float> got;
  std::vector<double> sent_back;
  for (std::size_t cut : {std::size_t{0}, std::size_t{1}, bytes.size() - 1}) {
    const std::span<const std::byte> shorter(bytes.data(), cut);
    try {
      decode_report(shorter, 4, x.size(), "peer 5 (10.0.0.6:7000)", sent_back, got);
      ADD_FAILURE() << "a report of " << cut << " bytes was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kParse);
      EXPECT_NE(std::string(e.what()).find("report from peer 5 (10.0.0.6:7000)"), std::string::npos) << e.what();
    }
  }
  bytes.push_back(std::byte{0});
  EXPECT_THROW(decode_report(bytes, 4, x.size(), "peer 5", sent_back, got), Error);
  bytes.pop_back();  // right length for 4 peers, wrong for 5
  EXPECT_THROW(decode_report(bytes, 5, x.size(), "peer 5", sent_back, got), Error);
}

// (1/m) Σ_i ‖x_i − x̄‖² and x̄, against a direct double-precision computation.
TEST(Report, ConsensusDistanceIsTheMeanSquaredDistanceToTheAverage) {
  std::mt19937 rng(9);
  const std::size_t n = 517;
  std::vector<std::vector<float>> vs;
  for (int i = 0; i < 5; ++i) vs.push_back(random_floats(n, rng));
  std::vector<std::span<const float>> xs(vs.begin(), vs.end());
  std::vector<float> average;
  const double got = consensus_distance(xs, average);
  std::vector<double> mean(n, 0.0);
  for (const auto& v : vs)
    for (std::size_t k = 0; k < n; ++k) mean[k] += v[k];
  for (double& m : mean) m /= static_cast<double>(vs.size());
  double want = 0;
  for (const auto& v : vs)
    for (std::size_t k = 0; k < n; ++k) want += (v[k] - mean[k]) * (v[k] - mean[k]);
  want /= static_cast<double>(vs.size());
  EXPECT_NEAR(got, want, 1e-9 * want);
  ASSERT_EQ(average.size(), n);
  double err = 0, norm = 0;
  for (std::size_t k = 0; k < n; ++k) {
    err += (average[k] - mean[k]) * (average[k] - mean[k]);
    norm += mean[k] * mean[k];
  }
  EXPECT_LT(std::sqrt(err / norm), 1e-6);
  // Identical vectors: no distance.
  const std::vector<std::span<const float>> same(3, xs[0]);
  EXPECT_EQ(consensus_distance(same, average), 0.0);
}

}  // namespace
}  // namespace peertrain::train
