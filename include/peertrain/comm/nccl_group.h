// The Group backend for workers that each drive one GPU inside one process, over NCCL: one
// communicator per listed CUDA device, made together by ncclCommInitAll. The rest of the
// code sees only comm::Group; CUDA and NCCL types stay in src/comm/nccl_group.cpp.
//
// What differs from ThreadGroup, because NCCL works that way:
// - Every span passed to an operation points to DEVICE memory (cudaMalloc'd) on the
//   member's own device; host memory is rejected with kInvalidArgument.
// - Operations are enqueued on the member's own CUDA stream (stream(rank)); a kernel
//   launched on that stream after an operation sees its result without a host wait, which
//   is how a ring-attention or pipeline hop overlaps compute. Work::wait and the
//   blocking collectives return once the operation has finished on the GPU.
// - There are no tags: the messages between two ranks match in the order they were posted,
//   whatever their tags, and a size mismatch cannot be detected (NCCL sends no header: the
//   result is a hang or wrong data, never an error). Callers must post sends and receives
//   of each pair in the same order with the same sizes. A send to oneself is the
//   exception: it is matched here and copied, and a size mismatch is kInvalidArgument on
//   both sides.
// - NCCL runs one communicator's operations one after another on the GPU, so a receive
//   waits behind every operation its member posted before it. A ring step where every rank
//   posts its receive before its send (or its send before its receive, once messages
//   exceed NCCL's buffers) cannot complete; alternate the order by rank parity.
// - A timeout cannot withdraw work already on the GPU: a Work::wait or a collective that
//   runs past its timeout aborts the whole group (ncclCommAbort of every communicator), and
//   every later operation of every rank fails with kPeerLost.
// - Collectives check only what one rank can see (all is size()·mine, spans on the right
//   device); ranks passing different sizes or roots are not detected either.
// - An empty operation returns at once without reaching NCCL, so it meets nobody.
// - One rank per GPU: NCCL cannot put two ranks of one communicator on one device.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "peertrain/comm/group.h"

namespace peertrain::comm {

class NcclGroup {
 public:
  // devices: the CUDA device of each rank, in rank order; each at most once and within
  // [0, cudaGetDeviceCount()), else kInvalidArgument. name: how errors refer to the group.
  NcclGroup(std::vector<int> devices, std::string name);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int size() const;
  // Each member is used from its own thread; its methods select its device themselves.
  Group& member(int rank);  // throws kInvalidArgument outside [0, size)
  // The member's cudaStream_t, as void* so that this header stays free of CUDA.
  void* stream(int rank) const;  // throws kInvalidArgument outside [0, size)

 private:
  struct Shared;
  std::unique_ptr<Shared> shared_;
};

}  // namespace peertrain::comm
