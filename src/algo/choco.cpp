#include "peertrain/algo/choco.h"

#include "peertrain/core/error.h"

namespace peertrain::algo {

ChocoGossip::ChocoGossip(Gossip& gossip, Compression compression, float gamma, std::uint64_t seed, bool time_varying,
                         bool common_start)
    : gossip_(gossip), compression_(compression), gamma_(gamma), rng_(seed), common_start_(common_start) {
  if (!(gamma > 0 && gamma <= 1))
    throw Error(ErrorKind::kInvalidArgument, str("--gossip-step ", gamma, " is outside (0, 1]"));
  if (time_varying)
    throw Error(ErrorKind::kInvalidArgument,
                "compressed gossip (choco) needs neighbours that stay the same every step: its public copies x̂_j are "
                "updated only by the messages a neighbour sends, so a topology that changes them every step "
                "(one-peer exponential) would leave the copies out of step; use a static graph");
  if (gossip.max_staleness() > 0)
    throw Error(ErrorKind::kInvalidArgument, "compressed gossip (choco) is synchronous: use --max-staleness 0");
}

std::vector<float>& ChocoGossip::copy_of(int peer, std::size_t n) {
  auto [it, fresh] = hat_.try_emplace(peer);
  if (fresh) it->second = x0_;
  PEERTRAIN_CHECK(it->second.size() == n, "a public copy of ", it->second.size(), " for ", n, " parameters");
  return it->second;
}

void ChocoGossip::prime(std::span<const float> x0) {
  if (!self_hat_.empty()) return;
  if (common_start_)
    x0_.assign(x0.begin(), x0.end());
  else
    x0_.assign(x0.size(), 0.0f);
  self_hat_ = x0_;
}

void ChocoGossip::start(std::uint64_t step, std::span<const float> x) {
  const std::size_t n = x.size();
  prime(x);
  PEERTRAIN_CHECK(self_hat_.size() == n, "choco was started with ", self_hat_.size(), " parameters, now ", n);
  diff_.resize(n);
  for (std::size_t i = 0; i < n; ++i) diff_[i] = x[i] - self_hat_[i];
  net::Payload message = compress(compression_, diff_, rng_);
  decompress_add(compression_, message, 1.0f, self_hat_, "this peer");  // exactly what the neighbours add
  last_bytes_ = message.size();
  gossip_.start_message(step, std::move(message));
}

double ChocoGossip::finish(std::span<float> x, std::span<const float> update) {
  const std::size_t n = x.size();
  PEERTRAIN_CHECK(update.empty() || update.size() == n, "update of ", update.size(), " for ", n);
  const double waited = gossip_.finish_message([&](int peer, float, const net::Payload& payload) {
    decompress_add(compression_, payload, 1.0f, copy_of(peer, n), gossip_.network().peer_name(peer));
  });
  for (const auto& [peer, why] : gossip_.newly_lost()) hat_.erase(peer);
  const MixingRow& row = gossip_.applied_row();
  // x ← x − update + γ Σ_j w_j x̂_j − γ (Σ_j w_j) x̂_i, fused per neighbour.
  float total = 0;
  for (std::size_t j = 0; j < row.peers.size(); ++j) {
    if (row.weights[j] == 0) continue;
    const float w = gamma_ * row.weights[j];
    total += w;
    const float* h = copy_of(row.peers[j], n).data();
    for (std::size_t i = 0; i < n; ++i) x[i] += w * h[i];
  }
  const float* mine = self_hat_.data();
  if (update.empty())
    for (std::size_t i = 0; i < n; ++i) x[i] -= total * mine[i];
  else
    for (std::size_t i = 0; i < n; ++i) x[i] -= total * mine[i] + update[i];
  return waited;
}

}  // namespace peertrain::algo
