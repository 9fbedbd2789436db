#include "peertrain/algo/gossip.h"

#include <algorithm>
#include <chrono>

#include "peertrain/core/error.h"

namespace peertrain::algo {

std::vector<MixingRow> mixing_rows(const topology::Topology& topology, int self) {
  std::vector<MixingRow> rows;
  for (int step = 0; step < topology.period(); ++step) {
    const topology::SparseMatrix w = topology.mixing_at(step);
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

Gossip::Gossip(net::Network& network, std::vector<MixingRow> rows, int max_staleness)
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
  for (auto& send : sends_) {
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
  PEERTRAIN_CHECK(sends_.empty(), "set_rows() between start() and finish()");
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

double Gossip::deadline_s() const {
  constexpr double kFloor = 10.0, kFactor = 30.0;
  if (rounds_ < 10 || slow_round_expected_) return network_.peer_timeout_s();  // the user's bound
  return std::min(network_.peer_timeout_s(), std::max(kFloor, kFactor * slowest_round_s_));
}

// Waits for the neighbour's parameters of this step. Past the adaptive deadline it counts
// as lost only if it has also been silent that long: a neighbour that is itself waiting
// on a stalled peer still sends heartbeats, and dropping it would spread one failure
// across the graph. --peer-timeout bounds the whole wait either way.
net::Payload Gossip::receive_or_give_up(int peer, std::uint64_t step) {
  const auto start = std::chrono::steady_clock::now();
  const double limit = network_.peer_timeout_s();
  while (true) {
    const double deadline = deadline_s();
    const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    try {
      return network_.receive(peer, net::MessageType::kParameters, step, 0, std::min(deadline, limit - spent));
    } catch (const Error& e) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (e.kind() != ErrorKind::kTimeout || waited >= limit - 1e-3 || network_.silence_s(peer) >= deadline) throw;
    }
  }
}

bool Gossip::is_lost(int peer) const { return std::find(lost_.begin(), lost_.end(), peer) != lost_.end(); }

void Gossip::start(std::uint64_t step, std::span<const float> x) {
  PEERTRAIN_CHECK(sends_.empty(), "start() twice without finish() at step ", step);
  step_ = step;
  if (max_staleness_ > 0) return start_stale(x);
  const MixingRow& row = rows_[step % rows_.size()];
  for (int peer : row.peers)
    if (!is_lost(peer)) sends_.push_back(network_.send(peer, net::MessageType::kParameters, step, 0, net::as_bytes(x)));
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
  if (max_staleness_ > 0) return finish_stale(x, update);
  const auto begin = std::chrono::steady_clock::now();
  newly_lost_.clear();
  MixingRow row = rows_[step_ % rows_.size()];
  std::vector<net::Payload> received;
  std::vector<float> weights;
  received.reserve(row.peers.size());
  for (std::size_t j = 0; j < row.peers.size(); ++j) {
    const int peer = row.peers[j];
    if (is_lost(peer)) {
      row.self_weight += row.weights[j];  // a lost neighbour's weight stays home
      continue;
    }
    try {
      net::Payload payload = receive_or_give_up(peer, step_);
      if (payload.size() != x.size_bytes())
        throw Error(ErrorKind::kPeerLost, str(network_.peer_name(peer), " sent ", payload.size(),
                                              " bytes of parameters for step ", step_, ", expected ", x.size_bytes()));
      received.push_back(std::move(payload));
      weights.push_back(row.weights[j]);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kPeerLost && e.kind() != ErrorKind::kTimeout) throw;
      give_up_on(peer, e.what());
      row.self_weight += row.weights[j];
    }
  }
  // Our x must not change while it is being sent; a send to a peer just lost may fail.
  for (auto& send : sends_) {
    try {
      send.wait();
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kPeerLost && e.kind() != ErrorKind::kTimeout) throw;
    }
  }
  sends_.clear();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  note_round(waited);
  std::vector<const float*> inputs;
  for (const auto& payload : received) inputs.push_back(reinterpret_cast<const float*>(payload.data()));
  mix(x, row.self_weight, weights, inputs, update);
  for (auto& payload : received) network_.recycle(std::move(payload));
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
