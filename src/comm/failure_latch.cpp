#include "peertrain/comm/failure_latch.h"

#include "peertrain/core/error.h"

namespace peertrain::comm {

void FailureLatch::record(std::exception_ptr error, const std::string& where) {
  std::string message;
  ErrorKind kind = ErrorKind::kInternal;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    kind = e.kind();
    message = e.what();
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "an unknown exception";
  }
  {
    std::lock_guard lock(mutex_);
    if (first_) return;  // later failures are the echo of the first one's abort
    first_ = std::make_exception_ptr(Error(kind, str(where, ": ", message)));
  }
  for (Group* group : groups_) group->abort(str(where, " failed: ", message));
}

void FailureLatch::rethrow() const {
  if (first_) std::rethrow_exception(first_);
}

}  // namespace peertrain::comm
