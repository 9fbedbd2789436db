// The TCP transport's private parts: a link (one connection to one peer, with its write
// queue and its state) and the transport's shared state, whose member functions live in
// tcp_transport.cpp (reading, writing, failing) and tcp_connect.cpp (dialing, accepting,
// the handshake's I/O).
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "admission.h"
#include "handshake.h"
#include "mailbox.h"
#include "peertrain/core/work.h"
#include "peertrain/net/tcp.h"
#include "shared_ring.h"
#include "wire_clock.h"

namespace peertrain::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// The completion condition of every frame's reads and writes on an established link (the
// handshake's frames are small and keep Asio's default). Asio's transfer_all() hands
// the kernel at most 64 KiB a call (default_max_transfer_size): a 2.7 MB parameter frame
// took 43 sendmsg and 43 recvfrom, each behind its own reactor wake-up, and those context
// switches took cores from the gradient that the exchange overlaps. With this the
// kernel takes what its socket buffer holds at each call.
struct TransferAll {
  std::size_t operator()(const boost::system::error_code& ec, std::size_t) const { return ec ? 0 : kMaxCall; }
  static constexpr std::size_t kMaxCall = std::size_t{1} << 30;
};

// One frame on its way out. The payload's bytes are owned by the SendBuffer or borrowed
// from the sender, who keeps them until `state` is done (transport.h).
struct Outgoing {
  FrameHeader fields;               // what `header` encodes
  std::uint64_t payload_sum = 0;    // checksum_payload of the payload (not with a secret)
  bool sum_pending = false;         // ... to be computed by finish_header
  std::ptrdiff_t ring_offset = -1;  // where the payload goes in the link's ring; -1: inline
  HeaderBytes header;
  SendBuffer payload;
  std::shared_ptr<Work::State> state;
  Clock::time_point ready_at;
  bool shaped = true;
  std::size_t written = 0;  // of header + payload
};

struct Link {
  explicit Link(asio::io_context& io) : socket(io), timer(io), read_timer(io) {}
  int peer = 0;
  std::string name;
  tcp::socket socket;
  // Its descriptor while open, else -1; under the core's mutex, so that another thread may
  // ask the kernel about the connection (link_report) without racing a close.
  int fd = -1;
  asio::steady_timer timer;       // shaping waits
  asio::steady_timer read_timer;  // ingress shaping waits
  LinkShaping shaping;
  WireClock wire;               // its bandwidth cap
  // When the next piece, its wires reserved, may go (empty: not reserved yet).
  std::optional<std::chrono::steady_clock::time_point> piece_due;
  std::deque<Outgoing> queue;  // I/O thread only
  bool writing = false;
  HeaderBytes header_in{};
  Payload payload_in;
  FrameHeader pending;
  // Shared memory with a peer on this host (shared_ring.h), per connection; I/O thread only.
  // Each side sends one ring offer (a ring, or none) and answers the other's;
  // connect() returns once both have arrived, so that no frame of this exchange is still on
  // its way to a peer that might close right after connecting (unread bytes at a close make
  // the kernel reset the connection, and the peer then loses what it had not read yet).
  bool loopback = false;                 // both ends of the connection on the loopback interface
  std::unique_ptr<SharedRing> ring_out;  // offered for this side's payloads
  bool ring_out_answered = false;        // the peer answered the offer (or there was none)
  bool ring_offer_seen = false;          // the peer's offer (or its "none") arrived
  std::unique_ptr<SharedRing> ring_in;   // the peer's, mapped here
  std::ptrdiff_t ring_in_offset = -1;    // of `pending`'s payload, when shared
  // ring_out was mapped by the peer. Set and cleared on the I/O thread; atomic because
  // send() reads it on the caller's thread, to leave a large payload's checksum to
  // finish_header, which computes it while copying into the ring.
  std::atomic<bool> shares{false};
  // Guarded by TcpCore::mutex:
  bool connected = false;
  bool settled = false;  // the ring exchange above is over
  bool dead = false;
  bool left = false;  // said goodbye
  // The caller gave up on it (drop()) and has not counted it in again (readmit()): a
  // restarted process for it may rejoin once the link is dead.
  bool dropped = false;
  int rejoins = 0;
  std::string death;
  LinkCounters counters;
  std::unique_ptr<FrameAuthenticator> auth;  // set by the handshake when a secret is in use
  std::unique_ptr<asio::steady_timer> heartbeat;
  Clock::time_point last_write = Clock::now();  // I/O thread only
  Clock::time_point last_heard = Clock::now();  // guarded by TcpCore::mutex
  // While dialing: since when every attempt was refused (nobody listens on its port), or
  // unset. A rejoining peer counts a link refused for long enough as a process that is gone.
  std::optional<Clock::time_point> refused_since;  // guarded by TcpCore::mutex
  // Bumped when a rejoined peer replaces the socket: completions of the old socket's
  // reads and writes that run later must not touch the new connection.
  std::uint64_t generation = 0;  // I/O thread only
};

// Everything the I/O thread and the callers share. Held by shared_ptr so that a Work's
// cancel hook, which may run after the transport is gone, can tell.
struct TcpCore {
  explicit TcpCore(TcpOptions o) : options(std::move(o)) {}
  TcpOptions options;
  // Declared before the io_context: handlers that hold a handshake slot release it when
  // the io_context destroys them.
  Admission admission{kMaxPendingHandshakes, kMaxPendingPerAddress};
  RateLimitedLine stranger_line{10.0};
  RateLimitedLine accept_line{10.0};
  double accept_backoff_s = 0;  // after accept failed for lack of descriptors

  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  tcp::acceptor acceptor{io};
  std::thread thread;
  // False once the I/O thread has left io.run(): no handler can touch a send's bytes then.
  std::atomic<bool> io_running{true};
  std::map<int, std::unique_ptr<Link>> links;

  std::mutex mutex;  // guards the mailbox and the link states marked above
  std::condition_variable changed;
  Mailbox mailbox;
  WireClock node_wire;      // the shared egress cap (I/O thread only)
  WireClock ingress_wire;   // the shared ingress cap (I/O thread only)
  std::string fatal;        // a refusal that ends connect()
  std::string last_refusal;
  std::vector<int> lost_order;  // the peers whose links failed, in the order they did
  bool closed = false;

  Link& link(int peer);
  // Marks a link lost, once, in lost_order; false if it was already dead. Mutex held.
  bool mark_lost(Link& l, const std::string& why);
  const Link* first_lost() const;  // the earliest link still lost (not one that said goodbye); mutex held
  std::string name_of(int peer) const;

  // tcp_transport.cpp: failing, reading, writing.
  void fail_link(Link& l, const std::string& why);
  void close_socket(Link& l);  // l.fd = -1 under the mutex, then the close
  void stop_links(void (*how)(Link&, boost::system::error_code&));
  void start_read(Link& l);
  void read_failed(Link& l, const boost::system::error_code& ec);
  void read_payload_shaped(Link& l, std::uint64_t generation, std::size_t done);
  void read_piece(Link& l, std::uint64_t generation, std::size_t done, std::size_t piece);
  void payload_read(Link& l);
  void deliver(Link& l);
  void enqueue(Link& l, Outgoing out);
  void write_next(Link& l);
  void wrote(Link& l, const boost::system::error_code& ec, bool frame_done);
  Outgoing make_frame(MessageType type, std::uint64_t step, std::uint32_t tag, SendBuffer payload, bool shaped,
                      const std::string& to, bool authenticated = false, bool may_share = false);
  void established(Link& l, tcp::socket socket);
  // Shared memory (shared_ring.h): offering this side's ring, mapping the peer's, and the
  // frames that use them.
  void offer_ring(Link& l);
  void accept_ring(Link& l, std::span<const std::byte> offer);
  void ring_accepted(Link& l, std::span<const std::byte> answer);
  void settle_if_done(Link& l);
  void forget_rings(Link& l);  // the link is gone: unmap both rings
  void finish_header(Link& l, Outgoing& out);
  void schedule_heartbeat(Link& l);

  // tcp_connect.cpp: dialing, accepting, the handshake's I/O.
  void dial_all(Clock::time_point deadline);
  void dial(Link& l, Clock::time_point deadline);
  void retry_dial(Link& l, Clock::time_point deadline, const std::string& why);
  void send_hello(Link& l, Clock::time_point deadline, std::shared_ptr<tcp::socket> socket);
  void prove_as_dialer(Link& l, Clock::time_point deadline, std::shared_ptr<tcp::socket> socket,
                       const handshake::Hello& hello, const handshake::Reply& reply,
                       std::shared_ptr<asio::steady_timer> timer);
  void refuse_fatally(const std::string& why);
  void listen();
  void accept_next();
  void handshake(std::shared_ptr<tcp::socket> socket, std::shared_ptr<void> slot, const std::string& from);
  void answer_hello(std::shared_ptr<tcp::socket> socket, const handshake::Hello& hello, const std::string& from,
                    std::shared_ptr<asio::steady_timer> timer, std::shared_ptr<void> slot);
  handshake::Verdict admit_hello(const handshake::Hello& hello);  // under the lock
};

}  // namespace peertrain::net
