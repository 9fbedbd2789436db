// The Group backend for workers that are threads of one process. Messages move by one
// memcpy from the sender's buffer into the receiver's (a rendezvous: whichever of isend
// and irecv comes second does the copy), and collectives reduce in place over shared
// memory, each rank summing its own slice of the result, so nothing is staged twice.
#pragma once

#include <memory>
#include <string>

#include "peertrain/comm/group.h"

namespace peertrain::comm {

class ThreadGroup {
 public:
  // name: how errors refer to the group. Members are made up front; each thread uses its own.
  ThreadGroup(int size, std::string name);
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int size() const;
  Group& member(int rank);  // throws kInvalidArgument outside [0, size)

 private:
  struct Shared;
  std::unique_ptr<Shared> shared_;
};

}  // namespace peertrain::comm
