// Plain symmetric Lanczos for both extreme eigenvalues of an operator, with no
// reorthogonalization. On sparse mixing matrices the cost of Spectra's implicitly
// restarted Lanczos is dominated by re-orthogonalizing against its whole basis each step
// (measured: 1,809 operator applications took 3.1 s for a 100,000-peer graph whose
// applications alone take 0.6 s); the plain three-term recurrence costs one application
// and a few vector updates per step. Without reorthogonalization Ritz values can repeat
// ("ghosts") but the extreme ones still converge (Paige 1976), and nothing is reported on
// the recurrence's word: the Ritz vectors are rebuilt in a second pass from the stored
// coefficients and accepted only when their true residual ‖Ay − ρy‖ is within tolerance,
// which bounds the distance from ρ to an eigenvalue of A.
#pragma once

#include <Eigen/Core>
#include <functional>

namespace peertrain::topology::detail {

struct ExtremeEigenvalues {
  bool converged = false;
  double largest = 0;
  double smallest = 0;
  double largest_residual = 0;
  double smallest_residual = 0;
  int steps = 0;
};

using ApplyFn = std::function<void(const Eigen::VectorXd& x, Eigen::VectorXd& y)>;

// `start` must be nonzero; `applications` (may be null) counts calls of `apply`. Stops when both residuals are ≤ tolerance, or after max_steps.
ExtremeEigenvalues lanczos_extremes(const ApplyFn& apply, const Eigen::VectorXd& start, double tolerance,
                                    int max_steps, long long* applications);

}  // namespace peertrain::topology::detail
