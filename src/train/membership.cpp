#include "membership.h"
#include "peertrain/core/clock.h"

#include <chrono>
#include <thread>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>

#include "peertrain/core/error.h"
#include "peertrain/core/log.h"

namespace peertrain::train {

void check_fault_options(const TrainConfig& config, const topology::Topology& topology, int rank) {
  (void)rank;
  check_algorithm_topology(config, topology);
  // Push-sum takes each late message once, whenever it arrives: a changing graph is fine.
  if (config.max_staleness > 0 && topology.time_varying() && config.algorithm != Algorithm::kSgp)
    throw Error(ErrorKind::kInvalidArgument,
                str("--max-staleness ", config.max_staleness, ": ", topology.path, " changes every peer's neighbours "
                    "from step to step (", topology.name, "), so a neighbour's last parameters may be many steps old; "
                    "use --max-staleness 0 with it"));
  // CHOCO's public copies and D²'s previous iterate are not in the checkpoints, and a
  // peer coming back would not hold its neighbours' copies.
  if (config.algorithm == Algorithm::kAdpsgd && (config.resume || config.checkpoint_every > 0 || config.rejoin))
    throw Error(ErrorKind::kInvalidArgument,
                str(config.resume   ? "--resume"
                    : config.rejoin ? "--rejoin"
                                    : "--checkpoint-every",
                    ": --algorithm adpsgd has no global step to checkpoint at or rejoin at; it goes on without a lost "
                    "peer. Use dpsgd for checkpoints and rejoins"));
  const bool keeps_more = config.algorithm == Algorithm::kChoco || config.algorithm == Algorithm::kD2 ||
                          config.algorithm == Algorithm::kGt || config.algorithm == Algorithm::kSgp;
  if (config.resume && keeps_more)
    throw Error(ErrorKind::kInvalidArgument,
                str("--resume: --algorithm ", to_string(config.algorithm), " keeps state the checkpoints do not hold (",
                    config.algorithm == Algorithm::kChoco ? "the public copies x̂"
                    : config.algorithm == Algorithm::kGt  ? "the tracked gradient y"
                    : config.algorithm == Algorithm::kSgp ? "the push-sum weight w and its numerator x"
                                                          : "the previous iterate and update",
                    "); resume works with dpsgd and the centralized algorithms"));
  if (!config.rejoin) return;
  if (config.resume) throw Error(ErrorKind::kInvalidArgument, "--rejoin and --resume exclude each other");
  if (config.algorithm == Algorithm::kDiloco && config.outer.exchange != OuterExchange::kPs) return;
  if (config.algorithm != Algorithm::kDpsgd)
    throw Error(ErrorKind::kInvalidArgument,
                str("--rejoin needs --algorithm dpsgd or diloco; ", to_string(config.algorithm),
                    keeps_more || config.algorithm == Algorithm::kEl
                        ? " goes on without a lost peer but cannot take it back (its state is not shared)"
                        : " stops the whole run when a peer is lost"));
}

Membership::Membership(net::Transport& network, const topology::Topology& topology, int rank, MembershipOptions options)
    : network_(network), topology_(topology), rank_(rank), n_(topology.num_peers()), options_(options),
      reports_sent_(static_cast<std::size_t>(n_), 0), reports_read_(static_cast<std::size_t>(n_), 0),
      announcements_read_(static_cast<std::size_t>(n_), 0), back_at_(static_cast<std::size_t>(n_), 0) {
  linked_.assign(static_cast<std::size_t>(n_), 0);
  for (int p : network.links()) linked_[static_cast<std::size_t>(p)] = 1;
}

bool Membership::is_lost(int peer) const { return std::binary_search(lost_.begin(), lost_.end(), peer); }

bool Membership::joining(int peer) const {
  return std::any_of(joining_.begin(), joining_.end(), [&](const Rejoin& j) { return j.peer == peer; });
}

// More steps than any peer can run ahead of the coordinator: gossip lets a peer run at most
// max_staleness + 1 steps ahead of each neighbour, and no peer is more than n hops away.
std::uint64_t Membership::switch_lead() const {
  return (static_cast<std::uint64_t>(n_) + 2) * (static_cast<std::uint64_t>(options_.max_staleness) + 1);
}

std::uint64_t Membership::switch_step_after(std::uint64_t step, bool apart) const {
  std::uint64_t at = step + switch_lead();
  const auto sync = static_cast<std::uint64_t>(options_.sync_every);
  if (apart && sync > 0) at = (at + sync - 1) / sync * sync;  // step k·sync runs right after barrier k
  return at;
}

// Counts a peer lost and drops our link to it (so a restarted process for it can rejoin:
// net::Transport accepts a rejoining peer only on a link its side has dropped).
void Membership::count_lost(std::uint64_t step, int peer, const std::string& reason) {
  if (peer == rank_ || is_lost(peer)) return;
  // A peer that noticed the old process die before it rejoined (a late report).
  if (step < back_at_[static_cast<std::size_t>(peer)]) return;
  // A coordinator that stops the run (--on-split stop) sends its last announcement and
  // goes at once: read what it left before dropping its link, or a peer that notices the
  // broken link first would never hear the stop and would train on. Any peer's link, not
  // only our coordinator's: after a partition a peer may lose its side's new coordinator
  // before it has read the takeover that names it (seen in cli.netlab: peer 5 lost 4, 6
  // and 7, which had stopped, and reported itself cut off instead of the stop).
  if (!is_coordinator() && !reading_last_words_) {
    reading_last_words_ = true;
    try {
      read_announcements();
    } catch (...) {
      reading_last_words_ = false;
      throw;
    }
    reading_last_words_ = false;
    if (is_lost(peer)) return;  // a takeover the announcements carried counts it already
  }
  lost_.insert(std::upper_bound(lost_.begin(), lost_.end(), peer), peer);
  if (linked_[static_cast<std::size_t>(peer)])
    network_.drop(peer, str("peer ", rank_, " counts ", name(peer), " as lost since step ", step));
  log::warn("peer ", peer, " is lost (noticed at step ", step, "): ", reason);
  Failure f{peer, step, reason.substr(0, kMaxReasonBytes)};
  if (is_coordinator()) {
    failures_.push_back(std::move(f));
    changed_ = true;
  } else {
    local_.push_back(std::move(f));
  }
}

void Membership::report_lost(std::uint64_t step, const std::vector<std::pair<int, std::string>>& lost) {
  std::vector<int> fresh;
  for (const auto& [peer, reason] : lost)
    if (peer != rank_ && !is_lost(peer)) {
      count_lost(step, peer, reason);
      if (is_lost(peer)) fresh.push_back(peer);
    }
  if (is_lost(coordinator_)) return coordinator_gone(step);  // tells the next one everything
  if (!fresh.empty()) send_report(step, fresh, lost.front().second);
}

// Our coordinator is lost: the lowest id we do not count lost takes over (maybe us).
void Membership::coordinator_gone(std::uint64_t step) {
  const int old = coordinator_;
  // A candidate that has sent nothing, not even the heartbeat its transport sends every
  // second, for half of --peer-timeout (the gossip's bound for a silent neighbour) is gone
  // too: skipping it now spares a wait of --peer-timeout per silent candidate, which on
  // a peer cut off from the network added up to minutes before it found itself alone.
  const double silent_s = network_.peer_timeout_s() / 2;
  int next = 0;
  for (;;) {
    while (is_lost(next)) ++next;  // stops at rank_ at the latest: we never count ourselves lost
    if (next == rank_ || !linked_[static_cast<std::size_t>(next)]) break;
    const double silence = network_.silence_s(next);
    if (silence < silent_s) break;
    count_lost(step, next, str(name(next), " has sent nothing, not even a heartbeat, for ", static_cast<int>(silence),
                               " s; peer ", rank_, " gives up on it"));
  }
  coordinator_ = next;
  if (next == rank_) {
    ++epoch_;
    takeovers_.push_back({rank_, step, old});
    for (Failure& f : local_) {
      const bool known = std::any_of(failures_.begin(), failures_.end(), [&](const Failure& g) {
        return g.peer == f.peer && g.step == f.step;
      });
      if (!known) failures_.push_back(std::move(f));
    }
    local_.clear();
    changed_ = true;  // announced at the next poll()
    log::warn("peer ", old, ", the coordinator, is lost; peer ", rank_, " (this peer) takes over at step ", step,
              " (epoch ", epoch_, ")");
    return;
  }
  log::warn("peer ", old, ", the coordinator, is lost; turning to peer ", next);
  const std::vector<Failure> mine = local_;  // send_report may lose the next one too
  for (const Failure& f : mine) {
    if (coordinator_ != next) return;  // coordinator_gone ran again inside and told its successor
    send_report(f.step, {f.peer}, f.reason);
  }
}

void Membership::send_report(std::uint64_t step, const std::vector<int>& peers, const std::string& reason) {
  if (is_coordinator()) return;
  const int to = coordinator_;
  try {
    network_.send(to, net::MessageType::kMembership, reports_sent_[static_cast<std::size_t>(to)]++, kReportTag,
                  encode_report({step, peers, reason}), false)
        .wait();
  } catch (const Error& e) {
    report_lost(step, to, str("cannot report a lost peer to it: ", e.what()));
  }
}

void Membership::add_pending(Pending p) {
  auto at = std::upper_bound(pending_.begin(), pending_.end(), p.switch_step,
                             [](std::uint64_t s, const Pending& q) { return s < q.switch_step; });
  pending_.insert(at, std::move(p));
}

void Membership::record_rejoin(const Rejoin& r) {
  const bool known = std::any_of(rejoins_.begin(), rejoins_.end(), [&](const Rejoin& q) {
    return q.peer == r.peer && q.step == r.step;
  });
  if (!known) rejoins_.push_back(r);
}

// A takeover (a higher epoch) first, from whoever sent it: it supersedes anything the old
// coordinator still has queued to us. Then our coordinator's announcements, in order.
void Membership::read_announcements() {
  auto take = [&](int from) -> std::optional<Announcement> {
    auto& next = announcements_read_[static_cast<std::size_t>(from)];
    std::optional<net::Payload> message;
    try {
      message = network_.try_receive(from, net::MessageType::kMembership, next, kAnnounceTag);
    } catch (const Error&) {
      return std::nullopt;  // a dead link: read_reports() counts it
    }
    if (!message) return std::nullopt;
    ++next;
    return decode_announcement(*message, n_, name(from));
  };
  std::optional<std::pair<int, Announcement>> claim;
  for (int from = 0; from < n_; ++from) {
    if (from == rank_ || from == coordinator_ || is_lost(from) || !linked_[static_cast<std::size_t>(from)]) continue;
    while (auto a = take(from)) {
      // Judged against the best claim of this pass as well, so two claims read together
      // settle as they would one after the other.
      const int against = claim ? claim->first : coordinator_;
      const std::uint32_t at = claim ? claim->second.epoch : epoch_;
      const ClaimVerdict verdict = judge_claim(from, *a, against, at, lost_);
      if (verdict != ClaimVerdict::kAdopt) {
        log::warn("ignoring an announcement from ", name(from), " for epoch ", a->epoch, " (", to_string(verdict),
                  "): peer ", against, " coordinates epoch ", at, a->stop ? "; its stop is not followed" : "");
        continue;
      }
      claim.emplace(from, std::move(*a));
    }
  }
  if (claim) adopt(claim->first, std::move(claim->second));
  while (!is_coordinator() && !is_lost(coordinator_)) {
    const int from = coordinator_;
    auto a = take(from);
    if (!a) break;
    if (a->epoch < epoch_) continue;
    adopt(from, std::move(*a));
  }
}

void Membership::adopt(int from, Announcement a) {
  if (a.stop)
    throw Error(ErrorKind::kPeerLost, str(name(from), " stopped the run: the graph split after losing peers, or too few are left "
                                          "(--on-split stop)"));
  if (std::find(a.lost.begin(), a.lost.end(), rank_) != a.lost.end())
    throw Error(ErrorKind::kPeerLost,
                str(name(from), ", the coordinator, counts this peer lost: it was stalled or cut off for longer than "
                                "--peer-timeout. Restart it with --rejoin to come back"));
  const bool takeover = from != coordinator_ || a.epoch != epoch_;
  if (takeover) {
    log::warn(name(from), " coordinates the run from now on (epoch ", a.epoch, ")");
    coordinator_ = from;
    epoch_ = a.epoch;
  }
  failures_ = std::move(a.failures);
  rejoins_ = std::move(a.rejoins);
  takeovers_ = std::move(a.takeovers);
  for (const Rejoin& r : rejoins_)
    back_at_[static_cast<std::size_t>(r.peer)] = std::max(back_at_[static_cast<std::size_t>(r.peer)], r.step);
  for (const Rejoin& j : a.joins)
    back_at_[static_cast<std::size_t>(j.peer)] = std::max(back_at_[static_cast<std::size_t>(j.peer)], a.switch_step);
  // Leave every peer it counts lost, so that no one mixes with a peer the others have left.
  for (int p : a.lost)
    if (!is_lost(p)) {
      lost_.insert(std::upper_bound(lost_.begin(), lost_.end(), p), p);
      if (linked_[static_cast<std::size_t>(p)]) network_.drop(p, str(name(from), " counts ", name(p), " as lost"));
    }
  std::erase_if(local_, [&](const Failure& f) { return std::find(a.lost.begin(), a.lost.end(), f.peer) != a.lost.end(); });
  if (takeover)
    for (const Failure& f : std::vector<Failure>(local_)) send_report(f.step, {f.peer}, f.reason);
  apart_ = pieces_without(a.lost) > 1 && !topology_.time_varying();  // should we take over later
  add_pending({a.switch_step, std::move(a.lost), std::move(a.joins)});
}

// Reports come to whoever their sender counts as coordinator; a peer that gets one while
// it does not coordinate yet counts those peers lost too, which is how a survivor that
// is no neighbour of a lost coordinator learns that it is next.
void Membership::read_reports(std::uint64_t step) {
  std::vector<int> fresh;
  for (int from = 0; from < n_; ++from) {
    if (from == rank_ || is_lost(from) || !linked_[static_cast<std::size_t>(from)]) continue;
    try {
      auto& next = reports_read_[static_cast<std::size_t>(from)];
      while (auto message = network_.try_receive(from, net::MessageType::kMembership, next, kReportTag)) {
        ++next;
        const LostReport r = decode_report(*message, n_, name(from));
        for (int id : r.peers)
          if (!is_lost(id) && id != rank_) {
            count_lost(r.step, id, str("reported by peer ", from, ": ", r.reason));
            if (is_lost(id)) fresh.push_back(id);
          }
      }
    } catch (const Error& e) {
      // The link broke (or carried garbage): that peer is gone too, neighbour or not.
      count_lost(step, from, e.what());
      if (is_lost(from)) fresh.push_back(from);
    }
  }
  if (is_lost(coordinator_)) return coordinator_gone(step);
  if (!fresh.empty() && !is_coordinator()) send_report(step, fresh, "its link broke or a peer reported it");
}

void Membership::answer_rejoins(std::uint64_t step) {
  for (int peer : std::vector<int>(lost_)) {
    if (joining(peer) || !linked_[static_cast<std::size_t>(peer)] || !network_.alive(peer)) continue;
    try {
      auto request = network_.try_receive(peer, net::MessageType::kMembership, 0, kRejoinTag);
      if (!request) continue;
      decode_rejoin_request(*request, name(peer));
      if (is_coordinator()) {
        answer_rejoin(step, peer);
      } else {
        RejoinAnswer redirect;
        redirect.status = RejoinStatus::kAskCoordinator;
        redirect.coordinator = coordinator_;
        network_.send(peer, net::MessageType::kMembership, 0, kRejoinTag, encode_rejoin_answer(redirect), false).wait();
      }
    } catch (const Error& e) {
      log::warn("peer ", peer, " could not rejoin: ", e.what());
      network_.drop(peer, e.what());
    }
  }
}

// The coordinator, on a request from a restarted peer whose link is up again.
void Membership::answer_rejoin(std::uint64_t step, int peer) {
  const std::uint64_t switch_step = switch_step_after(step, apart_);
  RejoinAnswer answer;
  int donor = -1;
  for (int q : topology_.graph.neighbors(peer))
    if (!is_lost(q) && (q == rank_ || (linked_[static_cast<std::size_t>(q)] && network_.alive(q))) && (donor < 0 || q < donor))
      donor = q;
  if (donor < 0) answer.reason = str("none of peer ", peer, "'s neighbours is left to take parameters from");
  else if (options_.total_steps > 0 && switch_step + 1 >= static_cast<std::uint64_t>(options_.total_steps))
    answer.reason = str("the run ends at step ", options_.total_steps, ", too soon after step ", switch_step,
                        " for it to come back");
  answer.status = answer.reason.empty() ? RejoinStatus::kAccepted : RejoinStatus::kRefused;
  answer.announcement = announcements_sent_;  // the announcement that takes it back
  answer.epoch = epoch_;
  answer.switch_step = switch_step;
  answer.donor = std::max(donor, 0);
  answer.coordinator = rank_;
  if (answer.status == RejoinStatus::kAccepted) {
    const Rejoin join{peer, switch_step, donor};
    joining_.push_back(join);
    reports_read_[static_cast<std::size_t>(peer)] = 0;  // a new process counts from 0
    announcements_read_[static_cast<std::size_t>(peer)] = 0;
    back_at_[static_cast<std::size_t>(peer)] = switch_step;
    log::info("peer ", peer, " asks to rejoin; it comes back at step ", switch_step, " with peer ", donor,
              "'s parameters");
    announce(step, {join});  // sent to the joining peer too, ahead of the answer
  } else {
    log::warn("peer ", peer, " asked to rejoin; refused: ", answer.reason);
  }
  try {
    network_.send(peer, net::MessageType::kMembership, 0, kRejoinTag, encode_rejoin_answer(answer), false).wait();
  } catch (const Error& e) {
    log::warn("could not answer peer ", peer, "'s request to rejoin: ", e.what());
  }
}

// How many pieces the graph falls into without the `lost` peers.
int Membership::pieces_without(const std::vector<int>& lost) const {
  const topology::Graph& g = topology_.graph;
  std::vector<int> label(static_cast<std::size_t>(g.num_peers()), -1), stack;
  int pieces = 0;
  auto gone = [&](int p) { return std::find(lost.begin(), lost.end(), p) != lost.end(); };
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
  return pieces;
}

void Membership::announce(std::uint64_t step, const std::vector<Rejoin>& joins) {
  Announcement a;
  a.epoch = epoch_;
  for (int p : lost_)  // the set everyone switches to: lost, less the peers coming back
    if (!joining(p)) a.lost.push_back(p);
  // Does the survivors' graph still hang together?
  const int pieces = pieces_without(a.lost);
  const bool split = pieces > 1 && !topology_.time_varying();
  // A joining peer was told its step already (answer_rejoin, this same step).
  a.switch_step = switch_step_after(step, apart_ || (joins.empty() && split));
  for (const Rejoin& j : joins) a.switch_step = std::max(a.switch_step, j.step);
  apart_ = split;
  // A network partition looks, from each side, like the other side died: each side sees
  // one whole piece. Under --on-split stop only a side holding more than half of the peers
  // may go on, so two sides never train apart (the primary-component rule).
  const int survivors = n_ - static_cast<int>(a.lost.size());
  const bool minority = 2 * survivors <= n_;
  a.stop = options_.policy == SplitPolicy::kStop && (split || minority);
  if (split)
    log::warn("the survivors' graph fell into ", pieces, " pieces; ",
              a.stop ? "stopping everyone (--on-split stop)" : "each piece trains on alone (--on-split continue)");
  else if (a.stop)
    log::warn("only ", survivors, " of ", n_, " peers are left, not more than half: the others may be training "
              "on the far side of a network partition; stopping everyone (--on-split stop)");
  a.joins = joins;
  a.failures = failures_;
  a.rejoins = rejoins_;
  a.takeovers = takeovers_;
  const net::Payload payload = encode_announcement(a);
  const std::uint64_t sequence = announcements_sent_++;
  for (int peer = 0; peer < n_; ++peer) {
    if (peer == rank_ || (is_lost(peer) && !joining(peer)) || !linked_[static_cast<std::size_t>(peer)]) continue;
    try {
      network_.send(peer, net::MessageType::kMembership, sequence, kAnnounceTag, payload, false).wait();
    } catch (const Error& e) {
      log::warn("could not tell peer ", peer, " about the new membership: ", e.what());
    }
  }
  changed_ = false;
  if (a.stop)
    throw Error(ErrorKind::kPeerLost,
                split ? str("the graph split into ", pieces, " pieces after losing peers; stopped (--on-split stop)")
                      : str("only ", survivors, " of ", n_, " peers are left (not more than half, so possibly one "
                                                          "side of a partition); stopped (--on-split stop)"));
  log::info("peers lost so far: ", a.lost.size(), joins.empty() ? "" : str(", ", joins.size(), " coming back"),
            "; all survivors switch to recomputed weights at step ", a.switch_step);
  add_pending({a.switch_step, std::move(a.lost), joins});
}

bool Membership::await_switch(std::uint64_t step, double timeout_s) {
  const auto start = RunClock::now();
  for (;;) {
    read_announcements();
    read_reports(step);
    stop_if_cut_off(step);
    if (is_coordinator() && changed_) announce(step);
    if (!pending_.empty()) return true;
    const double left = timeout_s - seconds_since(start);
    if (left <= 0) return false;
    // The coordinator announces what it counts (above); one that counts nothing new has
    // nothing to wait for here (the others' reports come with its next polls).
    if (is_coordinator() || is_lost(coordinator_)) return false;
    auto& next = announcements_read_[static_cast<std::size_t>(coordinator_)];
    try {
      net::Payload message =
          network_.receive(coordinator_, net::MessageType::kMembership, next, kAnnounceTag, std::min(left, 0.25));
      ++next;
      Announcement a = decode_announcement(message, n_, name(coordinator_));
      if (a.epoch >= epoch_) adopt(coordinator_, std::move(a));
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kPeerLost)
        report_lost(step, coordinator_, e.what());
      else if (e.kind() != ErrorKind::kTimeout)
        throw;
    }
  }
}

RejoinTicket Membership::rejoin() {
  // The peers we could not reach while connecting are gone; anyone else may answer.
  for (int p = 0; p < n_; ++p)
    if (p != rank_ && (!linked_[static_cast<std::size_t>(p)] || !network_.alive(p)) && !is_lost(p)) lost_.insert(std::upper_bound(lost_.begin(), lost_.end(), p), p);
  int ask = 0;
  while (ask < n_ && (ask == rank_ || is_lost(ask))) ++ask;
  if (ask == n_) throw Error(ErrorKind::kPeerLost, str("peer ", rank_, " reached no other peer of the run to rejoin"));
  for (int tries = 0; tries < n_; ++tries) {
    network_.send(ask, net::MessageType::kMembership, 0, kRejoinTag, encode_rejoin_request(), false).wait();
    const RejoinAnswer a =
        decode_rejoin_answer(network_.receive(ask, net::MessageType::kMembership, 0, kRejoinTag), n_, name(ask));
    if (a.status == RejoinStatus::kAskCoordinator) {
      if (a.coordinator == ask || a.coordinator == rank_ || is_lost(a.coordinator))
        throw Error(ErrorKind::kPeerLost, str(name(ask), " says peer ", a.coordinator,
                                              " coordinates the run, which this peer cannot reach"));
      log::info(name(ask), " says peer ", a.coordinator, " coordinates the run; asking it");
      ask = a.coordinator;
      continue;
    }
    if (a.status == RejoinStatus::kRefused)
      throw Error(ErrorKind::kPeerLost, str(name(ask), " refused to take peer ", rank_, " back: ", a.reason));
    const auto neighbours = topology_.graph.neighbors(rank_);
    if (std::find(neighbours.begin(), neighbours.end(), a.donor) == neighbours.end())
      throw Error(ErrorKind::kPeerLost, str(name(ask), " named peer ", a.donor, ", not a neighbour of peer ", rank_, ", as donor"));
    coordinator_ = ask;
    epoch_ = a.epoch;
    announcements_read_[static_cast<std::size_t>(ask)] = a.announcement;  // the one that takes us back, and later ones
    log::info(name(ask), " takes us back at step ", a.switch_step, " with peer ", a.donor, "'s parameters");
    return {a.switch_step, a.donor};
  }
  throw Error(ErrorKind::kPeerLost, str("peer ", rank_, " was sent from peer to peer ", n_, " times asking to rejoin"));
}

void Membership::take_parameters(const RejoinTicket& ticket, std::span<float> x) {
  const net::Payload payload = network_.receive(ticket.donor, net::MessageType::kParameters, ticket.step, kRejoinTag);
  if (payload.size() != x.size_bytes())
    throw Error(ErrorKind::kPeerLost, str(name(ticket.donor), " sent ", payload.size(),
                                          " bytes of parameters for the rejoin at step ", ticket.step, ", expected ",
                                          x.size_bytes()));
  std::memcpy(x.data(), payload.data(), payload.size());
}

void Membership::stop_if_cut_off(std::uint64_t step) const {
  if (n_ > 1 && static_cast<int>(lost_.size()) == n_ - 1)
    throw Error(ErrorKind::kPeerLost,
                str("peer ", rank_, " counts every other peer lost at step ", step, ": either they all failed or this "
                    "peer was stalled or cut off for longer than --peer-timeout and they dropped it; it stops rather "
                    "than train alone (restart it with --rejoin to come back)"));
}

std::optional<std::vector<algo::MixingRow>> Membership::poll(std::uint64_t step, std::span<const float> x) {
  read_announcements();
  read_reports(step);
  stop_if_cut_off(step);
  answer_rejoins(step);
  if (is_coordinator() && changed_) announce(step);
  std::optional<std::vector<int>> switch_to;
  while (!pending_.empty() && step >= pending_.front().switch_step) {
    Pending& next = pending_.front();
    if (step > next.switch_step)
      log::warn("switching to recomputed weights at step ", step, ", after the agreed step ", next.switch_step);
    for (const Rejoin& join : next.joins) {
      if (join.peer == rank_) continue;
      if (join.donor == rank_) {
        // The peer coming back starts from our parameters of this step.
        PEERTRAIN_CHECK(x.size() > 0, "poll() needs x at a step where this peer is a donor");
        try {
          network_.send(join.peer, net::MessageType::kParameters, step, kRejoinTag, net::as_bytes(x), false).wait();
          log::info("sent peer ", join.peer, " our parameters of step ", step, " to rejoin with");
        } catch (const Error& e) {
          log::warn("could not send peer ", join.peer, " the parameters to rejoin with: ", e.what());
        }
      }
      lost_.erase(std::remove(lost_.begin(), lost_.end(), join.peer), lost_.end());
      joining_.erase(std::remove_if(joining_.begin(), joining_.end(), [&](const Rejoin& j) { return j.peer == join.peer; }),
                     joining_.end());
      reports_read_[static_cast<std::size_t>(join.peer)] = 0;  // its new process numbers from 0
      announcements_read_[static_cast<std::size_t>(join.peer)] = 0;
      reports_sent_[static_cast<std::size_t>(join.peer)] = 0;
      if (linked_[static_cast<std::size_t>(join.peer)]) network_.readmit(join.peer);
      record_rejoin(join);
      log::info("peer ", join.peer, " is back from step ", step);
    }
    switch_to = std::move(next.lost);
    last_switch_ = next.switch_step;
    pending_.erase(pending_.begin());
  }
  if (!switch_to) return std::nullopt;
  std::string lost_list;
  for (int p : *switch_to) lost_list += (lost_list.empty() ? "" : ",") + std::to_string(p);
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(view_hash(last_switch_, *switch_to)));
  log::info("membership view at step ", last_switch_, ": ", n_ - static_cast<int>(switch_to->size()),
            " peers in, lost [", lost_list, "], coordinator ", coordinator_, " (epoch ", epoch_, "), hash ", hash);
  return algo::mixing_rows_without(topology_, rank_, *switch_to);
}

// FNV-1a over the switch step, the lost set, the coordinator and its epoch, and every
// survivor's row of the recomputed W (peers and weights bit for bit): equal on every
// survivor that switched at that step, or the membership protocol failed. The rows cost
// O(n · degree² · lost) on every peer, so runs of more than kViewHashRowsUpTo peers (a
// simulated cluster of thousands) hash the view without them.
std::uint64_t Membership::view_hash(std::uint64_t step, const std::vector<int>& lost) const {
  constexpr int kViewHashRowsUpTo = 512;
  std::uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 0x100000001b3ULL;
  };
  auto bits = [](float f) { return static_cast<std::uint64_t>(std::bit_cast<std::uint32_t>(f)); };
  mix(step);
  mix(lost.size());
  for (int p : lost) mix(static_cast<std::uint64_t>(p));
  mix(static_cast<std::uint64_t>(coordinator_));
  mix(epoch_);
  for (int p = 0; p < n_ && n_ <= kViewHashRowsUpTo; ++p) {
    if (std::find(lost.begin(), lost.end(), p) != lost.end()) continue;
    for (const algo::MixingRow& row : algo::mixing_rows_without(topology_, p, lost)) {
      mix(static_cast<std::uint64_t>(p));
      mix(bits(row.self_weight));
      for (std::size_t j = 0; j < row.peers.size(); ++j) {
        mix(static_cast<std::uint64_t>(row.peers[j]));
        mix(bits(row.weights[j]));
      }
    }
  }
  return h;
}

}  // namespace peertrain::train
