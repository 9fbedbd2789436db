#include "peertrain/algo/async_gossip.h"

#include <algorithm>
#include <cstring>

#include "async_gossip_codec.h"
#include "peertrain/core/codec.h"
#include "peertrain/core/error.h"

namespace peertrain::algo {
namespace {

constexpr double kPollS = 0.05;  // how often the protocol thread looks at stop() and time-outs

}  // namespace

AveragingMessage decode_averaging_message(std::span<const std::byte> payload, int peers, const std::string& what) {
  codec::Reader in(payload, what);
  AveragingMessage d;
  d.kind = in.u32();
  if (d.kind < 1 || d.kind > 4) throw Error(ErrorKind::kParse, str(what, ": unknown kind ", d.kind));
  const std::uint32_t n = in.u32();
  if (n != static_cast<std::uint32_t>(peers))
    throw Error(ErrorKind::kParse, str(what, ": counts of ", n, " peers, expected ", peers));
  for (std::uint32_t p = 0; p < n; ++p) d.counts.push_back(in.u64());
  if (in.left() % sizeof(float) != 0)
    throw Error(ErrorKind::kParse, str(what, ": ", in.left(), " bytes of parameters, not whole floats"));
  // The floats start at 8 + 8n bytes: aligned for float in the payload's heap buffer.
  const auto rest = in.bytes(in.left());
  d.values = {reinterpret_cast<const float*>(rest.data()), rest.size() / sizeof(float)};
  return d;
}

AsyncGossip::AsyncGossip(net::Transport& network, std::span<float> x, std::mutex& x_mutex, AsyncGossipOptions options)
    : network_(network),
      x_(x),
      mutex_(x_mutex),
      options_(std::move(options)),
      self_(network.self()),
      start_(SteadyClock::now()),
      rng_(options_.seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(self_)) {
  const auto n = static_cast<std::size_t>(options_.peers);
  PEERTRAIN_CHECK(self_ >= 0 && static_cast<std::size_t>(self_) < n, "peer ", self_, " of ", n);
  for (int p : options_.neighbours)
    PEERTRAIN_CHECK(p >= 0 && static_cast<std::size_t>(p) < n && p != self_, "neighbour ", p);
  live_ = options_.neighbours;
  counts_.assign(n, 0);
  send_seq_.assign(n, 0);
  receive_seq_.assign(n, 0);
  thread_ = std::thread([this] { serve(); });
}

AsyncGossip::~AsyncGossip() {
  try {
    stop();
  } catch (...) {
  }
}

std::string AsyncGossip::name(int peer) const { return network_.peer_name(peer); }

net::Payload AsyncGossip::message(Kind kind, std::span<const float> values) const {
  codec::Writer out(8 + 8 * counts_.size() + values.size_bytes());
  out.u32(static_cast<std::uint32_t>(kind)).u32(static_cast<std::uint32_t>(counts_.size()));
  for (std::uint64_t c : counts_) out.u64(c);
  out.floats(values);
  return out.take();
}

void AsyncGossip::send(int to, net::SendBuffer payload) {
  sends_.push_back(
      network_.send(to, net::MessageType::kAverage, send_seq_[static_cast<std::size_t>(to)]++, 0, std::move(payload)));
}

void AsyncGossip::reap_sends() {
  std::erase_if(sends_, [](Work& w) {
    if (!w.done()) return false;
    try {
      w.wait();
    } catch (const Error&) {
      // A send to a peer lost meanwhile: the receiving side reports the loss.
    }
    return true;
  });
}

void AsyncGossip::lose(int peer, const std::string& why, bool drop) {
  const auto it = std::find(live_.begin(), live_.end(), peer);
  if (it == live_.end()) return;
  live_.erase(it);
  lost_.emplace_back(peer, why);
  if (awaiting_ == peer) awaiting_ = -1;  // the averaging did not happen: x stays as it is
  if (drop) network_.drop(peer, str("peer ", self_, " dropped ", name(peer), ": ", why));
}

void AsyncGossip::check_finished() {
  if (finished_) return;
  if (options_.time_budget_s > 0 && seconds_since(start_) >= options_.time_budget_s) finished_ = true;
  double total = 0;
  for (std::uint64_t c : counts_) total += static_cast<double>(c);
  if (options_.sample_budget > 0 && total >= options_.sample_budget) finished_ = true;
}

void AsyncGossip::step_done(long long samples) {
  std::lock_guard lock(mutex_);
  counts_[static_cast<std::size_t>(self_)] += static_cast<std::uint64_t>(samples);
  check_finished();
  reap_sends();
  if (finished_ || stopping_ || live_.empty()) return;
  if (awaiting_ >= 0) {
    ++stats_.skipped;
    return;
  }
  const int partner = live_[rng_.uniform_below(live_.size())];
  // The request's x is kept (shared with its send, not copied): the answer is applied
  // relative to it.
  net::SendBuffer request(message(Kind::kRequest, x_));
  request_ = request.owner();
  awaiting_ = partner;
  asked_at_ = SteadyClock::now();
  ++stats_.requested;
  send(partner, std::move(request));
}

bool AsyncGossip::finished() const {
  std::lock_guard lock(mutex_);
  return finished_;
}

double AsyncGossip::known_samples() const {
  std::lock_guard lock(mutex_);
  double total = 0;
  for (std::uint64_t c : counts_) total += static_cast<double>(c);
  return total;
}

void AsyncGossip::handle(int from, const net::Payload& payload) {
  const AveragingMessage m =
      decode_averaging_message(payload, options_.peers, str("averaging message from ", name(from)));
  net::Payload answer;
  if (static_cast<Kind>(m.kind) == Kind::kRequest) answer.resize(8 + 8 * counts_.size() + x_.size_bytes());
  std::lock_guard lock(mutex_);
  for (std::size_t p = 0; p < counts_.size(); ++p)
    if (p != static_cast<std::size_t>(self_)) counts_[p] = std::max(counts_[p], m.counts[p]);
  check_finished();
  const auto kind = static_cast<Kind>(m.kind);
  if ((kind == Kind::kRequest || kind == Kind::kAccept) && m.values.size() != x_.size())
    throw Error(ErrorKind::kParse, str(name(from), " sent ", m.values.size(), " parameters to average, expected ",
                                       x_.size(), " (another model?)"));
  if ((kind == Kind::kAccept || kind == Kind::kRefuse) && awaiting_ != from)
    throw Error(ErrorKind::kParse, str(name(from), " answered a request peer ", self_, " had not sent it"));
  switch (kind) {
    case Kind::kRequest: {
      const bool crossing = awaiting_ == from;
      if (crossing) ++stats_.crossed;
      // Waiting for an answer: refuse, except the higher rank's request when two ask each other.
      if (awaiting_ >= 0 && !(crossing && self_ < from)) {
        ++stats_.declined;
        send(from, message(Kind::kRefuse));
        return;
      }
      // One pass writes the average into x and into the answer (allocated before the lock).
      const net::Payload header = message(Kind::kAccept);
      std::memcpy(answer.data(), header.data(), header.size());
      float* avg = reinterpret_cast<float*>(answer.data() + header.size());
      for (std::size_t i = 0; i < x_.size(); ++i) avg[i] = x_[i] = 0.5f * (x_[i] + m.values[i]);
      ++stats_.served;
      if (options_.keep_log) log_.push_back(from);
      send(from, std::move(answer));
      return;
    }
    case Kind::kAccept: {
      // x_i ← avg + (x_i − x_sent): the gradient steps taken since the request stay on top
      // of the average. Where nothing changed, exactly avg, as the partner holds.
      const AveragingMessage sent = decode_averaging_message(*request_, options_.peers, "this peer's request");
      for (std::size_t i = 0; i < x_.size(); ++i)
        x_[i] = x_[i] == sent.values[i] ? m.values[i] : x_[i] + (m.values[i] - sent.values[i]);
      ++stats_.averaged;
      stats_.exchange_s += seconds_since(asked_at_);
      if (options_.keep_log) log_.push_back(from);
      awaiting_ = -1;
      return;
    }
    case Kind::kRefuse:
      ++stats_.refused;
      stats_.exchange_s += seconds_since(asked_at_);
      awaiting_ = -1;
      return;
    case Kind::kDone: {
      finished_ = true;  // the run is over everywhere
      if (awaiting_ == from) {
        ++stats_.refused;
        awaiting_ = -1;
      }
      const auto it = std::find(live_.begin(), live_.end(), from);
      if (it != live_.end()) live_.erase(it);
      return;
    }
  }
}

void AsyncGossip::serve() {
  std::vector<net::Transport::Wanted> wanted;
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      reap_sends();
      if (stopping_ && awaiting_ < 0) break;
      if (awaiting_ >= 0 && seconds_since(asked_at_) > network_.peer_timeout_s())
        lose(awaiting_,
             str("no answer to an averaging request within ", network_.peer_timeout_s(), " s (--peer-timeout)"), true);
      wanted.clear();
      for (int p : live_)
        wanted.push_back({p, net::MessageType::kAverage, receive_seq_[static_cast<std::size_t>(p)], 0});
    }
    if (wanted.empty()) {  // alone: nothing to serve, nobody to wait for
      std::lock_guard lock(mutex_);
      awaiting_ = -1;
      if (stopping_) break;
      std::this_thread::sleep_for(std::chrono::duration<double>(kPollS));
      continue;
    }
    auto arrival = network_.receive_any(wanted, kPollS);
    if (!arrival) continue;
    const int from = wanted[arrival->index].peer;
    if (arrival->gone) {
      std::lock_guard lock(mutex_);
      lose(from, arrival->why, false);
      continue;
    }
    {
      std::lock_guard lock(mutex_);
      ++receive_seq_[static_cast<std::size_t>(from)];
    }
    try {
      handle(from, arrival->payload);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kParse) throw;
      std::lock_guard lock(mutex_);
      lose(from, e.what(), true);  // a malformed or out-of-turn message: that link is not trusted
    }
    network_.recycle(std::move(arrival->payload));
  }
  // Tell the neighbours the run is over, and let the last messages go out before the
  // trainer closes the links.
  std::vector<Work> last;
  {
    std::lock_guard lock(mutex_);
    finished_ = true;
    for (int p : live_) send(p, message(Kind::kDone));
    last = std::move(sends_);
    sends_.clear();
  }
  for (Work& w : last) {
    try {
      w.wait();
    } catch (const Error&) {
    }
  }
}

void AsyncGossip::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::vector<std::pair<int, std::string>> AsyncGossip::lost() const {
  std::lock_guard lock(mutex_);
  return lost_;
}

AsyncGossipStats AsyncGossip::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::vector<int> AsyncGossip::log() const {
  std::lock_guard lock(mutex_);
  return log_;
}

}  // namespace peertrain::algo
