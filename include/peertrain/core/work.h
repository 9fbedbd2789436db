// One handle for every asynchronous operation in peertrain: a send between peers
// (net::Transport), a point-to-point operation inside a peer's group (comm::Group). The
// shape is PyTorch c10d's Work: wait(timeout) blocks until the operation finished and
// rethrows the typed peertrain::Error that ended it; a wait that runs out of time
// withdraws the operation from its backend first, so the caller may free its buffers as
// soon as wait() has thrown.
//
// Buffers an operation borrows must stay valid until it is done. Destroying a Work that
// was not waited for therefore waits for it (bounded by the backend's timeout, and
// withdrawn like a timed-out wait), so an exception that unwinds past a send can never
// leave the backend reading freed memory.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace peertrain {

inline constexpr double kDefaultTimeoutS = 60.0;

class Work {
 public:
  struct State;
  Work() = default;
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}
  Work(Work&&) noexcept = default;
  Work& operator=(Work&&) noexcept;
  ~Work();

  // Blocks until the operation completed, or throws the Error that ended it. Past
  // timeout_s (without one: the backend's own, e.g. --peer-timeout for a send between
  // peers) it withdraws the operation and throws Error(kTimeout) naming it.
  void wait();
  void wait(double timeout_s);
  // Finished (done or failed): wait() would return or throw at once.
  bool done() const;
  bool valid() const { return state_ != nullptr; }

  // A Work that is already done; with an error, wait() throws it.
  static Work completed(std::exception_ptr failure = nullptr);

 private:
  std::shared_ptr<State> state_;
};

// The shared state behind a Work, for the backends that complete operations (the
// transports and the groups) and the thread that waits for them.
struct Work::State {
  // Builds the description only when something asks for it (an error, a timeout). The
  // groups post an operation for every message between threads, and formatting each
  // one's description up front took about 3 % of a pipelined GPT step.
  using Describe = std::function<std::string()>;

  explicit State(std::string description, double timeout_s = kDefaultTimeoutS)
      : timeout_s(timeout_s), description_(std::move(description)) {}
  explicit State(Describe describe, double timeout_s = kDefaultTimeoutS)
      : timeout_s(timeout_s), describe_(std::move(describe)) {}

  // "parameters for step 12 to peer 3 (127.0.0.1:29503)": what a timeout names.
  std::string what() const { return describe_ ? describe_() : description_; }

  // Marks the operation finished (failure == nullptr: it succeeded) and wakes its waiter.
  // Later calls are ignored, so a race between a completion and an abort is harmless.
  void complete(std::exception_ptr failure = nullptr);

  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  // The backend's timeout: what wait() without an argument, and a Work destroyed without
  // a wait, wait for at most.
  const double timeout_s;
  // Called by a wait that ran out of time. It must leave the backend no longer touching
  // the operation's buffers when it returns: either it withdrew the operation before
  // anyone took it (true; the waiter then completes it with kTimeout), or it completed the
  // operation itself, or the operation is already moving and finishes in bounded time
  // (false; the waiter then waits for that). Set before the Work is handed out and never
  // changed, so waiters may call it unlocked. Without one, a timed-out wait waits on for
  // the backend to end the operation (every backend ends its operations in bounded time).
  std::function<bool()> cancel;
  // For a backend whose operations move only while their waiter lets them (a simulated
  // network, sim/cluster.h): wait() calls it instead of sleeping on cv, and it returns once
  // the operation is complete (it calls complete()) or timeout_s has passed in the
  // backend's time. Set before the Work is handed out and never changed.
  std::function<void(double timeout_s)> drive;

 private:
  const std::string description_;
  const Describe describe_;
};

}  // namespace peertrain
