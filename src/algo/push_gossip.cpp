#include "peertrain/algo/push_gossip.h"

#include <algorithm>
#include <cstring>

#include "peertrain/algo/gossip.h"
#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"

namespace peertrain::algo {

DirectedRow directed_row(const topology::SparseMatrix& p, int self) {
  DirectedRow row;
  row.self_weight = 0;
  for (topology::SparseMatrix::InnerIterator it(p, self); it; ++it) {
    if (it.row() == self) {
      row.self_weight = static_cast<float>(it.value());
    } else if (it.value() != 0.0) {
      row.targets.push_back(static_cast<int>(it.row()));
      row.shares.push_back(static_cast<float>(it.value()));
    }
  }
  for (int j = 0; j < p.cols(); ++j) {
    if (j == self) continue;
    const double weight = p.coeff(self, j);
    if (weight != 0.0) {
      row.sources.push_back(j);
      row.weights.push_back(static_cast<float>(weight));
    }
  }
  return row;
}

PushGossip::PushGossip(net::Transport& network, DirectedMixing mixing, int max_delay)
    : network_(network), mixing_(mixing), max_delay_(max_delay) {
  if (max_delay < 0)
    throw Error(ErrorKind::kInvalidArgument, str("--max-staleness must be 0 or more, got ", max_delay));
  if (max_delay > 0 && mixing == DirectedMixing::kRows)
    throw Error(
        ErrorKind::kInvalidArgument,
        "--max-staleness needs push-sum (--algorithm sgp): a row-stochastic average of late messages is biased");
}

PushGossip::~PushGossip() {
  for (Work& send : sends_) {
    try {
      send.wait();
    } catch (...) {
    }
  }
}

bool PushGossip::is_lost(int peer) const { return std::find(lost_.begin(), lost_.end(), peer) != lost_.end(); }

void PushGossip::give_up_on(int peer, const std::string& why) {
  if (is_lost(peer)) return;
  lost_.push_back(peer);
  newly_lost_.emplace_back(peer, why);
  network_.drop(peer, why);
}

void PushGossip::wait_sends() {
  for (Work& send : sends_) {
    try {
      send.wait();
    } catch (const Error&) {
      // The target was lost on the way; its receive side counts it.
    }
  }
  sends_.clear();
}

void PushGossip::start(std::uint64_t step, DirectedRow row, std::span<const float> v) {
  PEERTRAIN_CHECK(!started_, "start() twice without finish()");
  PEERTRAIN_CHECK(row.targets.size() == row.shares.size() && row.sources.size() == row.weights.size(),
                  "a directed row needs a share per target and a weight per source");
  // A delayed step's sends own their copies and finish on their own; forget those done.
  std::erase_if(sends_, [](const Work& send) { return send.done(); });
  newly_lost_.clear();
  started_ = true;
  step_ = step;
  row_ = std::move(row);
  applied_ = row_;
  const std::span<const std::byte> bytes = std::as_bytes(v);
  net::SendBuffer buffer =
      max_delay_ > 0 ? net::SendBuffer(net::Payload(bytes.begin(), bytes.end())) : net::SendBuffer(bytes);
  for (std::size_t k = 0; k < row_.targets.size(); ++k) {
    const int target = row_.targets[k];
    // A target silent for half the peer timeout (not even a heartbeat) is given up on here
    // too: a peer that only sends to it would otherwise keep pouring mass into it.
    if (!is_lost(target) && !network_.alive(target))
      give_up_on(target, str("the link to peer ", target, " is lost; peer ", network_.self(), " keeps its share home"));
    if (!is_lost(target) && network_.silence_s(target) >= network_.peer_timeout_s() / 2)
      give_up_on(target, str("peer ", target, " has sent nothing, not even a heartbeat, for ",
                             static_cast<int>(network_.silence_s(target)), " s; peer ", network_.self(),
                             " keeps its share home"));
    if (is_lost(target)) {
      if (mixing_ == DirectedMixing::kPushSum) applied_.self_weight += row_.shares[k];  // the mass stays
      applied_.shares[k] = 0;
      continue;
    }
    sends_.push_back(network_.send(target, net::MessageType::kParameters, step, 0, buffer));
  }
  for (std::size_t j = 0; j < row_.sources.size(); ++j) owed_.push_back({step, row_.sources[j], row_.weights[j]});
}

net::SharedPayload PushGossip::take(const Owed& owed, bool wait, std::size_t size) {
  if (is_lost(owed.source)) return nullptr;
  net::SharedPayload payload;
  // Waited for in slices of at most a second, between which it is given up on once it
  // left or its link is gone (what it sent has then all arrived: a peer that failed at
  // start closes its links, and waiting the whole bound for it made the peers waiting on
  // this one give up on it too), once it has been silent, not even heartbeating, for half
  // of --peer-timeout, or at the whole bound.
  const double bound = network_.peer_timeout_s();
  const auto begin = RunClock::now();
  // Why to give the source up now, or empty. Judged before each look at the mailbox: a
  // source found gone has delivered everything it sent, so the look after it sees its
  // message if there is one.
  auto give_up_reason = [&](double waited) -> std::string {
    if (!network_.alive(owed.source)) return "left or was lost";
    if (const double silence = network_.silence_s(owed.source); silence >= bound / 2)
      return str("has sent nothing, not even a heartbeat, for ", static_cast<int>(silence), " s");
    if (waited >= bound) return str("still sounds alive but sent nothing within ", static_cast<int>(bound), " s");
    return {};
  };
  try {
    for (;;) {
      const double waited = seconds_since(begin);
      const std::string why = wait ? give_up_reason(waited) : std::string();
      if (auto arrived = network_.try_receive(owed.source, net::MessageType::kParameters, owed.step, 0)) {
        payload = std::make_shared<net::Payload>(std::move(*arrived));
        break;
      }
      if (!wait) return nullptr;
      if (!why.empty()) {
        give_up_on(owed.source, str(network_.peer_name(owed.source), " ", why, " before it sent step ", owed.step,
                                    "; peer ", network_.self(), " gives up on it"));
        return nullptr;
      }
      try {
        payload = std::make_shared<net::Payload>(network_.receive(owed.source, net::MessageType::kParameters, owed.step,
                                                                  0, std::clamp(bound - waited, 0.001, 1.0)));
        break;
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kTimeout) throw;
      }
    }
  } catch (const Error& e) {
    give_up_on(owed.source, e.what());
    return nullptr;
  }
  if (payload->size() != size * sizeof(float)) {
    give_up_on(owed.source, str("peer ", owed.source, " sent ", payload->size(), " bytes at step ", owed.step,
                                ", expected ", size * sizeof(float), " (", size, " floats)"));
    return nullptr;
  }
  return payload;
}

double PushGossip::finish(std::span<float> v, std::span<const float> update) {
  PEERTRAIN_CHECK(started_, "finish() without start()");
  started_ = false;
  // (Targets given up on in start() are reported with this step's sources.)
  return take_and_mix(v, update, false);
}

double PushGossip::drain(std::span<float> v) {
  PEERTRAIN_CHECK(!started_, "drain() between start() and finish()");
  applied_ = DirectedRow{};
  newly_lost_.clear();
  return take_and_mix(v, {}, true);
}

double PushGossip::take_and_mix(std::span<float> v, std::span<const float> update, bool all) {
  const auto begin = RunClock::now();
  std::vector<net::SharedPayload> held;
  std::vector<const float*> inputs;
  std::vector<float> weights;
  const bool delayed = max_delay_ > 0 || all;
  if (delayed && sum_.size() != v.size()) sum_.assign(v.size(), 0.0f);
  if (delayed) std::fill(sum_.begin(), sum_.end(), 0.0f);
  for (auto it = owed_.begin(); it != owed_.end();) {
    const bool due = all || it->step + static_cast<std::uint64_t>(max_delay_) <= step_;
    net::SharedPayload payload = take(*it, due, v.size());
    if (!payload && !is_lost(it->source)) {
      ++it;  // not there yet, and not due
      continue;
    }
    if (!payload) {
      // Lost: push-sum drops its mass; a row keeps the weight home.
      if (mixing_ == DirectedMixing::kRows) applied_.self_weight += it->weight;
      const auto source = std::find(applied_.sources.begin(), applied_.sources.end(), it->source);
      if (source != applied_.sources.end())
        applied_.weights[static_cast<std::size_t>(source - applied_.sources.begin())] = 0;
    } else {
      ++mixed_terms_;
      if (it->step < step_) ++delayed_terms_;
      const auto* in = reinterpret_cast<const float*>(payload->data());
      if (delayed) {
        for (std::size_t i = 0; i < v.size(); ++i) sum_[i] += it->weight * in[i];
      } else {
        inputs.push_back(in);
        weights.push_back(it->weight);
      }
      held.push_back(std::move(payload));
    }
    it = owed_.erase(it);
  }
  if (!delayed) wait_sends();  // they borrow v, which the mix overwrites
  const double waited = seconds_since(begin);
  if (delayed) {
    const float self = all ? 1.0f : applied_.self_weight;
    inputs.assign(1, sum_.data());
    weights.assign(1, 1.0f);
    Gossip::mix(v, self, weights, inputs, update);
  } else {
    Gossip::mix(v, applied_.self_weight, weights, inputs, update);
  }
  for (auto& payload : held) network_.release(std::move(payload));
  return waited;
}

}  // namespace peertrain::algo
