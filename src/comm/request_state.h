// The shared state behind a comm::Request, private to the comm backends: the backend that
// completes an operation and the thread that waits for it meet here.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

#include "peertrain/comm/group.h"

namespace peertrain::comm {

struct Request::State {
  explicit State(std::string description) : what(std::move(description)) {}

  // Marks the operation finished (error == nullptr: it succeeded) and wakes its waiter.
  // Later calls are ignored, so a race between a completion and an abort is harmless.
  void complete(std::exception_ptr failure = nullptr) {
    {
      std::lock_guard lock(mutex);
      if (done) return;
      done = true;
      error = std::move(failure);
    }
    cv.notify_all();
  }

  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  // "thread group 'g': rank 1 irecv from rank 0 (tag 3, 100 floats)": what a timeout names.
  const std::string what;
  // Withdraws the operation from its backend if no partner has taken it yet (true); false
  // once a partner is already moving its bytes, which then finishes in bounded time. Set
  // before the Request is handed out and never changed, so waiters may call it unlocked.
  std::function<bool()> cancel;
};

}  // namespace peertrain::comm
