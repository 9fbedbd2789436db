// Cross-mesh resharding carried out (reshard.h plans it): the workers of a source mesh
// hold a tensor one way, those of a destination mesh want it another way, and they are
// ranks of one group that can send each other messages. Used by the pipeline engine at a
// boundary between stages with different meshes, and by `bench reshard`.
//
// A worker's part of the tensor is its tile (the boxes tiles() gives it), stored packed:
// per dimension the indices it holds in ascending order, row-major over those — which is
// how a sequence rank holds its tokens (a zigzag rank its two chunks, one after the other).
//
// The strategies, as ReshardSchedule's transfers say:
//   send-recv        the sender packs the slice and sends it to its one receiver;
//   broadcast        the sender sends the slice to the first receiver, which passes it on
//                    to the next, and so on (NCCL's ring broadcast: one crossing between the
//                    meshes, the other hops inside the destination mesh), in pieces so that
//                    the hops overlap;
//   local-allgather  each receiver gets its 1/k of the slice across, then sends it to the
//                    others of its group inside the destination mesh.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <span>
#include <tuple>
#include <vector>

#include "peertrain/comm/group.h"
#include "peertrain/parallel/reshard.h"

namespace peertrain::parallel {

// One worker's tile, and where each element of it sits in the worker's packed buffer.
class PackedTile {
 public:
  PackedTile() = default;
  PackedTile(const std::vector<Box>& boxes, std::span<const std::int64_t> shape);
  std::int64_t elements() const;
  // Copies `slice` (inside one of the tile's boxes) out of the packed buffer, row-major, or
  // back into it.
  void pack(const Box& slice, std::span<const float> local, std::span<float> out) const;
  void unpack(const Box& slice, std::span<const float> in, std::span<float> local) const;

 private:
  // Per dimension: the held intervals, ascending, and each one's first packed index.
  struct Span {
    std::int64_t lo, hi, packed;
  };
  std::vector<std::vector<Span>> spans_;
  std::vector<std::int64_t> extents_;  // held indices per dimension
  std::int64_t packed_index(std::size_t dimension, std::int64_t index) const;
  template <class Fn>
  void for_each_row(const Box& slice, Fn&& fn) const;
};

// A planned resharding between two meshes whose workers are ranks of one group.
struct ReshardExchange {
  std::vector<std::int64_t> shape;
  ReshardStrategy strategy = ReshardStrategy::kSendRecv;
  ReshardSchedule schedule;
  std::vector<int> source_ranks, destination_ranks;  // each mesh worker's rank in the group
  std::vector<PackedTile> source_tiles, destination_tiles;
};

ReshardExchange plan_exchange(const Mesh& source, const Layout& source_layout, std::vector<int> source_ranks,
                              const Mesh& destination, const Layout& destination_layout,
                              std::vector<int> destination_ranks, std::span<const std::int64_t> shape,
                              ReshardStrategy strategy);

// How a worker reaches the others: post copies the data and returns at once; take blocks
// until the message from that rank arrived. Messages between two ranks arrive in order.
class ExchangeLink {
 public:
  virtual ~ExchangeLink() = default;
  virtual void post(int to_rank, std::span<const float> data) = 0;
  virtual void take(int from_rank, std::span<float> into) = 0;
};

class LinkEmulator;

// ExchangeLink over a comm::Group, every message with one tag: a posted buffer is kept
// until its receiver took it; with an emulator, messages take the emulated links' time.
class GroupLink final : public ExchangeLink {
 public:
  GroupLink(comm::Group& group, int tag, double timeout_s, LinkEmulator* emulator = nullptr)
      : group_(group), tag_(tag), timeout_s_(timeout_s), emulator_(emulator) {}
  void post(int to_rank, std::span<const float> data) override;
  void take(int from_rank, std::span<float> into) override;
  void finish();  // waits until every posted message was taken

 private:
  struct Posted {
    std::vector<float> data;
    Work request;
  };
  comm::Group& group_;
  int tag_;
  double timeout_s_;
  LinkEmulator* emulator_;
  std::deque<Posted> posted_;
};

// Source worker `worker` (its index in the source mesh) sends its slices from `local`.
void exchange_send(const ReshardExchange& exchange, int worker, std::span<const float> local, ExchangeLink& link);
// Destination worker `worker` assembles its tile in `local` (destination_tiles[worker]'s size).
void exchange_receive(const ReshardExchange& exchange, int worker, std::span<float> local, ExchangeLink& link);

// Emulated links between the workers of a group (LinkModel's figures): a pair of workers
// in the same mesh has a link of its own at within_bytes_per_s; between meshes every worker
// has one link (a NIC) at between_bytes_per_s each way, which all its messages to and from
// other meshes share, full duplex. A message holds a link for bytes / bandwidth, one message
// at a time: the sender's NIC from when it is free (booked as it posts), the receiver's
// from when it is free and the bytes are on their way (booked as it takes the message, in
// its order; streaming, so a busy receiver does not hold up its senders' other messages);
// it arrives latency_s after. The receiver, once the message is in memory, waits until
// its emulated arrival.
class LinkEmulator {
 public:
  LinkEmulator(LinkModel model, std::vector<int> mesh_of_rank);
  void posted(int from, int to, int tag, std::size_t bytes);
  void taken(int from, int to, int tag);  // sleeps until the message's arrival

 private:
  using Clock = std::chrono::steady_clock;
  LinkModel model_;
  std::vector<int> mesh_of_;
  std::mutex mutex_;
  std::vector<Clock::time_point> pair_free_, out_free_, in_free_;
  struct Posted {
    Clock::time_point sent;  // off the sender's link
    Clock::duration hold;    // what it holds the receiver's NIC for; zero inside a mesh
  };
  std::map<std::tuple<int, int, int>, std::deque<Posted>> arrivals_;
};

}  // namespace peertrain::parallel
