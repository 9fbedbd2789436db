// The first failure among the threads of one step (pipeline stages, sequence ranks, on the
// CPU or on devices). Recording it aborts every watched group, so that threads blocked on
// the failed one are released at once rather than at their timeouts; later failures, the
// echo of that abort, are dropped.
#pragma once

#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "peertrain/comm/group.h"

namespace peertrain::comm {

class FailureLatch {
 public:
  void watch(Group& group) { groups_.push_back(&group); }

  // `where` names the thread ("stage 1 rank 0"); the kept error reads "where: message".
  void record(std::exception_ptr error, const std::string& where);

  // Throws the first recorded failure, if any (after every thread has been joined).
  void rethrow() const;

 private:
  std::mutex mutex_;
  std::exception_ptr first_;
  std::vector<Group*> groups_;
};

}  // namespace peertrain::comm
