// GEMM through cuBLAS. TF32 and BF16 are cuBLAS's "fast" float32 compute types: the
// inputs stay float32 in memory and are rounded inside the tensor cores, so one buffer
// layout serves every precision and the CPU twin is the same call in model::Gemm.
#include "compat.h"
#include "cublas_library.h"
#include "peertrain/kernels/ops.h"
#include "peertrain/core/error.h"

namespace peertrain::kernels {
namespace {

using detail::cublas;

void check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorKind::kInternal, str("cuBLAS ", call, ": ", cublas().status_string(status)));
}

cublasComputeType_t compute_type(GemmPrecision precision) {
  switch (precision) {
    case GemmPrecision::kTf32:
      return CUBLAS_COMPUTE_32F_FAST_TF32;
    case GemmPrecision::kBf16:
      return CUBLAS_COMPUTE_32F_FAST_16BF;
    case GemmPrecision::kFp32:
      break;
  }
  return CUBLAS_COMPUTE_32F;
}

}  // namespace

Blas::Blas(Stream stream, GemmPrecision precision) : stream_(stream), precision_(precision) {
  cublasHandle_t handle = nullptr;
  check(cublas().create(&handle), "cublasCreate");
  handle_ = handle;
  check(cublas().set_stream(handle, static_cast<cudaStream_t>(stream.handle)), "cublasSetStream");
}

Blas::~Blas() {
  if (handle_ != nullptr) cublas().destroy(static_cast<cublasHandle_t>(handle_));
}

void Blas::gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, const float* b, float* c,
                bool accumulate) {
  if (m == 0 || n == 0) return;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  if (k == 0) {  // cuBLAS leaves C alone when k is 0; the product is zero
    if (!accumulate) zero(c, sizeof(float) * static_cast<std::size_t>(m) * n, stream_);
    return;
  }
  check(cublas().gemm_ex(static_cast<cublasHandle_t>(handle_), trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                         trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_R_32F, trans_a ? k : m, b,
                         CUDA_R_32F, trans_b ? n : k, &beta, c, CUDA_R_32F, m, compute_type(precision_),
                         CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

}  // namespace peertrain::kernels
