// The TCP transport between peers: one connection per link, a handshake that refuses
// peers of another run or topology (and, with a shared key, peers that cannot prove they
// hold it), framed messages, heartbeats, link emulation (one-way latency and a sender-side
// token-bucket bandwidth cap), and counters. One I/O thread per process runs every socket
// (Boost.Asio); callers on other threads send asynchronously and receive with a deadline.
// Asio stays behind make_tcp_transport, so nothing that uses a Transport includes it.
//
// Strangers. Anyone may connect to a peer's port, so what a stranger can cost is bounded:
// at most kMaxPendingHandshakes handshakes are open at once (kMaxPendingPerAddress from one
// address); more are closed on accept, and the refusals are logged in one line per ten
// seconds. Each handshake must finish within kHandshakeTimeoutS on both sides. An accept
// that fails for lack of file descriptors backs off instead of spinning.
//
// Peers on one host. A link whose two ends are both on the loopback interface moves its
// large payloads (kSharedMinBytes and up) through shared memory (shared_ring.h): each
// sender offers a ring, and a receiver that can map it (same host, pid namespace and user)
// accepts. Headers, and so ordering, heartbeats, authentication and the detection of a
// lost peer, stay on the TCP connection, and the link emulation holds the frames as long as
// before. Links over any other address, or with shared_memory off, are plain TCP: tc or
// netem on `lo` sees only the headers of shared frames, so a run emulating faults there
// turns it off (--shared-memory off).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "peertrain/net/auth.h"
#include "peertrain/net/transport.h"

namespace peertrain::net {

inline constexpr int kMaxPendingHandshakes = 64;
inline constexpr int kMaxPendingPerAddress = 8;
inline constexpr double kHandshakeTimeoutS = 10;
inline constexpr std::size_t kSharedMinBytes = 64 * 1024;

struct Endpoint {
  std::string host;
  int port = 0;
};

struct LinkShaping {
  double latency_ms = 0;      // added one way, to every frame
  double bandwidth_mbps = 0;  // cap on the sender; 0 = none
};

struct TcpOptions {
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
  double node_ingress_mbps = 0;    // cap on its incoming data frames over all links; 0 = none
  // The shared key (--secret-file): the handshake then proves both sides hold it, and every
  // later frame carries a ChaCha20-Poly1305 tag instead of the checksum (docs/net.md).
  std::optional<Secret> secret;
  // This process restarts a peer the others dropped (--rejoin): it dials every link, not
  // only the higher ids, and says so in its hello. A neighbour accepts it only once it has
  // itself dropped the old link (drop()), and otherwise answers "not yet", which is retried.
  bool rejoin = false;
  // A centralized baseline: no collective finishes without every peer, so a lost link ends
  // every wait at once, named as the cause, rather than each peer waiting on a neighbour
  // that will stop only later, of the same loss.
  bool every_link_needed = false;
  // Payloads to peers on this host through shared memory (above); off: every byte on TCP.
  bool shared_memory = true;
  // Each ring's size; 0: twice max_payload_bytes (at least 1 MiB), so that one message can
  // be copied out while the next goes in.
  std::size_t shared_ring_bytes = 0;
  // What one linked peer may leave unread here before its link is closed as a flood; 0:
  // 16 of the largest message plus 64 MiB, and 65,536 messages. An honest peer is at
  // most a few steps ahead, so this bounds the mailbox without refusing one.
  std::size_t max_unread_bytes = 0;
  std::size_t max_unread_messages = 0;
};

// Binds the listening socket (Error(kIo) if the port is taken) and starts the I/O thread;
// connect() then establishes the links: the lower id dials, with retries until the
// connect deadline.
std::unique_ptr<Transport> make_tcp_transport(TcpOptions options);

}  // namespace peertrain::net
