#include <chrono>

#include "peertrain/comm/group.h"
#include "peertrain/core/error.h"
#include "request_state.h"

namespace peertrain::comm {

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    // The operation this handle owned still writes into its buffers: finish it first, as
    // the destructor would.
    Request old(std::move(state_));
    state_ = std::move(other.state_);
  }
  return *this;
}

Request::~Request() {
  if (!state_) return;
  try {
    wait(kDefaultTimeoutS);
  } catch (...) {
    // A destructor cannot report; the error was the owner's to collect with wait().
  }
}

void Request::wait(double timeout_s) {
  if (!state_) return;
  State& s = *state_;
  std::unique_lock lock(s.mutex);
  const auto limit = std::chrono::duration<double>(timeout_s < 0 ? 0 : timeout_s);
  if (!s.cv.wait_for(lock, limit, [&] { return s.done; })) {
    lock.unlock();
    // Withdraw the operation so that a partner arriving later cannot write into a buffer
    // the caller is about to free; if a partner already took it, its copy ends shortly.
    if (s.cancel && s.cancel())
      s.complete(std::make_exception_ptr(
          Error(ErrorKind::kTimeout, str(s.what, " timed out after ", timeout_s, " s"))));
    lock.lock();
    s.cv.wait(lock, [&] { return s.done; });
  }
  if (s.error) std::rethrow_exception(s.error);
}

bool Request::done() const {
  if (!state_) return true;
  std::lock_guard lock(state_->mutex);
  return state_->done;
}

}  // namespace peertrain::comm
