// The spectrum against closed forms, and the solvers against each other.
#include "peertrain/topology/spectrum.h"

#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <numbers>

#include "peertrain/topology/generators.h"
#include "test_util.h"

namespace peertrain::topology {
namespace {

constexpr double kPi = std::numbers::pi;

Spectrum spectrum_of(const Graph& g, WeightScheme scheme, SpectrumSolver solver = SpectrumSolver::kAuto) {
  SpectrumOptions options;
  options.solver = solver;
  return analyze_spectrum(build_mixing_matrix(g, scheme), g, options);
}

Graph ring(int n) {
  GeneratorParams p;
  p.n = n;
  return generate("ring", p);
}

TEST(Spectrum, RingWithThirdsMatchesTheClosedForm) {
  // W = (I + A)/3: eigenvalues 1/3 + 2/3·cos(2πk/n).
  for (int n : {5, 16, 101, 2000, 6000}) {
    for (auto solver : {SpectrumSolver::kAuto, SpectrumSolver::kLanczos}) {
      const Spectrum s = spectrum_of(ring(n), WeightScheme::kMetropolis, solver);
      const double lambda2 = 1.0 / 3 + 2.0 / 3 * std::cos(2 * kPi / n);
      const double lambda_min = 1.0 / 3 + 2.0 / 3 * std::cos(2 * kPi * (n / 2) / n);
      EXPECT_NEAR(s.lambda2, lambda2, 1e-9) << n << " " << s.solver;
      EXPECT_NEAR(s.lambda_min, lambda_min, 1e-9) << n << " " << s.solver;
      EXPECT_NEAR(s.spectral_gap, 1 - std::max(std::abs(lambda2), std::abs(lambda_min)), 1e-9);
      EXPECT_TRUE(s.consensus());
    }
  }
}

TEST(Spectrum, LongRingsFallBackToAMethodThatConverges) {
  const Spectrum s = spectrum_of(ring(20'000), WeightScheme::kMetropolis, SpectrumSolver::kLanczos);
  EXPECT_NE(s.solver.find("fell back"), std::string::npos) << s.solver;
  EXPECT_NEAR(1 - s.lambda2, 2.0 / 3 * (1 - std::cos(2 * kPi / 20'000)), 1e-12);
  // An odd ring's λ_min does not sit on the Gershgorin bound, so bisection has to work.
  const int odd = 4'001;
  const Spectrum o = spectrum_of(ring(odd), WeightScheme::kMetropolis, SpectrumSolver::kLanczos);
  EXPECT_NEAR(o.lambda_min, 1.0 / 3 + 2.0 / 3 * std::cos(2 * kPi * (odd / 2) / odd), 1e-9) << o.solver;
}

TEST(Spectrum, CompleteGraphAveragesExactly) {
  GeneratorParams p;
  p.n = 9;
  const Spectrum s = spectrum_of(generate("complete", p), WeightScheme::kMaxDegree);  // W = 11ᵀ/9
  EXPECT_NEAR(s.spectral_gap, 1.0, 1e-12);
  EXPECT_NEAR(s.contraction_per_step(), 0.0, 1e-12);
}

TEST(Spectrum, TorusWithFifthsMatchesTheClosedForm) {
  for (int side : {3, 4, 10, 40, 100}) {
    GeneratorParams p;
    p.rows = side;
    p.cols = side;
    const Graph g = generate("torus", p);
    const double expected = 0.8 * std::pow(std::sin(kPi / side), 2);
    EXPECT_NEAR(spectrum_of(g, WeightScheme::kMetropolis).spectral_gap, expected, 1e-9) << side;
    if (side >= 10) {
      EXPECT_NEAR(spectrum_of(g, WeightScheme::kMetropolis, SpectrumSolver::kLanczos).spectral_gap, expected, 1e-9)
          << side;
    }
  }
}

TEST(Spectrum, HypercubeWithMetropolisHasGapTwoOverOnePlusDimension) {
  for (int dim : {3, 6, 11}) {
    GeneratorParams p;
    p.n = 1 << dim;
    const Spectrum s = spectrum_of(generate("hypercube", p), WeightScheme::kMetropolis);
    EXPECT_NEAR(s.spectral_gap, 2.0 / (1 + dim), 1e-9) << dim << " " << s.solver;
  }
}

TEST(Spectrum, BipartiteWithZeroDiagonalHasNoConsensus) {
  // An even ring with W_{i,i±1} = 1/2 and nothing on the diagonal: λ_min = −1.
  const int n = 8;
  const Graph g = ring(n);
  SparseMatrix w(n, n);
  for (const Edge& e : g.edges()) {
    w.insert(e.u, e.v) = 0.5;
    w.insert(e.v, e.u) = 0.5;
  }
  validate_mixing_matrix(g, w, "bipartite");
  const Spectrum s = analyze_spectrum(w, g);
  EXPECT_NEAR(s.lambda_min, -1.0, 1e-12);
  EXPECT_EQ(s.spectral_gap, 0.0);
  EXPECT_FALSE(s.consensus());
}

TEST(Spectrum, LanczosSpectraAndDenseAgreeOnRandomRegularGraphs) {
  for (int degree : {3, 4, 6})
    for (std::uint64_t seed : {1, 2}) {
      GeneratorParams p;
      p.n = 1'200 + 100 * degree;
      p.degree = degree;
      p.seed = seed;
      const Graph g = generate("random-regular", p);
      const Spectrum dense = spectrum_of(g, WeightScheme::kMetropolis, SpectrumSolver::kDense);
      const Spectrum lanczos = spectrum_of(g, WeightScheme::kMetropolis, SpectrumSolver::kLanczos);
      const Spectrum spectra = spectrum_of(g, WeightScheme::kMetropolis, SpectrumSolver::kSpectra);
      for (const Spectrum* s : {&lanczos, &spectra}) {
        EXPECT_NEAR(s->lambda2, dense.lambda2, 1e-9) << s->solver;
        EXPECT_NEAR(s->lambda_min, dense.lambda_min, 1e-9) << s->solver;
      }
      EXPECT_EQ(lanczos.solver.find("fell back"), std::string::npos) << lanczos.solver;
    }
}

TEST(Spectrum, ExponentialGraphMatchesItsCirculantSpectrum) {
  // A circulant W has eigenvalues Σ_h w_h cos(2πkh/n) over its hops h (including 0).
  const int n = 4'096;
  GeneratorParams p;
  p.n = n;
  const Graph g = generate("exponential", p);
  const SparseMatrix w = build_mixing_matrix(g, WeightScheme::kMetropolis);
  double lambda2 = -2, lambda_min = 2;
  for (int k = 1; k < n; ++k) {
    double value = 0;
    for (SparseMatrix::InnerIterator it(w, 0); it; ++it) value += it.value() * std::cos(2 * kPi * k * it.row() / n);
    lambda2 = std::max(lambda2, value);
    lambda_min = std::min(lambda_min, value);
  }
  const Spectrum s = analyze_spectrum(w, g);
  EXPECT_NEAR(s.lambda2, lambda2, 1e-9);
  EXPECT_NEAR(s.lambda_min, lambda_min, 1e-9);
}

std::vector<SparseMatrix> one_period(int n) {
  std::vector<SparseMatrix> steps;
  for (int t = 0; t < one_peer_exponential_period(n); ++t)
    steps.push_back(build_mixing_matrix(one_peer_exponential_step(n, t), WeightScheme::kMetropolis));
  return steps;
}

TEST(Spectrum, OnePeerExponentialPeriodIsExactAveragingForPowersOfTwo) {
  for (int n : {2, 16, 4096}) {
    const PeriodSpectrum p = analyze_period(one_period(n));
    EXPECT_EQ(p.contraction, 0.0) << n << " " << p.solver;
    EXPECT_EQ(p.spectral_gap, 1.0);
  }
  // One step alone is a perfect matching: no consensus from it.
  const Graph step = one_peer_exponential_step(16, 0);
  EXPECT_FALSE(analyze_spectrum(build_mixing_matrix(step, WeightScheme::kMetropolis), step).consensus());
}

TEST(Spectrum, OnePeerExponentialGeneralCaseContractsAndSolversAgree) {
  const PeriodSpectrum small = analyze_period(one_period(12));
  EXPECT_GT(small.contraction, 0.0);
  EXPECT_LT(small.contraction, 1.0);
  SpectrumOptions dense, sparse;
  dense.dense_max_peers = 2'000;
  sparse.dense_max_peers = 10;
  const auto steps = one_period(1'100);
  const PeriodSpectrum a = analyze_period(steps, dense), b = analyze_period(steps, sparse);
  EXPECT_NE(a.solver, b.solver);
  EXPECT_NEAR(a.contraction, b.contraction, 1e-8);
}

TEST(Spectrum, OnePeerHasNothingToDisagreeWith) {
  const Graph one = ring(1);
  const Spectrum s = analyze_spectrum(build_mixing_matrix(one, WeightScheme::kMetropolis), one);
  EXPECT_EQ(s.spectral_gap, 1.0);
}

TEST(Spectrum, DiameterOfRingsAndTori) {
  EXPECT_EQ(estimate_diameter(ring(100)), 50);
  GeneratorParams p;
  p.rows = 6;
  p.cols = 8;
  EXPECT_EQ(estimate_diameter(generate("torus", p)), 7);
}

}  // namespace
}  // namespace peertrain::topology
