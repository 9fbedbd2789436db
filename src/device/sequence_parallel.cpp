// --sp S on the device: S sequence ranks, each a thread driving its own GPU with its own
// DeviceTransformer over the tokens sequence_positions gives it, joined by a group that
// moves device memory — NcclGroup on GPUs, a ThreadGroup over the emulator's memory in
// the emulated build. Attention runs around the group's ring and every rank ends the
// step with the all-reduced gradient; rank 0's is the answer.
#include <numeric>
#include <thread>
#include <vector>

#include "peertrain/device/device_transformer.h"
#include "peertrain/kernels/device.h"
#include "peertrain/comm/failure_latch.h"
#include "peertrain/config.h"
#include "peertrain/core/error.h"
#include "peertrain/model/batch_slice.h"
#include "peertrain/parallel/ring_attention.h"
#if PEERTRAIN_DEVICE_EMULATED
#include "peertrain/comm/thread_group.h"
#elif PEERTRAIN_HAVE_NCCL
#include "peertrain/comm/nccl_group.h"
#endif

namespace peertrain::device {
namespace {

#if PEERTRAIN_DEVICE_EMULATED
using SequenceGroup = comm::ThreadGroup;
std::unique_ptr<SequenceGroup> make_group(int ranks) {
  return std::make_unique<comm::ThreadGroup>(ranks, "device sequence group");
}
int device_of(int) { return 0; }  // the emulator has one device, shared by every rank
#elif PEERTRAIN_HAVE_NCCL
using SequenceGroup = comm::NcclGroup;
std::unique_ptr<SequenceGroup> make_group(int ranks) {
  std::vector<int> devices(static_cast<std::size_t>(ranks));
  std::iota(devices.begin(), devices.end(), 0);
  return std::make_unique<comm::NcclGroup>(std::move(devices), "device sequence group");
}
int device_of(int rank) { return rank; }
#endif

#if PEERTRAIN_DEVICE_EMULATED || PEERTRAIN_HAVE_NCCL
class SequenceParallel final : public model::DeviceModel {
 public:
  SequenceParallel(const model::TransformerConfig& config, const model::DeviceOptions& options)
      : config_(config), options_(options), group_(make_group(options.sp)) {
    for (int r = 0; r < options.sp; ++r) {
      model::DeviceOptions rank_options = options;
      rank_options.device = device_of(r);
      rank_options.sp = 1;
      ranks_.push_back(make_sequence_rank(config, rank_options, &group_->member(r)));
    }
    model::DeviceOptions whole = options;
    whole.device = device_of(0);
    whole.sp = 1;
    evaluator_ = make_device_transformer(config, whole);  // whole sequences, for evaluate()
    scratch_.resize(static_cast<std::size_t>(options.sp));
    slices_.resize(static_cast<std::size_t>(options.sp));
  }

  std::string describe() const override {
    return str(options_.sp, " sequence ranks (", options_.zigzag ? "zigzag" : "contiguous", "), rank 0 on ",
               ranks_[0]->describe());
  }

  std::size_t peak_device_bytes() const override { return kernels::peak_allocated_bytes(); }

  float forward_backward(std::span<const float> params, const model::TokenBatch& batch,
                         std::span<float> grads) override {
    const int ranks = options_.sp;
    std::vector<float> losses(static_cast<std::size_t>(ranks), 0.0f);
    comm::FailureLatch failure;
    for (int r = 0; r < ranks; ++r) failure.watch(group_->member(r));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        try {
          const std::vector<int> positions = parallel::sequence_positions(
              batch.tokens, ranks, r, options_.zigzag ? parallel::SequenceSplit::kZigzag : parallel::SequenceSplit::kContiguous);
          model::BatchSlice& mine = slices_[static_cast<std::size_t>(r)];
          model::slice_batch(config_, batch, 0, batch.batch, positions, mine);
          std::vector<float>& scratch = scratch_[static_cast<std::size_t>(r)];
          if (r != 0) scratch.assign(grads.size(), 0.0f);
          // Every rank ends with the same all-reduced gradient: rank 0 adds it into grads.
          losses[static_cast<std::size_t>(r)] = ranks_[static_cast<std::size_t>(r)]->forward_backward(
              params, mine.batch, r == 0 ? grads : std::span<float>(scratch));
        } catch (...) {
          failure.record(std::current_exception(), str("sequence rank ", r));
        }
      });
    for (std::thread& t : threads) t.join();
    failure.rethrow();
    return std::accumulate(losses.begin(), losses.end(), 0.0f);
  }

  model::LossSums evaluate(std::span<const float> params, const model::TokenBatch& batch,
                           bool params_changed) override {
    return evaluator_->evaluate(params, batch, params_changed);
  }

 private:
  model::TransformerConfig config_;
  model::DeviceOptions options_;
  std::unique_ptr<SequenceGroup> group_;
  std::vector<std::unique_ptr<model::DeviceModel>> ranks_;
  std::unique_ptr<model::DeviceModel> evaluator_;
  std::vector<std::vector<float>> scratch_;
  std::vector<model::BatchSlice> slices_;  // each rank's tokens of the step's batch
};
#endif

}  // namespace

std::unique_ptr<model::DeviceModel> make_sequence_parallel(const model::TransformerConfig& config,
                                                           const model::DeviceOptions& options) {
#if PEERTRAIN_DEVICE_EMULATED || PEERTRAIN_HAVE_NCCL
  const int devices = kernels::device_count();
  if (!kernels::emulated() && options.sp > devices)
    throw Error(ErrorKind::kInvalidArgument,
                str("--device cuda --sp ", options.sp, " needs ", options.sp,
                    " GPUs (NCCL puts one sequence rank on each), ", devices, " visible"));
  (void)parallel::sequence_positions(config.seq, options.sp, 0,
                                     options.zigzag ? parallel::SequenceSplit::kZigzag
                                                    : parallel::SequenceSplit::kContiguous);  // T divisible?
  return std::make_unique<SequenceParallel>(config, options);
#else
  (void)config;
  throw Error(ErrorKind::kInvalidArgument,
              str("--device cuda --sp ", options.sp, ": this build has CUDA but no NCCL, which sequence ranks need"));
#endif
}

}  // namespace peertrain::device
