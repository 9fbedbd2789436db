// The transport between peers: one TCP connection per link, a handshake that refuses
// peers of another run or topology, framed messages, link emulation (one-way latency and
// a sender-side token-bucket bandwidth cap), and counters. One I/O thread per process
// runs every socket (Boost.Asio); callers on other threads send asynchronously and receive
// with a deadline. Asio stays behind this header, so the algorithms never include it.
//
// Messages are addressed by (peer, type, step, tag): a receiver asks for exactly the
// message it needs next, which keeps steps from mixing when a fast peer runs ahead.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "peertrain/net/auth.h"
#include "peertrain/net/frame.h"

namespace peertrain::net {

struct Endpoint {
  std::string host;
  int port = 0;
};

struct LinkShaping {
  double latency_ms = 0;      // added one way, to every frame
  double bandwidth_mbps = 0;  // cap on the sender; 0 = none
};

struct NetworkOptions {
  int self = 0;
  std::vector<Endpoint> endpoints;  // every peer's address, by id
  std::vector<int> links;           // the peers this one keeps a connection with
  std::uint64_t fingerprint = 0;    // of the topology (graph and W)
  std::uint64_t run_id = 0;
  double connect_timeout_s = 60;    // peers may start in any order until then
  double peer_timeout_s = 60;       // every later wait
  std::uint64_t max_payload_bytes = 1 << 20;
  std::function<LinkShaping(int peer)> shaping;  // empty: no emulation
  double node_bandwidth_mbps = 0;  // cap on this peer's outgoing traffic over all links; 0 = none
  // The shared key (--secret-file): the handshake then proves both sides hold it, and every
  // later frame carries a ChaCha20-Poly1305 tag instead of the checksum (docs/net.md).
  std::optional<Secret> secret;
  // This process restarts a peer the others dropped (--rejoin): it dials every link, not
  // only the higher ids, and says so in its hello. A neighbour accepts it only once it has
  // itself dropped the old link (drop()), and otherwise answers "not yet", which is retried.
  bool rejoin = false;
};

struct LinkCounters {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t messages_sent = 0;
  std::uint64_t messages_received = 0;
};

using Payload = std::vector<std::byte>;

namespace detail {
struct SendState;
}

// Completion of one asynchronous send; wait() rethrows the failure as a peertrain::Error.
class SendHandle {
 public:
  SendHandle() = default;
  void wait() const;
  bool valid() const { return state_ != nullptr; }
  // Finished (sent or failed): wait() would return or throw at once.
  bool ready() const;

 private:
  friend class Network;
  std::shared_ptr<detail::SendState> state_;
  double timeout_s_ = 0;
};

class Network {
 public:
  // Binds the listening socket (Error if the port is taken) and starts the I/O thread.
  explicit Network(NetworkOptions options);
  ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  // Establishes every link: the lower id dials, with retries until the connect deadline.
  // Throws Error when a peer refuses us (naming the reason) or the deadline passes.
  void connect();

  // Queues `payload` for `peer`; the bytes must stay valid until the handle's wait()
  // returns. `shaped` = false bypasses link emulation (measurement traffic).
  SendHandle send(int peer, MessageType type, std::uint64_t step, std::uint32_t tag,
                  std::span<const std::byte> payload, bool shaped = true);
  // Blocks until that message arrives (at most the peer timeout); throws Error naming the
  // peer on timeout, on a lost link or on a bad frame.
  Payload receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag);
  // The same with a deadline shorter than the peer timeout (never longer).
  Payload receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag, double timeout_s);
  double peer_timeout_s() const;

  // The message if it has arrived, without waiting; throws like receive() if the link is lost.
  std::optional<Payload> try_receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag);

  // Closes the link to a peer this one has given up on, so that peer learns it was dropped.
  // A dropped peer may come back: a restarted process for it (NetworkOptions::rejoin) is
  // accepted once the link is dead, the link is fresh (messages left from the old one are
  // discarded) and alive() says true again; rejoins() counts how often that happened.
  void drop(int peer, const std::string& why);
  // The caller counts a peer that rejoined in again: from now on another restart of it
  // is answered "not yet" until the caller drop()s it again.
  void readmit(int peer);
  int rejoins(int peer) const;
  bool alive(int peer) const;
  // Seconds since anything (a message or a heartbeat) last arrived from `peer`. Every link
  // carries a heartbeat when it has been quiet for a second, and it comes from the I/O
  // thread, so a peer that is blocked waiting for someone else still sounds alive, while
  // a stopped or cut-off one falls silent.
  double silence_s(int peer) const;

  // Hands a received payload back so a later message can reuse its memory: a 10 MB
  // buffer allocated per message costs its page faults on every step.
  void recycle(Payload payload);

  // Says goodbye on every live link, flushes what is queued, and closes. Idempotent.
  void close();
  // Drops every connection at once without a goodbye, as a crash would (fault tests).
  void abort();

  int self() const;
  const std::vector<int>& links() const;
  LinkCounters counters(int peer) const;
  LinkCounters total_counters() const;
  std::string peer_name(int peer) const;  // "peer 3 (127.0.0.1:29503)"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Floats as the bytes a message carries, without copying.
inline std::span<const std::byte> as_bytes(std::span<const float> values) { return std::as_bytes(values); }

}  // namespace peertrain::net
