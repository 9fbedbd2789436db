// The link between peers, as one small interface (gloo's transport::Pair, c10d's
// ProcessGroup): gossip, the collectives, the membership protocol and the trainer see only
// this. Implementations are made by factory functions:
//  - make_tcp_transport (tcp.h): TCP over Boost.Asio, the real one;
//  - make_loopback_transports (loopback.h): n peers in one process, for tests;
//  - make_faulty_transport (faulty.h): a decorator that drops, delays, corrupts or kills
//    chosen messages and links at a chosen step, for fault tests.
//
// Messages are addressed by (peer, type, step, tag): a receiver asks for exactly the
// message it needs next, which keeps steps from mixing when a fast peer runs ahead. Each
// (peer, type, step, tag) is sent at most once per link; a second is a protocol error.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "peertrain/core/work.h"
#include "peertrain/net/frame.h"

namespace peertrain::net {

using Payload = std::vector<std::byte>;
// A received payload that a transport may hand to several receivers without copying (a
// simulated cluster gives every neighbour the same bytes). Its holders only read it.
using SharedPayload = std::shared_ptr<Payload>;
// The payload itself: moved out when this is its last holder, copied otherwise.
Payload unshare(SharedPayload shared);

struct LinkCounters {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t messages_sent = 0;
  std::uint64_t messages_received = 0;
  std::uint64_t messages_shared = 0;  // of those sent, how many went through shared memory (tcp.h)
  LinkCounters& operator+=(const LinkCounters& o) {
    bytes_sent += o.bytes_sent;
    bytes_received += o.bytes_received;
    messages_sent += o.messages_sent;
    messages_received += o.messages_received;
    messages_shared += o.messages_shared;
    return *this;
  }
};

// The bytes a send carries. Either the send owns them (a Payload moved in: the caller may
// do what it likes afterwards) or it borrows them from the caller, who keeps them valid
// and unchanged until the send's Work is done. Borrowing is safe against time-outs: a
// Work whose wait() runs out of time fails the link on the transport's I/O thread before
// the error reaches the caller, and a Work destroyed unwaited waits, so once wait() has
// returned or thrown, or the Work is gone, nothing reads the bytes any more.
class SendBuffer {
 public:
  SendBuffer() = default;
  SendBuffer(std::span<const std::byte> borrowed) : bytes_(borrowed) {}
  SendBuffer(const Payload& borrowed) : bytes_(borrowed) {}
  SendBuffer(Payload&& owned) : owner_(std::make_shared<Payload>(std::move(owned))) { bytes_ = *owner_; }
  std::span<const std::byte> bytes() const { return bytes_; }
  // Keeps owned bytes alive for as long as the transport holds a copy of this.
  const std::shared_ptr<Payload>& owner() const { return owner_; }

 private:
  std::span<const std::byte> bytes_;
  std::shared_ptr<Payload> owner_;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // Establishes every link; throws Error when a peer refuses us (naming the reason) or the
  // connect deadline passes.
  virtual void connect() = 0;

  // Queues a message for `peer`. `shaped` = false bypasses link emulation (measurement
  // and control traffic). The Work's wait() throws kPeerLost when the link is lost, and
  // kTimeout (after failing the link) when the send does not finish in time.
  virtual Work send(int peer, MessageType type, std::uint64_t step, std::uint32_t tag, SendBuffer payload,
                    bool shaped = true) = 0;
  // Blocks until that message arrives, at most timeout_s (never longer than the peer
  // timeout); throws Error naming the peer on a time-out, a lost link or a bad frame.
  virtual Payload receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag, double timeout_s) = 0;
  Payload receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag) {
    return receive(peer, type, step, tag, peer_timeout_s());
  }
  // Waits for that message as long as `peer` sounds alive, at most cap_s: gives up (kTimeout)
  // once it has been silent, not even heartbeating, for half of the peer timeout. For a
  // wait on a peer that may itself be waiting on others (the coordinator of an
  // evaluation), where a fixed time-out would give up on it first.
  Payload receive_while_alive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag, double cap_s);
  // The message if it has arrived, without waiting; throws like receive() if the link is
  // lost. A peer that finished cleanly is not lost: it simply has nothing more to say.
  virtual std::optional<Payload> try_receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag) = 0;
  // receive(), as a payload that may be shared with other receivers. The default wraps
  // receive()'s own, without a copy.
  virtual SharedPayload receive_shared(int peer, MessageType type, std::uint64_t step, std::uint32_t tag,
                                       double timeout_s) {
    return std::make_shared<Payload>(receive(peer, type, step, tag, timeout_s));
  }

  // Whichever of several expected messages comes first: a peer that serves requests from
  // any neighbour at any time (AD-PSGD's pairwise averaging) waits on all of its links at
  // once. Returns the index in `wanted` of the message taken, with its payload; or, for a
  // wanted peer whose link is lost or who left, that index with `gone` set and the reason
  // (the caller stops expecting it); or nothing once timeout_s has passed. The base form
  // polls try_receive(); the TCP and loopback transports wait on their arrivals.
  struct Wanted {
    int peer = 0;
    MessageType type = MessageType::kParameters;
    std::uint64_t step = 0;
    std::uint32_t tag = 0;
  };
  struct Arrival {
    std::size_t index = 0;
    Payload payload;
    bool gone = false;
    std::string why;  // when gone
  };
  virtual std::optional<Arrival> receive_any(std::span<const Wanted> wanted, double timeout_s);

  // Closes the link to a peer this one has given up on, so that peer learns it was
  // dropped. Nothing more is read from the link, but what had already arrived can still be
  // taken (a coordinator's last announcement before it stopped the run). A dropped peer
  // may come back: a restarted process for it (--rejoin) is accepted once the link is
  // dead, the link is fresh (messages left from the old one are discarded) and alive()
  // says true again; rejoins() counts how often that happened.
  virtual void drop(int peer, const std::string& why) = 0;
  // The caller counts a peer that rejoined in again: from now on another restart of it is
  // answered "not yet" until the caller drop()s it again.
  virtual void readmit(int peer) = 0;
  virtual int rejoins(int peer) const = 0;
  virtual bool alive(int peer) const = 0;
  // Seconds since anything (a message or a heartbeat) last arrived from `peer`. Heartbeats
  // come from the transport's own thread, so a peer blocked waiting for someone else still
  // sounds alive, while a stopped or cut-off one falls silent.
  virtual double silence_s(int peer) const = 0;
  // The longest silence_s a live, idle link may show: a shorter silence says nothing about
  // the peer. Zero where silence is exact (the in-process transport's stalls).
  virtual double live_silence_s() const { return 0; }
  // What the operating system knows of the link to `peer`, for an error that gives up on
  // it: whether its data or only its acknowledgements stopped, and TCP's own retransmission
  // timer. Empty where the transport has no such view (loopback) or the link is closed.
  virtual std::string link_report(int peer) const {
    (void)peer;
    return {};
  }
  // Why each lost link was lost (not those whose peer finished and said goodbye), in the
  // order they were, once the transport's own thread has handled every event it had already seen. A
  // centralized run stops at its first loss, and one loss brings others soon after (a
  // neighbour that stops on it closes its own links); two seen in one batch cannot be
  // ordered, so its error names every peer lost by then (PeerRun::train).
  virtual std::vector<std::string> lost_links() = 0;

  // Hands a received payload back so a later message can reuse its memory.
  virtual void recycle(Payload payload) { (void)payload; }
  // Hands back a shared one: recycled when this was its last holder.
  void release(SharedPayload shared) {
    if (shared && shared.use_count() == 1) recycle(std::move(*shared));
  }

  // Says goodbye on every live link, flushes what is queued, and closes. Idempotent.
  virtual void close() = 0;
  // Drops every connection at once without a goodbye, as a crash would (fault tests).
  virtual void abort() = 0;

  virtual int self() const = 0;
  virtual const std::vector<int>& links() const = 0;
  virtual LinkCounters counters(int peer) const = 0;
  virtual LinkCounters total_counters() const = 0;
  virtual std::string peer_name(int peer) const = 0;  // "peer 3 (127.0.0.1:29503)"
  virtual double peer_timeout_s() const = 0;
};

// Floats as the bytes a message carries, without copying.
inline std::span<const std::byte> as_bytes(std::span<const float> values) { return std::as_bytes(values); }

}  // namespace peertrain::net
