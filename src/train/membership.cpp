#include "membership.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "peertrain/core/error.h"
#include "peertrain/core/log.h"

namespace peertrain::train {
namespace {

// Payloads: a report is [step u64][count u32][ids u32...][reason]; an announcement is
// [switch step u64][stop u32][count u32][ids u32...][joins u32][(peer u32, donor u32)...].
// A rejoin request (tag kRejoinTag, step 0) is [version u32]; its answer is
// [status u32][announcement u64][switch step u64][donor u32][reason if status != 0].
constexpr std::uint32_t kRejoinTag = 1;
constexpr std::uint32_t kRejoinVersion = 1;
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

void check_fault_options(const TrainConfig& config, const topology::Topology& topology, int rank) {
  if (config.max_staleness > 0 && topology.time_varying())
    throw Error(ErrorKind::kInvalidArgument,
                str("--max-staleness ", config.max_staleness, ": ", topology.path, " changes every peer's neighbours "
                    "from step to step (", topology.name, "), so a neighbour's last parameters may be many steps old; "
                    "use --max-staleness 0 with it"));
  if (!config.rejoin) return;
  if (rank == 0)
    throw Error(ErrorKind::kInvalidArgument, "--rejoin: peer 0 coordinates the run and cannot rejoin it; restart the "
                                             "run with --resume from the latest checkpoints instead");
  if (config.resume) throw Error(ErrorKind::kInvalidArgument, "--rejoin and --resume exclude each other");
  if (config.algorithm != Algorithm::kDpsgd)
    throw Error(ErrorKind::kInvalidArgument, str("--rejoin needs --algorithm dpsgd; ", to_string(config.algorithm),
                                                 " stops the whole run when a peer is lost"));
}

Membership::Membership(net::Transport& network, const topology::Topology& topology, int rank, MembershipOptions options)
    : network_(network), topology_(topology), rank_(rank), options_(options),
      reports_read_(static_cast<std::size_t>(topology.num_peers()), 0),
      back_at_(static_cast<std::size_t>(topology.num_peers()), 0) {}

bool Membership::is_lost(int peer) const { return std::find(lost_.begin(), lost_.end(), peer) != lost_.end(); }

bool Membership::joining(int peer) const {
  return std::any_of(joining_.begin(), joining_.end(), [&](const Rejoin& j) { return j.peer == peer; });
}

// More steps than any peer can run ahead of peer 0: gossip lets a peer run at most
// max_staleness + 1 steps ahead of each neighbour, and no peer is more than n hops away.
std::uint64_t Membership::switch_lead() const {
  return (static_cast<std::uint64_t>(topology_.num_peers()) + 2) * (static_cast<std::uint64_t>(options_.max_staleness) + 1);
}

void Membership::add_failure(std::uint64_t step, int peer, const std::string& reason) {
  if (peer == 0 || is_lost(peer)) return;
  // A neighbour that noticed the old process die before the peer rejoined (a late report).
  if (step < back_at_[static_cast<std::size_t>(peer)]) return;
  lost_.push_back(peer);
  std::sort(lost_.begin(), lost_.end());
  failures_.push_back({peer, step, reason});
  log::warn("peer ", peer, " is lost (noticed at step ", step, "): ", reason);
  // Close our link too, so that a restarted process for it can rejoin (net::Transport
  // accepts a rejoining peer only on a link its side has dropped).
  if (rank_ == 0) network_.drop(peer, str("peer 0 counts ", network_.peer_name(peer), " as lost since step ", step));
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

void Membership::announce(std::uint64_t step, const std::vector<Rejoin>& joins) {
  const std::uint64_t switch_step = step + switch_lead();
  // The set everyone switches to: lost, less the peers coming back.
  std::vector<int> announced;
  for (int p : lost_)
    if (!joining(p)) announced.push_back(p);
  // Does the survivors' graph still hang together?
  const topology::Graph& g = topology_.graph;
  std::vector<int> label(static_cast<std::size_t>(g.num_peers()), -1), stack;
  int pieces = 0;
  auto gone = [&](int p) { return std::find(announced.begin(), announced.end(), p) != announced.end(); };
  for (int start = 0; start < g.num_peers(); ++start) {
    if (gone(start) || label[start] >= 0) continue;
    label[start] = pieces;
    stack.push_back(start);
    while (!stack.empty()) {
      const int p = stack.back();
      stack.pop_back();
      for (int q : g.neighbors(p))
        if (!gone(q) && label[q] < 0) {
          label[q] = pieces;
          stack.push_back(q);
        }
    }
    ++pieces;
  }
  const bool split = pieces > 1 && !topology_.time_varying();
  const bool stop = split && options_.policy == SplitPolicy::kStop;
  if (split)
    log::warn("the survivors' graph fell into ", pieces, " pieces; ",
              stop ? "stopping everyone (--on-split stop)" : "each piece trains on alone (--on-split continue)");
  std::vector<std::byte> payload;
  put(payload, &switch_step, sizeof switch_step);
  const std::uint32_t stop_flag = stop ? 1 : 0;
  put(payload, &stop_flag, sizeof stop_flag);
  const auto count = static_cast<std::uint32_t>(announced.size());
  put(payload, &count, sizeof count);
  for (int p : announced) {
    const auto id = static_cast<std::uint32_t>(p);
    put(payload, &id, sizeof id);
  }
  const auto join_count = static_cast<std::uint32_t>(joins.size());
  put(payload, &join_count, sizeof join_count);
  for (const Rejoin& j : joins) {
    const auto ids = std::array<std::uint32_t, 2>{static_cast<std::uint32_t>(j.peer), static_cast<std::uint32_t>(j.donor)};
    put(payload, ids.data(), sizeof ids);
  }
  const std::uint64_t sequence = announcements_++;
  for (int peer = 1; peer < topology_.num_peers(); ++peer) {
    if ((is_lost(peer) && !joining(peer)) || !network_.alive(peer)) continue;
    try {
      network_.send(peer, net::MessageType::kMembership, sequence, 0, payload, false).wait();
    } catch (const Error& e) {
      log::warn("could not tell peer ", peer, " about the new membership: ", e.what());
    }
  }
  if (stop)
    throw Error(ErrorKind::kPeerLost, str("the graph split into ", pieces, " pieces after losing peers; stopped "
                                          "(--on-split stop)"));
  std::vector<Rejoin> at_switch = joins;
  for (Rejoin& j : at_switch) j.step = switch_step;
  pending_.push_back({switch_step, announced, at_switch});
  log::info("peers lost so far: ", announced.size(), joins.empty() ? "" : str(", ", joins.size(), " coming back"),
            "; all survivors switch to recomputed weights at step ", switch_step);
}

// Peer 0, on a request from a restarted peer whose link is up again.
void Membership::answer_rejoin(std::uint64_t step, int peer) {
  const std::uint64_t switch_step = step + switch_lead();
  std::string refusal;
  int donor = -1;
  for (int q : topology_.graph.neighbors(peer))
    if (!is_lost(q) && (q == 0 || network_.alive(q)) && (donor < 0 || q < donor)) donor = q;
  if (coordinator_lost_) refusal = "peer 0 lost touch with the run";
  else if (donor < 0) refusal = str("none of peer ", peer, "'s neighbours is left to take parameters from");
  else if (options_.total_steps > 0 && switch_step + 1 >= static_cast<std::uint64_t>(options_.total_steps))
    refusal = str("the run ends at step ", options_.total_steps, ", too soon after step ", switch_step,
                  " for it to come back");
  std::vector<std::byte> answer;
  const std::uint32_t status = refusal.empty() ? 0 : 1;
  put(answer, &status, sizeof status);
  const std::uint64_t sequence = announcements_;  // the announcement that takes it back
  put(answer, &sequence, sizeof sequence);
  put(answer, &switch_step, sizeof switch_step);
  const auto donor_id = static_cast<std::uint32_t>(std::max(donor, 0));
  put(answer, &donor_id, sizeof donor_id);
  put(answer, refusal.data(), refusal.size());
  if (refusal.empty()) {
    const Rejoin join{peer, switch_step, donor};
    joining_.push_back(join);
    reports_read_[static_cast<std::size_t>(peer)] = 0;  // a new process counts from 0
    back_at_[static_cast<std::size_t>(peer)] = switch_step;
    log::info("peer ", peer, " asks to rejoin; it comes back at step ", switch_step, " with peer ", donor,
              "'s parameters");
    announce(step, {join});  // it is sent to the joining peer too, ahead of the answer
  } else {
    log::warn("peer ", peer, " asked to rejoin; refused: ", refusal);
  }
  try {
    network_.send(peer, net::MessageType::kMembership, 0, kRejoinTag, answer, false).wait();
  } catch (const Error& e) {
    log::warn("could not answer peer ", peer, "'s request to rejoin: ", e.what());
  }
}

RejoinTicket Membership::rejoin() {
  PEERTRAIN_CHECK(rank_ != 0, "peer 0 cannot rejoin");
  std::vector<std::byte> request;
  put(request, &kRejoinVersion, sizeof kRejoinVersion);
  network_.send(0, net::MessageType::kMembership, 0, kRejoinTag, request, false).wait();
  const net::Payload answer = network_.receive(0, net::MessageType::kMembership, 0, kRejoinTag);
  std::size_t at = 0;
  const auto status = take<std::uint32_t>(answer, at, "peer 0");
  const auto sequence = take<std::uint64_t>(answer, at, "peer 0");
  const auto switch_step = take<std::uint64_t>(answer, at, "peer 0");
  const auto donor = take<std::uint32_t>(answer, at, "peer 0");
  if (status != 0)
    throw Error(ErrorKind::kPeerLost, str("peer 0 refused to take peer ", rank_, " back: ",
                                          std::string(reinterpret_cast<const char*>(answer.data()) + at, answer.size() - at)));
  const auto neighbours = topology_.graph.neighbors(rank_);
  if (std::find(neighbours.begin(), neighbours.end(), static_cast<int>(donor)) == neighbours.end())
    throw Error(ErrorKind::kPeerLost, str("peer 0 named peer ", donor, ", not a neighbour of peer ", rank_, ", as donor"));
  announcements_ = sequence;  // poll() reads the announcement that takes us back, and later ones
  log::info("peer 0 takes us back at step ", switch_step, " with peer ", donor, "'s parameters");
  return {switch_step, static_cast<int>(donor)};
}

void Membership::take_parameters(const RejoinTicket& ticket, std::span<float> x) {
  const net::Payload payload = network_.receive(ticket.donor, net::MessageType::kParameters, ticket.step, kRejoinTag);
  if (payload.size() != x.size_bytes())
    throw Error(ErrorKind::kPeerLost, str(network_.peer_name(ticket.donor), " sent ", payload.size(),
                                          " bytes of parameters for the rejoin at step ", ticket.step, ", expected ",
                                          x.size_bytes()));
  std::memcpy(x.data(), payload.data(), payload.size());
}

std::optional<std::vector<algo::MixingRow>> Membership::poll(std::uint64_t step, std::span<const float> x) {
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
    // A restarted peer whose link is up again may ask to come back.
    for (int peer = 1; peer < topology_.num_peers(); ++peer) {
      if (!is_lost(peer) || joining(peer) || !network_.alive(peer)) continue;
      try {
        if (auto request = network_.try_receive(peer, net::MessageType::kMembership, 0, kRejoinTag)) {
          std::size_t at = 0;
          const auto version = take<std::uint32_t>(*request, at, network_.peer_name(peer));
          if (version != kRejoinVersion)
            throw Error(ErrorKind::kPeerLost, str(network_.peer_name(peer), " asked to rejoin with version ", version,
                                                  ", we speak ", kRejoinVersion));
          answer_rejoin(step, peer);
        }
      } catch (const Error& e) {
        log::warn("peer ", peer, " could not rejoin: ", e.what());
        network_.drop(peer, e.what());
      }
    }
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
        std::vector<Rejoin> joins;
        const auto join_count = at < message->size() ? take<std::uint32_t>(*message, at, "peer 0") : 0;
        if (join_count > static_cast<std::uint32_t>(topology_.num_peers()))
          throw Error(ErrorKind::kPeerLost, str("membership message from peer 0 lists ", join_count, " rejoining peers"));
        for (std::uint32_t i = 0; i < join_count; ++i) {
          const auto peer = take<std::uint32_t>(*message, at, "peer 0");
          const auto donor = take<std::uint32_t>(*message, at, "peer 0");
          const auto n = static_cast<std::uint32_t>(topology_.num_peers());
          if (peer >= n || donor >= n)
            throw Error(ErrorKind::kPeerLost, str("membership message from peer 0 names peer ", std::max(peer, donor)));
          joins.push_back({static_cast<int>(peer), switch_step, static_cast<int>(donor)});
        }
        lost_ = ids;
        pending_.push_back({switch_step, std::move(ids), std::move(joins)});
      }
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kPeerLost && std::string(e.what()).find("stopped the run") != std::string::npos) throw;
      coordinator_lost_ = true;
      log::warn("lost peer 0, the coordinator: ", e.what());
    }
  }
  std::optional<std::vector<int>> switch_to;
  while (!pending_.empty() && step >= pending_.front().switch_step) {
    Pending& next = pending_.front();
    if (step > next.switch_step)
      log::warn("switching to recomputed weights at step ", step, ", after the agreed step ", next.switch_step);
    for (const Rejoin& join : next.joins) {
      if (join.donor == rank_ && join.peer != rank_) {
        // The peer coming back starts from our parameters of this step.
        PEERTRAIN_CHECK(x.size() > 0, "poll() needs x at a step where this peer is a donor");
        try {
          network_.send(join.peer, net::MessageType::kParameters, step, kRejoinTag, net::as_bytes(x), false).wait();
          log::info("sent peer ", join.peer, " our parameters of step ", step, " to rejoin with");
        } catch (const Error& e) {
          log::warn("could not send peer ", join.peer, " the parameters to rejoin with: ", e.what());
        }
      }
      if (rank_ == 0) {
        lost_.erase(std::remove(lost_.begin(), lost_.end(), join.peer), lost_.end());
        joining_.erase(std::remove_if(joining_.begin(), joining_.end(), [&](const Rejoin& j) { return j.peer == join.peer; }),
                       joining_.end());
        rejoins_.push_back(join);
        network_.readmit(join.peer);
        log::info("peer ", join.peer, " is back from step ", step);
      }
    }
    switch_to = std::move(next.lost);
    pending_.erase(pending_.begin());
  }
  if (switch_to) return algo::mixing_rows_without(topology_, rank_, *switch_to);
  return std::nullopt;
}

}  // namespace peertrain::train
