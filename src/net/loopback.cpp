#include "peertrain/net/loopback.h"

#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>

#include "mailbox.h"
#include "peertrain/core/error.h"

namespace peertrain::net {

using Clock = std::chrono::steady_clock;

struct LoopbackFabric::State {
  struct Side {  // one direction of a link, as seen by its owner
    bool connected = true, dead = false, left = false, dropped = false;
    int rejoins = 0;
    std::string death;
    LinkCounters counters;
  };
  LoopbackOptions options;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Mailbox> mailboxes;           // by receiver
  std::map<std::pair<int, int>, Side> sides;  // (owner, peer)
  std::vector<int> generation;              // of each peer's process
  std::map<int, Clock::time_point> stalled_since;
  std::vector<std::pair<int, int>> lost_order;  // (owner, peer) of each side killed, in order

  Side& side(int owner, int peer) {
    auto it = sides.find({owner, peer});
    if (it == sides.end()) throw Error(ErrorKind::kInvalidArgument, str("peer ", owner, " has no link to peer ", peer));
    return it->second;
  }
  static std::string name(int peer) { return str("peer ", peer, " (loopback)"); }
  // Kills both directions; `why_here` is what the owner hears, the other side hears that
  // the owner closed the connection.
  void kill(int owner, int peer, const std::string& why_here) {
    Side& mine = side(owner, peer);
    Side& theirs = side(peer, owner);
    if (!mine.dead) {
      mine.death = why_here;
      lost_order.emplace_back(owner, peer);
    }
    mine.dead = true;
    if (!theirs.dead) {
      theirs.death = str(name(owner), " closed the connection (it exited or crashed)");
      lost_order.emplace_back(peer, owner);
    }
    theirs.dead = true;
    changed.notify_all();
  }
};

namespace {

class LoopbackTransport final : public Transport {
 public:
  LoopbackTransport(std::shared_ptr<LoopbackFabric::State> state, int rank) : s_(std::move(state)), rank_(rank) {
    links_ = s_->options.links.at(static_cast<std::size_t>(rank));
  }
  ~LoopbackTransport() override {
    bool clean;
    {
      std::lock_guard lock(s_->mutex);
      clean = closed_;
    }
    if (!clean) abort();
  }

  void connect() override {}

  Work send(int peer, MessageType type, std::uint64_t step, std::uint32_t tag, SendBuffer payload, bool) override {
    std::lock_guard lock(s_->mutex);
    auto& mine = s_->side(rank_, peer);
    if (mine.dead || closed_) return failed(mine.dead ? mine.death : "the transport was closed");
    auto& theirs = s_->side(peer, rank_);
    if (type == MessageType::kGoodbye) {
      theirs.left = true;
      s_->changed.notify_all();
      return Work::completed();
    }
    const auto bytes = payload.bytes();
    if (!s_->mailboxes[static_cast<std::size_t>(peer)].put(Mailbox::key(rank_, type, step, tag),
                                                           Payload(bytes.begin(), bytes.end()))) {
      s_->kill(peer, rank_, str("bad frame from ", LoopbackFabric::State::name(rank_), ": a second ", to_string(type),
                                " for step ", step, " (part ", tag, "); closing the link"));
      return failed(mine.death);
    }
    mine.counters.bytes_sent += kHeaderBytes + bytes.size();
    ++mine.counters.messages_sent;
    theirs.counters.bytes_received += kHeaderBytes + bytes.size();
    ++theirs.counters.messages_received;
    s_->changed.notify_all();
    return Work::completed();
  }

  Payload receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag, double timeout_s) override {
    timeout_s = std::min(timeout_s, s_->options.peer_timeout_s);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    const auto key = Mailbox::key(peer, type, step, tag);
    std::unique_lock lock(s_->mutex);
    auto& box = s_->mailboxes[static_cast<std::size_t>(rank_)];
    while (true) {
      auto& l = s_->side(rank_, peer);
      if (auto p = box.take(key)) return std::move(*p);
      const std::string waiting = str(to_string(type), " for step ", step, tag ? str(" (part ", tag, ")") : "");
      if (l.dead) throw Error(ErrorKind::kPeerLost, str(l.death, "; peer ", rank_, " was waiting for ", waiting));
      if (l.left) throw Error(ErrorKind::kPeerLost, str(LoopbackFabric::State::name(peer), " finished and left before sending ", waiting));
      if (s_->changed.wait_until(lock, deadline) == std::cv_status::timeout && !box.has(key))
      {
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%g", timeout_s);
        throw Error(ErrorKind::kTimeout, str(LoopbackFabric::State::name(peer), " sent no ", waiting, " within ", seconds,
                                             " s; peer ", rank_, " gives up"));
      }
    }
  }

  std::optional<Arrival> receive_any(std::span<const Wanted> wanted, double timeout_s) override {
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    std::unique_lock lock(s_->mutex);
    auto& box = s_->mailboxes[static_cast<std::size_t>(rank_)];
    while (true) {
      for (std::size_t i = 0; i < wanted.size(); ++i) {
        const Wanted& w = wanted[i];
        if (auto p = box.take(Mailbox::key(w.peer, w.type, w.step, w.tag))) return Arrival{i, std::move(*p), false, {}};
        const auto& l = s_->side(rank_, w.peer);
        if (l.dead) return Arrival{i, {}, true, l.death};
        if (l.left) return Arrival{i, {}, true, str(LoopbackFabric::State::name(w.peer), " finished and left")};
      }
      if (s_->changed.wait_until(lock, deadline) == std::cv_status::timeout) return std::nullopt;
    }
  }

  std::optional<Payload> try_receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag) override {
    std::lock_guard lock(s_->mutex);
    auto& l = s_->side(rank_, peer);
    if (auto p = s_->mailboxes[static_cast<std::size_t>(rank_)].take(Mailbox::key(peer, type, step, tag))) return p;
    if (l.dead && !l.left) throw Error(ErrorKind::kPeerLost, l.death);
    return std::nullopt;
  }

  void drop(int peer, const std::string& why) override {
    std::lock_guard lock(s_->mutex);
    s_->kill(rank_, peer, why);
    s_->side(rank_, peer).dropped = true;
  }
  void readmit(int peer) override {
    std::lock_guard lock(s_->mutex);
    s_->side(rank_, peer).dropped = false;
  }
  int rejoins(int peer) const override {
    std::lock_guard lock(s_->mutex);
    return s_->side(rank_, peer).rejoins;
  }
  bool alive(int peer) const override {
    std::lock_guard lock(s_->mutex);
    const auto& l = s_->side(rank_, peer);
    return l.connected && !l.dead && !l.left;
  }
  double silence_s(int peer) const override {
    std::lock_guard lock(s_->mutex);
    s_->side(rank_, peer);
    auto it = s_->stalled_since.find(peer);
    return it == s_->stalled_since.end() ? 0.0 : std::chrono::duration<double>(Clock::now() - it->second).count();
  }

  std::vector<std::string> lost_links() override {
    std::lock_guard lock(s_->mutex);
    std::vector<std::string> lost;
    std::set<int> named;  // a link lost, rejoined and lost again is named once
    for (const auto& [owner, peer] : s_->lost_order) {
      if (owner != rank_) continue;
      const auto& l = s_->side(rank_, peer);
      if (l.dead && !l.left && named.insert(peer).second) lost.push_back(l.death);
    }
    return lost;
  }

  void close() override {
    std::lock_guard lock(s_->mutex);
    if (closed_) return;
    closed_ = true;
    for (int peer : links_) {
      auto& theirs = s_->side(peer, rank_);
      if (!theirs.dead) theirs.left = true;
      auto& mine = s_->side(rank_, peer);
      mine.dead = true;
      if (mine.death.empty()) mine.death = "the transport was closed";
    }
    s_->changed.notify_all();
  }
  void abort() override {
    std::lock_guard lock(s_->mutex);
    if (closed_) return;
    closed_ = true;
    for (int peer : links_) s_->kill(rank_, peer, "the transport was aborted");
  }

  int self() const override { return rank_; }
  const std::vector<int>& links() const override { return links_; }
  LinkCounters counters(int peer) const override {
    std::lock_guard lock(s_->mutex);
    return s_->side(rank_, peer).counters;
  }
  LinkCounters total_counters() const override {
    std::lock_guard lock(s_->mutex);
    LinkCounters t;
    for (int peer : links_) t += s_->side(rank_, peer).counters;
    return t;
  }
  std::string peer_name(int peer) const override { return LoopbackFabric::State::name(peer); }
  double peer_timeout_s() const override { return s_->options.peer_timeout_s; }

 private:
  static Work failed(const std::string& why) {
    return Work::completed(std::make_exception_ptr(Error(ErrorKind::kPeerLost, why)));
  }
  std::shared_ptr<LoopbackFabric::State> s_;
  int rank_;
  std::vector<int> links_;
  bool closed_ = false;  // guarded by the fabric's mutex
};

}  // namespace

LoopbackFabric::LoopbackFabric(LoopbackOptions options) : state_(std::make_shared<State>()) {
  State& s = *state_;
  PEERTRAIN_CHECK(static_cast<int>(options.links.size()) == options.peers, "links for ", options.links.size(), " of ",
                  options.peers, " peers");
  s.mailboxes.resize(static_cast<std::size_t>(options.peers));
  for (int i = 0; i < options.peers; ++i)
    for (int j : options.links[static_cast<std::size_t>(i)]) {
      const auto& back = options.links.at(static_cast<std::size_t>(j));
      PEERTRAIN_CHECK(std::find(back.begin(), back.end(), i) != back.end(), "link ", i, "-", j, " is not symmetric");
      s.sides[{i, j}] = {};
    }
  s.options = std::move(options);
}

LoopbackFabric::~LoopbackFabric() = default;

std::unique_ptr<Transport> LoopbackFabric::transport(int rank) { return std::make_unique<LoopbackTransport>(state_, rank); }

std::unique_ptr<Transport> LoopbackFabric::rejoin(int rank) {
  State& s = *state_;
  {
    std::unique_lock lock(s.mutex);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(s.options.peer_timeout_s));
    for (int peer : s.options.links.at(static_cast<std::size_t>(rank))) {
      // The neighbour accepts the new process once it has dropped the old one.
      if (!s.changed.wait_until(lock, deadline, [&] { return s.side(peer, rank).dropped; }))
        throw Error(ErrorKind::kTimeout, str("peer ", peer, " did not drop peer ", rank, " in time for it to rejoin"));
      State::Side& theirs = s.side(peer, rank);
      theirs.dead = theirs.left = false;
      theirs.death.clear();
      ++theirs.rejoins;
      s.side(rank, peer) = {};
      s.mailboxes[static_cast<std::size_t>(peer)].forget(rank);
    }
    s.mailboxes[static_cast<std::size_t>(rank)] = Mailbox();
    s.stalled_since.erase(rank);
    s.changed.notify_all();
  }
  return std::make_unique<LoopbackTransport>(state_, rank);
}

void LoopbackFabric::stall(int rank) {
  std::lock_guard lock(state_->mutex);
  state_->stalled_since.emplace(rank, Clock::now());
}

void LoopbackFabric::resume(int rank) {
  std::lock_guard lock(state_->mutex);
  state_->stalled_since.erase(rank);
}

}  // namespace peertrain::net
