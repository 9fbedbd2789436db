// Messages that arrived and wait for their receiver, keyed by (peer, type, step, tag), and
// a small pool of received buffers to reuse. Not locked: each transport guards its mailbox
// with the same lock as its link states, so a receiver sees a message and a link's death
// in one consistent view.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "peertrain/core/error.h"
#include "peertrain/net/transport.h"

namespace peertrain::net {

class Mailbox {
 public:
  using Key = std::tuple<int, int, std::uint64_t, std::uint32_t>;
  static Key key(int peer, MessageType type, std::uint64_t step, std::uint32_t tag) {
    return {peer, static_cast<int>(type), step, tag};
  }

  // How much one sender may leave unread. An honest peer is at most a few steps ahead, so
  // a sender past either cap is flooding (or replaying) and its link is closed: the
  // mailbox's memory is bounded by the caps times the linked peers.
  struct Limits {
    std::size_t bytes_per_sender = 0;  // 0: no cap
    std::size_t messages_per_sender = 0;
  };
  void set_limits(Limits limits) { limits_ = limits; }
  // Why storing `bytes` more from `peer` would pass a cap, or empty when it would not.
  std::string over_limit(int peer, std::size_t bytes) const {
    const auto it = waiting_.find(peer);
    const Waiting w = it == waiting_.end() ? Waiting{} : it->second;
    if (limits_.bytes_per_sender && w.bytes + bytes > limits_.bytes_per_sender)
      return str(w.bytes + bytes, " bytes unread (cap ", limits_.bytes_per_sender, ")");
    if (limits_.messages_per_sender && w.messages + 1 > limits_.messages_per_sender)
      return str(w.messages + 1, " messages unread (cap ", limits_.messages_per_sender, ")");
    return {};
  }

  // False when that message is already waiting: an honest peer sends each message once.
  bool put(const Key& key, Payload payload) {
    const std::size_t bytes = payload.size();
    if (!messages_.emplace(key, std::move(payload)).second) return false;
    Waiting& w = waiting_[std::get<0>(key)];
    w.bytes += bytes;
    ++w.messages;
    return true;
  }
  std::optional<Payload> take(const Key& key) {
    auto it = messages_.find(key);
    if (it == messages_.end()) return std::nullopt;
    Payload p = std::move(it->second);
    messages_.erase(it);
    Waiting& w = waiting_[std::get<0>(key)];
    w.bytes -= p.size();
    --w.messages;
    return p;
  }
  bool has(const Key& key) const { return messages_.count(key) > 0; }
  // Forgets what a peer sent: it was dropped, or a new process replaced it.
  void forget(int peer) {
    for (auto it = messages_.begin(); it != messages_.end();)
      it = std::get<0>(it->first) == peer ? messages_.erase(it) : std::next(it);
    waiting_.erase(peer);
  }

  // A buffer with room for `bytes` from the pool, or an empty one.
  Payload reuse(std::size_t bytes) {
    for (auto it = pool_.begin(); it != pool_.end(); ++it)
      if (it->capacity() >= bytes) {
        Payload p = std::move(*it);
        pool_.erase(it);
        return p;
      }
    return {};
  }
  void recycle(Payload payload) {
    constexpr std::size_t kPoolLimit = 16;
    if (pool_.size() < kPoolLimit && payload.capacity() > 0) pool_.push_back(std::move(payload));
  }

 private:
  struct Waiting {
    std::size_t bytes = 0, messages = 0;
  };
  std::map<Key, Payload> messages_;
  std::map<int, Waiting> waiting_;  // by sender
  Limits limits_;
  std::vector<Payload> pool_;
};

}  // namespace peertrain::net
