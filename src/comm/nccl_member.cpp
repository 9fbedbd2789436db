// One rank's side of NcclGroup: the Group operations that its worker thread calls. They
// check their arguments, enqueue NCCL calls on the rank's stream and wait for collectives;
// the Works they hand out are completed by nccl_progress.cpp, on other threads.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include "nccl_group_state.h"

namespace peertrain::comm::nccl_internal {
namespace {

// Deletes a collective's event on every way out of the call.
struct ScopedEvent {
  cudaEvent_t event = nullptr;
  ~ScopedEvent() {
    if (event) (void)cudaEventDestroy(event);
  }
};

class Member final : public Group {
 public:
  Member(std::shared_ptr<Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank), me_(*hub_->ranks[rank]) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(hub_->ranks.size()); }
  std::string name() const override { return hub_->name; }

  Work isend(int peer, int tag, std::span<const float> data) override {
    check_peer(peer, "isend");
    auto state = std::make_shared<Work::State>(str(hub_->prefix(rank_), " isend to rank ", peer, " (tag ", tag,
                                                      ", ", data.size(), " floats)"));
    // NCCL never writes through a send buffer; the const_cast only lets one type carry both.
    float* buffer = const_cast<float*>(data.data());
    if (peer == rank_) return post_self(std::move(state), /*is_send=*/true, buffer, data.size());
    return post_p2p(std::move(state), /*is_send=*/true, peer, buffer, data.size());
  }

  Work irecv(int peer, int tag, std::span<float> data) override {
    check_peer(peer, "irecv");
    auto state = std::make_shared<Work::State>(str(hub_->prefix(rank_), " irecv from rank ", peer, " (tag ", tag,
                                                      ", ", data.size(), " floats)"));
    if (peer == rank_) return post_self(std::move(state), /*is_send=*/false, data.data(), data.size());
    return post_p2p(std::move(state), /*is_send=*/false, peer, data.data(), data.size());
  }

  void all_reduce(std::span<float> data, double timeout_s) override {
    const std::string what = describe("all_reduce", data.size());
    if (!begin_collective(what, data.size())) return;
    check_device_span(data.data(), data.size(), "data", what);
    run_collective(what, timeout_s, "ncclAllReduce", [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclSum, comm, stream);
    });
  }

  void all_gather(std::span<const float> mine, std::span<float> all, double timeout_s) override {
    const std::string what = describe("all_gather", mine.size());
    check_parts(mine.data(), mine.size(), all.data(), all.size(), "mine", "all", what);
    if (!begin_collective(what, mine.size())) return;
    check_device_span(mine.data(), mine.size(), "mine", what);
    check_device_span(all.data(), all.size(), "all", what);
    // In place when mine is this rank's part of all, which NCCL recognises by the pointers.
    run_collective(what, timeout_s, "ncclAllGather", [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllGather(mine.data(), all.data(), mine.size(), ncclFloat, comm, stream);
    });
  }

  void reduce_scatter(std::span<const float> all, std::span<float> mine, double timeout_s) override {
    const std::string what = describe("reduce_scatter", mine.size());
    check_parts(mine.data(), mine.size(), all.data(), all.size(), "mine", "all", what);
    if (!begin_collective(what, mine.size())) return;
    check_device_span(all.data(), all.size(), "all", what);
    check_device_span(mine.data(), mine.size(), "mine", what);
    run_collective(what, timeout_s, "ncclReduceScatter", [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclReduceScatter(all.data(), mine.data(), mine.size(), ncclFloat, ncclSum, comm, stream);
    });
  }

  void broadcast(std::span<float> data, int root, double timeout_s) override {
    const std::string what = describe("broadcast", data.size());
    if (root < 0 || root >= size())
      throw Error(ErrorKind::kInvalidArgument, str(what, ": root ", root, " is outside [0, ", size(), ")"));
    if (!begin_collective(what, data.size())) return;
    check_device_span(data.data(), data.size(), "data", what);
    run_collective(what, timeout_s, "ncclBroadcast", [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclBroadcast(data.data(), data.data(), data.size(), ncclFloat, root, comm, stream);
    });
  }

  void barrier(double timeout_s) override {
    const std::string what = str(hub_->prefix(rank_), " barrier");
    begin_collective(what, 1);
    run_collective(what, timeout_s, "ncclAllReduce", [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(me_.barrier_word, me_.barrier_word, 1, ncclFloat, ncclSum, comm, stream);
    });
  }

  void abort(const std::string& reason) override {
    // This rank's communicator stops before returning: its caller may free buffers next.
    hub_->abort_group(str("rank ", rank_, ": ", reason), rank_);
  }

 private:
  std::string describe(const char* op, std::size_t count) const {
    return str(hub_->prefix(rank_), " ", op, " (", count, " floats)");
  }

  void check_peer(int peer, const char* op) const {
    if (peer < 0 || peer >= size())
      throw Error(ErrorKind::kInvalidArgument,
                  str(hub_->prefix(rank_), " ", op, ": peer ", peer, " is outside [0, ", size(), ")"));
  }

  // NCCL would take a host pointer and fault on the GPU, which ends the whole process's
  // CUDA context; cudaPointerGetAttributes tells the mistake apart for about a µs.
  void check_device_span(const float* data, std::size_t count, const char* argument, const std::string& what) const {
    if (count == 0) return;
    cudaPointerAttributes attributes{};
    const cudaError_t result = cudaPointerGetAttributes(&attributes, data);
    if (result != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it so the next call does not report it
      throw Error(ErrorKind::kInvalidArgument, str(what, ": ", argument, " is not device memory (",
                                                   cuda_failure("cudaPointerGetAttributes", result), ")"));
    }
    if (attributes.type == cudaMemoryTypeManaged) return;
    if (attributes.type != cudaMemoryTypeDevice)
      throw Error(ErrorKind::kInvalidArgument,
                  str(what, ": ", argument, " points to host memory; NcclGroup needs device memory on device ",
                      me_.device));
    if (attributes.device != me_.device)
      throw Error(ErrorKind::kInvalidArgument, str(what, ": ", argument, " is on device ", attributes.device,
                                                   " but rank ", rank_, " runs on device ", me_.device));
  }

  // all is size()·mine, and mine is either apart from all or exactly this rank's part of it:
  // any other overlap would have NCCL read what it is writing.
  void check_parts(const float* mine, std::size_t mine_count, const float* all, std::size_t all_count,
                   const char* mine_name, const char* all_name, const std::string& what) const {
    const std::size_t expected = mine_count * static_cast<std::size_t>(size());
    if (all_count != expected)
      throw Error(ErrorKind::kInvalidArgument, str(what, ": ", all_name, " holds ", all_count, " floats, expected ",
                                                   size(), " × ", mine_count, " = ", expected));
    if (mine_count == 0) return;
    const std::less<const float*> before;
    const bool apart = !before(mine, all + all_count) || !before(all, mine + mine_count);
    if (!apart && mine != all + static_cast<std::size_t>(rank_) * mine_count)
      throw Error(ErrorKind::kInvalidArgument,
                  str(what, ": ", mine_name, " overlaps ", all_name, " but is not rank ", rank_, "'s part of it"));
  }

  // False when there is nothing to move: an empty collective never reaches NCCL, and so
  // synchronises nobody (ranks that all pass empty spans still agree on the sequence).
  bool begin_collective(const std::string& what, std::size_t count) const {
    if (hub_->aborted) throw aborted_error(what, hub_->reason());
    return count > 0;
  }

  std::function<bool()> make_cancel(const Work::State* state) const {
    return [weak = std::weak_ptr<Hub>(hub_), rank = rank_, state] {
      const auto hub = weak.lock();
      if (!hub) return true;  // the group is gone, and shut everything down on its way
      return hub->cancel(rank, state);
    };
  }

  // Enqueues one NCCL call on this member's stream and records an event after it. A failure
  // aborts the group (unless NCCL calls it a harmless bad argument): the other ranks would
  // otherwise wait for an operation that never came.
  template <typename Call>
  cudaEvent_t enqueue(const std::string& what, const char* call_name, Call call) {
    std::string failure;
    ErrorKind kind = ErrorKind::kInternal;
    cudaEvent_t event = nullptr;
    bool gone = false;
    {
      std::lock_guard lock(me_.comm_mutex);
      if (!me_.comm) {
        gone = true;
      } else if (const cudaError_t set = cudaSetDevice(me_.device); set != cudaSuccess) {
        failure = cuda_failure("cudaSetDevice", set);
      } else if (const ncclResult_t result = call(me_.comm, me_.stream); result != ncclSuccess) {
        failure = nccl_failure(call_name, result);
        kind = kind_of(result);
        if (const char* detail = ncclGetLastError(me_.comm); detail && *detail) failure += str(" (", detail, ")");
      } else if (const cudaError_t created = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
                 created != cudaSuccess) {
        failure = cuda_failure("cudaEventCreateWithFlags", created);
        event = nullptr;
      } else if (const cudaError_t recorded = cudaEventRecord(event, me_.stream); recorded != cudaSuccess) {
        failure = cuda_failure("cudaEventRecord", recorded);
        (void)cudaEventDestroy(event);
        event = nullptr;
      }
    }
    if (gone) throw aborted_error(what, hub_->reason());
    if (!failure.empty()) {
      const std::string message = str(what, ": ", failure);
      if (kind != ErrorKind::kInvalidArgument) hub_->abort_group(message, rank_);
      throw Error(kind, message);
    }
    return event;
  }

  Work post_p2p(StatePtr state, bool is_send, int peer, float* data, std::size_t count) {
    if (hub_->aborted) return hub_->failed(std::move(state));
    // Both sides skip an empty message alike, so the order of the others is unchanged.
    if (count == 0) {
      state->complete();
      return Work(std::move(state));
    }
    const std::string what = state->what();  // a copy: State builds it on demand
    check_device_span(data, count, is_send ? "the send buffer" : "the receive buffer", what);
    cudaEvent_t event = is_send ? enqueue(what, "ncclSend",
                                          [&](ncclComm_t comm, cudaStream_t stream) {
                                            return ncclSend(data, count, ncclFloat, peer, comm, stream);
                                          })
                                : enqueue(what, "ncclRecv", [&](ncclComm_t comm, cudaStream_t stream) {
                                    return ncclRecv(data, count, ncclFloat, peer, comm, stream);
                                  });
    state->cancel = make_cancel(state.get());
    hub_->track(me_, {state}, event);
    return Work(std::move(state));
  }

  // NCCL accepts a send to oneself only fused with its receive in one ncclGroupStart/End,
  // which two separate calls cannot be; so the hub matches the pair itself, in order of
  // posting like NCCL's, and moves it by one device-to-device copy on the stream.
  Work post_self(StatePtr state, bool is_send, float* data, std::size_t count) {
    if (hub_->aborted) return hub_->failed(std::move(state));
    check_device_span(data, count, is_send ? "the send buffer" : "the receive buffer", state->what());
    state->cancel = make_cancel(state.get());
    return hub_->post_self(me_, std::move(state), is_send, data, count);
  }

  // Enqueues the collective and waits for its event against the deadline. Every way out
  // except success stops this rank's communicator first, so that no kernel still touches
  // the caller's buffers when the call returns.
  template <typename Call>
  void run_collective(const std::string& what, double timeout_s, const char* call_name, Call call) {
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(timeout_s, 0.0)));
    ScopedEvent event{enqueue(what, call_name, call)};
    for (int poll = 1;; ++poll) {
      const cudaError_t result = cudaEventQuery(event.event);
      if (result == cudaSuccess) {
        // An abort while it ran may have cut it short; the event fires either way.
        if (hub_->aborted) throw aborted_error(what, hub_->reason());
        return;
      }
      if (result != cudaErrorNotReady) {
        const std::string message = str(what, ": ", cuda_failure("cudaEventQuery", result));
        hub_->abort_group(message, rank_);
        throw Error(ErrorKind::kInternal, message);
      }
      if (hub_->aborted) {
        hub_->abort_comm(me_, /*blocking=*/true);
        throw aborted_error(what, hub_->reason());
      }
      if (poll % kAsyncCheckEvery == 0) {
        if (const std::string failure = hub_->async_error(me_, /*blocking=*/true); !failure.empty()) {
          const std::string message = str(what, ": ", failure);
          hub_->abort_group(message, rank_);
          throw Error(ErrorKind::kPeerLost, message);
        }
      }
      if (Clock::now() >= deadline) {
        // The other ranks can no longer agree with this one on where the sequence stands.
        const std::string message = str(what, " timed out after ", timeout_s, " s");
        hub_->abort_group(message, rank_);
        throw Error(ErrorKind::kTimeout, message);
      }
      std::this_thread::sleep_for(kCollectivePoll);
    }
  }

  std::shared_ptr<Hub> hub_;
  const int rank_;
  RankState& me_;
};

}  // namespace

std::unique_ptr<Group> make_member(std::shared_ptr<Hub> hub, int rank) {
  return std::make_unique<Member>(std::move(hub), rank);
}

}  // namespace peertrain::comm::nccl_internal
