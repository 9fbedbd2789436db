// How NcclGroup's operations end, and the hub's queues they wait in: the progress thread
// completes operations as their events fire, messages to oneself are matched with their
// partners, and cancel and abort fail what is left. Kept apart from the member operations
// because all of it works on the queues shared under the hub's mutex, from any thread (a
// member posting, the progress thread, a waiter that timed out, another rank's abort): it
// is where the locking rules of nccl_group_state.h have to hold.
#include <algorithm>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "nccl_group_state.h"

namespace peertrain::comm::nccl_internal {

bool Hub::abort_comm(RankState& r, bool blocking) {
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

void Hub::fail_in_flight(RankState& r) {
  std::deque<InFlight> failed;
  std::vector<const Work::State*> skip;
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
        state->complete(std::make_exception_ptr(aborted_error(state->what(), why)));
  }
}

void Hub::abort_group(const std::string& reason, int blocking_rank) {
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
    message.state->complete(std::make_exception_ptr(aborted_error(message.state->what(), why)));
  for (auto& r : ranks) abort_comm(*r, r->rank == blocking_rank);
  progress_cv.notify_all();
}

std::string Hub::async_error(RankState& r, bool blocking) {
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

bool Hub::cancel(int rank, const Work::State* state) {
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
  abort_group(str(state->what(), " timed out, and NCCL cannot withdraw an operation from the GPU"), rank);
  std::lock_guard lock(mutex);
  withdrawn.erase(std::find(withdrawn.begin(), withdrawn.end(), state));
  return true;
}

Work Hub::failed(StatePtr state) {
  state->complete(std::make_exception_ptr(aborted_error(state->what(), reason())));
  return Work(std::move(state));
}

Work Hub::post_self(RankState& me, StatePtr state, bool is_send, float* data, std::size_t count) {
  std::unique_lock lock(mutex);
  if (aborted) {
    lock.unlock();
    return failed(std::move(state));
  }
  auto& partners = is_send ? me.self_recvs : me.self_sends;
  if (partners.empty()) {
    (is_send ? me.self_sends : me.self_recvs).push_back(SelfMessage{state, data, count});
    return Work(std::move(state));
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
          ErrorKind::kInvalidArgument, str(prefix(me.rank), " sent ", send.count,
                                           " floats to itself, but its matching receive is of ", recv.count,
                                           " floats (messages to oneself match in order of posting)")));
    };
    send.state->complete(mismatch());
    recv.state->complete(mismatch());
    return Work(std::move(state));
  }
  if (count == 0) {
    lock.unlock();
    send.state->complete();
    recv.state->complete();
    return Work(std::move(state));
  }
  // Enqueued under the hub's lock (these calls only queue work): a waiter's cancel then
  // finds the pair either still queued or in flight, never in between.
  std::string failure;
  cudaEvent_t event = nullptr;
  if (const cudaError_t set = cudaSetDevice(me.device); set != cudaSuccess) {
    failure = cuda_failure("cudaSetDevice", set);
  } else if (const cudaError_t copied = cudaMemcpyAsync(recv.data, send.data, count * sizeof(float),
                                                        cudaMemcpyDeviceToDevice, me.stream);
             copied != cudaSuccess) {
    failure = cuda_failure("cudaMemcpyAsync", copied);
  } else if (const cudaError_t created = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
             created != cudaSuccess) {
    failure = cuda_failure("cudaEventCreateWithFlags", created);
    event = nullptr;
  } else if (const cudaError_t recorded = cudaEventRecord(event, me.stream); recorded != cudaSuccess) {
    failure = cuda_failure("cudaEventRecord", recorded);
    (void)cudaEventDestroy(event);
    event = nullptr;
  }
  if (failure.empty()) {
    me.in_flight.push_back(InFlight{{send.state, recv.state}, event});
    progress_cv.notify_all();
    return Work(std::move(state));
  }
  lock.unlock();
  const std::string message = str(state->what(), ": ", failure);
  // The partner left its queue above, so the abort cannot reach it: fail it here.
  abort_group(message, me.rank);
  partner.state->complete(std::make_exception_ptr(aborted_error(partner.state->what(), message)));
  throw Error(ErrorKind::kInternal, message);
}

void Hub::track(RankState& r, std::vector<StatePtr> states, cudaEvent_t event) {
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
  for (auto& state : states) state->complete(std::make_exception_ptr(aborted_error(state->what(), why)));
}

void Hub::sweep() {
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

bool Hub::has_work_locked() const {
  for (const auto& r : ranks)
    if (!r->in_flight.empty() || (aborted && r->comm_alive)) return true;
  return false;
}

void Hub::progress_loop() {
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

}  // namespace peertrain::comm::nccl_internal
