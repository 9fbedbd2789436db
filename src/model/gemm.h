// The float32 GEMM every CPU model layer runs on (internal to the model module).
//
// C (m×n) ← op(A)·op(B), or C += op(A)·op(B) when accumulate; A, B, C column-major, op a
// transpose where the flag says so (only a storage order given to the kernel, never a copy).
// An epilogue (gemm_epilogue.h) adds a bias per row and a matrix (a residual) and applies
// a ReLU or a GELU (forward or backward).
//
// In an AVX-512 build it runs our own kernel (gemm_avx512.h), which applies the epilogue
// in its stores; with Eigen::nbThreads() > 1, each thread a contiguous range of C's
// rows or columns, with the one-thread result's bits. Otherwise it runs Eigen's, and the epilogue costs passes over
// C of its own, before the product (bias and addend) and after it (ReLU). Eigen's own
// product allocates its packing buffers on every call, and for these sizes each allocation
// comes back from the kernel as fresh pages: ~190 page faults and 10% of a 784-512-512-10
// MLP step. With one thread this calls Eigen's GEMM driver directly with packing buffers
// that live here and only grow. With more threads it uses the public product, whose
// parallel driver packs into buffers of its own.
#pragma once

#include <Eigen/Core>
#include <vector>

#include "gemm_avx512.h"

namespace peertrain::model {

// sums (rows floats) += the row sums of x (rows × n, column-major), column by column in
// order, as the AVX-512 kernel's packing adds them: a Linear's bias gradient.
void add_row_sums(Eigen::Index rows, Eigen::Index n, const float* x, float* sums);

// Holds the packing buffers, so keep one per thread and reuse it; not thread-safe.
class Gemm : public Eigen::internal::level3_blocking<float, float> {
 public:
  void run(bool trans_a, bool trans_b, Eigen::Index m, Eigen::Index n, Eigen::Index k, const float* a, const float* b,
           float* c, bool accumulate, const GemmEpilogue& epilogue = {});

 private:
  // Our AVX-512 kernel, over Eigen::nbThreads() ranges of C.
  void run_ours(bool trans_a, bool trans_b, Eigen::Index m, Eigen::Index n, Eigen::Index k, const float* a,
                const float* b, float* c, bool accumulate, const GemmEpilogue& epilogue);
  void eigen_run(bool trans_a, bool trans_b, Eigen::Index m, Eigen::Index n, Eigen::Index k, const float* a,
                 const float* b, float* c, bool accumulate);
  template <bool kTransA, bool kTransB>
  void run_typed(Eigen::Index m, Eigen::Index n, Eigen::Index k, const float* a, const float* b, float* c,
                 bool accumulate);

  Eigen::VectorXf packed_a_;  // Eigen aligns these for its packet loads
  Eigen::VectorXf packed_b_;
  avx512_gemm::Buffers own_;  // our kernel's packing buffers
  // With more threads, the packing buffers of threads 1, 2, ... (OpenMP's pool keeps its
  // threads, so each range's buffers stay warm on the thread that uses them).
  std::vector<avx512_gemm::Buffers> threads_own_;
  // Fewer columns or rows a thread, and one thread takes C: two 12-column or two 32-row
  // micro-panels at least, so that a range's packing is not most of its work.
  static constexpr Eigen::Index kColumnsPerThread = 24;
  static constexpr Eigen::Index kRowsPerThread = 64;
};

}  // namespace peertrain::model
