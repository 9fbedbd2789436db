// The model's GEMM: the transposes become template flags here, because both Eigen's product
// expressions and its GEMM driver take the storage order of each operand at compile time.
#include "gemm.h"

#include <algorithm>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "gelu.h"
#include "peertrain/core/error.h"

namespace peertrain::model {
namespace {

using Eigen::Index;
using Matrix = Eigen::Map<Eigen::MatrixXf>;
using ConstMatrix = Eigen::Map<const Eigen::MatrixXf>;

}  // namespace

void add_row_sums(Index rows, Index n, const float* x, float* sums) {
  Eigen::Map<Eigen::VectorXf> s(sums, rows);
  for (Index j = 0; j < n; ++j) s += Eigen::Map<const Eigen::VectorXf>(x + j * rows, rows);
}

template <bool kTransA, bool kTransB>
void Gemm::run_typed(Index m, Index n, Index k, const float* a, const float* b, float* c, bool accumulate) {
  const ConstMatrix a_map(a, kTransA ? k : m, kTransA ? m : k);
  const ConstMatrix b_map(b, kTransB ? n : k, kTransB ? k : n);
  Matrix c_map(c, m, n);
  if (m == 0 || n == 0 || k == 0) {  // k = 0 is an empty sum: C becomes zero, or stays as it is
    if (!accumulate) c_map.setZero();
    return;
  }
  if (Eigen::nbThreads() > 1) {
    const auto multiply = [&](const auto& op_a, const auto& op_b) {
      if (accumulate)
        c_map.noalias() += op_a * op_b;
      else
        c_map.noalias() = op_a * op_b;
    };
    if constexpr (kTransA && kTransB)
      multiply(a_map.transpose(), b_map.transpose());
    else if constexpr (kTransA)
      multiply(a_map.transpose(), b_map);
    else if constexpr (kTransB)
      multiply(a_map, b_map.transpose());
    else
      multiply(a_map, b_map);
    return;
  }
  m_kc = k;
  m_mc = m;
  m_nc = n;
  Eigen::internal::computeProductBlockingSizes<float, float, 1>(m_kc, m_mc, m_nc, Index{1});
  // A long inner dimension (the weight gradients, k = batch·tokens) gets Eigen's deepest
  // panels (kc 688 at k 2048), whose packed blocks spill from L2 on this core. Panels of 256
  // measured 12 % faster on the GPT's dW GEMMs (133 → 152 GFLOP/s at 384×128×2048) and no
  // slower on the others; at k ≤ 512 Eigen's single panel stays the best.
  constexpr Index kLongInnerPanel = 256;
  if (k > 2 * kLongInnerPanel) m_kc = std::min(m_kc, kLongInnerPanel);
  if (packed_a_.size() < m_kc * m_mc) packed_a_.resize(m_kc * m_mc);
  if (packed_b_.size() < m_kc * m_nc) packed_b_.resize(m_kc * m_nc);
  m_blockA = packed_a_.data();
  m_blockB = packed_b_.data();
  if (!accumulate) c_map.setZero();  // the driver accumulates
  Eigen::internal::general_matrix_matrix_product<Index, float, kTransA ? Eigen::RowMajor : Eigen::ColMajor, false,
                                                 float, kTransB ? Eigen::RowMajor : Eigen::ColMajor, false,
                                                 Eigen::ColMajor, 1>::run(m, n, k, a, kTransA ? k : m, b,
                                                                          kTransB ? n : k, c, 1, m, 1.0f, *this);
}

// More threads take contiguous ranges of C, each packing its own panels, and every range
// packs all of the operand it does not split: C's rows split when that gives more ranges,
// or as many and C has more rows than columns (an MLP's forward and input gradient, W·X
// and Wᵀ·D with the batch as C's 128 columns, pack B, the smaller, twice instead of W), its
// columns otherwise. An element's
// sum does not depend on the ranges (the kernel blocks k alike for every range, and a
// range's blocks of m or n change only which elements a call computes), so any count of
// threads gives the one-thread bits. Eigen's parallel product, which this replaced, made
// an MLP step at 2 threads 0.89x one thread on this host.
void Gemm::run_ours(bool trans_a, bool trans_b, Index m, Index n, Index k, const float* a, const float* b, float* c,
                    bool accumulate, const GemmEpilogue& epilogue) {
  const Index lda = trans_a ? k : m, ldb = trans_b ? n : k;
  // Eigen's count (the MLP's --threads), capped by this thread's OpenMP limit: a pipeline
  // worker sets that to its threads per worker, so that N workers do not each open a team
  // of N (num_threads below would override the limit).
  Index threads = Eigen::nbThreads();
#ifdef _OPENMP
  threads = std::min<Index>(threads, omp_get_max_threads());
#endif
  // The direction that gives more threads work; with as many either way, the longer side.
  const Index by_rows = std::min<Index>(threads, m / kRowsPerThread);
  const Index by_columns = std::min<Index>(threads, n / kColumnsPerThread);
  const bool split_rows = by_rows > by_columns || (by_rows == by_columns && m > n);
  const Index parts = split_rows ? by_rows : by_columns;
  if (parts <= 1) {
    const avx512_gemm::Epilogue e{epilogue, accumulate, m};
    avx512_gemm::run(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, m, e, own_);
    return;
  }
  if (static_cast<Index>(threads_own_.size()) < parts) threads_own_.resize(static_cast<std::size_t>(parts));
  // Whole micro-panels (32 rows, 12 columns) to each range but the last.
  const Index unit = split_rows ? 32 : 12, extent = split_rows ? m : n, panels = (extent + unit - 1) / unit;
#pragma omp parallel for num_threads(parts) schedule(static, 1)
  for (Index part = 0; part < parts; ++part) {
    const Index from = std::min(extent, panels * part / parts * unit);
    const Index to = std::min(extent, panels * (part + 1) / parts * unit);
    if (from >= to) continue;
    avx512_gemm::Buffers& buffers = part == 0 ? own_ : threads_own_[static_cast<std::size_t>(part)];
    avx512_gemm::Epilogue e{epilogue, accumulate, m};
    // Element (i, j) of C and of the m × n terms lies at i + j·m.
    const Index at = split_rows ? from : from * m;
    const auto offset = [at](auto* p) { return p == nullptr ? p : p + at; };
    e.addend = offset(epilogue.addend);
    e.gelu_out = offset(epilogue.gelu_out);
    e.gelu_grad_at = offset(epilogue.gelu_grad_at);
    if (split_rows) {
      e.row_bias = offset(epilogue.row_bias);
      e.a_row_sums = offset(epilogue.a_row_sums);  // each range sums its own rows of A
      avx512_gemm::run(trans_a, trans_b, to - from, n, k, trans_a ? a + from * k : a + from, lda, b, ldb, c + from, m,
                       e, buffers);
    } else {
      if (from > 0) e.a_row_sums = nullptr;  // A's rows are summed once, by the first range
      avx512_gemm::run(trans_a, trans_b, m, to - from, k, a, lda, trans_b ? b + from : b + from * k, ldb, c + from * m,
                       m, e, buffers);
    }
  }
}

void Gemm::run(bool trans_a, bool trans_b, Index m, Index n, Index k, const float* a, const float* b, float* c,
               bool accumulate, const GemmEpilogue& epilogue) {
  PEERTRAIN_CHECK(epilogue.a_row_sums == nullptr || !trans_a, "the GEMM sums A's rows only untransposed");
  if (m == 0 || n == 0) {
    if (epilogue.a_row_sums != nullptr) add_row_sums(m, k, a, epilogue.a_row_sums);
    return;
  }
  if (k > 0 && avx512_gemm::available()) {  // our kernel: every term in its passes
    run_ours(trans_a, trans_b, m, n, k, a, b, c, accumulate, epilogue);
    return;
  }
  if (epilogue.a_row_sums != nullptr) add_row_sums(m, k, a, epilogue.a_row_sums);
  Matrix c_map(c, m, n);
  if (epilogue.row_bias != nullptr || epilogue.addend != nullptr) {  // the terms first; the driver adds the product
    if (!accumulate) {
      if (epilogue.addend != nullptr)
        c_map = ConstMatrix(epilogue.addend, m, n);
      else
        c_map.setZero();
    } else if (epilogue.addend != nullptr) {
      c_map += ConstMatrix(epilogue.addend, m, n);
    }
    if (epilogue.row_bias != nullptr) c_map.colwise() += Eigen::Map<const Eigen::VectorXf>(epilogue.row_bias, m);
    accumulate = true;
  }
  eigen_run(trans_a, trans_b, m, n, k, a, b, c, accumulate);
  if (epilogue.relu) c_map = c_map.cwiseMax(0.0f);
  if (epilogue.gelu_out != nullptr) gelu::forward(c, epilogue.gelu_out, m * n);
  if (epilogue.gelu_grad_at != nullptr) gelu::backward(epilogue.gelu_grad_at, c, c, m * n);
}

void Gemm::eigen_run(bool trans_a, bool trans_b, Index m, Index n, Index k, const float* a, const float* b, float* c,
                     bool accumulate) {
  if (trans_a && trans_b)
    run_typed<true, true>(m, n, k, a, b, c, accumulate);
  else if (trans_a)
    run_typed<true, false>(m, n, k, a, b, c, accumulate);
  else if (trans_b)
    run_typed<false, true>(m, n, k, a, b, c, accumulate);
  else
    run_typed<false, false>(m, n, k, a, b, c, accumulate);
}

}  // namespace peertrain::model
