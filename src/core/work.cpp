#include "peertrain/core/work.h"

#include <chrono>

#include "peertrain/core/error.h"

namespace peertrain {

void Work::State::complete(std::exception_ptr failure) {
  {
    std::lock_guard lock(mutex);
    if (done) return;
    done = true;
    error = std::move(failure);
  }
  cv.notify_all();
}

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    // The operation this handle owned may still use its buffers: finish it first, as the
    // destructor would.
    Work old(std::move(state_));
    state_ = std::move(other.state_);
  }
  return *this;
}

Work::~Work() {
  if (!state_) return;
  try {
    wait();
  } catch (...) {
    // A destructor cannot report; the error was the owner's to collect with wait().
  }
}

void Work::wait() {
  if (state_) wait(state_->timeout_s);
}

void Work::wait(double timeout_s) {
  if (!state_) return;
  State& s = *state_;
  auto finished = [&s] {
    std::lock_guard lock(s.mutex);
    return s.done;
  };
  // A driven operation is asked to move only while it is under way: once complete (a
  // done() may have completed it), its backend may no longer know it.
  if (s.drive && !finished()) {
    s.drive(timeout_s < 0 ? 0 : timeout_s);
    if (!finished() && (!s.cancel || s.cancel()))
      s.complete(std::make_exception_ptr(
          Error(ErrorKind::kTimeout, str(s.what(), " did not finish within ", timeout_s, " s"))));
  }
  std::unique_lock lock(s.mutex);
  const auto limit = std::chrono::duration<double>(timeout_s < 0 ? 0 : timeout_s);
  if (!s.cv.wait_for(lock, limit, [&] { return s.done; })) {
    lock.unlock();
    if (s.cancel && s.cancel())
      s.complete(std::make_exception_ptr(
          Error(ErrorKind::kTimeout, str(s.what(), " did not finish within ", timeout_s, " s"))));
    lock.lock();
    s.cv.wait(lock, [&] { return s.done; });
  }
  if (s.error) std::rethrow_exception(s.error);
}

bool Work::done() const {
  if (!state_) return true;
  if (state_->drive) {
    std::unique_lock lock(state_->mutex);
    if (state_->done) return true;
    lock.unlock();
    state_->drive(0);  // a simulated operation moves only when asked: test it
  }
  std::lock_guard lock(state_->mutex);
  return state_->done;
}

Work Work::completed(std::exception_ptr failure) {
  auto state = std::make_shared<State>("a completed operation");
  state->complete(std::move(failure));
  return Work(std::move(state));
}

}  // namespace peertrain
