// The state that NcclGroup's parts share, private to src/comm/nccl_*.cpp: a header of its
// own so that the group can be read a file at a time, while CUDA and NCCL types stay out of
// include/peertrain/comm/nccl_group.h. The parts are nccl_group.cpp (set-up and teardown),
// nccl_member.cpp (the Group operations of one rank) and nccl_progress.cpp (the hub's
// queues: matching messages to oneself, completion, cancel and abort).
//
// Every operation is enqueued on its member's stream, followed by a CUDA event; nothing on
// the host waits for the GPU except through those events. Asynchronous sends and receives
// hand out a Work that a progress thread completes when its event has fired (events of
// one stream fire in order, so it only ever tests the oldest of each member). Collectives
// block their caller, polling their own event against the timeout. Polling rather than
// cudaEventSynchronize is what makes timeouts and abort possible: a synchronize on a kernel
// whose partner never comes would never return.
//
// NCCL cannot withdraw work it has put on a GPU, so every way out of a stuck operation is
// ncclCommAbort, which stops the communicator's kernels and leaves the clique unusable. A
// timeout, an asynchronous NCCL error or abort() therefore aborts the whole group at once
// (as ThreadGroup does for a collective timeout): the other members would otherwise wait
// out their own timeouts for a partner that can no longer answer.
//
// Locks. NCCL communicators are not thread-safe, and the member thread, the progress thread
// and any thread calling abort() all touch them: every call on a communicator holds that
// member's comm_mutex. The hub's mutex guards the lists of operations in flight and the
// abort reason. The two are never held together, so they cannot deadlock. A member whose
// thread is inside an NCCL call (which, in blocking mode, can wait on the host for a
// partner while NCCL sets up a connection) cannot be aborted by another thread at that
// moment; the progress thread keeps trying until its comm_mutex is free.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "peertrain/comm/group.h"
#include "peertrain/core/error.h"
#include "peertrain/core/work.h"

// A named namespace, not an anonymous one, because these types cross files; the name keeps
// them apart from ThreadGroup's internals in the same library.
namespace peertrain::comm::nccl_internal {

using Clock = std::chrono::steady_clock;
using StatePtr = std::shared_ptr<Work::State>;

// How often the progress thread tests outstanding events, and how long a blocking
// collective sleeps between tests of its own: short against NCCL's latency of a few µs to
// a ms, long enough that an idle wait costs no core.
inline constexpr auto kProgressInterval = std::chrono::microseconds(50);
inline constexpr auto kCollectivePoll = std::chrono::microseconds(20);
// ncclCommGetAsyncError is cheap but takes the member's comm_mutex; a collective tests it
// once per this many polls.
inline constexpr int kAsyncCheckEvery = 64;

inline std::string cuda_failure(const char* call, cudaError_t result) {
  return str(call, " failed: ", cudaGetErrorName(result), ": ", cudaGetErrorString(result));
}

inline std::string nccl_failure(const char* call, ncclResult_t result) {
  return str(call, " failed: ", ncclGetErrorString(result));
}

// NCCL reports bad arguments as non-fatal (the call had no effect) and lost connections as
// remote or system errors; the rest are bugs or CUDA failures inside NCCL.
inline ErrorKind kind_of(ncclResult_t result) {
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: return ErrorKind::kInvalidArgument;
    case ncclSystemError:
    case ncclRemoteError: return ErrorKind::kPeerLost;
    default: return ErrorKind::kInternal;
  }
}

inline Error aborted_error(const std::string& what, const std::string& reason) {
  return Error(ErrorKind::kPeerLost, str(what, ": group aborted: ", reason));
}

// Puts back the calling thread's current device: calls on other members' devices (abort,
// cancel, set-up) must not move the caller's own later kernel launches to another GPU.
class DeviceRestorer {
 public:
  DeviceRestorer() { saved_ = cudaGetDevice(&device_) == cudaSuccess; }
  ~DeviceRestorer() {
    if (saved_) (void)cudaSetDevice(device_);
  }
  DeviceRestorer(const DeviceRestorer&) = delete;
  DeviceRestorer& operator=(const DeviceRestorer&) = delete;

 private:
  int device_ = 0;
  bool saved_ = false;
};

// An operation on a member's stream: its event fires when the operation is done. A send to
// oneself completes two requests with one copy.
struct InFlight {
  std::vector<StatePtr> states;
  cudaEvent_t event = nullptr;
};

// A send to or receive from oneself still waiting for its partner.
struct SelfMessage {
  StatePtr state;
  float* data;  // the receiver's buffer, or the sender's (only read)
  std::size_t count;
};

struct RankState {
  int rank = 0;
  int device = 0;
  cudaStream_t stream = nullptr;
  float* barrier_word = nullptr;  // barrier() is an all_reduce of this one float

  std::mutex comm_mutex;
  ncclComm_t comm = nullptr;  // null once aborted or destroyed; guarded by comm_mutex
  std::atomic<bool> comm_alive{false};  // comm != nullptr, readable without the lock

  // Guarded by Hub::mutex.
  std::deque<InFlight> in_flight;  // in stream order
  std::deque<SelfMessage> self_sends, self_recvs;
};

// Shared by the members, the progress thread and the cancel hooks of Works, which hold
// it by weak_ptr and may outlive the NcclGroup.
struct Hub {
  explicit Hub(std::string group_name) : name(std::move(group_name)) {}

  const std::string name;
  std::vector<std::unique_ptr<RankState>> ranks;

  std::mutex mutex;
  std::condition_variable progress_cv;
  bool stopping = false;          // guarded by mutex
  std::string abort_reason;       // guarded by mutex
  std::atomic<bool> aborted{false};
  // Works whose waiter timed out and completes them itself with kTimeout; an abort that
  // races with it must not complete them first with kPeerLost. Guarded by mutex.
  std::vector<const Work::State*> withdrawn;
  bool shut_down = false;  // touched only by the constructor and the destructor
  std::thread progress;

  std::string prefix(int rank) const { return str("nccl group '", name, "': rank ", rank); }

  std::string reason() {
    std::lock_guard lock(mutex);
    return abort_reason;
  }

  // Stops member r's kernels and fails its operations in flight. Without `blocking`, gives
  // up when another thread is inside an NCCL call on this communicator; the progress
  // thread then tries again.
  bool abort_comm(RankState& r, bool blocking);

  // Only after the communicator is aborted: an event that fires then proves nothing, and a
  // waiter told to give up must find its buffers no longer written.
  void fail_in_flight(RankState& r);

  // Ends every member's pending and future operations with kPeerLost and this reason (the
  // first reason wins). blocking_rank: the member whose communicator must be stopped
  // before this returns (its caller is about to hand buffers back); -1 for none.
  void abort_group(const std::string& reason, int blocking_rank);

  // Empty while the communicator is healthy. Without `blocking`, skips a communicator that
  // another thread is using (it will be tested again).
  std::string async_error(RankState& r, bool blocking);

  // Work::State::cancel, after a wait timed out. A message to oneself still waiting for
  // its partner is withdrawn; anything on the GPU can only be stopped with the group.
  bool cancel(int rank, const Work::State* state);

  // Completes a request posted after the group was aborted (kPeerLost), and hands it out.
  Work failed(StatePtr state);

  // Queues a send to or receive from oneself of member `me`, or pairs it with the oldest
  // of the other kind and enqueues their copy. Here rather than in the member because
  // cancel and abort_group search the same queues under the same mutex.
  Work post_self(RankState& me, StatePtr state, bool is_send, float* data, std::size_t count);

  // Adds an enqueued operation to its member's list, or fails it if the group was aborted
  // meanwhile (its communicator may already be gone, and no one would complete it).
  void track(RankState& r, std::vector<StatePtr> states, cudaEvent_t event);

  // One round of the progress thread over every member.
  void sweep();
  bool has_work_locked() const;
  void progress_loop();

  // Stops the progress thread and frees every CUDA and NCCL resource; idempotent, and safe
  // on a half-built group. Nothing here can throw: failures while freeing are ignored, as
  // there is no one left to report them to.
  void shutdown();
};

// Rank `rank` of the group, as the Group its worker thread uses (nccl_member.cpp).
std::unique_ptr<Group> make_member(std::shared_ptr<Hub> hub, int rank);

}  // namespace peertrain::comm::nccl_internal
