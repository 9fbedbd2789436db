// Cross-mesh resharding (Zhuang et al., MLSys 2023, "On Optimizing the Communication of
// Model Parallelism", as in Alpa): a tensor sharded one way over the workers of one mesh
// must arrive sharded another way over the workers of another — a pipeline boundary
// between two stages with different layouts. This is the planner, plain data: which
// destination tile needs which slice of which source tiles, and three ways to carry the
// slices over, with the bytes each worker sends and receives.
//
//   Mesh     workers arranged along axes, e.g. {2, 2}; worker w has coordinates w in
//            row-major order (the last axis fastest).
//   Layout   for each tensor dimension, the mesh axis it is split over evenly, or −1: not
//            split. A mesh axis that no dimension uses replicates the tensor along it.
//            "S0,R" splits dimension 0 over axis 0 and keeps dimension 1 whole.
//            "Z0" splits it zigzag, as sequence parallelism holds a causal sequence: into
//            2k equal pieces over the axis's k workers, worker c holding pieces c and
//            2k − 1 − c (parallel/ring_attention.h's SequenceSplit::kZigzag).
//   Tile     the boxes of the tensor one worker holds (one, or two per zigzag dimension).
//
// plan_reshard gives, for every destination worker, the slices that cover its tile — the
// intersections with the distinct source tiles, so every destination element is in
// exactly one slice — each with every source worker that holds it. schedule_reshard turns
// them into transfers:
//   send-recv        one sender per (destination, slice); senders balanced greedily by bytes;
//   broadcast        the destinations that need the same slice from the same holders get
//                    it from one sender at once (the paper's multicast);
//   local-allgather  such a group of k destinations (the destination replicates the slice)
//                    each receives 1/k of it across the meshes, then they all-gather inside
//                    the destination mesh.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace peertrain::parallel {

struct Mesh {
  std::vector<int> axes;  // workers along each axis
  int workers() const;
  std::vector<int> coordinates(int worker) const;
};

struct Layout {
  std::vector<int> split_axis;  // per tensor dimension: the mesh axis, or −1
  std::vector<char> zigzag;     // per dimension: split zigzag (empty: none is)
  bool is_zigzag(std::size_t dimension) const { return dimension < zigzag.size() && zigzag[dimension]; }
};

// "S0,R,Z1": per dimension S<axis>, Z<axis> or R. Throws Error(kInvalidArgument) naming `what`.
Layout parse_layout(std::string_view text, std::string_view what = "layout");
std::string to_string(const Layout& layout);

// A box of the tensor: [lo, hi) per dimension.
struct Box {
  std::vector<std::int64_t> lo, hi;
  std::int64_t elements() const;
  bool empty() const;
  bool contains(std::span<const std::int64_t> index) const;
  bool operator==(const Box&) const = default;
};
Box intersect(const Box& a, const Box& b);

// Throws Error(kInvalidArgument) naming `what` (e.g. "stage 1's mesh"), the dimension and
// the axis: a layout of another rank than the shape, an axis the mesh lacks or used twice,
// a dimension that the axis does not divide.
void check_layout(const Mesh& mesh, const Layout& layout, std::span<const std::int64_t> shape,
                  std::string_view what = "layout");

// The boxes worker `worker` holds, in ascending order; disjoint.
std::vector<Box> tiles(const Mesh& mesh, const Layout& layout, std::span<const std::int64_t> shape, int worker);
// The one box of a layout without zigzag dimensions.
Box tile(const Mesh& mesh, const Layout& layout, std::span<const std::int64_t> shape, int worker);

struct ReshardTask {
  int destination = 0;       // a worker of the destination mesh
  Box slice;                 // part of its tile
  std::vector<int> holders;  // every source worker whose tile contains the slice, ascending
};

// Every destination worker's tile covered exactly once by slices of the source tiles.
std::vector<ReshardTask> plan_reshard(const Mesh& source, const Layout& source_layout, const Mesh& destination,
                                      const Layout& destination_layout, std::span<const std::int64_t> shape);

enum class ReshardStrategy { kSendRecv, kBroadcast, kLocalAllGather };
ReshardStrategy parse_reshard_strategy(std::string_view text, std::string_view flag = "--reshard");
std::string_view to_string(ReshardStrategy strategy);

// One cross-mesh transfer: `slice` from source worker `sender` to every one of `receivers`
// (one for send-recv). Under local-allgather, `group` lists the destinations that then
// all-gather the pieces of `whole` among themselves (empty otherwise).
struct Transfer {
  int sender = 0;
  std::vector<int> receivers;
  Box slice;
  std::vector<int> group;
  Box whole;
};

struct ReshardSchedule {
  std::vector<Transfer> transfers;
  // Elements each worker sends across the meshes and receives across them, and receives
  // inside the destination mesh (local-allgather's all-gather).
  std::vector<std::int64_t> source_sent, destination_received, destination_gathered;
  std::int64_t busiest_link() const;  // the most elements through one worker's cross-mesh link
};

ReshardSchedule schedule_reshard(const std::vector<ReshardTask>& tasks, ReshardStrategy strategy, int source_workers,
                                 int destination_workers);

// "sender → receivers: slice (elements)" per transfer, then the elements per worker.
std::string describe(const ReshardSchedule& schedule);

// Links as a modelled machine has them: each worker's link to the other mesh, and inside a
// mesh, a bandwidth (bytes/s, each direction) and a latency per message.
struct LinkModel {
  double between_bytes_per_s = 1.25e9;  // 10 Gb/s
  double within_bytes_per_s = 12.5e9;   // 100 Gb/s
  double latency_s = 20e-6;
};

// The schedule's time on the model: the cross-mesh phase (the busiest worker link's bytes
// over its bandwidth, plus a latency per message it carries), then local-allgather's
// gather inside the destination mesh. The bound, from both ends of the links: each group
// of destinations that need the same slice must bring it across at least once between
// them, so the busiest destination receives at least Σ slice / group size across; and
// each distinct slice must leave the source mesh once, so a source worker sends at least
// the slices only it holds, and the busiest at least their total over the source workers;
// plus one message's latency.
struct ReshardCost {
  double seconds = 0;
  double bound_seconds = 0;
  std::int64_t busiest_link_bytes = 0;
};
ReshardCost reshard_cost(const std::vector<ReshardTask>& tasks, const ReshardSchedule& schedule, const LinkModel& links,
                         int element_bytes = 4);

}  // namespace peertrain::parallel
