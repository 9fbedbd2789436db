// Messages that arrived and wait for their receiver, keyed by (peer, type, step, tag), and
// a small pool of received buffers to reuse. Not locked: each transport guards its mailbox
// with the same lock as its link states, so a receiver sees a message and a link's death
// in one consistent view.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "peertrain/net/transport.h"

namespace peertrain::net {

class Mailbox {
 public:
  using Key = std::tuple<int, int, std::uint64_t, std::uint32_t>;
  static Key key(int peer, MessageType type, std::uint64_t step, std::uint32_t tag) {
    return {peer, static_cast<int>(type), step, tag};
  }

  // False when that message is already waiting: an honest peer sends each message once.
  bool put(const Key& key, Payload payload) { return messages_.emplace(key, std::move(payload)).second; }
  std::optional<Payload> take(const Key& key) {
    auto it = messages_.find(key);
    if (it == messages_.end()) return std::nullopt;
    Payload p = std::move(it->second);
    messages_.erase(it);
    return p;
  }
  bool has(const Key& key) const { return messages_.count(key) > 0; }
  // Forgets what a peer sent: it was dropped, or a new process replaced it.
  void forget(int peer) {
    for (auto it = messages_.begin(); it != messages_.end();)
      it = std::get<0>(it->first) == peer ? messages_.erase(it) : std::next(it);
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
  std::map<Key, Payload> messages_;
  std::vector<Payload> pool_;
};

}  // namespace peertrain::net
