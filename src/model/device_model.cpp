#include "peertrain/model/device_model.h"

#include <mutex>

#include "peertrain/core/error.h"

namespace peertrain::model {
namespace {

std::mutex backend_mutex;
DeviceBackend backend;

}  // namespace

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  throw Error(ErrorKind::kInvalidArgument, str("--device '", name, "' is not one of cpu, cuda"));
}

const char* device_name(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

GemmMode parse_gemm_mode(const std::string& name) {
  if (name == "fp32") return GemmMode::kFp32;
  if (name == "tf32") return GemmMode::kTf32;
  if (name == "bf16") return GemmMode::kBf16;
  throw Error(ErrorKind::kInvalidArgument, str("--gemm-precision '", name, "' is not one of fp32, tf32, bf16"));
}

void register_device_backend(DeviceBackend b) {
  std::lock_guard lock(backend_mutex);
  backend = b;
}

int cuda_device_count() {
  std::lock_guard lock(backend_mutex);
  return backend.device_count != nullptr ? backend.device_count() : 0;
}

int require_cuda_device() {
  DeviceBackend b;
  {
    std::lock_guard lock(backend_mutex);
    b = backend;
  }
  if (b.make == nullptr)
    throw Error(ErrorKind::kInvalidArgument,
                "--device cuda: this peertrain was built without CUDA (CMake found no nvcc, or PEERTRAIN_CUDA=OFF)");
  const int count = b.device_count();
  if (count == 0) throw Error(ErrorKind::kInvalidArgument, "--device cuda: no CUDA device is visible to this process");
  return count;
}

std::unique_ptr<DeviceModel> make_device_model(const TransformerConfig& config, const DeviceOptions& options) {
  const int count = require_cuda_device();
  DeviceBackend b;
  {
    std::lock_guard lock(backend_mutex);
    b = backend;
  }
  if (options.device < 0 || options.device >= count)
    throw Error(ErrorKind::kInvalidArgument,
                str("--device cuda: device ", options.device, " does not exist (", count, " visible)"));
  return b.make(config, options);
}

}  // namespace peertrain::model
