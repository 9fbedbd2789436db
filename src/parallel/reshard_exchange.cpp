// Resharding carried out over a group's messages; see reshard_exchange.h.
#include "peertrain/parallel/reshard_exchange.h"

#include <algorithm>
#include <thread>

#include "peertrain/core/error.h"

namespace peertrain::parallel {

PackedTile::PackedTile(const std::vector<Box>& boxes, std::span<const std::int64_t> shape) {
  spans_.resize(shape.size());
  extents_.assign(shape.size(), 0);
  for (std::size_t d = 0; d < shape.size(); ++d) {
    std::vector<std::pair<std::int64_t, std::int64_t>> intervals;
    for (const Box& b : boxes) intervals.push_back({b.lo[d], b.hi[d]});
    std::sort(intervals.begin(), intervals.end());
    intervals.erase(std::unique(intervals.begin(), intervals.end()), intervals.end());
    for (auto [lo, hi] : intervals) {
      spans_[d].push_back({lo, hi, extents_[d]});
      extents_[d] += hi - lo;
    }
  }
}

std::int64_t PackedTile::elements() const {
  std::int64_t n = 1;
  for (auto e : extents_) n *= e;
  return n;
}

std::int64_t PackedTile::packed_index(std::size_t d, std::int64_t index) const {
  for (const Span& s : spans_[d])
    if (index >= s.lo && index < s.hi) return s.packed + index - s.lo;
  PEERTRAIN_CHECK(false, "index ", index, " of dimension ", d, " is not in the tile");
  return 0;
}

// fn(packed offset of the row's first element, row length) for each row (last dimension)
// of the slice, in row-major order.
template <class Fn>
void PackedTile::for_each_row(const Box& slice, Fn&& fn) const {
  const std::size_t rank = extents_.size();
  const std::int64_t row = slice.hi[rank - 1] - slice.lo[rank - 1];
  std::vector<std::int64_t> at(slice.lo.begin(), slice.lo.end());
  if (slice.empty()) return;
  while (true) {
    std::int64_t offset = 0;
    for (std::size_t d = 0; d < rank; ++d) offset = offset * extents_[d] + packed_index(d, at[d]);
    fn(offset, row);
    std::size_t d = rank - 1;  // next row: advance the dimensions before the last
    while (d-- > 0) {
      if (++at[d] < slice.hi[d]) break;
      at[d] = slice.lo[d];
    }
    if (d == static_cast<std::size_t>(-1)) return;
  }
}

void PackedTile::pack(const Box& slice, std::span<const float> local, std::span<float> out) const {
  PEERTRAIN_CHECK(static_cast<std::int64_t>(out.size()) == slice.elements(), "pack: ", out.size(), " floats for ",
                  slice.elements());
  std::size_t at = 0;
  for_each_row(slice, [&](std::int64_t offset, std::int64_t n) {
    std::copy_n(local.begin() + offset, n, out.begin() + static_cast<std::ptrdiff_t>(at));
    at += static_cast<std::size_t>(n);
  });
}

void PackedTile::unpack(const Box& slice, std::span<const float> in, std::span<float> local) const {
  PEERTRAIN_CHECK(static_cast<std::int64_t>(in.size()) == slice.elements(), "unpack: ", in.size(), " floats for ",
                  slice.elements());
  std::size_t at = 0;
  for_each_row(slice, [&](std::int64_t offset, std::int64_t n) {
    std::copy_n(in.begin() + static_cast<std::ptrdiff_t>(at), n, local.begin() + offset);
    at += static_cast<std::size_t>(n);
  });
}

ReshardExchange plan_exchange(const Mesh& source, const Layout& source_layout, std::vector<int> source_ranks,
                              const Mesh& destination, const Layout& destination_layout,
                              std::vector<int> destination_ranks, std::span<const std::int64_t> shape,
                              ReshardStrategy strategy) {
  PEERTRAIN_CHECK(static_cast<int>(source_ranks.size()) == source.workers() &&
                      static_cast<int>(destination_ranks.size()) == destination.workers(),
                  "plan_exchange: a rank for every worker");
  ReshardExchange x;
  x.shape.assign(shape.begin(), shape.end());
  x.strategy = strategy;
  const auto tasks = plan_reshard(source, source_layout, destination, destination_layout, shape);
  x.schedule = schedule_reshard(tasks, strategy, source.workers(), destination.workers());
  x.source_ranks = std::move(source_ranks);
  x.destination_ranks = std::move(destination_ranks);
  for (int w = 0; w < source.workers(); ++w) x.source_tiles.emplace_back(tiles(source, source_layout, shape, w), shape);
  for (int w = 0; w < destination.workers(); ++w)
    x.destination_tiles.emplace_back(tiles(destination, destination_layout, shape, w), shape);
  return x;
}

namespace {

// A broadcast's slice travels down its chain in up to this many pieces, so that the hops
// overlap; pieces below kMinimumPiece floats are not worth a message of their own.
constexpr std::size_t kBroadcastPieces = 4, kMinimumPiece = 4096;

std::size_t pieces_of(std::size_t floats) {
  return std::clamp<std::size_t>(floats / kMinimumPiece, 1, kBroadcastPieces);
}
std::span<float> piece(std::span<float> all, std::size_t k, std::size_t pieces) {
  const std::size_t lo = all.size() * k / pieces, hi = all.size() * (k + 1) / pieces;
  return all.subspan(lo, hi - lo);
}

}  // namespace

void exchange_send(const ReshardExchange& x, int worker, std::span<const float> local, ExchangeLink& link) {
  const PackedTile& tile = x.source_tiles[static_cast<std::size_t>(worker)];
  PEERTRAIN_CHECK(static_cast<std::int64_t>(local.size()) == tile.elements(), "exchange_send: the tile holds ",
                  tile.elements(), " floats, the buffer ", local.size());
  std::vector<float> packed;
  for (const Transfer& t : x.schedule.transfers) {
    if (t.sender != worker) continue;
    packed.resize(static_cast<std::size_t>(t.slice.elements()));
    tile.pack(t.slice, local, packed);
    if (x.strategy == ReshardStrategy::kBroadcast) {  // down the chain: to its head only
      const std::size_t pieces = pieces_of(packed.size());
      for (std::size_t k = 0; k < pieces; ++k)
        link.post(x.destination_ranks[static_cast<std::size_t>(t.receivers.front())], piece(packed, k, pieces));
    } else {
      for (int r : t.receivers) link.post(x.destination_ranks[static_cast<std::size_t>(r)], packed);
    }
  }
}

void exchange_receive(const ReshardExchange& x, int worker, std::span<float> local, ExchangeLink& link) {
  const PackedTile& tile = x.destination_tiles[static_cast<std::size_t>(worker)];
  PEERTRAIN_CHECK(static_cast<std::int64_t>(local.size()) == tile.elements(), "exchange_receive: the tile holds ",
                  tile.elements(), " floats, the buffer ", local.size());
  auto rank_of = [&](int destination) { return x.destination_ranks[static_cast<std::size_t>(destination)]; };
  std::vector<float> packed;
  // Across the meshes (and down broadcast chains), in the schedule's order on every worker.
  for (const Transfer& t : x.schedule.transfers) {
    const auto me = std::find(t.receivers.begin(), t.receivers.end(), worker);
    if (me == t.receivers.end()) continue;
    packed.resize(static_cast<std::size_t>(t.slice.elements()));
    if (x.strategy == ReshardStrategy::kBroadcast) {
      const int from =
          me == t.receivers.begin() ? x.source_ranks[static_cast<std::size_t>(t.sender)] : rank_of(*(me - 1));
      const bool last = me + 1 == t.receivers.end();
      const std::size_t pieces = pieces_of(packed.size());
      for (std::size_t k = 0; k < pieces; ++k) {
        link.take(from, piece(packed, k, pieces));
        if (!last) link.post(rank_of(*(me + 1)), piece(packed, k, pieces));
      }
    } else {
      link.take(x.source_ranks[static_cast<std::size_t>(t.sender)], packed);
    }
    tile.unpack(t.slice, packed, local);
  }
  if (x.strategy != ReshardStrategy::kLocalAllGather) return;
  // Inside the destination mesh: each piece from its receiver to the rest of its group.
  for (const Transfer& t : x.schedule.transfers) {
    if (t.group.empty() || t.receivers.front() != worker) continue;
    packed.resize(static_cast<std::size_t>(t.slice.elements()));
    tile.pack(t.slice, local, packed);
    for (int r : t.group)
      if (r != worker) link.post(rank_of(r), packed);
  }
  for (const Transfer& t : x.schedule.transfers) {
    if (t.receivers.front() == worker || std::find(t.group.begin(), t.group.end(), worker) == t.group.end()) continue;
    packed.resize(static_cast<std::size_t>(t.slice.elements()));
    link.take(rank_of(t.receivers.front()), packed);
    tile.unpack(t.slice, packed, local);
  }
}

void GroupLink::post(int to_rank, std::span<const float> data) {
  Posted& p = posted_.emplace_back(Posted{std::vector<float>(data.begin(), data.end()), Work()});
  if (emulator_ != nullptr) emulator_->posted(group_.rank(), to_rank, tag_, data.size() * sizeof(float));
  p.request = group_.isend(to_rank, tag_, p.data);
}

void GroupLink::take(int from_rank, std::span<float> into) {
  group_.recv(from_rank, tag_, into, timeout_s_);
  if (emulator_ != nullptr) emulator_->taken(from_rank, group_.rank(), tag_);
}

void GroupLink::finish() {
  for (Posted& p : posted_) p.request.wait(timeout_s_);
  posted_.clear();
}

LinkEmulator::LinkEmulator(LinkModel model, std::vector<int> mesh_of_rank)
    : model_(model), mesh_of_(std::move(mesh_of_rank)) {
  const std::size_t n = mesh_of_.size();
  pair_free_.assign(n * n, Clock::time_point{});
  out_free_.assign(n, Clock::time_point{});
  in_free_.assign(n, Clock::time_point{});
}

void LinkEmulator::posted(int from, int to, int tag, std::size_t bytes) {
  const auto f = static_cast<std::size_t>(from), t = static_cast<std::size_t>(to);
  const bool across = mesh_of_[f] != mesh_of_[t];
  const auto hold = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
      static_cast<double>(bytes) / (across ? model_.between_bytes_per_s : model_.within_bytes_per_s)));
  std::lock_guard lock(mutex_);
  const auto now = Clock::now();
  // Across the meshes the sender's NIC carries the message as soon as it is free; the
  // receiver's NIC is booked when the message is taken (in the receiver's order, which is
  // the order the transfers were planned in), not here: senders post in whatever order
  // their threads run, and booking a receiver's NIC in that order would be an artefact.
  auto& link = across ? out_free_[f] : pair_free_[f * mesh_of_.size() + t];
  link = std::max(now, link) + hold;
  arrivals_[{from, to, tag}].push_back({link, across ? hold : Clock::duration::zero()});
}

void LinkEmulator::taken(int from, int to, int tag) {
  Clock::time_point arrival;
  {
    std::lock_guard lock(mutex_);
    auto& queue = arrivals_[{from, to, tag}];
    PEERTRAIN_CHECK(!queue.empty(), "link emulator: a message from ", from, " to ", to, " that was never posted");
    auto [sent, hold] = queue.front();
    queue.pop_front();
    if (hold > Clock::duration::zero()) {  // the receiver's NIC takes it in once free: full duplex, streaming
      auto& nic = in_free_[static_cast<std::size_t>(to)];
      sent = std::max(sent, nic + hold);
      nic = sent;
    }
    arrival = sent + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(model_.latency_s));
  }
  std::this_thread::sleep_until(arrival);
}

}  // namespace peertrain::parallel
