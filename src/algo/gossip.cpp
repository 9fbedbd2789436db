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

double Gossip::finish(std::span<float> x, std::span<const float> update) {
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

  // One pass over memory: the mix is bandwidth-bound, so fusing the neighbours (two per
  // pass) and the update halves its time against a pass per term (bench/gossip_bench.cpp).
  PEERTRAIN_CHECK(update.empty() || update.size() == x.size(), "update of ", update.size(), " for ", x.size());
  const std::size_t n = x.size();
  float* out = x.data();
  auto input = [&](std::size_t j) { return reinterpret_cast<const float*>(received[j].data()); };
  const float* minus = update.empty() ? nullptr : update.data();
  float self_weight = row.self_weight;
  std::size_t j = 0;
  auto finish_pass = [&] {
    self_weight = 1.0f;
    minus = nullptr;
  };
  for (; j + 2 <= received.size(); j += 2) {
    const float* a = input(j);
    const float* b = input(j + 1);
    const float wa = row.weights[j], wb = row.weights[j + 1];
    if (minus)
      for (std::size_t i = 0; i < n; ++i) out[i] = self_weight * out[i] + wa * a[i] + wb * b[i] - minus[i];
    else
      for (std::size_t i = 0; i < n; ++i) out[i] = self_weight * out[i] + wa * a[i] + wb * b[i];
    finish_pass();
  }
  if (j < received.size()) {
    const float* a = input(j);
    const float wa = row.weights[j];
    if (minus)
      for (std::size_t i = 0; i < n; ++i) out[i] = self_weight * out[i] + wa * a[i] - minus[i];
    else
      for (std::size_t i = 0; i < n; ++i) out[i] = self_weight * out[i] + wa * a[i];
    finish_pass();
  }
  if (self_weight != 1.0f || minus)
    for (std::size_t i = 0; i < n; ++i) out[i] = self_weight * out[i] - (minus ? minus[i] : 0.0f);
  for (auto& payload : received) network_.recycle(std::move(payload));
  return waited;
}

}  // namespace peertrain::algo
