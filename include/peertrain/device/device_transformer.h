// The byte-level GPT of model/transformer.h on one GPU, composed from kernels/ops.h in the
// order and with the layout of the CPU model (src/model/transformer.cpp), so the two are
// serial twins: tests/device/ holds them equal on the CPU emulator, and on a device when
// there is one. One rank holds whole sequences and every unit (--sp 1 --pp 1).
#pragma once

#include <memory>

#include "peertrain/model/device_model.h"

namespace peertrain::comm {
class Group;
}

namespace peertrain::device {

// Throws kInvalidArgument naming the flag for what the device path does not run: vit,
// a head_dim the attention kernel has no instance for. options.sp > 1 gives the
// sequence-parallel model of sequence_parallel.cpp, options.pp > 1 the pipeline.
std::unique_ptr<model::DeviceModel> make_device_transformer(const model::TransformerConfig& config,
                                                            const model::DeviceOptions& options);

// One rank of a sequence group: it holds some tokens of every sequence (the batch's
// positions), runs attention around the group's ring and all-reduces the gradient over
// the group, which must act on device memory. Only forward_backward may be called.
std::unique_ptr<model::DeviceModel> make_sequence_rank(const model::TransformerConfig& config,
                                                       const model::DeviceOptions& options,
                                                       comm::Group* sequence_group);

// --sp S on the device: S ranks, one thread and one GPU each, over NcclGroup (the CPU
// emulator: a ThreadGroup). Needs S visible devices.
std::unique_ptr<model::DeviceModel> make_sequence_parallel(const model::TransformerConfig& config,
                                                           const model::DeviceOptions& options);

// --pp P on the device (device_pipeline.cpp): P stages of consecutive units, one thread
// each, stage s on device options.device + s mod the visible devices, over options.microbatches
// micro-batches in the order of options.schedule (gpipe, 1f1b, eager-1f1b). Throws
// kInvalidArgument naming the flag for a schedule it does not run, --sp > 1, more stages
// than units, or a bad --stages split.
std::unique_ptr<model::DeviceModel> make_device_pipeline(const model::TransformerConfig& config,
                                                         const model::DeviceOptions& options);

// The factory and device count that the peertrain command registers (model/device_model.h).
model::DeviceBackend backend();

}  // namespace peertrain::device
