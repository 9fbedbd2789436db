// Spectrum of a mixing matrix: λ₂ (largest eigenvalue below 1), λ_min, and the spectral
// gap 1 − max(|λ₂|, |λ_min|), which sets how fast gossip reaches consensus: the consensus
// distance shrinks by about (1 − gap)² per step.
//
// Solvers: dense Eigen for small n; Lanczos on sparse W with the all-ones direction
// deflated for large n (our plain Lanczos by default, Spectra's restarted one on request). Long rings and large tori have clustered spectra on which
// Lanczos crawls; those are detected (large diameter, or Lanczos not converging) and solved
// by methods that converge on them: Lanczos on the pseudo-inverse of the Laplacian I − W
// (sparse Cholesky of the grounded Laplacian) for λ₂, and bisection on the inertia of
// W − σI (a Cholesky factorization succeeds exactly when σ < λ_min) for λ_min. A number is
// never reported unless its method converged; otherwise Error(kNotConverged) is thrown.
#pragma once

#include <string>
#include <vector>

#include "peertrain/topology/graph.h"
#include "peertrain/topology/mixing.h"

namespace peertrain::topology {

// kLanczos: plain Lanczos with verified residuals (src/topology/lanczos.h), the fast default
// for large n; kSpectra: Spectra's implicitly restarted Lanczos, kept as a cross-check.
enum class SpectrumSolver { kAuto, kDense, kLanczos, kSpectra };

struct SpectrumOptions {
  SpectrumSolver solver = SpectrumSolver::kAuto;
  int dense_max_peers = 1024;       // kAuto uses the dense solver up to this n
  double tolerance = 1e-9;          // Lanczos residual bound, relative: |λ − θ| ≤ tol·|θ|
  int lanczos_max_steps = 4000;     // plain Lanczos steps before falling back
  int lanczos_max_restarts = 1000;  // Spectra restarts before falling back
  int lanczos_subspace = 32;        // Krylov subspace size (Spectra's ncv); measured fastest
  int clustered_diameter = 64;      // a graph whose diameter is at least this skips plain Lanczos
};

inline constexpr double kNoConsensusGap = 1e-12;

struct Spectrum {
  int peers = 0;
  double lambda2 = 0;
  double lambda_min = 0;
  double spectral_gap = 0;  // 1 − max(|λ₂|, |λ_min|)
  bool consensus() const { return spectral_gap > kNoConsensusGap; }
  // Predicted factor by which (1/n)Σ‖x_i − x̄‖² shrinks per gossip step: (1 − gap)².
  double contraction_per_step() const { return (1 - spectral_gap) * (1 - spectral_gap); }
  std::string solver;    // which method produced the numbers, including any fall-back
  double seconds = 0;    // solver time
  long long matvecs = 0; // operator applications (W·x or a Cholesky solve)
};

// W must already be validated (symmetric, doubly stochastic). `graph` is W's support; it
// is used only to detect clustered spectra from the graph's diameter.
Spectrum analyze_spectrum(const SparseMatrix& w, const Graph& graph, const SpectrumOptions& options = {});

// For a time-varying topology: the contraction of one period's product P = W_{τ−1}⋯W_0,
// ‖P − 11ᵀ/n‖₂, and the equivalent per-step gap 1 − contraction^(1/τ).
struct PeriodSpectrum {
  int period = 0;
  double contraction = 0;  // 0 means the period's product is exact averaging
  double spectral_gap = 0; // per-step equivalent
  std::string solver;
  double seconds = 0;
};
PeriodSpectrum analyze_period(const std::vector<SparseMatrix>& steps, const SpectrumOptions& options = {});

// Best-constant edge weight α = 2/(λ_1(L) + λ_{n−1}(L)) of the graph Laplacian L = D − A.
double laplacian_best_constant(const Graph& graph, const SpectrumOptions& options = {});

// Double-sweep BFS lower bound on the diameter (exact on trees, rings and tori).
int estimate_diameter(const Graph& graph);

}  // namespace peertrain::topology
