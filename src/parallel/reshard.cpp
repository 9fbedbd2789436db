// The cross-mesh resharding planner of reshard.h.
#include "peertrain/parallel/reshard.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "peertrain/core/error.h"

namespace peertrain::parallel {
namespace {

Error invalid(const std::string& message) { return Error(ErrorKind::kInvalidArgument, message); }

// What identifies a group of destinations that can share one transfer: the same slice
// from the same holders.
using SliceKey = std::tuple<std::vector<std::int64_t>, std::vector<std::int64_t>, std::vector<int>>;
SliceKey slice_key(const ReshardTask& task) { return {task.slice.lo, task.slice.hi, task.holders}; }

// The order the transfers go out in: rounds in which no source worker sends twice and no
// destination worker receives across twice, the larger transfers first (greedy matchings
// of the bipartite graph of transfers). Senders then spread their first messages over
// different receivers instead of all starting on the same one, which on links that carry
// one message at a time would leave most of them idle — the role of the paper's ordering
// of the send/recv tasks. Each worker still handles its own transfers in list order.
void order_in_rounds(std::vector<Transfer>& transfers) {
  std::vector<std::size_t> left(transfers.size());
  std::iota(left.begin(), left.end(), 0);
  std::stable_sort(left.begin(), left.end(), [&](std::size_t a, std::size_t b) {
    return transfers[a].slice.elements() > transfers[b].slice.elements();
  });
  std::vector<Transfer> ordered;
  while (!left.empty()) {
    std::set<int> senders, receivers;
    std::vector<std::size_t> later;
    for (std::size_t i : left) {
      const Transfer& t = transfers[i];
      if (senders.count(t.sender) || receivers.count(t.receivers.front())) {
        later.push_back(i);
        continue;
      }
      senders.insert(t.sender);
      receivers.insert(t.receivers.front());
      ordered.push_back(std::move(transfers[i]));
    }
    left = std::move(later);
  }
  transfers = std::move(ordered);
}

std::string box_text(const Box& box) {
  std::string text = "[";
  for (std::size_t d = 0; d < box.lo.size(); ++d) text += str(d ? ", " : "", box.lo[d], ":", box.hi[d]);
  return text + "]";
}

}  // namespace

int Mesh::workers() const {
  int n = 1;
  for (int a : axes) n *= a;
  return n;
}

std::vector<int> Mesh::coordinates(int worker) const {
  std::vector<int> at(axes.size());
  for (std::size_t a = axes.size(); a-- > 0;) {
    at[a] = worker % axes[a];
    worker /= axes[a];
  }
  return at;
}

Layout parse_layout(std::string_view text, std::string_view what) {
  Layout layout;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    if (item == "R") {
      layout.split_axis.push_back(-1);
    } else if (item.size() == 2 && (item[0] == 'S' || item[0] == 'Z') && item[1] >= '0' && item[1] <= '9') {
      layout.split_axis.push_back(item[1] - '0');
      layout.zigzag.resize(layout.split_axis.size(), 0);
      layout.zigzag.back() = item[0] == 'Z';
    } else {
      throw invalid(str(what, " '", text, "': '", item,
                        "' is neither R (not split), S<axis> (split over that mesh axis) nor Z<axis> (split "
                        "zigzag), e.g. S0,R"));
    }
    start = comma + 1;
  }
  layout.zigzag.resize(layout.split_axis.size(), 0);
  return layout;
}

std::string to_string(const Layout& layout) {
  std::string text;
  for (std::size_t d = 0; d < layout.split_axis.size(); ++d)
    text += str(d ? "," : "", layout.split_axis[d] < 0 ? std::string("R")
                                                       : str(layout.is_zigzag(d) ? "Z" : "S", layout.split_axis[d]));
  return text;
}

std::int64_t Box::elements() const {
  std::int64_t n = 1;
  for (std::size_t d = 0; d < lo.size(); ++d) n *= std::max<std::int64_t>(0, hi[d] - lo[d]);
  return n;
}

bool Box::empty() const { return elements() == 0; }

bool Box::contains(std::span<const std::int64_t> index) const {
  for (std::size_t d = 0; d < lo.size(); ++d)
    if (index[d] < lo[d] || index[d] >= hi[d]) return false;
  return true;
}

Box intersect(const Box& a, const Box& b) {
  Box c;
  for (std::size_t d = 0; d < a.lo.size(); ++d) {
    c.lo.push_back(std::max(a.lo[d], b.lo[d]));
    c.hi.push_back(std::max(c.lo.back(), std::min(a.hi[d], b.hi[d])));
  }
  return c;
}

void check_layout(const Mesh& mesh, const Layout& layout, std::span<const std::int64_t> shape, std::string_view what) {
  if (mesh.axes.empty()) throw invalid(str(what, ": a mesh needs at least one axis"));
  for (std::size_t a = 0; a < mesh.axes.size(); ++a)
    if (mesh.axes[a] < 1) throw invalid(str(what, ": axis ", a, " has ", mesh.axes[a], " workers, expected ≥ 1"));
  if (layout.split_axis.size() != shape.size())
    throw invalid(str(what, ": layout ", to_string(layout), " has ", layout.split_axis.size(),
                      " dimensions, the tensor ", shape.size()));
  std::vector<bool> used(mesh.axes.size(), false);
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const int a = layout.split_axis[d];
    if (a < 0) continue;
    if (a >= static_cast<int>(mesh.axes.size()))
      throw invalid(
          str(what, ": dimension ", d, " is split over axis ", a, ", but the mesh has ", mesh.axes.size(), " axes"));
    if (used[a]) throw invalid(str(what, ": axis ", a, " splits two dimensions"));
    used[a] = true;
    const int pieces = layout.is_zigzag(d) ? 2 * mesh.axes[a] : mesh.axes[a];
    if (shape[d] % pieces != 0)
      throw invalid(str(what, ": dimension ", d, " (", shape[d], ") does not split evenly over axis ", a, " (",
                        mesh.axes[a], " workers", layout.is_zigzag(d) ? str(", ", pieces, " zigzag pieces") : "", ")"));
  }
}

std::vector<Box> tiles(const Mesh& mesh, const Layout& layout, std::span<const std::int64_t> shape, int worker) {
  PEERTRAIN_CHECK(worker >= 0 && worker < mesh.workers(), "worker ", worker, " of ", mesh.workers());
  const auto at = mesh.coordinates(worker);
  std::vector<Box> boxes{Box{}};
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const int a = layout.split_axis[d];
    // The intervals of dimension d this worker holds: one, or a zigzag pair.
    std::vector<std::pair<std::int64_t, std::int64_t>> spans;
    if (a < 0) {
      spans.push_back({0, shape[d]});
    } else if (!layout.is_zigzag(d)) {
      const std::int64_t part = shape[d] / mesh.axes[a];
      spans.push_back({at[a] * part, (at[a] + 1) * part});
    } else {
      const std::int64_t k = mesh.axes[a], part = shape[d] / (2 * k);
      for (std::int64_t piece : {static_cast<std::int64_t>(at[a]), 2 * k - 1 - at[a]})
        spans.push_back({piece * part, (piece + 1) * part});
    }
    std::vector<Box> next;
    for (const Box& b : boxes)
      for (auto [lo, hi] : spans) {
        Box c = b;
        c.lo.push_back(lo);
        c.hi.push_back(hi);
        next.push_back(std::move(c));
      }
    boxes = std::move(next);
  }
  return boxes;
}

Box tile(const Mesh& mesh, const Layout& layout, std::span<const std::int64_t> shape, int worker) {
  auto boxes = tiles(mesh, layout, shape, worker);
  PEERTRAIN_CHECK(boxes.size() == 1, "layout ", to_string(layout), " gives worker ", worker, " ", boxes.size(),
                  " boxes: call tiles()");
  return boxes.front();
}

std::vector<ReshardTask> plan_reshard(const Mesh& source, const Layout& source_layout, const Mesh& destination,
                                      const Layout& destination_layout, std::span<const std::int64_t> shape) {
  check_layout(source, source_layout, shape, "the source mesh");
  check_layout(destination, destination_layout, shape, "the destination mesh");
  // The distinct source tiles (replicas share one) partition the tensor, so their
  // intersections with a destination tile cover it exactly once.
  std::vector<std::pair<Box, std::vector<int>>> distinct;
  for (int w = 0; w < source.workers(); ++w)
    for (const Box& box : tiles(source, source_layout, shape, w)) {
      auto it = std::find_if(distinct.begin(), distinct.end(), [&](const auto& e) { return e.first == box; });
      if (it == distinct.end())
        distinct.push_back({box, {w}});
      else
        it->second.push_back(w);
    }
  std::vector<ReshardTask> tasks;
  for (int w = 0; w < destination.workers(); ++w)
    for (const Box& wanted : tiles(destination, destination_layout, shape, w))
      for (const auto& [box, holders] : distinct) {
        Box slice = intersect(wanted, box);
        if (!slice.empty()) tasks.push_back({w, std::move(slice), holders});
      }
  return tasks;
}

ReshardStrategy parse_reshard_strategy(std::string_view text, std::string_view flag) {
  if (text == "send-recv") return ReshardStrategy::kSendRecv;
  if (text == "broadcast") return ReshardStrategy::kBroadcast;
  if (text == "local-allgather") return ReshardStrategy::kLocalAllGather;
  throw invalid(str(flag, " '", text, "': expected send-recv, broadcast or local-allgather"));
}

std::string_view to_string(ReshardStrategy strategy) {
  switch (strategy) {
    case ReshardStrategy::kSendRecv:
      return "send-recv";
    case ReshardStrategy::kBroadcast:
      return "broadcast";
    case ReshardStrategy::kLocalAllGather:
      return "local-allgather";
  }
  return "?";
}

std::int64_t ReshardSchedule::busiest_link() const {
  std::int64_t most = 0;
  for (auto n : source_sent) most = std::max(most, n);
  for (auto n : destination_received) most = std::max(most, n);
  return most;
}

ReshardSchedule schedule_reshard(const std::vector<ReshardTask>& tasks, ReshardStrategy strategy, int source_workers,
                                 int destination_workers) {
  ReshardSchedule out;
  out.source_sent.assign(static_cast<std::size_t>(source_workers), 0);
  out.destination_received.assign(static_cast<std::size_t>(destination_workers), 0);
  out.destination_gathered.assign(static_cast<std::size_t>(destination_workers), 0);
  // The destinations that need the same slice from the same holders: one group each
  // (send-recv keeps every destination apart).
  struct Group {
    Box slice;
    std::vector<int> holders, receivers;
  };
  std::vector<Group> groups;
  std::map<SliceKey, std::size_t> index;
  for (const ReshardTask& task : tasks) {
    const SliceKey key = slice_key(task);
    auto it = strategy == ReshardStrategy::kSendRecv ? index.end() : index.find(key);
    if (it == index.end()) {
      if (strategy != ReshardStrategy::kSendRecv) index[key] = groups.size();
      groups.push_back({task.slice, task.holders, {task.destination}});
    } else {
      groups[it->second].receivers.push_back(task.destination);
    }
  }
  // Greedy balance by bytes: the largest pieces first, each from the holder that has sent
  // the least so far.
  std::stable_sort(groups.begin(), groups.end(),
                   [](const Group& a, const Group& b) { return a.slice.elements() > b.slice.elements(); });
  auto least_loaded = [&](const std::vector<int>& holders) {
    return *std::min_element(holders.begin(), holders.end(), [&](int a, int b) {
      return std::tie(out.source_sent[static_cast<std::size_t>(a)], a) <
             std::tie(out.source_sent[static_cast<std::size_t>(b)], b);
    });
  };
  std::vector<std::int64_t> head_bytes(static_cast<std::size_t>(destination_workers), 0);
  for (const Group& g : groups) {
    const std::int64_t n = g.slice.elements();
    if (strategy != ReshardStrategy::kLocalAllGather || g.receivers.size() == 1) {
      const int sender = least_loaded(g.holders);
      out.source_sent[static_cast<std::size_t>(sender)] += n;  // a multicast leaves the sender once
      for (int r : g.receivers) out.destination_received[static_cast<std::size_t>(r)] += n;
      // Carried out as a chain (reshard_exchange.h), the first receiver's link takes the
      // slice across: start the chain at the receiver that has headed the fewest bytes.
      std::vector<int> chain = g.receivers;
      const auto head = std::min_element(chain.begin(), chain.end(), [&](int a, int b) {
        return std::tie(head_bytes[static_cast<std::size_t>(a)], a) <
               std::tie(head_bytes[static_cast<std::size_t>(b)], b);
      });
      std::rotate(chain.begin(), head, chain.end());
      head_bytes[static_cast<std::size_t>(chain.front())] += n;
      out.transfers.push_back({sender, std::move(chain), g.slice, {}, {}});
      continue;
    }
    // Local all-gather: the slice cut along its longest dimension into one piece per
    // receiver (fewer when that dimension is shorter), each sent to one receiver, then
    // gathered inside the destination mesh.
    std::size_t longest = 0;
    for (std::size_t d = 1; d < g.slice.lo.size(); ++d)
      if (g.slice.hi[d] - g.slice.lo[d] > g.slice.hi[longest] - g.slice.lo[longest]) longest = d;
    const std::int64_t length = g.slice.hi[longest] - g.slice.lo[longest];
    const auto pieces = static_cast<int>(std::min<std::int64_t>(length, static_cast<std::int64_t>(g.receivers.size())));
    auto piece_of = [&](int k) {
      Box piece = g.slice;
      piece.lo[longest] = g.slice.lo[longest] + length * k / pieces;
      piece.hi[longest] = g.slice.lo[longest] + length * (k + 1) / pieces;
      return piece;
    };
    for (int k = 0; k < static_cast<int>(g.receivers.size()); ++k) {
      const int receiver = g.receivers[static_cast<std::size_t>(k)];
      std::int64_t got = 0;
      if (k < pieces) {
        const Box piece = piece_of(k);
        const int sender = least_loaded(g.holders);
        got = piece.elements();
        out.source_sent[static_cast<std::size_t>(sender)] += got;
        out.destination_received[static_cast<std::size_t>(receiver)] += got;
        out.transfers.push_back({sender, {receiver}, piece, g.receivers, g.slice});
      }
      out.destination_gathered[static_cast<std::size_t>(receiver)] += n - got;
    }
  }
  order_in_rounds(out.transfers);
  return out;
}

std::string describe(const ReshardSchedule& schedule) {
  std::string text;
  for (const Transfer& t : schedule.transfers) {
    std::string to;
    for (int r : t.receivers) to += str(to.empty() ? "" : ",", r);
    text += str("source ", t.sender, " -> destination ", to, ": ", box_text(t.slice), " (", t.slice.elements(),
                " elements)");
    if (!t.group.empty()) {
      std::string group;
      for (int r : t.group) group += str(group.empty() ? "" : ",", r);
      text += str(", then all-gathered by ", group, " into ", box_text(t.whole));
    }
    text += "\n";
  }
  for (std::size_t w = 0; w < schedule.source_sent.size(); ++w)
    text += str("source ", w, " sends ", schedule.source_sent[w], "\n");
  for (std::size_t w = 0; w < schedule.destination_received.size(); ++w)
    text += str("destination ", w, " receives ", schedule.destination_received[w], " across, ",
                schedule.destination_gathered[w], " by all-gather\n");
  return text;
}

ReshardCost reshard_cost(const std::vector<ReshardTask>& tasks, const ReshardSchedule& schedule, const LinkModel& links,
                         int element_bytes) {
  const double eb = element_bytes;
  std::vector<int> sender_messages(schedule.source_sent.size(), 0),
      receiver_messages(schedule.destination_received.size(), 0);
  for (const Transfer& t : schedule.transfers) {
    ++sender_messages[static_cast<std::size_t>(t.sender)];
    for (int r : t.receivers) ++receiver_messages[static_cast<std::size_t>(r)];
  }
  double across = 0, gather = 0;
  for (std::size_t w = 0; w < schedule.source_sent.size(); ++w)
    across = std::max(across, static_cast<double>(schedule.source_sent[w]) * eb / links.between_bytes_per_s +
                                  links.latency_s * sender_messages[w]);
  for (std::size_t w = 0; w < schedule.destination_received.size(); ++w) {
    across = std::max(across, static_cast<double>(schedule.destination_received[w]) * eb / links.between_bytes_per_s +
                                  links.latency_s * receiver_messages[w]);
    if (schedule.destination_gathered[w] > 0)
      gather = std::max(gather, static_cast<double>(schedule.destination_gathered[w]) * eb / links.within_bytes_per_s +
                                    links.latency_s);
  }
  // How many destinations need each (slice, holders), for the bound.
  std::map<SliceKey, int> sharing;
  for (const ReshardTask& t : tasks) ++sharing[slice_key(t)];
  std::vector<double> least(schedule.destination_received.size(), 0.0);
  for (const ReshardTask& t : tasks)
    least[static_cast<std::size_t>(t.destination)] += static_cast<double>(t.slice.elements()) / sharing[slice_key(t)];
  // And every distinct slice must leave the source mesh once: a slice only one worker holds
  // from that worker, and all of them from the source workers together.
  std::vector<double> must_send(schedule.source_sent.size(), 0.0);
  double unique = 0;
  for (const auto& [key, count] : sharing) {
    const auto& [lo, hi, holders] = key;
    const double n = static_cast<double>(Box{lo, hi}.elements());
    unique += n;
    if (holders.size() == 1) must_send[static_cast<std::size_t>(holders[0])] += n;
  }
  const double source_least =
      std::max(*std::max_element(must_send.begin(), must_send.end()), unique / static_cast<double>(must_send.size()));
  ReshardCost cost;
  cost.seconds = across + gather;
  cost.bound_seconds =
      std::max(*std::max_element(least.begin(), least.end()), source_least) * eb / links.between_bytes_per_s +
      links.latency_s;  // and one message at least
  cost.busiest_link_bytes = schedule.busiest_link() * element_bytes;
  return cost;
}

}  // namespace peertrain::parallel
