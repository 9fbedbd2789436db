// The float32 GEMM every CPU model layer runs on (internal to the model module).
//
// C (m×n) ← op(A)·op(B), or C += op(A)·op(B) when accumulate; A, B, C column-major, op a
// transpose where the flag says so (only a storage order given to the kernel, never a copy).
// Eigen's own product allocates its packing buffers on every call, and for these sizes each
// allocation comes back from the kernel as fresh pages: ~190 page faults and 10% of a
// 784-512-512-10 MLP step. With one thread this calls Eigen's GEMM driver directly with
// packing buffers that live here and only grow. With more threads it uses the public
// product, whose parallel driver packs into buffers of its own.
#pragma once

#include <Eigen/Core>

namespace peertrain::model {

// Holds the packing buffers, so keep one per thread and reuse it; not thread-safe.
class Gemm : public Eigen::internal::level3_blocking<float, float> {
 public:
  void run(bool trans_a, bool trans_b, Eigen::Index m, Eigen::Index n, Eigen::Index k, const float* a,
           const float* b, float* c, bool accumulate);

 private:
  template <bool kTransA, bool kTransB>
  void run_typed(Eigen::Index m, Eigen::Index n, Eigen::Index k, const float* a, const float* b, float* c,
                 bool accumulate);

  Eigen::VectorXf packed_a_;  // Eigen aligns these for its packet loads
  Eigen::VectorXf packed_b_;
};

}  // namespace peertrain::model
