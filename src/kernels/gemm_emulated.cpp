// The emulator's GEMM: Eigen on the host, in float32 whatever the precision asked for
// (the tests compare the emulated kernels with the CPU path at float32 tolerances).
#include <Eigen/Core>

#include "emulator.h"
#include "peertrain/kernels/ops.h"

namespace peertrain::kernels {

namespace {

void gemm_now(bool trans_a, bool trans_b, int m, int n, int k, const float* a, const float* b, float* c,
              bool accumulate) {
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;
  using ConstMap = Eigen::Map<const Matrix>;
  if (m == 0 || n == 0) return;
  Eigen::Map<Matrix> C(c, m, n);
  const ConstMap A(a, trans_a ? k : m, trans_a ? m : k), B(b, trans_b ? n : k, trans_b ? k : n);
  Matrix product(m, n);
  if (trans_a && trans_b)
    product.noalias() = A.transpose() * B.transpose();
  else if (trans_a)
    product.noalias() = A.transpose() * B;
  else if (trans_b)
    product.noalias() = A * B.transpose();
  else
    product.noalias() = A * B;
  if (accumulate)
    C += product;
  else
    C = product;
}

}  // namespace

Blas::Blas(Stream stream, GemmPrecision precision) : stream_(stream), precision_(precision) {}
Blas::~Blas() = default;

void Blas::gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, const float* b, float* c,
                bool accumulate) {
  // Queued on the handle's stream like every emulated kernel (runtime_emulated.cpp).
  emulator::enqueue(stream_, [=] { gemm_now(trans_a, trans_b, m, n, k, a, b, c, accumulate); });
}

}  // namespace peertrain::kernels
