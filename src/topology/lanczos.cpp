#include "lanczos.h"

#include <Eigen/Eigenvalues>
#include <algorithm>
#include <cmath>
#include <vector>

namespace peertrain::topology::detail {
namespace {

using Vector = Eigen::VectorXd;

// Runs the three-term recurrence from `start`; `visit(j, q_j)` sees every basis vector.
// Re-running with the same coefficients reproduces the same vectors bit for bit.
class Recurrence {
 public:
  Recurrence(const ApplyFn& apply, const Vector& start, long long* applications)
      : apply_(apply), applications_(applications) {
    q_ = start / start.norm();
    q_prev_ = Vector::Zero(start.size());
    w_.resize(start.size());
  }

  // One step: appends α_j and β_j; returns false when the Krylov space is invariant.
  bool step(std::vector<double>& alpha, std::vector<double>& beta) {
    apply_(q_, w_);
    if (applications_) ++*applications_;
    const double a = q_.dot(w_);
    const double b_prev = beta.empty() ? 0.0 : beta.back();
    w_ -= a * q_ + b_prev * q_prev_;
    const double b = w_.norm();
    alpha.push_back(a);
    beta.push_back(b);
    if (b <= 1e-14 * std::max(1.0, std::abs(a))) return false;
    q_prev_.swap(q_);
    q_ = w_ / b;
    return true;
  }

  const Vector& current() const { return q_; }

 private:
  const ApplyFn& apply_;
  long long* applications_;
  Vector q_, q_prev_, w_;
};

// Solves (T − σI)x = b for symmetric tridiagonal T (diagonal d, off-diagonal e) by
// Gaussian elimination with partial pivoting, as LAPACK's gttrf/gttrs do: stable even
// when σ is an eigenvalue to rounding, which is what inverse iteration asks of it.
Vector solve_shifted_tridiagonal(const std::vector<double>& d_in, const std::vector<double>& e, double sigma,
                                 Vector b) {
  const auto m = static_cast<Eigen::Index>(b.size());
  // Row i holds d[i] at column i, du[i] at i+1 and du2[i] at i+2; dl[i] sits at (i+1, i).
  Vector d(m), du = Vector::Zero(m), du2 = Vector::Zero(m), dl = Vector::Zero(m);
  for (Eigen::Index i = 0; i < m; ++i) d[i] = d_in[i] - sigma;
  for (Eigen::Index i = 0; i + 1 < m; ++i) du[i] = dl[i] = e[i];
  for (Eigen::Index i = 0; i + 1 < m; ++i) {
    if (std::abs(d[i]) >= std::abs(dl[i])) {
      const double fact = d[i] != 0 ? dl[i] / d[i] : 0.0;
      d[i + 1] -= fact * du[i];
      b[i + 1] -= fact * b[i];
    } else {  // swap rows i and i+1, then eliminate
      const double fact = d[i] / dl[i];
      d[i] = dl[i];
      const double old_d = d[i + 1];
      d[i + 1] = du[i] - fact * old_d;
      if (i + 2 < m) {
        du2[i] = du[i + 1];
        du[i + 1] = -fact * du[i + 1];
      }
      du[i] = old_d;
      std::swap(b[i], b[i + 1]);
      b[i + 1] -= fact * b[i];
    }
  }
  const double tiny = 1e-300;  // an exactly singular pivot: inverse iteration wants a huge x, not a NaN
  Vector x(m);
  for (Eigen::Index i = m - 1; i >= 0; --i) {
    double v = b[i];
    if (i + 1 < m) v -= du[i] * x[i + 1];
    if (i + 2 < m) v -= du2[i] * x[i + 2];
    x[i] = v / (std::abs(d[i]) > tiny ? d[i] : tiny);
  }
  return x;
}

// |last component| of the unit eigenvector of T for eigenvalue θ, by two steps of inverse
// iteration. β_m·|s_m| is then the residual of the Ritz pair: A·Q = Q·T + β_m q e_mᵀ holds
// to rounding whether or not the basis stayed orthogonal.
double last_component(const std::vector<double>& d, const std::vector<double>& e, double theta) {
  Vector x = Vector::Ones(static_cast<Eigen::Index>(d.size()));
  for (int iteration = 0; iteration < 2; ++iteration) {
    x = solve_shifted_tridiagonal(d, e, theta, x);
    const double norm = x.norm();
    if (!(norm > 0) || !std::isfinite(norm)) return 1.0;  // no estimate: let verification decide
    x /= norm;
  }
  return std::abs(x[x.size() - 1]);
}

struct Verified {
  double value;
  double residual;
};

// Rebuilds the Ritz vectors of T's extreme eigenpairs from the stored coefficients and
// measures their true residuals.
std::pair<Verified, Verified> verify(const ApplyFn& apply, const Vector& start, const std::vector<double>& alpha,
                                     const std::vector<double>& beta, long long* applications) {
  const auto m = static_cast<Eigen::Index>(alpha.size());
  Vector diag = Eigen::Map<const Vector>(alpha.data(), m);
  Vector sub = Eigen::Map<const Vector>(beta.data(), m - 1);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> t;
  t.computeFromTridiagonal(diag, sub, Eigen::ComputeEigenvectors);
  const Vector s_top = t.eigenvectors().col(m - 1);
  const Vector s_bottom = t.eigenvectors().col(0);

  Vector y_top = Vector::Zero(start.size()), y_bottom = Vector::Zero(start.size());
  Vector q = start / start.norm(), q_prev = Vector::Zero(start.size()), w(start.size());
  for (Eigen::Index j = 0; j < m; ++j) {
    y_top += s_top[j] * q;
    y_bottom += s_bottom[j] * q;
    if (j + 1 == m) break;
    apply(q, w);
    if (applications) ++*applications;
    w -= alpha[j] * q + (j > 0 ? beta[j - 1] : 0.0) * q_prev;
    q_prev.swap(q);
    q = w / beta[j];
  }
  auto measure = [&](Vector& y) {
    y /= y.norm();
    Vector ay(y.size());
    apply(y, ay);
    if (applications) ++*applications;
    const double rho = y.dot(ay);
    return Verified{rho, (ay - rho * y).norm()};
  };
  return {measure(y_top), measure(y_bottom)};
}

}  // namespace

ExtremeEigenvalues lanczos_extremes(const ApplyFn& apply, const Vector& start, double tolerance, int max_steps,
                                    long long* applications) {
  ExtremeEigenvalues result;
  std::vector<double> alpha, beta;
  Recurrence recurrence(apply, start, applications);
  int next_check = 10;
  bool invariant = false;
  while (static_cast<int>(alpha.size()) < max_steps) {
    invariant = !recurrence.step(alpha, beta);
    const auto m = static_cast<int>(alpha.size());
    if (!invariant && m < next_check) continue;
    next_check = m + std::max(10, m / 8);
    // Extreme Ritz values of T_m; a check costs O(m²), so checks thin out as m grows.
    Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> t;
    t.computeFromTridiagonal(Eigen::Map<const Vector>(alpha.data(), m),
                             Eigen::Map<const Vector>(beta.data(), m - 1), Eigen::EigenvaluesOnly);
    const double top = t.eigenvalues()[m - 1], bottom = t.eigenvalues()[0];
    const double b = beta.back();
    const bool settled = b * last_component(alpha, beta, top) <= 0.5 * tolerance &&
                         b * last_component(alpha, beta, bottom) <= 0.5 * tolerance;
    if (!settled && !invariant) continue;
    const auto [v_top, v_bottom] = verify(apply, start, alpha, beta, applications);
    result = {v_top.residual <= tolerance && v_bottom.residual <= tolerance,
              v_top.value,
              v_bottom.value,
              v_top.residual,
              v_bottom.residual,
              m};
    if (result.converged || invariant) return result;
  }
  result.steps = static_cast<int>(alpha.size());
  return result;
}

}  // namespace peertrain::topology::detail
