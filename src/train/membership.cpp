#include "membership.h"

#include <algorithm>
#include <cstring>

#include "peertrain/core/error.h"
#include "peertrain/core/log.h"

namespace peertrain::train {
namespace {

// Payloads: a report is [step u64][count u32][ids u32...][reason]; an announcement is
// [switch step u64][stop u32][count u32][ids u32...].
void put(std::vector<std::byte>& out, const void* data, std::size_t size) {
  const auto* bytes = static_cast<const std::byte*>(data);
  out.insert(out.end(), bytes, bytes + size);
}

template <typename T>
T take(const net::Payload& in, std::size_t& at, const std::string& from) {
  T value;
  if (at + sizeof(T) > in.size()) throw Error(ErrorKind::kPeerLost, str("truncated membership message from ", from));
  std::memcpy(&value, in.data() + at, sizeof(T));
  at += sizeof(T);
  return value;
}

std::vector<int> read_ids(const net::Payload& in, std::size_t& at, int peers, const std::string& from) {
  const auto count = take<std::uint32_t>(in, at, from);
  if (count > static_cast<std::uint32_t>(peers))
    throw Error(ErrorKind::kPeerLost, str("membership message from ", from, " lists ", count, " peers"));
  std::vector<int> ids;
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto id = take<std::uint32_t>(in, at, from);
    if (id >= static_cast<std::uint32_t>(peers))
      throw Error(ErrorKind::kPeerLost, str("membership message from ", from, " names peer ", id));
    ids.push_back(static_cast<int>(id));
  }
  return ids;
}

}  // namespace

Membership::Membership(net::Network& network, const topology::Topology& topology, int rank, SplitPolicy policy)
    : network_(network), topology_(topology), rank_(rank), policy_(policy),
      reports_read_(static_cast<std::size_t>(topology.num_peers()), 0) {}

bool Membership::is_lost(int peer) const { return std::find(lost_.begin(), lost_.end(), peer) != lost_.end(); }

void Membership::add_failure(std::uint64_t step, int peer, const std::string& reason) {
  if (peer == 0 || is_lost(peer)) return;
  lost_.push_back(peer);
  std::sort(lost_.begin(), lost_.end());
  failures_.push_back({peer, step, reason});
  log::warn("peer ", peer, " is lost (noticed at step ", step, "): ", reason);
}

void Membership::report_lost(std::uint64_t step, const std::vector<std::pair<int, std::string>>& lost) {
  for (const auto& [peer, reason] : lost) {
    if (peer == 0) {
      coordinator_lost_ = true;
      log::warn("lost peer 0, the coordinator: training goes on without evaluation or recomputed weights");
    }
  }
  if (rank_ == 0) {
    for (const auto& [peer, reason] : lost) add_failure(step, peer, reason);
    return;
  }
  std::vector<int> peers;
  for (const auto& [peer, reason] : lost)
    if (peer != 0) peers.push_back(peer);
  if (!peers.empty()) send_to_coordinator(step, peers, lost.front().second);
}

void Membership::lost_outside_gossip(std::uint64_t step, int peer, const std::string& reason) {
  add_failure(step, peer, reason);
}

void Membership::send_to_coordinator(std::uint64_t step, const std::vector<int>& peers, const std::string& reason) {
  if (coordinator_lost_) return;
  std::vector<std::byte> payload;
  put(payload, &step, sizeof step);
  const auto count = static_cast<std::uint32_t>(peers.size());
  put(payload, &count, sizeof count);
  for (int p : peers) {
    const auto id = static_cast<std::uint32_t>(p);
    put(payload, &id, sizeof id);
  }
  put(payload, reason.data(), std::min<std::size_t>(reason.size(), 512));
  try {
    network_.send(0, net::MessageType::kMembership, reports_sent_++, 0, payload, false).wait();
  } catch (const Error& e) {
    coordinator_lost_ = true;
    log::warn("cannot reach peer 0 to report a lost peer: ", e.what());
  }
}

void Membership::announce(std::uint64_t step) {
  const std::uint64_t switch_step = step + static_cast<std::uint64_t>(topology_.num_peers()) + 2;
  // Does the survivors' graph still hang together?
  const topology::Graph& g = topology_.graph;
  std::vector<int> label(static_cast<std::size_t>(g.num_peers()), -1), stack;
  int pieces = 0;
  for (int start = 0; start < g.num_peers(); ++start) {
    if (is_lost(start) || label[start] >= 0) continue;
    label[start] = pieces;
    stack.push_back(start);
    while (!stack.empty()) {
      const int p = stack.back();
      stack.pop_back();
      for (int q : g.neighbors(p))
        if (!is_lost(q) && label[q] < 0) {
          label[q] = pieces;
          stack.push_back(q);
        }
    }
    ++pieces;
  }
  const bool split = pieces > 1 && !topology_.time_varying();
  const bool stop = split && policy_ == SplitPolicy::kStop;
  if (split)
    log::warn("the survivors' graph fell into ", pieces, " pieces; ",
              stop ? "stopping everyone (--on-split stop)" : "each piece trains on alone (--on-split continue)");
  std::vector<std::byte> payload;
  put(payload, &switch_step, sizeof switch_step);
  const std::uint32_t stop_flag = stop ? 1 : 0;
  put(payload, &stop_flag, sizeof stop_flag);
  const auto count = static_cast<std::uint32_t>(lost_.size());
  put(payload, &count, sizeof count);
  for (int p : lost_) {
    const auto id = static_cast<std::uint32_t>(p);
    put(payload, &id, sizeof id);
  }
  const std::uint64_t sequence = announcements_++;
  for (int peer = 1; peer < topology_.num_peers(); ++peer) {
    if (is_lost(peer) || !network_.alive(peer)) continue;
    try {
      network_.send(peer, net::MessageType::kMembership, sequence, 0, payload, false).wait();
    } catch (const Error& e) {
      log::warn("could not tell peer ", peer, " about the new membership: ", e.what());
    }
  }
  if (stop)
    throw Error(ErrorKind::kPeerLost, str("the graph split into ", pieces, " pieces after losing peers; stopped "
                                          "(--on-split stop)"));
  pending_ = std::make_pair(switch_step, lost_);
  log::info("peers lost so far: ", lost_.size(), "; all survivors switch to recomputed weights at step ", switch_step);
}

std::optional<std::vector<algo::MixingRow>> Membership::poll(std::uint64_t step) {
  if (rank_ == 0) {
    const std::size_t known = lost_.size();
    for (int peer = 1; peer < topology_.num_peers(); ++peer) {
      if (is_lost(peer)) continue;
      try {
        while (auto report = network_.try_receive(peer, net::MessageType::kMembership, reports_read_[peer], 0)) {
          ++reports_read_[peer];
          std::size_t at = 0;
          const auto when = take<std::uint64_t>(*report, at, network_.peer_name(peer));
          const auto ids = read_ids(*report, at, topology_.num_peers(), network_.peer_name(peer));
          const std::string reason(reinterpret_cast<const char*>(report->data() + at), report->size() - at);
          for (int id : ids) add_failure(when, id, str("reported by peer ", peer, ": ", reason));
        }
      } catch (const Error& e) {
        // The link to a peer that is not our gossip neighbour broke: it is gone too.
        add_failure(step, peer, e.what());
      }
    }
    if (lost_.size() != known) announce(step);
  } else if (!coordinator_lost_) {
    try {
      while (auto message = network_.try_receive(0, net::MessageType::kMembership, announcements_, 0)) {
        ++announcements_;
        std::size_t at = 0;
        const auto switch_step = take<std::uint64_t>(*message, at, "peer 0");
        const auto stop = take<std::uint32_t>(*message, at, "peer 0");
        auto ids = read_ids(*message, at, topology_.num_peers(), "peer 0");
        if (stop)
          throw Error(ErrorKind::kPeerLost, "peer 0 stopped the run: the graph split after losing peers (--on-split stop)");
        lost_ = ids;
        pending_ = std::make_pair(switch_step, std::move(ids));
      }
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kPeerLost && std::string(e.what()).find("stopped the run") != std::string::npos) throw;
      coordinator_lost_ = true;
      log::warn("lost peer 0, the coordinator: ", e.what());
    }
  }
  if (pending_ && step >= pending_->first) {
    if (step > pending_->first)
      log::warn("switching to recomputed weights at step ", step, ", after the agreed step ", pending_->first);
    auto rows = algo::mixing_rows_without(topology_, rank_, pending_->second);
    pending_.reset();
    return rows;
  }
  return std::nullopt;
}

}  // namespace peertrain::train
