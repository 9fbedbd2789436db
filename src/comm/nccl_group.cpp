// NcclGroup's public surface, and the set-up and teardown of its clique: checking the
// devices, ncclCommInitAll, each rank's stream, and the orderly or aborting shutdown. These
// run once per group, on the thread that owns it, so they read best apart from the
// operations (nccl_member.cpp) and the progress thread (nccl_progress.cpp).
#include "peertrain/comm/nccl_group.h"

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "nccl_group_state.h"

namespace peertrain::comm {
namespace nccl_internal {

void Hub::shutdown() {
  if (shut_down) return;
  shut_down = true;
  const DeviceRestorer restorer;
  {
    std::lock_guard lock(mutex);
    stopping = true;
  }
  progress_cv.notify_all();
  if (progress.joinable()) progress.join();

  // Operations the GPU has finished complete normally; if any is still running, or a
  // communicator failed, every communicator is aborted, since ncclCommDestroy would wait
  // for kernels that may never end.
  bool healthy = !aborted;
  for (auto& r : ranks) {
    std::vector<InFlight> finished;
    {
      std::lock_guard lock(mutex);
      while (!aborted && !r->in_flight.empty() && cudaEventQuery(r->in_flight.front().event) == cudaSuccess) {
        finished.push_back(std::move(r->in_flight.front()));
        r->in_flight.pop_front();
      }
      if (!r->in_flight.empty()) healthy = false;
    }
    for (auto& op : finished) {
      (void)cudaEventDestroy(op.event);
      for (auto& state : op.states) state->complete();
    }
    if (healthy && !async_error(*r, /*blocking=*/true).empty()) healthy = false;
  }
  if (!healthy) {
    abort_group("the nccl group was destroyed", -1);
    for (auto& r : ranks) abort_comm(*r, /*blocking=*/true);
  } else {
    {
      std::lock_guard lock(mutex);
      aborted = true;
      abort_reason = "the nccl group was destroyed";
    }
    // The single-process pattern of NCCL's own examples: destroy each communicator of
    // an ncclCommInitAll clique in turn from one thread.
    for (auto& r : ranks) {
      std::lock_guard lock(r->comm_mutex);
      if (r->comm) {
        (void)cudaSetDevice(r->device);
        (void)ncclCommDestroy(r->comm);
        r->comm = nullptr;
        r->comm_alive = false;
      }
    }
    abort_group("the nccl group was destroyed", -1);  // fails unmatched self messages
  }
  for (auto& r : ranks) {
    (void)cudaSetDevice(r->device);
    if (r->barrier_word) (void)cudaFree(r->barrier_word);
    if (r->stream) (void)cudaStreamDestroy(r->stream);
    r->barrier_word = nullptr;
    r->stream = nullptr;
  }
}

}  // namespace nccl_internal

using nccl_internal::cuda_failure;
using nccl_internal::DeviceRestorer;
using nccl_internal::Hub;
using nccl_internal::kind_of;
using nccl_internal::nccl_failure;
using nccl_internal::RankState;

struct NcclGroup::Shared {
  std::shared_ptr<Hub> hub;
  std::vector<std::unique_ptr<Group>> members;
};

NcclGroup::NcclGroup(std::vector<int> devices, std::string name) {
  const std::string where = str("nccl group '", name, "'");
  if (devices.empty()) throw Error(ErrorKind::kInvalidArgument, str(where, ": needs at least one device"));
  // NCCL cannot put two ranks of one communicator on one GPU (it hangs or fails at init).
  for (std::size_t i = 0; i < devices.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (devices[i] == devices[j])
        throw Error(ErrorKind::kInvalidArgument, str(where, ": device ", devices[i], " is listed twice (ranks ", j,
                                                     " and ", i, "); NCCL needs one GPU per rank"));
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  std::string no_device;
  if (counted != cudaSuccess) {
    // No driver or no GPU: every device id is out of range, which says what is wrong.
    no_device = str(" (", cuda_failure("cudaGetDeviceCount", counted), ")");
    (void)cudaGetLastError();
    count = 0;
  }
  for (std::size_t i = 0; i < devices.size(); ++i)
    if (devices[i] < 0 || devices[i] >= count)
      throw Error(ErrorKind::kInvalidArgument, str(where, ": device ", devices[i], " of rank ", i,
                                                   " is outside [0, ", count, "), the CUDA devices of this machine",
                                                   no_device));

  const DeviceRestorer restorer;
  shared_ = std::make_unique<Shared>();
  shared_->hub = std::make_shared<Hub>(std::move(name));
  Hub& hub = *shared_->hub;
  const int size = static_cast<int>(devices.size());
  for (int rank = 0; rank < size; ++rank) {
    hub.ranks.push_back(std::make_unique<RankState>());
    hub.ranks.back()->rank = rank;
    hub.ranks.back()->device = devices[rank];
  }
  try {
    // ncclCommInitAll blocks without a time limit, which is acceptable here: all ranks are
    // in this process and this call, so there is no partner that could fail to come.
    std::vector<ncclComm_t> comms(devices.size(), nullptr);
    if (const ncclResult_t result = ncclCommInitAll(comms.data(), size, devices.data()); result != ncclSuccess)
      throw Error(kind_of(result) == ErrorKind::kInvalidArgument ? ErrorKind::kInvalidArgument : ErrorKind::kInternal,
                  str(where, ": ", nccl_failure("ncclCommInitAll", result)));
    for (int rank = 0; rank < size; ++rank) {
      RankState& r = *hub.ranks[rank];
      r.comm = comms[rank];
      r.comm_alive = true;
    }
    for (int rank = 0; rank < size; ++rank) {
      RankState& r = *hub.ranks[rank];
      const auto check = [&](cudaError_t result, const char* call) {
        if (result != cudaSuccess)
          throw Error(ErrorKind::kInternal, str(hub.prefix(rank), " (device ", r.device, "): ", cuda_failure(call, result)));
      };
      check(cudaSetDevice(r.device), "cudaSetDevice");
      // Non-blocking: the legacy default stream, which other code may use, must not
      // serialise with communication.
      check(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      void* word = nullptr;
      check(cudaMalloc(&word, sizeof(float)), "cudaMalloc");
      r.barrier_word = static_cast<float*>(word);
      // Zero, so that the sums of later barriers stay zero instead of growing from garbage.
      check(cudaMemsetAsync(r.barrier_word, 0, sizeof(float), r.stream), "cudaMemsetAsync");
    }
    hub.progress = std::thread([shared_hub = &hub] { shared_hub->progress_loop(); });
  } catch (...) {
    hub.shutdown();
    throw;
  }
  for (int rank = 0; rank < size; ++rank) shared_->members.push_back(nccl_internal::make_member(shared_->hub, rank));
}

NcclGroup::~NcclGroup() { shared_->hub->shutdown(); }

int NcclGroup::size() const { return static_cast<int>(shared_->members.size()); }

Group& NcclGroup::member(int rank) {
  if (rank < 0 || rank >= size())
    throw Error(ErrorKind::kInvalidArgument,
                str("nccl group '", shared_->hub->name, "': rank ", rank, " is outside [0, ", size(), ")"));
  return *shared_->members[rank];
}

void* NcclGroup::stream(int rank) const {
  if (rank < 0 || rank >= size())
    throw Error(ErrorKind::kInvalidArgument,
                str("nccl group '", shared_->hub->name, "': rank ", rank, " is outside [0, ", size(), ")"));
  return shared_->hub->ranks[rank]->stream;
}

}  // namespace peertrain::comm
