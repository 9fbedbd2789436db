#include "peertrain/algo/gossip.h"

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

Gossip::Gossip(net::Network& network, std::vector<MixingRow> rows) : network_(network), rows_(std::move(rows)) {
  PEERTRAIN_CHECK(!rows_.empty(), "gossip needs at least one mixing row");
}

void Gossip::start(std::uint64_t step, std::span<const float> x) {
  PEERTRAIN_CHECK(sends_.empty(), "start() twice without finish() at step ", step);
  step_ = step;
  const MixingRow& row = rows_[step % rows_.size()];
  for (int peer : row.peers) sends_.push_back(network_.send(peer, net::MessageType::kParameters, step, 0, net::as_bytes(x)));
}

double Gossip::finish(std::span<float> x) {
  const auto begin = std::chrono::steady_clock::now();
  const MixingRow& row = rows_[step_ % rows_.size()];
  std::vector<net::Payload> received;
  received.reserve(row.peers.size());
  for (int peer : row.peers) {
    received.push_back(network_.receive(peer, net::MessageType::kParameters, step_, 0));
    if (received.back().size() != x.size_bytes())
      throw Error(ErrorKind::kPeerLost, str(network_.peer_name(peer), " sent ", received.back().size(),
                                            " bytes of parameters for step ", step_, ", expected ", x.size_bytes()));
  }
  // Our x must not change while it is being sent.
  for (auto& send : sends_) send.wait();
  sends_.clear();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();

  const std::size_t n = x.size();
  float* out = x.data();
  const float self_weight = row.self_weight;
  for (std::size_t i = 0; i < n; ++i) out[i] *= self_weight;
  for (std::size_t j = 0; j < received.size(); ++j) {
    const auto* in = reinterpret_cast<const float*>(received[j].data());
    const float w = row.weights[j];
    for (std::size_t i = 0; i < n; ++i) out[i] += w * in[i];
  }
  for (auto& payload : received) network_.recycle(std::move(payload));
  return waited;
}

}  // namespace peertrain::algo
