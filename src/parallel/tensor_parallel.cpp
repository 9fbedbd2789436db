// Megatron's column- and row-parallel Linear layers; see tensor_parallel.h.
#include "peertrain/parallel/tensor_parallel.h"

#include <Eigen/Core>

#include "peertrain/core/error.h"
#include "matrix_views.h"

namespace peertrain::parallel {

using namespace views;

Block tensor_shard(int size, int ranks, int rank, const char* what) {
  if (ranks < 1 || size % ranks != 0)
    throw Error(ErrorKind::kInvalidArgument,
                str("--tp ", ranks, " does not divide the ", size, " ", what, " (each rank takes an equal share)"));
  PEERTRAIN_CHECK(rank >= 0 && rank < ranks, "rank ", rank, " of ", ranks);
  return {rank * (size / ranks), size / ranks};
}

void column_parallel_forward(int in, int out, std::span<const Block> rows, int n, const float* w, const float* b,
                             const float* x, float* y) {
  int total = 0;
  for (const Block& r : rows) total += r.count;
  const ConstMatrix X(x, in, n);
  MutableStrided Y(y, total, n, Eigen::OuterStride<>(total));
  int at = 0;
  for (const Block& r : rows) {
    auto part = Y.middleRows(at, r.count);
    part.noalias() = Strided(w + r.first, r.count, in, Eigen::OuterStride<>(out)) * X;
    if (b != nullptr) part.colwise() += Eigen::Map<const Eigen::VectorXf>(b + r.first, r.count);
    at += r.count;
  }
}

void column_parallel_backward(comm::Group& group, int in, int out, std::span<const Block> rows, int n, const float* w,
                              const float* x, const float* dy, float* dw, float* db, float* dx, double timeout_s) {
  int total = 0;
  for (const Block& r : rows) total += r.count;
  const ConstMatrix X(x, in, n);
  const Strided DY(dy, total, n, Eigen::OuterStride<>(total));
  Matrix DX(dx, in, n);
  DX.setZero();
  int at = 0;
  for (const Block& r : rows) {
    const auto part = DY.middleRows(at, r.count);
    MutableStrided(dw + r.first, r.count, in, Eigen::OuterStride<>(out)).noalias() += part * X.transpose();
    if (db != nullptr) Eigen::Map<Eigen::VectorXf>(db + r.first, r.count) += part.rowwise().sum();
    DX.noalias() += Strided(w + r.first, r.count, in, Eigen::OuterStride<>(out)).transpose() * part;
    at += r.count;
  }
  group.all_reduce(std::span<float>(dx, static_cast<std::size_t>(in) * n), timeout_s);  // Megatron's f, backward
}

void row_parallel_forward(comm::Group& group, int in, int out, Block columns, int n, const float* w, const float* b,
                          const float* x_part, float* y, double timeout_s) {
  Matrix Y(y, out, n);
  Y.noalias() = ConstMatrix(w + static_cast<std::ptrdiff_t>(columns.first) * out, out, columns.count) *
                ConstMatrix(x_part, columns.count, n);
  group.all_reduce(std::span<float>(y, static_cast<std::size_t>(out) * n), timeout_s);  // Megatron's g, forward
  if (b != nullptr) Y.colwise() += Eigen::Map<const Eigen::VectorXf>(b, out);
  (void)in;
}

void row_parallel_backward(comm::Group& group, int in, int out, Block columns, int n, const float* w,
                           const float* x_part, const float* dy, float* dw, float* db, float* dx_part) {
  const ConstMatrix DY(dy, out, n);
  const ConstMatrix X(x_part, columns.count, n);
  Matrix(dw + static_cast<std::ptrdiff_t>(columns.first) * out, out, columns.count).noalias() += DY * X.transpose();
  if (db != nullptr && group.rank() == 0) Eigen::Map<Eigen::VectorXf>(db, out) += DY.rowwise().sum();
  Matrix(dx_part, columns.count, n).noalias() =
      ConstMatrix(w + static_cast<std::ptrdiff_t>(columns.first) * out, out, columns.count).transpose() * DY;
  (void)in;
}

}  // namespace peertrain::parallel
