#include <cuda_runtime.h>

#include "device.h"

namespace peertrain::kernels {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

}  // namespace peertrain::kernels
