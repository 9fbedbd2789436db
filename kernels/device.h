// The one device interface that model, parallel and comm use for GPU work. Every call
// checks the CUDA status and reports a failure as a message (the caller turns it into a
// peertrain::Error), so no CUDA header leaks into the rest of the code.
#pragma once

#include <cstddef>
#include <string>

namespace peertrain::kernels {

// Number of usable CUDA devices; 0 when there is no driver or no GPU.
int device_count();

// x ← Σ_j weight[j] · inputs[j], element-wise over `count` floats, all pointers on the
// device. Returns an empty string on success, else the CUDA error.
std::string gossip_mix(float* x, const float* const* inputs, const float* weights, int num_inputs,
                       std::size_t count);

}  // namespace peertrain::kernels
