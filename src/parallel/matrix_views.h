// Eigen views of the parallel module's raw float buffers, column-major as everywhere in
// peertrain: a whole matrix, or a block of one with the parent's leading dimension
// (Eigen's GEMM packs a strided block, so the stride costs nothing). Internal to the module.
#pragma once

#include <Eigen/Core>

namespace peertrain::parallel::views {

using Matrix = Eigen::Map<Eigen::MatrixXf>;
using ConstMatrix = Eigen::Map<const Eigen::MatrixXf>;
using Strided = Eigen::Map<const Eigen::MatrixXf, 0, Eigen::OuterStride<>>;
using MutableStrided = Eigen::Map<Eigen::MatrixXf, 0, Eigen::OuterStride<>>;

}  // namespace peertrain::parallel::views
