// Bounded-staleness gossip: D-PSGD whose mix may use a neighbour's parameters up to K steps
// old (--max-staleness K). Synchronous D-PSGD waits every step for every neighbour's x_k,
// so a slow peer holds up its neighbours at once and, through them, everyone. Here peer i
// mixes at step k with the freshest x_j^(s) it holds from each neighbour j as long as
// s ≥ k − K, and waits only for a neighbour more than K steps behind:
//
//     x_i ← W_ii·x_i^(k) + Σ_j W_ij·x_j^(s_j) − u_i,    k − K ≤ s_j ≤ k.
//
// W is unchanged (still symmetric and doubly stochastic), so the average is preserved in
// expectation and the consensus contraction of D-PSGD holds with a delay of at most K
// steps. This sits between synchronous D-PSGD (Lian et al., NeurIPS 2017; K = 0) and
// asynchronous decentralized SGD, which mixes with whatever a neighbour last had (AD-PSGD:
// Lian, Zhang, Zhang, Liu, "Asynchronous Decentralized Parallel Stochastic Gradient
// Descent", ICML 2018, which shows convergence at the synchronous rate for bounded
// staleness). The bound itself is the stale synchronous parallel model of Ho et al., "More
// Effective Distributed ML via a Stale Synchronous Parallel Parameter Server", NIPS 2013,
// applied per link instead of against a server: a peer can run at most K + 1 steps ahead
// of each neighbour, hence at most d·(K + 1) ahead of a peer d hops away.
//
// Sending: x changes before a send to a slow (or emulated-latency) link has left, so each
// step's x is copied into a snapshot that stays alive until its sends finish; at most
// K + 2 snapshots are in flight, the oldest waited for first. Receiving: a neighbour's
// messages arrive in step order on its link, so its mailbox is drained step by step and
// the newest kept (older ones are recycled). A neighbour's first message after it
// (re)joined is for the step its rows start at; set_rows() forgets what we held of it.
//
// Parts (set_parts): each part of a neighbour is held, drained and waited for on its own,
// and mixed as soon as every neighbour's copy of it is fresh enough, so parts of one
// neighbour may mix copies of different steps, each at most K old. A neighbour counts
// once per step in mixed_terms(), and in stale_terms() if any of its parts was older.
//
// Not deterministic: which s_j a step mixes depends on timing. Checkpoints do not save the
// held neighbour parameters, so a resumed run starts with one synchronous round.
#include <algorithm>
#include <chrono>

#include "peertrain/algo/gossip.h"
#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"

namespace peertrain::algo {

void Gossip::start_stale(std::span<const float> x) {
  // Bound the memory held by sends that have not left yet (a slow link).
  while (in_flight_.size() > static_cast<std::size_t>(max_staleness_) + 1) {
    wait_sends(in_flight_.front().sends);
    spare_.push_back(std::move(in_flight_.front().x));
    in_flight_.pop_front();
  }
  Snapshot snapshot;
  snapshot.step = step_;
  if (!spare_.empty()) {
    snapshot.x = std::move(spare_.back());
    spare_.pop_back();
  }
  snapshot.x.assign(x.begin(), x.end());
  const MixingRow& row = rows_[0];
  for (int peer : row.peers) {
    if (is_lost(peer)) continue;
    Freshest& held = freshest_[peer];
    if (!held.started) {  // its first message is the one of this step
      held.started = true;
      held.parts.assign(parts_.size(), HeldPart{});
      for (HeldPart& part : held.parts) part.next = step_;
    }
  }
  const std::span<const float> sent(snapshot.x);
  for (std::size_t p = 0; p < parts_.size(); ++p)
    for (int peer : row.peers)
      if (!is_lost(peer))
        snapshot.sends.push_back(network_.send(peer, net::MessageType::kParameters, step_, part_tag(p),
                                               net::as_bytes(sent.subspan(parts_[p].first, parts_[p].second))));
  in_flight_.push_back(std::move(snapshot));
}

void Gossip::flush() {
  PEERTRAIN_CHECK(!sending(), "flush() between start() and finish()");
  for (Snapshot& snapshot : in_flight_) wait_sends(snapshot.sends);
  while (!in_flight_.empty()) {
    spare_.push_back(std::move(in_flight_.front().x));
    in_flight_.pop_front();
  }
}

double Gossip::finish_stale(std::span<float> x, std::span<const float> update) {
  const std::vector<Part>& parts = parts_for(x.size());
  newly_lost_.clear();
  const std::uint64_t oldest = step_ >= static_cast<std::uint64_t>(max_staleness_) ? step_ - max_staleness_ : 0;
  MixingRow row = rows_[0];
  // home[j]: neighbour j's weight has moved to the diagonal; mixed[j], stale[j]: it entered
  // some part of the mix, an older copy of it did.
  std::vector<char> home(row.peers.size(), 0), mixed(row.peers.size(), 0), stale(row.peers.size(), 0);
  std::vector<float> weights;
  std::vector<const float*> inputs;
  double waited = 0;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const auto begin = RunClock::now();
    const auto [offset, size] = parts[p];
    const std::size_t bytes = size * sizeof(float);
    weights.clear();
    inputs.clear();
    for (std::size_t j = 0; j < row.peers.size(); ++j) {
      if (left_out(row, home, j)) continue;
      const int peer = row.peers[j];
      HeldPart& held = freshest_[peer].parts.at(p);
      try {
        auto take = [&](net::Payload payload) {
          if (payload.size() != bytes)
            throw Error(ErrorKind::kPeerLost, str(network_.peer_name(peer), " sent ", payload.size(),
                                                  " bytes of parameters for step ", held.next, part_name(p),
                                                  ", expected ", bytes));
          if (!held.payload.empty()) network_.recycle(std::move(held.payload));
          held.payload = std::move(payload);
          held.step = held.next++;
        };
        // Whatever has arrived, oldest first; then wait only if the newest is too old.
        while (held.next <= step_) {
          auto payload = network_.try_receive(peer, net::MessageType::kParameters, held.next, part_tag(p));
          if (!payload) break;
          take(std::move(*payload));
        }
        while (held.payload.empty() || held.step < oldest) take(net::unshare(receive_or_give_up(peer, held.next, p)));
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kPeerLost && e.kind() != ErrorKind::kTimeout) throw;
        give_up_during_round(row, home, j, e.what());  // forgets what we held of it; no input points there
        continue;
      }
      weights.push_back(row.weights[j]);
      inputs.push_back(reinterpret_cast<const float*>(held.payload.data()));
      mixed[j] = 1;
      if (held.step < step_) stale[j] = 1;
    }
    waited += (RunClock::now() - begin).count();
    mix(x.subspan(offset, size), row.self_weight, weights, inputs,
        update.empty() ? update : update.subspan(offset, size));
  }
  for (std::size_t j = 0; j < row.peers.size(); ++j) {
    mixed_terms_ += mixed[j];
    stale_terms_ += stale[j];
  }
  applied_ = row;
  note_round(waited);
  // Snapshots whose sends are done are free again.
  while (!in_flight_.empty() && in_flight_.front().step < step_) {
    bool done = true;
    for (auto& send : in_flight_.front().sends) done = done && send.done();
    if (!done) break;
    wait_sends(in_flight_.front().sends);
    spare_.push_back(std::move(in_flight_.front().x));
    in_flight_.pop_front();
  }
  return waited;
}

}  // namespace peertrain::algo
