// The byte-level GPT of model/transformer.h on one GPU, composed from kernels/ops.h in the
// order and with the layout of the CPU model (src/model/transformer.cpp), so the two are
// serial twins: tests/device/ holds them equal on the CPU emulator, and on a device when
// there is one. One rank holds whole sequences (--sp 1 --pp 1).
#pragma once

#include <memory>

#include "peertrain/model/device_model.h"

namespace peertrain::device {

// Throws kInvalidArgument naming the flag for what the device path does not run: vit,
// a head_dim the attention kernel has no instance for.
std::unique_ptr<model::DeviceModel> make_device_transformer(const model::TransformerConfig& config,
                                                            const model::DeviceOptions& options);

// The factory and device count that the peertrain command registers (model/device_model.h).
model::DeviceBackend backend();

}  // namespace peertrain::device
