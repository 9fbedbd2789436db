// cuBLAS, opened on first use rather than linked.
//
// Linking libcublas makes every start of the program pay for it: its static initializers
// and its ~390,000 relocations (cuBLASLt's) cost about 0.5 s of CPU per process on a
// 2-core VM, before main, whether or not the run touches a GPU. The peertrain program
// starts one process per peer, so the CPU path paid that on every launch. Opening the
// library only when a Blas is made confines the cost to GPU runs.
#pragma once

#include <cublas_v2.h>

namespace peertrain::kernels::detail {

// The cuBLAS entry points this module calls.
struct CublasLibrary {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  // cublas_api.h overloads cublasGemmEx in C++ (a cudaDataType compute type): name the
  // exported C entry point's type.
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// Opens cuBLAS once (thread-safe) and returns its entry points; throws a peertrain Error
// naming the library and the loader's reason when it cannot be opened.
const CublasLibrary& cublas();

}  // namespace peertrain::kernels::detail
