#include "peertrain/algo/gossip.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "peertrain/algo/push_gossip.h"
#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"

namespace peertrain::algo {

std::vector<MixingRow> mixing_rows(const topology::Topology& topology, int self) {
  std::vector<MixingRow> rows;
  for (int step = 0; step < topology.period(); ++step) {
    const topology::SparseMatrix w = topology.mixing_at(step);
    if (topology.directed) {  // row `self` of P: whom this peer hears from
      DirectedRow directed = directed_row(w, self);
      rows.push_back({std::move(directed.sources), std::move(directed.weights), directed.self_weight});
      continue;
    }
    MixingRow row;
    // W is symmetric, so column `self` is row `self`.
    for (topology::SparseMatrix::InnerIterator it(w, self); it; ++it) {
      if (it.row() == self) {
        row.self_weight = static_cast<float>(it.value());
      } else if (it.value() != 0.0) {
        row.peers.push_back(static_cast<int>(it.row()));
        row.weights.push_back(static_cast<float>(it.value()));
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<MixingRow> mixing_rows_without(const topology::Topology& topology, int self, const std::vector<int>& lost) {
  auto gone = [&](int peer) { return std::find(lost.begin(), lost.end(), peer) != lost.end(); };
  if (topology.time_varying()) {
    std::vector<MixingRow> rows = mixing_rows(topology, self);
    for (MixingRow& row : rows) {
      MixingRow kept;
      kept.self_weight = row.self_weight;
      for (std::size_t j = 0; j < row.peers.size(); ++j) {
        if (gone(row.peers[j])) {
          kept.self_weight += row.weights[j];
        } else {
          kept.peers.push_back(row.peers[j]);
          kept.weights.push_back(row.weights[j]);
        }
      }
      row = std::move(kept);
    }
    return rows;
  }
  // Metropolis–Hastings on the survivors' graph: every survivor computes the same W.
  const topology::Graph& g = topology.graph;
  auto survivor_degree = [&](int peer) {
    int d = 0;
    for (int q : g.neighbors(peer)) d += gone(q) ? 0 : 1;
    return d;
  };
  MixingRow row;
  row.self_weight = 1.0f;
  double self_weight = 1.0;
  const int mine = survivor_degree(self);
  for (int q : g.neighbors(self)) {
    if (gone(q)) continue;
    const double w = 1.0 / (1.0 + std::max(mine, survivor_degree(q)));
    row.peers.push_back(q);
    row.weights.push_back(static_cast<float>(w));
    self_weight -= w;
  }
  row.self_weight = static_cast<float>(self_weight);
  return {row};
}

Gossip::Gossip(net::Transport& network, std::vector<MixingRow> rows, int max_staleness)
    : network_(network), max_staleness_(max_staleness) {
  if (max_staleness < 0)
    throw Error(ErrorKind::kInvalidArgument, str("--max-staleness must be 0 or more, got ", max_staleness));
  if (max_staleness > 0 && rows.size() > 1)
    throw Error(ErrorKind::kInvalidArgument,
                str("--max-staleness ", max_staleness, " needs a topology whose neighbours stay the same every step; this "
                    "one changes them with a period of ", rows.size(), " (one-peer exponential): use --max-staleness 0"));
  set_rows(std::move(rows));
}

Gossip::~Gossip() {
  for (auto& part : sends_)
    for (auto& send : part) {
      try {
        send.wait();
      } catch (...) {
      }
    }
  for (Snapshot& snapshot : in_flight_)
    for (auto& send : snapshot.sends) {
      try {
        send.wait();
      } catch (...) {
      }
    }
}

void Gossip::set_rows(std::vector<MixingRow> rows) {
  PEERTRAIN_CHECK(!rows.empty(), "gossip needs at least one mixing row");
  PEERTRAIN_CHECK(!sending(), "set_rows() between start() and finish()");
  rows_ = std::move(rows);
  // A dropped peer named in the new rows whose link is up again has rejoined: it sends its
  // first parameters at the step these rows start, so the stale mode starts over with it.
  for (const MixingRow& row : rows_)
    for (int peer : row.peers)
      if (is_lost(peer) && network_.alive(peer)) {
        lost_.erase(std::find(lost_.begin(), lost_.end(), peer));
        freshest_.erase(peer);
        network_.readmit(peer);
      }
}

void Gossip::set_parts(std::vector<Part> parts) {
  PEERTRAIN_CHECK(!started_, "set_parts() after the first start(): the neighbours' messages would not line up");
  if (parts.empty()) throw Error(ErrorKind::kInvalidArgument, "gossip parts: expected at least one part, got none");
  if (parts.size() > std::numeric_limits<std::uint32_t>::max() - kPartTagBase)
    throw Error(ErrorKind::kInvalidArgument, str("gossip parts: ", parts.size(), " parts are more than the tags hold"));
  std::size_t end = 0;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const auto [offset, size] = parts[p];
    if (offset != end)
      throw Error(ErrorKind::kInvalidArgument,
                  str("gossip parts: part ", p, " starts at ", offset, ", expected ", end,
                      p == 0 ? " (the parts cover the vector from 0)" : str(", where part ", p - 1, " ends (contiguous, in order)")));
    if (size == 0) throw Error(ErrorKind::kInvalidArgument, str("gossip parts: part ", p, " at offset ", offset, " is empty"));
    end += size;
  }
  parts_ = std::move(parts);
  parts_given_ = true;
}

const std::vector<Gossip::Part>& Gossip::parts_for(std::size_t n) {
  if (!parts_given_) {
    if (parts_.size() != 1 || parts_[0].second != n) parts_.assign(1, Part{0, n});
  } else if (parts_.back().first + parts_.back().second != n) {
    throw Error(ErrorKind::kInvalidArgument, str("gossip parts cover ", parts_.back().first + parts_.back().second,
                                                 " parameters, the vector has ", n));
  }
  if (sends_.size() != parts_.size()) sends_.resize(parts_.size());
  return parts_;
}

std::string Gossip::part_name(std::size_t part) const {
  return parts_.size() > 1 ? str(" (part ", part, " of ", parts_.size(), ")") : std::string();
}

bool Gossip::sending() const {
  for (const auto& part : sends_)
    if (!part.empty()) return true;
  return false;
}

double Gossip::deadline_s() const {
  constexpr double kFloor = 10.0, kFactor = 30.0;
  // At most half the user's bound: a neighbour that is itself waiting on a stalled peer
  // (and so still sends heartbeats) must give up on that peer well before we give up on
  // it, or the give-ups cascade down the chain of waiting peers (seen on a ring of 8 with
  // --peer-timeout 5: every peer dropped its successor at the same 5 s). A peer that
  // still sounds alive is waited for up to the whole bound (receive_or_give_up).
  const double half = network_.peer_timeout_s() / 2;
  if (rounds_ < 10 || slow_round_expected_) return half;
  return std::min(half, std::max(kFloor, kFactor * slowest_round_s_));
}

// Waits for the neighbour's parameters of this step. Past the adaptive deadline it counts
// as lost only if it has also been silent that long: a neighbour that is itself waiting
// on a stalled peer still sends heartbeats, and dropping it would spread one failure
// across the graph. --peer-timeout bounds the whole wait either way.
//
// Each wait after the first lasts only until the neighbour's silence would reach the
// deadline, not a whole deadline more. We often start waiting a little before a
// neighbour stalls; a whole second wait then gave up on it at up to twice the deadline,
// the whole bound, when the next peer down the chain, waiting on us for the whole bound
// too, gave up on us as well (seen on a ring of 6 under load). A silence no longer than a
// live link shows (its heartbeats' period) never counts.
net::SharedPayload Gossip::receive_or_give_up(int peer, std::uint64_t step, std::size_t part) {
  constexpr double kMinSlice = 0.01;  // s; the silence is read this often at most
  const auto start = RunClock::now();
  const double limit = network_.peer_timeout_s();
  const double deadline = deadline_s();
  const double silent_enough = std::max(deadline, network_.live_silence_s());
  double slice = deadline;
  for (int slices = 1;; ++slices) {
    const double spent = (RunClock::now() - start).count();
    try {
      return network_.receive_shared(peer, net::MessageType::kParameters, step, part_tag(part),
                                     std::min(slice, limit - spent));
    } catch (const Error& e) {
      const double waited = (RunClock::now() - start).count();
      const double silence = network_.silence_s(peer);
      const bool bound = waited >= limit - 1e-3;
      if (e.kind() != ErrorKind::kTimeout || bound || silence >= silent_enough) {
        // The transport names the last slice only: say which rule gave up, after how long.
        std::string rule;
        if (e.kind() == ErrorKind::kTimeout && slices > 1) {
          auto centis = [](double s) { return std::round(s * 100) / 100; };
          rule = str(
              "; ", centis(waited), " s in all, ",
              bound ? std::string("the whole --peer-timeout")
                    : str("silent for ", centis(silence), " s (the adaptive deadline is ", centis(deadline), " s)"));
        }
        if (parts_.size() > 1 || !rule.empty())
          throw Error(e.kind(), str(e.what(), rule, parts_.size() > 1 ? str("; gossip", part_name(part)) : ""));
        throw;
      }
      slice = std::max(kMinSlice, silent_enough - silence);
    }
  }
}

void Gossip::wait_sends(std::vector<Work>& sends) {
  for (auto& send : sends) {
    try {
      send.wait();
    } catch (const Error& e) {
      // A send to a peer that was lost meanwhile fails; the receive side reports the loss.
      if (e.kind() != ErrorKind::kPeerLost && e.kind() != ErrorKind::kTimeout) throw;
    }
  }
  sends.clear();
}

bool Gossip::is_lost(int peer) const { return std::find(lost_.begin(), lost_.end(), peer) != lost_.end(); }

void Gossip::start(std::uint64_t step, std::span<const float> x) {
  PEERTRAIN_CHECK(!sending(), "start() twice without finish() at step ", step);
  const std::vector<Part>& parts = parts_for(x.size());
  started_ = true;
  step_ = step;
  if (max_staleness_ > 0) return start_stale(x);
  const MixingRow& row = rows_[step % rows_.size()];
  // Part-major, as the owners of the parts would send: every link carries the parts in order.
  for (std::size_t p = 0; p < parts.size(); ++p)
    for (int peer : row.peers)
      if (!is_lost(peer))
        sends_[p].push_back(network_.send(peer, net::MessageType::kParameters, step, part_tag(p),
                                          net::as_bytes(x.subspan(parts[p].first, parts[p].second))));
}

bool Gossip::left_out(MixingRow& row, std::vector<char>& home, std::size_t j) const {
  if (home[j]) return true;
  if (!is_lost(row.peers[j])) return false;
  row.keep_home(j);
  home[j] = 1;
  return true;
}

void Gossip::give_up_during_round(MixingRow& row, std::vector<char>& home, std::size_t j, const std::string& why) {
  give_up_on(row.peers[j], why);
  row.keep_home(j);
  home[j] = 1;
}

void Gossip::give_up_on(int peer, const std::string& why) {
  lost_.push_back(peer);
  newly_lost_.emplace_back(peer, why);
  freshest_.erase(peer);
  network_.drop(peer, str("peer ", network_.self(), " dropped ", network_.peer_name(peer), " at step ", step_));
}

void Gossip::note_round(double waited) {
  if (!slow_round_expected_) slowest_round_s_ = std::max(waited, 0.99 * slowest_round_s_);
  slow_round_expected_ = false;
  ++rounds_;
}

double Gossip::finish(std::span<float> x, std::span<const float> update) {
  PEERTRAIN_CHECK(update.empty() || update.size() == x.size(), "update of ", update.size(), " for ", x.size());
  if (max_staleness_ > 0) return finish_stale(x, update);
  const std::vector<Part>& parts = parts_for(x.size());
  newly_lost_.clear();
  MixingRow row = rows_[step_ % rows_.size()];
  // home[j]: neighbour j's weight has moved to the diagonal (lost before or during this round).
  std::vector<char> home(row.peers.size(), 0);
  std::vector<net::SharedPayload> received;
  std::vector<float> weights;
  std::vector<const float*> inputs;
  received.reserve(row.peers.size());
  double waited = 0;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const auto begin = RunClock::now();
    const auto [offset, size] = parts[p];
    const std::size_t bytes = size * sizeof(float);
    weights.clear();
    for (std::size_t j = 0; j < row.peers.size(); ++j) {
      if (left_out(row, home, j)) continue;
      const int peer = row.peers[j];
      try {
        net::SharedPayload payload = receive_or_give_up(peer, step_, p);
        if (payload->size() != bytes)
          throw Error(ErrorKind::kPeerLost,
                      str(network_.peer_name(peer), " sent ", payload->size(), " bytes of parameters for step ", step_,
                          part_name(p), ", expected ", bytes));
        received.push_back(std::move(payload));
        weights.push_back(row.weights[j]);
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kPeerLost && e.kind() != ErrorKind::kTimeout) throw;
        give_up_during_round(row, home, j, e.what());
      }
    }
    // This part of x must not change while it is being sent; a send to a peer just lost may fail.
    wait_sends(sends_[p]);
    waited += (RunClock::now() - begin).count();
    inputs.clear();
    for (const auto& payload : received) inputs.push_back(reinterpret_cast<const float*>(payload->data()));
    mix(x.subspan(offset, size), row.self_weight, weights, inputs,
        update.empty() ? update : update.subspan(offset, size));
    for (auto& payload : received) network_.release(std::move(payload));
    received.clear();
  }
  applied_ = std::move(row);
  note_round(waited);
  return waited;
}

void Gossip::start_message(std::uint64_t step, net::Payload message) {
  PEERTRAIN_CHECK(!sending(), "start_message() twice without finish_message() at step ", step);
  PEERTRAIN_CHECK(max_staleness_ == 0 && !parts_given_, "messages are exchanged synchronously and whole");
  started_ = true;
  step_ = step;
  if (sends_.size() != 1) sends_.resize(1);
  message_ = std::move(message);
  for (int peer : rows_[step % rows_.size()].peers)
    if (!is_lost(peer)) sends_[0].push_back(network_.send(peer, net::MessageType::kParameters, step, 0, message_));
}

double Gossip::finish_message(const TakeMessage& take) {
  const auto begin = RunClock::now();
  newly_lost_.clear();
  MixingRow row = rows_[step_ % rows_.size()];
  std::vector<char> home(row.peers.size(), 0);
  double taking = 0;  // time in take(): the caller's arithmetic, not waiting
  for (std::size_t j = 0; j < row.peers.size(); ++j) {
    if (left_out(row, home, j)) continue;
    const int peer = row.peers[j];
    try {
      net::Payload payload = net::unshare(receive_or_give_up(peer, step_, 0));
      const auto took = RunClock::now();
      take(peer, row.weights[j], payload);
      taking += (RunClock::now() - took).count();
      network_.recycle(std::move(payload));
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kPeerLost && e.kind() != ErrorKind::kTimeout && e.kind() != ErrorKind::kParse) throw;
      give_up_during_round(row, home, j, e.what());
    }
  }
  if (!sends_.empty()) wait_sends(sends_[0]);
  applied_ = std::move(row);
  const double waited = (RunClock::now() - begin).count() - taking;
  note_round(waited);
  return waited;
}

// One pass over memory: the mix is bandwidth-bound, so fusing the neighbours (two per
// pass) and the update halves its time against a pass per term (bench/gossip_bench.cpp).
void Gossip::mix(std::span<float> x, float self_weight, const std::vector<float>& weights,
                 const std::vector<const float*>& inputs, std::span<const float> update) {
  PEERTRAIN_CHECK(update.empty() || update.size() == x.size(), "update of ", update.size(), " for ", x.size());
  PEERTRAIN_CHECK(weights.size() == inputs.size(), weights.size(), " weights for ", inputs.size(), " inputs");
  const std::size_t n = x.size();
  float* out = x.data();
  auto input = [&](std::size_t j) { return inputs[j]; };
  const float* minus = update.empty() ? nullptr : update.data();
  std::size_t j = 0;
  auto finish_pass = [&] {
    self_weight = 1.0f;
    minus = nullptr;
  };
  for (; j + 2 <= inputs.size(); j += 2) {
    const float* a = input(j);
    const float* b = input(j + 1);
    const float wa = weights[j], wb = weights[j + 1];
    if (minus)
      for (std::size_t i = 0; i < n; ++i) out[i] = self_weight * out[i] + wa * a[i] + wb * b[i] - minus[i];
    else
      for (std::size_t i = 0; i < n; ++i) out[i] = self_weight * out[i] + wa * a[i] + wb * b[i];
    finish_pass();
  }
  if (j < inputs.size()) {
    const float* a = input(j);
    const float wa = weights[j];
    if (minus)
      for (std::size_t i = 0; i < n; ++i) out[i] = self_weight * out[i] + wa * a[i] - minus[i];
    else
      for (std::size_t i = 0; i < n; ++i) out[i] = self_weight * out[i] + wa * a[i];
    finish_pass();
  }
  if (self_weight != 1.0f || minus)
    for (std::size_t i = 0; i < n; ++i) out[i] = self_weight * out[i] - (minus ? minus[i] : 0.0f);
}

}  // namespace peertrain::algo
