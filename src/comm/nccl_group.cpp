// NcclGroup: the Group backend for workers that each drive one GPU of one process.
//
// Every operation is enqueued on its member's stream, followed by a CUDA event; nothing on
// the host waits for the GPU except through those events. Asynchronous sends and receives
// hand out a Request that a progress thread completes when its event has fired (events of
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
#include "peertrain/comm/nccl_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "peertrain/core/error.h"
#include "request_state.h"

namespace peertrain::comm {
namespace {

using Clock = std::chrono::steady_clock;
using StatePtr = std::shared_ptr<Request::State>;

// How often the progress thread tests outstanding events, and how long a blocking
// collective sleeps between tests of its own: short against NCCL's latency of a few µs to
// a ms, long enough that an idle wait costs no core.
constexpr auto kProgressInterval = std::chrono::microseconds(50);
constexpr auto kCollectivePoll = std::chrono::microseconds(20);
// ncclCommGetAsyncError is cheap but takes the member's comm_mutex; a collective tests it
// once per this many polls.
constexpr int kAsyncCheckEvery = 64;

std::string cuda_failure(const char* call, cudaError_t result) {
  return str(call, " failed: ", cudaGetErrorName(result), ": ", cudaGetErrorString(result));
}

std::string nccl_failure(const char* call, ncclResult_t result) {
  return str(call, " failed: ", ncclGetErrorString(result));
}

// NCCL reports bad arguments as non-fatal (the call had no effect) and lost connections as
// remote or system errors; the rest are bugs or CUDA failures inside NCCL.
ErrorKind kind_of(ncclResult_t result) {
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: return ErrorKind::kInvalidArgument;
    case ncclSystemError:
    case ncclRemoteError: return ErrorKind::kPeerLost;
    default: return ErrorKind::kInternal;
  }
}

Error aborted_error(const std::string& what, const std::string& reason) {
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

// Shared by the members, the progress thread and the cancel hooks of Requests, which hold
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
  // Requests whose waiter timed out and completes them itself with kTimeout; an abort that
  // races with it must not complete them first with kPeerLost. Guarded by mutex.
  std::vector<const Request::State*> withdrawn;
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
  bool abort_comm(RankState& r, bool blocking) {
    {
      std::unique_lock lock(r.comm_mutex, std::defer_lock);
      if (blocking)
        lock.lock();
      else if (!lock.try_lock())
        return false;
      if (r.comm) {
        // Nobody can act on a failure here: the communicator is gone either way.
        const DeviceRestorer restorer;
        (void)cudaSetDevice(r.device);
        (void)ncclCommAbort(r.comm);
        r.comm = nullptr;
        r.comm_alive = false;
      }
    }
    fail_in_flight(r);
    return true;
  }

  // Only after the communicator is aborted: an event that fires then proves nothing, and a
  // waiter told to give up must find its buffers no longer written.
  void fail_in_flight(RankState& r) {
    std::deque<InFlight> failed;
    std::vector<const Request::State*> skip;
    std::string why;
    {
      std::lock_guard lock(mutex);
      failed.swap(r.in_flight);
      skip = withdrawn;
      why = abort_reason;
    }
    for (auto& op : failed) {
      (void)cudaEventDestroy(op.event);  // released once the stream passes it
      for (auto& state : op.states)
        if (std::find(skip.begin(), skip.end(), state.get()) == skip.end())
          state->complete(std::make_exception_ptr(aborted_error(state->what, why)));
    }
  }

  // Ends every member's pending and future operations with kPeerLost and this reason (the
  // first reason wins). blocking_rank: the member whose communicator must be stopped
  // before this returns (its caller is about to hand buffers back); -1 for none.
  void abort_group(const std::string& reason, int blocking_rank) {
    std::vector<SelfMessage> unmatched;
    {
      std::lock_guard lock(mutex);
      if (!aborted) {
        abort_reason = reason;
        aborted = true;
      }
      for (auto& r : ranks) {
        for (auto* queue : {&r->self_sends, &r->self_recvs}) {
          unmatched.insert(unmatched.end(), queue->begin(), queue->end());
          queue->clear();
        }
      }
    }
    const std::string why = this->reason();
    for (auto& message : unmatched)
      message.state->complete(std::make_exception_ptr(aborted_error(message.state->what, why)));
    for (auto& r : ranks) abort_comm(*r, r->rank == blocking_rank);
    progress_cv.notify_all();
  }

  // Empty while the communicator is healthy. Without `blocking`, skips a communicator that
  // another thread is using (it will be tested again).
  std::string async_error(RankState& r, bool blocking) {
    std::unique_lock lock(r.comm_mutex, std::defer_lock);
    if (blocking)
      lock.lock();
    else if (!lock.try_lock())
      return {};
    if (!r.comm) return {};
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(r.comm, &state);
    if (result != ncclSuccess) return nccl_failure("ncclCommGetAsyncError", result);
    if (state == ncclSuccess || state == ncclInProgress) return {};
    const char* detail = ncclGetLastError(r.comm);
    return str("NCCL reported an asynchronous error: ", ncclGetErrorString(state),
               detail && *detail ? str(" (", detail, ")") : std::string());
  }

  // Request::State::cancel, after a wait timed out. A message to oneself still waiting for
  // its partner is withdrawn; anything on the GPU can only be stopped with the group.
  bool cancel(int rank, const Request::State* state) {
    RankState& r = *ranks[rank];
    {
      std::lock_guard lock(mutex);
      for (auto* queue : {&r.self_sends, &r.self_recvs}) {
        const auto found = std::find_if(queue->begin(), queue->end(),
                                        [&](const SelfMessage& m) { return m.state.get() == state; });
        if (found != queue->end()) {
          queue->erase(found);
          return true;
        }
      }
      const auto op = std::find_if(r.in_flight.begin(), r.in_flight.end(), [&](const InFlight& f) {
        return std::any_of(f.states.begin(), f.states.end(), [&](const StatePtr& s) { return s.get() == state; });
      });
      // Not in flight: completed or failed already, and wait() will see it.
      if (op == r.in_flight.end()) return false;
      {
        // Finished on the GPU a moment ago; the progress thread completes it next round.
        const DeviceRestorer restorer;
        (void)cudaSetDevice(r.device);
        if (cudaEventQuery(op->event) == cudaSuccess) return false;
      }
      withdrawn.push_back(state);
    }
    // Blocking for this rank: its entry has left in_flight when this returns, so the
    // pointer can leave `withdrawn` before its address could be reused.
    abort_group(str(state->what, " timed out, and NCCL cannot withdraw an operation from the GPU"), rank);
    std::lock_guard lock(mutex);
    withdrawn.erase(std::find(withdrawn.begin(), withdrawn.end(), state));
    return true;
  }

  // Adds an enqueued operation to its member's list, or fails it if the group was aborted
  // meanwhile (its communicator may already be gone, and no one would complete it).
  void track(RankState& r, std::vector<StatePtr> states, cudaEvent_t event) {
    {
      std::lock_guard lock(mutex);
      if (!aborted) {
        r.in_flight.push_back(InFlight{std::move(states), event});
        progress_cv.notify_all();
        return;
      }
    }
    (void)cudaEventDestroy(event);
    const std::string why = reason();
    for (auto& state : states) state->complete(std::make_exception_ptr(aborted_error(state->what, why)));
  }

  // One round of the progress thread over every member.
  void sweep() {
    for (auto& owned : ranks) {
      RankState& r = *owned;
      if (aborted) {
        if (r.comm_alive) abort_comm(r, /*blocking=*/false);
        continue;
      }
      std::vector<InFlight> finished;
      std::string failure;
      {
        std::lock_guard lock(mutex);
        // Events are queried with their own device current, like every other call on them.
        if (!r.in_flight.empty()) (void)cudaSetDevice(r.device);
        while (!r.in_flight.empty()) {
          const cudaError_t result = cudaEventQuery(r.in_flight.front().event);
          if (result == cudaErrorNotReady) break;
          if (result != cudaSuccess) {
            failure = cuda_failure("cudaEventQuery", result);
            break;
          }
          finished.push_back(std::move(r.in_flight.front()));
          r.in_flight.pop_front();
        }
      }
      for (auto& op : finished) {
        (void)cudaEventDestroy(op.event);
        for (auto& state : op.states) state->complete();
      }
      if (failure.empty()) {
        bool busy;
        {
          std::lock_guard lock(mutex);
          busy = !r.in_flight.empty();
        }
        if (busy) failure = async_error(r, /*blocking=*/false);
      }
      if (!failure.empty()) abort_group(str(prefix(r.rank), ": ", failure), -1);
    }
  }

  bool has_work_locked() const {
    for (const auto& r : ranks)
      if (!r->in_flight.empty() || (aborted && r->comm_alive)) return true;
    return false;
  }

  void progress_loop() {
    std::unique_lock lock(mutex);
    while (!stopping) {
      progress_cv.wait(lock, [&] { return stopping || has_work_locked(); });
      if (stopping) break;
      lock.unlock();
      sweep();
      lock.lock();
      progress_cv.wait_for(lock, kProgressInterval, [&] { return stopping; });
    }
  }

  // Stops the progress thread and frees every CUDA and NCCL resource; idempotent, and safe
  // on a half-built group. Nothing here can throw: failures while freeing are ignored, as
  // there is no one left to report them to.
  void shutdown() {
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
};

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

  Request isend(int peer, int tag, std::span<const float> data) override {
    check_peer(peer, "isend");
    auto state = std::make_shared<Request::State>(str(hub_->prefix(rank_), " isend to rank ", peer, " (tag ", tag,
                                                      ", ", data.size(), " floats)"));
    // NCCL never writes through a send buffer; the const_cast only lets one type carry both.
    float* buffer = const_cast<float*>(data.data());
    if (peer == rank_) return post_self(std::move(state), /*is_send=*/true, buffer, data.size());
    return post_p2p(std::move(state), /*is_send=*/true, peer, buffer, data.size());
  }

  Request irecv(int peer, int tag, std::span<float> data) override {
    check_peer(peer, "irecv");
    auto state = std::make_shared<Request::State>(str(hub_->prefix(rank_), " irecv from rank ", peer, " (tag ", tag,
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

  Request failed(StatePtr state) const {
    state->complete(std::make_exception_ptr(aborted_error(state->what, hub_->reason())));
    return Request(std::move(state));
  }

  std::function<bool()> make_cancel(const Request::State* state) const {
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

  Request post_p2p(StatePtr state, bool is_send, int peer, float* data, std::size_t count) {
    if (hub_->aborted) return failed(std::move(state));
    // Both sides skip an empty message alike, so the order of the others is unchanged.
    if (count == 0) {
      state->complete();
      return Request(std::move(state));
    }
    check_device_span(data, count, is_send ? "the send buffer" : "the receive buffer", state->what);
    cudaEvent_t event =
        is_send ? enqueue(state->what, "ncclSend",
                          [&](ncclComm_t comm, cudaStream_t stream) {
                            return ncclSend(data, count, ncclFloat, peer, comm, stream);
                          })
                : enqueue(state->what, "ncclRecv", [&](ncclComm_t comm, cudaStream_t stream) {
                    return ncclRecv(data, count, ncclFloat, peer, comm, stream);
                  });
    state->cancel = make_cancel(state.get());
    hub_->track(me_, {state}, event);
    return Request(std::move(state));
  }

  // NCCL accepts a send to oneself only fused with its receive in one ncclGroupStart/End,
  // which two separate calls cannot be; so the pair is matched here, in order of posting
  // like NCCL's, and moved by one device-to-device copy on the stream.
  Request post_self(StatePtr state, bool is_send, float* data, std::size_t count) {
    if (hub_->aborted) return failed(std::move(state));
    check_device_span(data, count, is_send ? "the send buffer" : "the receive buffer", state->what);
    state->cancel = make_cancel(state.get());
    std::unique_lock lock(hub_->mutex);
    if (hub_->aborted) {
      lock.unlock();
      return failed(std::move(state));
    }
    auto& partners = is_send ? me_.self_recvs : me_.self_sends;
    if (partners.empty()) {
      (is_send ? me_.self_sends : me_.self_recvs).push_back(SelfMessage{state, data, count});
      return Request(std::move(state));
    }
    SelfMessage partner = std::move(partners.front());
    partners.pop_front();
    SelfMessage mine{state, data, count};
    const SelfMessage& send = is_send ? mine : partner;
    const SelfMessage& recv = is_send ? partner : mine;
    if (send.count != recv.count) {
      lock.unlock();
      const auto mismatch = [&] {
        return std::make_exception_ptr(Error(
            ErrorKind::kInvalidArgument, str(hub_->prefix(rank_), " sent ", send.count,
                                             " floats to itself, but its matching receive is of ", recv.count,
                                             " floats (messages to oneself match in order of posting)")));
      };
      send.state->complete(mismatch());
      recv.state->complete(mismatch());
      return Request(std::move(state));
    }
    if (count == 0) {
      lock.unlock();
      send.state->complete();
      recv.state->complete();
      return Request(std::move(state));
    }
    // Enqueued under the hub's lock (these calls only queue work): a waiter's cancel then
    // finds the pair either still queued or in flight, never in between.
    std::string failure;
    cudaEvent_t event = nullptr;
    if (const cudaError_t set = cudaSetDevice(me_.device); set != cudaSuccess) {
      failure = cuda_failure("cudaSetDevice", set);
    } else if (const cudaError_t copied = cudaMemcpyAsync(recv.data, send.data, count * sizeof(float),
                                                          cudaMemcpyDeviceToDevice, me_.stream);
               copied != cudaSuccess) {
      failure = cuda_failure("cudaMemcpyAsync", copied);
    } else if (const cudaError_t created = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
               created != cudaSuccess) {
      failure = cuda_failure("cudaEventCreateWithFlags", created);
      event = nullptr;
    } else if (const cudaError_t recorded = cudaEventRecord(event, me_.stream); recorded != cudaSuccess) {
      failure = cuda_failure("cudaEventRecord", recorded);
      (void)cudaEventDestroy(event);
      event = nullptr;
    }
    if (failure.empty()) {
      me_.in_flight.push_back(InFlight{{send.state, recv.state}, event});
      hub_->progress_cv.notify_all();
      return Request(std::move(state));
    }
    lock.unlock();
    const std::string message = str(state->what, ": ", failure);
    // The partner left its queue above, so the abort cannot reach it: fail it here.
    hub_->abort_group(message, rank_);
    partner.state->complete(std::make_exception_ptr(aborted_error(partner.state->what, message)));
    throw Error(ErrorKind::kInternal, message);
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

struct NcclGroup::Shared {
  std::shared_ptr<Hub> hub;
  std::vector<std::unique_ptr<Member>> members;
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
  for (int rank = 0; rank < size; ++rank) shared_->members.push_back(std::make_unique<Member>(shared_->hub, rank));
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
