#include "cublas_library.h"

#include <dlfcn.h>

#include <string>

#include "peertrain/core/error.h"

namespace peertrain::kernels::detail {
namespace {

// Where to look: the soname the toolkit we built against gives it (found through the
// loader's path and this program's RUNPATH), then the same name in the toolkit's folder.
constexpr const char* kCandidates[] = {PEERTRAIN_CUBLAS_SONAME, PEERTRAIN_CUDA_LIBRARY_DIR "/" PEERTRAIN_CUBLAS_SONAME};

template <typename F>
void resolve(void* library, const char* symbol, F& into) {
  void* address = dlsym(library, symbol);
  if (address == nullptr) {
    dlclose(library);
    throw Error(ErrorKind::kIo, str(PEERTRAIN_CUBLAS_SONAME, " has no symbol ", symbol,
                                    ": it is not the cuBLAS this program was built against"));
  }
  into = reinterpret_cast<F>(address);
}

CublasLibrary open_cublas() {
  void* library = nullptr;
  std::string reasons;
  for (const char* name : kCandidates) {
    library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) break;
    const char* reason = dlerror();  // names the file itself
    reasons += str("\n  ", reason != nullptr ? reason : str(name, ": not found"));
  }
  if (library == nullptr)
    throw Error(ErrorKind::kIo, str("cannot open cuBLAS, which the GPU path needs for its GEMMs:", reasons));
  CublasLibrary api;
  resolve(library, "cublasCreate_v2", api.create);
  resolve(library, "cublasDestroy_v2", api.destroy);
  resolve(library, "cublasSetStream_v2", api.set_stream);
  resolve(library, "cublasGemmEx", api.gemm_ex);
  resolve(library, "cublasGetStatusString", api.status_string);
  return api;  // the library stays open for the life of the process
}

}  // namespace

const CublasLibrary& cublas() {
  static const CublasLibrary api = open_cublas();
  return api;
}

}  // namespace peertrain::kernels::detail
