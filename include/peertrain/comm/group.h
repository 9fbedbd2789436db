// The communicator of the workers inside one peer (pipeline stages × sequence ranks), in
// the shape of PyTorch's c10d ProcessGroup and gloo: point-to-point and collective
// operations over a fixed set of ranks, each bounded by a timeout. Backends: ThreadGroup
// (workers are threads of one process, shared memory) and, on GPUs, an NCCL group.
//
// Every operation throws peertrain::Error — kTimeout when the partner did not show up in
// time, kPeerLost when the group was aborted (another worker failed) — naming the group,
// the rank and the operation. Collectives must be called by every rank in the same order
// with the same sizes; a size mismatch is reported as kInvalidArgument, never truncated.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "peertrain/core/work.h"

namespace peertrain::comm {

using peertrain::kDefaultTimeoutS;
using peertrain::Work;

class Group {
 public:
  virtual ~Group() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // for messages: "stage 1 sequence group"

  // Point to point. Messages between a pair with the same tag arrive in the order sent.
  // The buffers must stay valid until the request completes. A receive whose buffer size
  // differs from the message fails with kInvalidArgument on both sides.
  virtual Work isend(int peer, int tag, std::span<const float> data) = 0;
  virtual Work irecv(int peer, int tag, std::span<float> data) = 0;
  void send(int peer, int tag, std::span<const float> data, double timeout_s = kDefaultTimeoutS) {
    isend(peer, tag, data).wait(timeout_s);
  }
  void recv(int peer, int tag, std::span<float> data, double timeout_s = kDefaultTimeoutS) {
    irecv(peer, tag, data).wait(timeout_s);
  }

  // Collectives (sums). all_gather: `all` is size()·mine.size(), rank r's part at r·n.
  // reduce_scatter: `all` is size()·mine.size(); rank r receives the sum of part r.
  virtual void all_reduce(std::span<float> data, double timeout_s = kDefaultTimeoutS) = 0;
  virtual void all_gather(std::span<const float> mine, std::span<float> all, double timeout_s = kDefaultTimeoutS) = 0;
  virtual void reduce_scatter(std::span<const float> all, std::span<float> mine,
                              double timeout_s = kDefaultTimeoutS) = 0;
  virtual void broadcast(std::span<float> data, int root, double timeout_s = kDefaultTimeoutS) = 0;
  virtual void barrier(double timeout_s = kDefaultTimeoutS) = 0;

  // Fails every pending and future operation of every rank with kPeerLost and this reason,
  // so that one worker's failure ends the others at once instead of at their timeouts.
  virtual void abort(const std::string& reason) = 0;
};

}  // namespace peertrain::comm
