#include "peertrain/topology/spectrum.h"

#include <Eigen/Dense>
#include <Eigen/SparseCholesky>
#include <Spectra/SymEigsSolver.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <queue>

#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "lanczos.h"

namespace peertrain::topology {
namespace {

using Vector = Eigen::VectorXd;
using ConstMap = Eigen::Map<const Vector>;
using Map = Eigen::Map<Vector>;
using Cholesky = Eigen::SimplicialLLT<SparseMatrix, Eigen::Lower, Eigen::AMDOrdering<int>>;

// W − (1 − μ)·11ᵀ/n: the all-ones eigenvector's eigenvalue 1 moves to μ, the mean of the
// other eigenvalues, which lies between λ_min and λ₂ and so is never an extreme that
// Lanczos could return instead of them. Every other eigenpair is unchanged.
class DeflatedMixingOp {
 public:
  using Scalar = double;
  DeflatedMixingOp(const SparseMatrix& w, long long* matvecs) : w_(w), matvecs_(matvecs) {
    const Eigen::Index n = w.rows();
    shift_ = 1.0 - (w.diagonal().sum() - 1.0) / static_cast<double>(n - 1);
  }
  Eigen::Index rows() const { return w_.rows(); }
  Eigen::Index cols() const { return w_.cols(); }
  void perform_op(const double* x_in, double* y_out) const {
    ConstMap x(x_in, rows());
    Map y(y_out, rows());
    y.noalias() = w_.transpose() * x;  // W is symmetric; the transpose product is the faster gather form
    y.array() -= shift_ * x.mean();
    ++*matvecs_;
  }

 private:
  const SparseMatrix& w_;
  double shift_ = 0;
  long long* matvecs_;
};

// The pseudo-inverse of L = I − W on the subspace orthogonal to 1, through a Cholesky
// factorization of L with its last row and column removed (grounded), which is positive
// definite for a connected graph. Its eigenvalues are 1/(1 − λ_k): the clustered top of
// W's spectrum becomes well separated (for a ring they fall off as 1/k²).
class LaplacianPseudoInverseOp {
 public:
  using Scalar = double;
  LaplacianPseudoInverseOp(const SparseMatrix& w, long long* matvecs) : n_(w.rows()), matvecs_(matvecs) {
    SparseMatrix identity(n_, n_);
    identity.setIdentity();
    SparseMatrix laplacian = identity - w;
    SparseMatrix grounded = laplacian.topLeftCorner(n_ - 1, n_ - 1);
    cholesky_.compute(grounded);
    if (cholesky_.info() != Eigen::Success)
      throw Error(ErrorKind::kNotConverged,
                  "spectrum: the grounded Laplacian I − W is not positive definite, so W's weighted graph is "
                  "disconnected (λ₂ = 1)");
  }
  Eigen::Index rows() const { return n_; }
  Eigen::Index cols() const { return n_; }
  void perform_op(const double* x_in, double* y_out) const {
    ConstMap x(x_in, n_);
    Map y(y_out, n_);
    Vector centered = x.array() - x.mean();
    y.head(n_ - 1) = cholesky_.solve(centered.head(n_ - 1));
    y[n_ - 1] = 0;
    y.array() -= y.mean();
    ++*matvecs_;
  }

 private:
  Eigen::Index n_;
  Cholesky cholesky_;
  long long* matvecs_;
};

template <typename Op>
std::optional<double> lanczos_extreme(Op& op, Spectra::SortRule rule, const SpectrumOptions& options) {
  const auto n = static_cast<int>(op.rows());
  const int ncv = std::min(n, std::max(options.lanczos_subspace, 3));
  Spectra::SymEigsSolver<Op> eigs(op, 1, ncv);
  eigs.init();
  eigs.compute(rule, options.lanczos_max_restarts, options.tolerance, rule);
  if (eigs.info() != Spectra::CompInfo::Successful) return std::nullopt;
  return eigs.eigenvalues()[0];
}

// λ_min by bisection on σ: W − σI has a Cholesky factorization exactly when σ < λ_min
// (Sylvester's law of inertia). Gershgorin gives a lower bracket, a diagonal entry (a
// Rayleigh quotient) an upper one. The sparsity pattern is analysed once.
double lambda_min_by_inertia(const SparseMatrix& w, double tolerance, long long* factorizations) {
  const Eigen::Index n = w.rows();
  SparseMatrix identity(n, n);
  identity.setIdentity();
  SparseMatrix shifted = w + identity;  // guarantees a stored diagonal entry in every column
  std::vector<double*> diagonal(n);
  Vector base(n);
  for (Eigen::Index j = 0; j < n; ++j) {
    diagonal[j] = &shifted.coeffRef(j, j);
    base[j] = *diagonal[j] - 1.0;
  }
  double lo = 1.0, hi = 1.0;
  for (Eigen::Index j = 0; j < n; ++j) {
    lo = std::min(lo, 2 * base[j] - 1);  // Gershgorin: W_jj − Σ_{i≠j} W_ij
    hi = std::min(hi, base[j]);
  }
  lo = std::max(lo, -1.0);
  Cholesky cholesky;
  cholesky.analyzePattern(shifted);
  auto positive_definite = [&](double sigma) {
    for (Eigen::Index j = 0; j < n; ++j) *diagonal[j] = base[j] - sigma;
    cholesky.factorize(shifted);
    ++*factorizations;
    return cholesky.info() == Eigen::Success;
  };
  const double slack = 1e-12;
  // λ_min cannot lie below the Gershgorin bound; if W − (bound − slack)I is already not
  // positive definite, λ_min equals the bound to rounding.
  if (!positive_definite(lo - slack)) return lo;
  // Even rings, tori and other graphs with an alternating eigenvector meet the bound
  // exactly; one more factorization just above it settles those at once.
  const double width = std::max(tolerance * 0.1, 1e-13);
  if (!positive_definite(lo + width)) return lo + 0.5 * width;
  lo += width;
  for (int step = 0; step < 200 && hi - lo > width; ++step) {
    const double mid = 0.5 * (lo + hi);
    (positive_definite(mid) ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

Spectrum dense_spectrum(const SparseMatrix& w) {
  Spectrum s;
  Eigen::MatrixXd dense = Eigen::MatrixXd(w);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> solver(dense, Eigen::EigenvaluesOnly);
  if (solver.info() != Eigen::Success)
    throw Error(ErrorKind::kNotConverged, "spectrum: the dense eigensolver did not converge");
  const Vector& e = solver.eigenvalues();  // ascending; e[n−1] = 1 belongs to the all-ones vector
  s.lambda2 = e[e.size() - 2];
  s.lambda_min = e[0];
  s.solver = "dense (Eigen SelfAdjointEigenSolver)";
  return s;
}

Spectrum sparse_spectrum(const SparseMatrix& w, const Graph& graph, const SpectrumOptions& options) {
  Spectrum s;
  const int diameter = graph.num_peers() == w.rows() ? estimate_diameter(graph) : 0;
  const bool clustered = diameter >= options.clustered_diameter;
  std::string reason = clustered ? str("diameter ", diameter, " >= ", options.clustered_diameter,
                                       " means a clustered spectrum")
                                 : "";
  DeflatedMixingOp deflated(w, &s.matvecs);

  std::optional<double> lambda2, lambda_min;
  std::string top;
  if (!clustered && options.solver == SpectrumSolver::kSpectra) {
    // Both ends from one restarted Krylov space: half the restarts of two separate runs.
    const auto n = static_cast<int>(w.rows());
    const int ncv = std::min(n, std::max(options.lanczos_subspace, 4));
    Spectra::SymEigsSolver<DeflatedMixingOp> eigs(deflated, 2, ncv);
    eigs.init();
    eigs.compute(Spectra::SortRule::BothEnds, options.lanczos_max_restarts, options.tolerance);
    if (eigs.info() == Spectra::CompInfo::Successful) {
      lambda2 = eigs.eigenvalues().maxCoeff();
      lambda_min = eigs.eigenvalues().minCoeff();
      top = "λ₂ and λ_min: implicitly restarted Lanczos (Spectra, all-ones deflated)";
    } else {
      reason = str("Spectra's Lanczos did not converge in ", options.lanczos_max_restarts, " restarts");
    }
  } else if (!clustered) {
    Rng rng(12345);
    Vector start(w.rows());
    for (auto& v : start) v = rng.normal();
    const detail::ApplyFn apply = [&](const Vector& x, Vector& y) { deflated.perform_op(x.data(), y.data()); };
    const auto found = detail::lanczos_extremes(apply, start, options.tolerance, options.lanczos_max_steps, nullptr);  // the operator counts
    if (found.converged) {
      lambda2 = found.largest;
      lambda_min = found.smallest;
      top = str("λ₂ and λ_min: Lanczos (", found.steps, " steps, all-ones deflated, residuals ",
                std::max(found.largest_residual, found.smallest_residual), ")");
    } else {
      reason = str("Lanczos did not converge in ", options.lanczos_max_steps, " steps");
    }
  }
  std::string bottom;
  if (!lambda2) {
    LaplacianPseudoInverseOp inverse(w, &s.matvecs);
    auto theta = lanczos_extreme(inverse, Spectra::SortRule::LargestAlge, options);
    if (!theta || *theta <= 0)
      throw Error(ErrorKind::kNotConverged,
                  "spectrum: λ₂ did not converge with Lanczos nor with shift-invert on the Laplacian");
    lambda2 = 1.0 - 1.0 / *theta;
    top = "λ₂: Lanczos (Spectra) on the Laplacian pseudo-inverse (Cholesky)";
    long long factorizations = 0;
    lambda_min = lambda_min_by_inertia(w, options.tolerance, &factorizations);
    s.matvecs += factorizations;
    bottom = str("; λ_min: inertia bisection (", factorizations, " Cholesky factorizations)");
  }
  s.lambda2 = *lambda2;
  s.lambda_min = *lambda_min;
  s.solver = reason.empty() ? str("sparse: ", top, bottom) : str("sparse: ", top, bottom, " [fell back: ", reason, "]");
  return s;
}

}  // namespace

int estimate_diameter(const Graph& graph) {
  const int n = graph.num_peers();
  if (n <= 1) return 0;
  std::vector<int> distance(n);
  auto farthest = [&](int source, int* far) {
    std::fill(distance.begin(), distance.end(), -1);
    std::queue<int> queue;
    distance[source] = 0;
    queue.push(source);
    int last = source;
    while (!queue.empty()) {
      last = queue.front();
      queue.pop();
      for (int q : graph.neighbors(last))
        if (distance[q] < 0) {
          distance[q] = distance[last] + 1;
          queue.push(q);
        }
    }
    *far = last;
    return distance[last];
  };
  int u = 0, v = 0;
  farthest(0, &u);
  return farthest(u, &v);
}

Spectrum analyze_spectrum(const SparseMatrix& w, const Graph& graph, const SpectrumOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const auto n = static_cast<int>(w.rows());
  PEERTRAIN_CHECK(n >= 1 && w.cols() == n, "W is ", w.rows(), "x", w.cols());
  Spectrum s;
  if (n == 1) {
    // One peer has nothing to disagree with: the subspace orthogonal to 1 is empty.
    s.solver = "trivial (one peer)";
  } else if (n <= 3 || options.solver == SpectrumSolver::kDense ||
             (options.solver == SpectrumSolver::kAuto && n <= options.dense_max_peers)) {
    s = dense_spectrum(w);
  } else {
    s = sparse_spectrum(w, graph, options);
  }
  s.peers = n;
  s.spectral_gap = n == 1 ? 1.0 : 1.0 - std::max(std::abs(s.lambda2), std::abs(s.lambda_min));
  if (std::abs(s.spectral_gap) < kNoConsensusGap) s.spectral_gap = 0.0;  // rounding around an exact 0
  s.seconds = seconds_since(start);
  return s;
}

PeriodSpectrum analyze_period(const std::vector<SparseMatrix>& steps, const SpectrumOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  PEERTRAIN_CHECK(!steps.empty(), "a period needs at least one step");
  const Eigen::Index n = steps[0].rows();
  PeriodSpectrum p;
  p.period = static_cast<int>(steps.size());
  auto apply = [&](Vector x, bool transpose) {  // (P − J)x or (P − J)ᵀx
    x.array() -= x.mean();
    for (std::size_t t = 0; t < steps.size(); ++t) {
      const SparseMatrix& w = steps[transpose ? steps.size() - 1 - t : t];
      Vector y = w.transpose() * x;
      x.swap(y);
    }
    return x;
  };
  if (n <= options.dense_max_peers) {
    Eigen::MatrixXd product = Eigen::MatrixXd::Identity(n, n);
    for (const SparseMatrix& w : steps) product = w * product;
    product.array() -= 1.0 / static_cast<double>(n);
    Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> solver(product.transpose() * product, Eigen::EigenvaluesOnly);
    p.contraction = std::sqrt(std::max(0.0, solver.eigenvalues()[n - 1]));
    p.solver = "dense (Eigen) on PᵀP";
  } else {
    Rng rng(7);
    double probe = 0;
    for (int trial = 0; trial < 3; ++trial) {
      Vector x(n);
      for (auto& v : x) v = rng.normal();
      x.array() -= x.mean();
      probe = std::max(probe, apply(x, false).norm() / x.norm());
    }
    if (probe < 1e-12) {
      p.contraction = 0;
      p.solver = "random probes: P − J vanishes (exact averaging)";
    } else {
      long long matvecs = 0;
      struct NormalOp {
        using Scalar [[maybe_unused]] = double;
        const decltype(apply)& apply_fn;
        Eigen::Index n;
        long long* count;
        Eigen::Index rows() const { return n; }
        Eigen::Index cols() const { return n; }
        void perform_op(const double* x_in, double* y_out) const {
          Map(y_out, n) = apply_fn(apply_fn(ConstMap(x_in, n), false), true);
          ++*count;
        }
      } op{apply, n, &matvecs};
      auto top = lanczos_extreme(op, Spectra::SortRule::LargestAlge, options);
      if (!top) throw Error(ErrorKind::kNotConverged, "spectrum: the period product's norm did not converge");
      p.contraction = std::sqrt(std::max(0.0, *top));
      p.solver = "Lanczos (Spectra) on PᵀP";
    }
  }
  if (p.contraction < 1e-12) p.contraction = 0;
  p.spectral_gap = 1.0 - std::pow(p.contraction, 1.0 / p.period);
  p.seconds = seconds_since(start);
  return p;
}

double laplacian_best_constant(const Graph& graph, const SpectrumOptions& options) {
  if (graph.num_peers() < 2) return 0.0;
  // W_c = I − cL with c = 1/(1 + d_max) is the max-degree matrix; its eigenvalues are
  // 1 − cμ_k, so its spectrum gives the Laplacian's extreme eigenvalues.
  const double c = 1.0 / (1.0 + graph.max_degree());
  const Spectrum s = analyze_spectrum(build_mixing_matrix(graph, WeightScheme::kMaxDegree), graph, options);
  const double mu_fiedler = (1.0 - s.lambda2) / c;
  const double mu_max = (1.0 - s.lambda_min) / c;
  return 2.0 / (mu_max + mu_fiedler);
}

}  // namespace peertrain::topology
