#include "peertrain/net/network.h"

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "peertrain/core/error.h"
#include "peertrain/core/log.h"

namespace peertrain::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace detail {
struct SendState {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::string error;  // empty on success
  std::string what;   // "parameters for step 12 to peer 3 (…)"

  void finish(std::string failure) {
    {
      std::lock_guard lock(mutex);
      done = true;
      error = std::move(failure);
    }
    done_cv.notify_all();
  }
};
}  // namespace detail

void SendHandle::wait() const {
  if (!state_) return;
  std::unique_lock lock(state_->mutex);
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
  if (!state_->done_cv.wait_until(lock, deadline, [&] { return state_->done; }))
    throw Error(ErrorKind::kTimeout, str("sending ", state_->what, " did not finish within ", timeout_s_,
                                         " s (--peer-timeout)"));
  if (!state_->error.empty()) throw Error(ErrorKind::kPeerLost, state_->error);
}

bool SendHandle::ready() const {
  if (!state_) return true;
  std::lock_guard lock(state_->mutex);
  return state_->done;
}

namespace {

// Bytes written per token-bucket grant: at least 64 KiB, and at fast emulated rates what
// the link carries in 1 ms, so a fast link does not cost a timer wake-up every 64 KiB.
constexpr std::size_t kShapedPiece = 64 * 1024;
std::size_t shaped_piece(double bandwidth_mbps) {
  return std::max<std::size_t>(kShapedPiece, static_cast<std::size_t>(bandwidth_mbps * 1e6 / 8 / 1000));
}
constexpr std::size_t kHelloBytes = 64;
constexpr std::size_t kAuthReplyBytes = 4 + kNonceBytes + kProofBytes;
constexpr std::uint32_t kFlagAuthenticated = 1;
constexpr std::uint32_t kFlagRejoin = 2;  // a restarted peer coming back to a running run
// hello-reply status: 0 accepted, 1 refused (the reason follows), 2 not yet (retry).
constexpr std::uint32_t kReplyRetry = 2;
constexpr std::uint64_t kMaxReplyBytes = 1024;
constexpr double kHandshakeTimeoutS = 10;

struct Outgoing {
  HeaderBytes header;
  std::span<const std::byte> payload;
  std::shared_ptr<detail::SendState> state;
  Clock::time_point ready_at;
  bool shaped = true;
  std::size_t written = 0;  // of header + payload
};

struct Hello {
  std::uint32_t version = kProtocolVersion;
  std::uint32_t peer = 0;
  std::uint32_t target = 0;
  std::uint64_t fingerprint = 0;
  std::uint64_t run_id = 0;
  std::uint32_t flags = 0;  // kFlagAuthenticated: the dialer uses --secret-file
  Nonce nonce{};            // the dialer's, for the challenge–response
};

Payload encode_hello(const Hello& h) {
  Payload bytes(kHelloBytes);
  std::memcpy(bytes.data(), &h.version, 4);
  std::memcpy(bytes.data() + 4, &h.peer, 4);
  std::memcpy(bytes.data() + 8, &h.target, 4);
  std::memcpy(bytes.data() + 12, &h.fingerprint, 8);
  std::memcpy(bytes.data() + 20, &h.run_id, 8);
  std::memcpy(bytes.data() + 28, &h.flags, 4);
  std::memcpy(bytes.data() + 32, h.nonce.data(), kNonceBytes);
  return bytes;
}

Hello decode_hello(const Payload& bytes) {
  Hello h;
  std::memcpy(&h.version, bytes.data(), 4);
  std::memcpy(&h.peer, bytes.data() + 4, 4);
  std::memcpy(&h.target, bytes.data() + 8, 4);
  std::memcpy(&h.fingerprint, bytes.data() + 12, 8);
  std::memcpy(&h.run_id, bytes.data() + 20, 8);
  std::memcpy(&h.flags, bytes.data() + 28, 4);
  std::memcpy(h.nonce.data(), bytes.data() + 32, kNonceBytes);
  return h;
}

std::string hex(std::uint64_t value) {
  char buffer[24];
  std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(value));
  return buffer;
}

}  // namespace

struct Link {
  explicit Link(asio::io_context& io) : socket(io), timer(io) {}
  int peer = 0;
  std::string name;
  tcp::socket socket;
  asio::steady_timer timer;  // shaping waits
  LinkShaping shaping;
  double tokens = 0;
  Clock::time_point refilled = Clock::now();
  std::deque<Outgoing> queue;  // I/O thread only
  bool writing = false;
  HeaderBytes header_in{};
  Payload payload_in;
  FrameHeader pending;
  // Guarded by Impl::mutex:
  bool connected = false;
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
  Clock::time_point last_heard = Clock::now();  // guarded by Impl::mutex
  // Bumped when a rejoined peer replaces the socket: completions of the old socket's
  // reads and writes that run later must not touch the new connection.
  std::uint64_t generation = 0;  // I/O thread only
};

struct Network::Impl {
  NetworkOptions options;
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  tcp::acceptor acceptor{io};
  std::thread thread;
  std::map<int, std::unique_ptr<Link>> links;

  std::mutex mutex;  // guards the mailbox and the link states below
  std::condition_variable changed;
  std::map<std::tuple<int, int, std::uint64_t, std::uint32_t>, Payload> mailbox;
  std::vector<Payload> pool;  // received buffers handed back by recycle()
  double node_tokens = 0;     // the shared egress token bucket (I/O thread only)
  Clock::time_point node_refilled = Clock::now();
  std::string fatal;  // a refusal that ends connect()
  std::string last_refusal;
  bool closed = false;

  Link& link(int peer) {
    auto it = links.find(peer);
    if (it == links.end())
      throw Error(ErrorKind::kInvalidArgument, str("peer ", options.self, " has no link to peer ", peer));
    return *it->second;
  }

  std::string name_of(int peer) const {
    const Endpoint& e = options.endpoints.at(peer);
    return str("peer ", peer, " (", e.host, ":", e.port, ")");
  }

  // --- failure -------------------------------------------------------------------------

  void fail_link(Link& l, const std::string& why) {
    bool already_dead = false;
    std::string death;
    {
      std::lock_guard lock(mutex);
      already_dead = l.dead;
      if (!already_dead) {
        l.dead = true;
        l.death = why;
      }
      death = l.death;
    }
    if (already_dead) {
      // A link that died quietly (the peer said goodbye and closed) may still hold queued
      // sends; end them now, or each wait() on them would run to the peer timeout. A write
      // still in flight keeps its frame: its completion handler pops it.
      auto first = l.queue.begin();
      if (l.writing && first != l.queue.end()) ++first;
      for (auto it = first; it != l.queue.end(); ++it) it->state->finish(death);
      l.queue.erase(first, l.queue.end());
      changed.notify_all();
      return;
    }
    if (!closed) log::error(why);
    boost::system::error_code ignored;
    l.socket.close(ignored);
    l.timer.cancel();
    if (l.heartbeat) l.heartbeat->cancel();
    for (Outgoing& out : l.queue) out.state->finish(why);
    l.queue.clear();
    l.writing = false;
    changed.notify_all();
  }

  // Marks the network closed, then, on the I/O thread, closes the acceptor and applies
  // `how` to every link; waits (at most 5 s) for that to have happened.
  void stop_links(void (*how)(Link&, boost::system::error_code&)) {
    {
      std::lock_guard lock(mutex);
      closed = true;
    }
    auto done = std::make_shared<std::promise<void>>();
    asio::post(io, [this, how, done] {
      boost::system::error_code ignored;
      acceptor.close(ignored);
      for (auto& [peer, link] : links) how(*link, ignored);
      done->set_value();
    });
    done->get_future().wait_for(std::chrono::seconds(5));
  }

  // --- reading -------------------------------------------------------------------------

  void start_read(Link& l) {
    const std::uint64_t generation = l.generation;
    asio::async_read(l.socket, asio::buffer(l.header_in), [this, &l, generation](boost::system::error_code ec, std::size_t) {
      if (generation != l.generation) return;
      if (ec) return read_failed(l, ec);
      try {
        l.pending = decode_header(l.header_in, {static_cast<std::uint32_t>(l.peer), options.max_payload_bytes, l.name});
      } catch (const Error& e) {
        return fail_link(l, e.what());
      }
      {
        std::lock_guard lock(mutex);
        for (auto it = pool.begin(); it != pool.end(); ++it)
          if (it->capacity() >= l.pending.length) {
            l.payload_in = std::move(*it);
            pool.erase(it);
            break;
          }
      }
      l.payload_in.resize(l.pending.length);  // bounded by decode_header's length check
      asio::async_read(l.socket, asio::buffer(l.payload_in), [this, &l, generation](boost::system::error_code ec2, std::size_t) {
        if (generation != l.generation) return;
        if (ec2) return read_failed(l, ec2);
        if (l.auth) {
          if (!l.auth->verify(l.header_in, l.payload_in))
            return fail_link(l, str("bad frame from ", l.name, ": authentication failed on a ", to_string(l.pending.type),
                                    " frame for step ", l.pending.step, " (forged, corrupted or replayed); closing the link"));
        } else {
          try {
            verify_checksum(l.pending, l.payload_in, {static_cast<std::uint32_t>(l.peer), options.max_payload_bytes, l.name});
          } catch (const Error& e) {
            return fail_link(l, e.what());
          }
        }
        deliver(l);
      });
    });
  }

  void read_failed(Link& l, const boost::system::error_code& ec) {
    bool quiet;
    {
      std::lock_guard lock(mutex);
      quiet = l.left || closed;
    }
    if (quiet) {
      std::lock_guard lock(mutex);
      l.dead = true;
      l.death = str(l.name, " finished and closed its connection");
      changed.notify_all();
      return;
    }
    fail_link(l, ec == asio::error::eof ? str(l.name, " closed the connection (it exited or crashed)")
                                        : str("lost ", l.name, ": ", ec.message()));
  }

  void deliver(Link& l) {
    const FrameHeader& h = l.pending;
    bool duplicate = false;
    {
      std::lock_guard lock(mutex);
      l.counters.bytes_received += kHeaderBytes + h.length;
      ++l.counters.messages_received;
      l.last_heard = Clock::now();
      if (h.type == MessageType::kGoodbye) {
        l.left = true;
      } else if (h.type == MessageType::kHeartbeat) {
        // nothing to deliver: hearing it was the point
      } else {
        auto key = std::make_tuple(l.peer, static_cast<int>(h.type), h.step, h.tag);
        if (mailbox.count(key)) {
          duplicate = true;  // an honest peer sends each message once
        } else {
          mailbox.emplace(key, std::move(l.payload_in));
          l.payload_in = Payload();
        }
      }
    }
    if (duplicate)
      return fail_link(l, str("bad frame from ", l.name, ": a second ", to_string(h.type), " for step ", h.step,
                              " (part ", h.tag, "); closing the link"));
    changed.notify_all();
    start_read(l);
  }

  // --- writing -------------------------------------------------------------------------

  void enqueue(Link& l, Outgoing out) {
    {
      std::lock_guard lock(mutex);
      if (l.dead) {
        out.state->finish(l.death);
        return;
      }
    }
    // Signed here, on the I/O thread, so that signing order is wire order.
    if (l.auth) l.auth->sign(out.header, out.payload);
    l.queue.push_back(std::move(out));
    if (!l.writing) write_next(l);
  }

  void write_next(Link& l) {
    if (l.queue.empty()) {
      l.writing = false;
      return;
    }
    l.writing = true;
    Outgoing& out = l.queue.front();
    const double node_mbps = options.node_bandwidth_mbps;
    const bool shaped = out.shaped && (l.shaping.latency_ms > 0 || l.shaping.bandwidth_mbps > 0 || node_mbps > 0);
    const std::uint64_t generation = l.generation;
    if (!shaped) {
      std::array<asio::const_buffer, 2> buffers = {asio::buffer(out.header), asio::buffer(out.payload.data(), out.payload.size())};
      asio::async_write(l.socket, buffers, [this, &l, generation](boost::system::error_code ec, std::size_t) {
        if (generation == l.generation) wrote(l, ec, true);
      });
      return;
    }
    const auto now = Clock::now();
    if (now < out.ready_at) {  // one-way latency
      l.timer.expires_at(out.ready_at);
      l.timer.async_wait([this, &l](boost::system::error_code ec) {
        if (!ec) write_next(l);
      });
      return;
    }
    const std::size_t total = kHeaderBytes + out.payload.size();
    const double link_mbps = l.shaping.bandwidth_mbps;
    const std::size_t burst = shaped_piece(std::max(link_mbps, node_mbps));
    const std::size_t piece = std::min(burst, total - out.written);
    // Two token buckets, the link's and the card's shared by every link; a piece goes when
    // both hold enough.
    double wait_s = 0;
    auto refill = [&](double& tokens, Clock::time_point& refilled, double mbps) {
      const double rate = mbps * 1e6 / 8;  // bytes per second
      tokens = std::min<double>(static_cast<double>(shaped_piece(mbps)),
                                tokens + rate * std::chrono::duration<double>(now - refilled).count());
      refilled = now;
      if (tokens < static_cast<double>(piece)) wait_s = std::max(wait_s, (static_cast<double>(piece) - tokens) / rate);
    };
    if (link_mbps > 0) refill(l.tokens, l.refilled, link_mbps);
    if (node_mbps > 0) refill(node_tokens, node_refilled, node_mbps);
    if (wait_s > 0) {
      l.timer.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait_s)));
      l.timer.async_wait([this, &l](boost::system::error_code ec) {
        if (!ec) write_next(l);
      });
      return;
    }
    if (link_mbps > 0) l.tokens -= static_cast<double>(piece);
    if (node_mbps > 0) node_tokens -= static_cast<double>(piece);
    std::vector<asio::const_buffer> buffers;
    std::size_t from = out.written, left = piece;
    if (from < kHeaderBytes) {
      const std::size_t n = std::min(left, kHeaderBytes - from);
      buffers.push_back(asio::buffer(out.header.data() + from, n));
      from += n;
      left -= n;
    }
    if (left > 0) buffers.push_back(asio::buffer(out.payload.data() + (from - kHeaderBytes), left));
    asio::async_write(l.socket, buffers, [this, &l, piece, generation](boost::system::error_code ec, std::size_t) {
      if (generation != l.generation) return;
      if (ec) return wrote(l, ec, true);
      if (l.queue.empty()) return wrote(l, ec, false);  // fail_link ended the frame meanwhile
      Outgoing& o = l.queue.front();
      o.written += piece;
      wrote(l, ec, o.written == kHeaderBytes + o.payload.size());
    });
  }

  void wrote(Link& l, const boost::system::error_code& ec, bool frame_done) {
    if (ec) {
      l.writing = false;  // this write is over: fail_link may end its frame with the rest
      return fail_link(l, str("sending to ", l.name, " failed: ", ec.message()));
    }
    l.last_write = Clock::now();
    if (frame_done && !l.queue.empty()) {  // empty: fail_link already ended this frame
      Outgoing done = std::move(l.queue.front());
      l.queue.pop_front();
      {
        std::lock_guard lock(mutex);
        l.counters.bytes_sent += kHeaderBytes + done.payload.size();
        ++l.counters.messages_sent;
      }
      done.state->finish("");
    }
    write_next(l);
  }

  Outgoing make_frame(MessageType type, std::uint64_t step, std::uint32_t tag, std::span<const std::byte> payload,
                      bool shaped, const std::string& to, bool authenticated = false) {
    FrameHeader h;
    h.type = type;
    h.sender = static_cast<std::uint32_t>(options.self);
    h.tag = tag;
    h.step = step;
    h.length = payload.size();
    if (!authenticated) h.checksum = frame_checksum(h, checksum_payload(payload));  // else the tag replaces it
    Outgoing out;
    out.header = encode_header(h);
    out.payload = payload;
    out.state = std::make_shared<detail::SendState>();
    out.state->what = str(to_string(type), " for step ", step, " to ", to);
    out.shaped = shaped;
    return out;
  }

  // --- connecting ----------------------------------------------------------------------

  void established(Link& l, tcp::socket socket) {
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    {
      std::lock_guard lock(mutex);
      if (l.connected) {  // a peer we dropped came back (rejoin): a fresh link
        ++l.generation;
        ++l.rejoins;
        l.dead = l.left = false;  // still `dropped` until the caller readmit()s it
        l.death.clear();
        for (auto it = mailbox.begin(); it != mailbox.end();)  // what the old process sent
          it = std::get<0>(it->first) == l.peer ? mailbox.erase(it) : std::next(it);
        l.queue.clear();
        l.writing = false;
        l.tokens = 0;
        log::info(l.name, " rejoined: its link is up again");
      }
    }
    l.timer.cancel();
    l.socket.close(ignored);
    l.socket = std::move(socket);
    {
      std::lock_guard lock(mutex);
      l.connected = true;
    }
    log::debug("connected to ", l.name);
    {
      std::lock_guard lock(mutex);
      l.last_heard = Clock::now();
    }
    changed.notify_all();
    start_read(l);
    l.heartbeat = std::make_unique<asio::steady_timer>(io);
    schedule_heartbeat(l);
  }

  void schedule_heartbeat(Link& l) {
    l.heartbeat->expires_after(std::chrono::seconds(1));
    l.heartbeat->async_wait([this, &l](boost::system::error_code ec) {
      if (ec) return;
      {
        std::lock_guard lock(mutex);
        if (closed || l.dead || l.left) return;
      }
      if (!l.writing && l.queue.empty() && Clock::now() - l.last_write > std::chrono::milliseconds(900)) {
        Outgoing beat = make_frame(MessageType::kHeartbeat, 0, 0, {}, false, l.name, options.secret.has_value());
        enqueue(l, std::move(beat));
      }
      schedule_heartbeat(l);
    });
  }

  void refuse_fatally(const std::string& why) {
    {
      std::lock_guard lock(mutex);
      if (fatal.empty()) fatal = why;
    }
    changed.notify_all();
  }

  void dial(Link& l, Clock::time_point deadline) {
    auto socket = std::make_shared<tcp::socket>(io);
    auto resolver = std::make_shared<tcp::resolver>(io);
    const Endpoint& e = options.endpoints.at(l.peer);
    resolver->async_resolve(e.host, std::to_string(e.port), [this, &l, deadline, socket, resolver](
                                                               boost::system::error_code ec, tcp::resolver::results_type results) {
      if (ec) return retry_dial(l, deadline, str("cannot resolve: ", ec.message()));
      asio::async_connect(*socket, results, [this, &l, deadline, socket](boost::system::error_code ec2, const tcp::endpoint&) {
        if (ec2) return retry_dial(l, deadline, ec2.message());
        send_hello(l, deadline, socket);
      });
    });
  }

  void retry_dial(Link& l, Clock::time_point deadline, const std::string& why) {
    if (closed) return;
    if (Clock::now() >= deadline) {
      std::lock_guard lock(mutex);
      last_refusal = str("could not reach ", l.name, ": ", why);
      changed.notify_all();
      return;
    }
    auto timer = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(100));
    timer->async_wait([this, &l, deadline, timer](boost::system::error_code ec) {
      if (!ec) dial(l, deadline);
    });
  }

  void send_hello(Link& l, Clock::time_point deadline, std::shared_ptr<tcp::socket> socket) {
    Hello hello{kProtocolVersion, static_cast<std::uint32_t>(options.self), static_cast<std::uint32_t>(l.peer),
                options.fingerprint, options.run_id};
    if (options.secret) {
      hello.flags = kFlagAuthenticated;
      hello.nonce = random_nonce();
    }
    if (options.rejoin) hello.flags |= kFlagRejoin;
    auto payload = std::make_shared<Payload>(encode_hello(hello));
    auto frame = std::make_shared<Outgoing>(make_frame(MessageType::kHello, 0, 0, *payload, false, l.name));
    std::array<asio::const_buffer, 2> buffers = {asio::buffer(frame->header), asio::buffer(*payload)};
    asio::async_write(*socket, buffers, [this, &l, deadline, socket, payload, frame, hello](boost::system::error_code ec,
                                                                                           std::size_t) {
      if (ec) return retry_dial(l, deadline, ec.message());
      read_frame(socket, static_cast<std::uint32_t>(l.peer), kMaxReplyBytes, l.name,
                 [this, &l, deadline, socket, hello](const std::string& error, FrameHeader h, Payload reply) {
                   if (!error.empty()) return retry_dial(l, deadline, error);
                   if (h.type != MessageType::kHelloReply || reply.size() < 4)
                     return refuse_fatally(str(l.name, " answered the handshake with a ", to_string(h.type), " frame"));
                   std::uint32_t status = 0;
                   std::memcpy(&status, reply.data(), 4);
                   if (status == kReplyRetry) {  // it has not dropped our old self yet
                     const std::string reason(reinterpret_cast<const char*>(reply.data()) + 4, reply.size() - 4);
                     boost::system::error_code ignore;
                     socket->close(ignore);
                     return retry_dial(l, deadline, str(l.name, " answered: ", reason));
                   }
                   if (status != 0) {
                     const std::string reason(reinterpret_cast<const char*>(reply.data()) + 4, reply.size() - 4);
                     log::error(l.name, " refused us: ", reason);
                     return refuse_fatally(str(l.name, " refused the connection: ", reason));
                   }
                   if (!options.secret) return established(l, std::move(*socket));
                   prove_as_dialer(l, socket, hello, reply);
                 });
    });
  }

  // The acceptor proved it holds the key; now we prove it, then the link is authenticated.
  void prove_as_dialer(Link& l, std::shared_ptr<tcp::socket> socket, const Hello& hello, const Payload& reply) {
    if (reply.size() != kAuthReplyBytes)
      return refuse_fatally(str(l.name, " answered without authentication; it was not started with --secret-file"));
    HandshakeContext context{static_cast<std::uint32_t>(options.self), static_cast<std::uint32_t>(l.peer), hello.nonce,
                             {}, options.fingerprint, options.run_id};
    std::memcpy(context.acceptor_nonce.data(), reply.data() + 4, kNonceBytes);
    std::span<const std::uint8_t, kProofBytes> their_proof(reinterpret_cast<const std::uint8_t*>(reply.data()) + 4 + kNonceBytes,
                                                           kProofBytes);
    if (!verify_handshake_proof(*options.secret, Role::kAcceptor, context, their_proof))
      return refuse_fatally(str(l.name, " failed authentication: its proof does not match our --secret-file (do both "
                                        "peers use the same key?)"));
    const Proof mine = handshake_proof(*options.secret, Role::kDialer, context);
    auto proof = std::make_shared<Payload>(kProofBytes);
    std::memcpy(proof->data(), mine.data(), kProofBytes);
    auto frame = std::make_shared<Outgoing>(make_frame(MessageType::kHelloProof, 0, 0, *proof, false, l.name));
    std::array<asio::const_buffer, 2> buffers = {asio::buffer(frame->header), asio::buffer(*proof)};
    asio::async_write(*socket, buffers, [this, &l, socket, proof, frame, context](boost::system::error_code ec, std::size_t) {
      if (ec) return refuse_fatally(str("sending our proof to ", l.name, " failed: ", ec.message()));
      l.auth = std::make_unique<FrameAuthenticator>(*options.secret, context, Role::kDialer);
      established(l, std::move(*socket));
    });
  }

  // Reads one whole frame on a socket that is not yet a link (the handshake).
  template <typename Done>
  void read_frame(std::shared_ptr<tcp::socket> socket, std::uint32_t sender, std::uint64_t max_payload,
                  const std::string& name, Done done) {
    auto header = std::make_shared<HeaderBytes>();
    asio::async_read(*socket, asio::buffer(*header), [socket, sender, max_payload, name, header, done](
                                                         boost::system::error_code ec, std::size_t) {
      if (ec) return done(ec.message(), FrameHeader{}, Payload{});
      FrameHeader h;
      FrameExpectations expect{sender, max_payload, name};
      try {
        h = decode_header(*header, expect);
      } catch (const Error& e) {
        return done(e.what(), FrameHeader{}, Payload{});
      }
      auto payload = std::make_shared<Payload>(h.length);
      asio::async_read(*socket, asio::buffer(*payload), [h, payload, expect, done](boost::system::error_code ec2, std::size_t) {
        if (ec2) return done(ec2.message(), h, Payload{});
        try {
          verify_checksum(h, *payload, expect);
        } catch (const Error& e) {
          return done(e.what(), h, Payload{});
        }
        done(std::string(), h, std::move(*payload));
      });
    });
  }

  void accept_next() {
    auto socket = std::make_shared<tcp::socket>(io);
    acceptor.async_accept(*socket, [this, socket](boost::system::error_code ec) {
      if (ec) {
        if (ec != asio::error::operation_aborted) log::warn("accept failed: ", ec.message());
        if (!closed && ec != asio::error::operation_aborted) accept_next();
        return;
      }
      accept_next();
      handshake(socket);
    });
  }

  void handshake(std::shared_ptr<tcp::socket> socket) {
    boost::system::error_code ignored;
    const auto remote = socket->remote_endpoint(ignored);
    const std::string from = str(remote.address().to_string(), ":", remote.port());
    auto timer = std::make_shared<asio::steady_timer>(io, std::chrono::duration_cast<Clock::duration>(
                                                              std::chrono::duration<double>(kHandshakeTimeoutS)));
    timer->async_wait([socket](boost::system::error_code ec) {
      if (!ec) {
        boost::system::error_code ignore;
        socket->close(ignore);  // a silent stranger does not hold a socket forever
      }
    });
    // The sender is unknown until the header is read; peek at it, then check it properly.
    auto header = std::make_shared<HeaderBytes>();
    asio::async_read(*socket, asio::buffer(*header), [this, socket, header, from, timer](boost::system::error_code ec, std::size_t) {
      if (ec) return;
      std::uint32_t claimed = 0;
      std::memcpy(&claimed, header->data() + 8, 4);
      FrameExpectations expect{claimed, kHelloBytes, str("a peer at ", from)};
      FrameHeader h;
      try {
        h = decode_header(*header, expect);
        if (h.type != MessageType::kHello || h.length != kHelloBytes)
          throw Error(ErrorKind::kPeerLost, str("expected a hello frame from ", from, ", got ", to_string(h.type)));
      } catch (const Error& e) {
        log::warn("refused a connection: ", e.what());
        boost::system::error_code ignore;
        socket->close(ignore);
        return;
      }
      auto payload = std::make_shared<Payload>(kHelloBytes);
      asio::async_read(*socket, asio::buffer(*payload), [this, socket, h, payload, expect, from, timer](
                                                            boost::system::error_code ec2, std::size_t) {
        if (ec2) return;
        try {
          verify_checksum(h, *payload, expect);
        } catch (const Error& e) {
          log::warn("refused a connection: ", e.what());
          return;
        }
        answer_hello(socket, decode_hello(*payload), from, timer);
      });
    });
  }

  // Empty when accepted; otherwise the reason, and `retry` when it may pass later.
  std::string check_hello(const Hello& hello, bool& retry) {
    retry = false;
    const int peer = static_cast<int>(hello.peer);
    const bool rejoining = (hello.flags & kFlagRejoin) != 0;
    if (hello.target != static_cast<std::uint32_t>(options.self))
      return str("it dialed peer ", hello.target, " but reached peer ", options.self, " (check the addresses)");
    const bool dialer_authenticates = (hello.flags & kFlagAuthenticated) != 0;
    if (options.secret && !dialer_authenticates)
      return "we require --secret-file, and it was started without one";
    if (!options.secret && dialer_authenticates)
      return "it uses --secret-file, but we were started without one";
    if (hello.fingerprint != options.fingerprint)
      return str("topology fingerprint ", hex(hello.fingerprint), " differs from ours ", hex(options.fingerprint),
                 " (was it started with a different topology file?)");
    if (hello.run_id != options.run_id)
      return str("run id ", hex(hello.run_id), " differs from ours ", hex(options.run_id),
                 " (a peer of another run, or started with other training flags?)");
    if (rejoining) {
      if (!links.count(peer)) return str("peer ", peer, " is not linked with peer ", options.self, " in this topology");
      std::lock_guard lock(mutex);
      const Link& l = *links.at(peer);
      if (!l.connected) return str("peer ", peer, " cannot rejoin: peer ", options.self, " has not started training yet");
      if (l.left) return str("peer ", peer, " finished this run already");
      if (!l.dropped) {
        retry = true;
        return str("peer ", options.self, " has not dropped peer ", peer, " yet");
      }
      if (!l.dead) return str("peer ", peer, " is back already (is another process running as peer ", peer, "?)");
      return "";
    }
    if (!links.count(peer) || peer > options.self)
      return str("peer ", peer, " is not a neighbour that dials peer ", options.self, " in this topology");
    std::lock_guard lock(mutex);
    if (links.at(peer)->connected && links.at(peer)->dead)
      return str("peer ", peer, " was dropped from this run, which is under way; restart it with --rejoin");
    if (links.at(peer)->connected && !links.at(peer)->dead) return str("peer ", peer, " is already connected");
    return "";
  }

  void answer_hello(std::shared_ptr<tcp::socket> socket, const Hello& hello, const std::string& from,
                    std::shared_ptr<asio::steady_timer> timer) {
    bool retry = false;
    const std::string reason = check_hello(hello, retry);
    if (!reason.empty() && retry) {
      log::debug("peer ", hello.peer, " from ", from, " asks to rejoin: ", reason, "; it will retry");
    } else if (!reason.empty()) {
      log::error("refused peer ", hello.peer, " from ", from, ": ", reason);
      std::lock_guard lock(mutex);
      last_refusal = str("refused peer ", hello.peer, " from ", from, ": ", reason);
    }
    const bool accepted = reason.empty();
    const bool authenticate = accepted && options.secret.has_value();
    HandshakeContext context{hello.peer, static_cast<std::uint32_t>(options.self), hello.nonce, {}, options.fingerprint,
                             options.run_id};
    auto reply = std::make_shared<Payload>(authenticate ? kAuthReplyBytes : 4 + reason.size());
    const std::uint32_t status = accepted ? 0 : retry ? kReplyRetry : 1;
    std::memcpy(reply->data(), &status, 4);
    if (authenticate) {
      context.acceptor_nonce = random_nonce();
      const Proof proof = handshake_proof(*options.secret, Role::kAcceptor, context);
      std::memcpy(reply->data() + 4, context.acceptor_nonce.data(), kNonceBytes);
      std::memcpy(reply->data() + 4 + kNonceBytes, proof.data(), kProofBytes);
    } else {
      std::memcpy(reply->data() + 4, reason.data(), reason.size());
    }
    auto frame = std::make_shared<Outgoing>(make_frame(MessageType::kHelloReply, 0, 0, *reply, false, from));
    std::array<asio::const_buffer, 2> buffers = {asio::buffer(frame->header), asio::buffer(*reply)};
    const int peer = static_cast<int>(hello.peer);
    asio::async_write(*socket, buffers, [this, socket, reply, frame, peer, accepted, authenticate, context, from, timer](
                                            boost::system::error_code ec, std::size_t) {
      if (ec || !accepted) {
        boost::system::error_code ignore;
        socket->close(ignore);
        return;
      }
      if (!authenticate) {
        timer->cancel();
        return established(*links.at(peer), std::move(*socket));
      }
      // The dialer must now prove it holds the key too; the handshake timer still runs.
      read_frame(socket, static_cast<std::uint32_t>(peer), kProofBytes, str("peer ", peer, " at ", from),
                 [this, socket, peer, context, from, timer](const std::string& error, FrameHeader h, Payload proof) {
                   std::string why = error;
                   if (why.empty() && (h.type != MessageType::kHelloProof || proof.size() != kProofBytes))
                     why = str("expected a hello-proof frame, got ", to_string(h.type));
                   if (why.empty() &&
                       !verify_handshake_proof(*options.secret, Role::kDialer, context,
                                               std::span<const std::uint8_t, kProofBytes>(
                                                   reinterpret_cast<const std::uint8_t*>(proof.data()), kProofBytes)))
                     why = "authentication failed (its --secret-file differs from ours?)";
                   if (!why.empty()) {
                     log::error("refused peer ", peer, " from ", from, ": ", why);
                     {
                       std::lock_guard lock(mutex);
                       last_refusal = str("refused peer ", peer, " from ", from, ": ", why);
                     }
                     boost::system::error_code ignore;
                     socket->close(ignore);
                     return;
                   }
                   timer->cancel();
                   links.at(peer)->auth = std::make_unique<FrameAuthenticator>(*options.secret, context, Role::kAcceptor);
                   established(*links.at(peer), std::move(*socket));
                 });
    });
  }
};

Network::Network(NetworkOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = std::move(options);
  const int self = m.options.self;
  PEERTRAIN_CHECK(self >= 0 && self < static_cast<int>(m.options.endpoints.size()), "self ", self, " of ",
                  m.options.endpoints.size(), " endpoints");
  for (int peer : m.options.links) {
    auto l = std::make_unique<Link>(m.io);
    l->peer = peer;
    l->name = m.name_of(peer);
    if (m.options.shaping) l->shaping = m.options.shaping(peer);
    m.links.emplace(peer, std::move(l));
  }
  const Endpoint& me = m.options.endpoints[self];
  try {
    tcp::endpoint bind_to(tcp::v4(), static_cast<unsigned short>(me.port));
    m.acceptor.open(bind_to.protocol());
    m.acceptor.set_option(tcp::acceptor::reuse_address(true));
    m.acceptor.bind(bind_to);
    m.acceptor.listen();
  } catch (const boost::system::system_error& e) {
    throw Error(ErrorKind::kIo, str("peer ", self, " cannot listen on port ", me.port, ": ", e.code().message()));
  }
  m.accept_next();
  m.thread = std::thread([&m] {
    try {
      m.io.run();
    } catch (const std::exception& e) {
      log::error("the I/O thread stopped: ", e.what());
    }
  });
}

Network::~Network() {
  // Only an explicit close() says goodbye: a Network destroyed by an exception must look
  // to its neighbours like the failure it is, not like a clean finish.
  bool clean;
  {
    std::lock_guard lock(impl_->mutex);
    clean = impl_->closed;
  }
  if (!clean) {
    try {
      abort();
    } catch (...) {
    }
  }
  impl_->work.reset();
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void Network::connect() {
  Impl& m = *impl_;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(m.options.connect_timeout_s));
  asio::post(m.io, [&m, deadline] {
    for (auto& [peer, link] : m.links)
      if (peer > m.options.self || m.options.rejoin) m.dial(*link, deadline);
  });
  std::unique_lock lock(m.mutex);
  auto all_connected = [&] {
    for (auto& [peer, link] : m.links)
      if (!link->connected) return false;
    return true;
  };
  m.changed.wait_until(lock, deadline, [&] { return !m.fatal.empty() || all_connected(); });
  if (!m.fatal.empty()) throw Error(ErrorKind::kPeerLost, str("peer ", m.options.self, ": ", m.fatal));
  if (!all_connected()) {
    std::string missing;
    for (auto& [peer, link] : m.links)
      if (!link->connected) missing += (missing.empty() ? "" : ", ") + link->name;
    throw Error(ErrorKind::kTimeout, str("peer ", m.options.self, " could not connect to ", missing, " within ",
                                         m.options.connect_timeout_s, " s",
                                         m.last_refusal.empty() ? "" : " (last problem: " + m.last_refusal + ")"));
  }
}

SendHandle Network::send(int peer, MessageType type, std::uint64_t step, std::uint32_t tag,
                         std::span<const std::byte> payload, bool shaped) {
  Impl& m = *impl_;
  Link& l = m.link(peer);
  PEERTRAIN_CHECK(payload.size() <= m.options.max_payload_bytes, "payload of ", payload.size(), " bytes exceeds ",
                  m.options.max_payload_bytes);
  Outgoing out = m.make_frame(type, step, tag, payload, shaped, l.name, m.options.secret.has_value());
  out.ready_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(l.shaping.latency_ms / 1000.0));
  SendHandle handle;
  handle.state_ = out.state;
  handle.timeout_s_ = m.options.peer_timeout_s;
  asio::post(m.io, [&m, &l, out = std::move(out)]() mutable { m.enqueue(l, std::move(out)); });
  return handle;
}

Payload Network::receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag) {
  return receive(peer, type, step, tag, impl_->options.peer_timeout_s);
}

double Network::peer_timeout_s() const { return impl_->options.peer_timeout_s; }

Payload Network::receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag, double timeout_s) {
  Impl& m = *impl_;
  Link& l = m.link(peer);
  const auto key = std::make_tuple(peer, static_cast<int>(type), step, tag);
  timeout_s = std::min(timeout_s, m.options.peer_timeout_s);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::unique_lock lock(m.mutex);
  while (true) {
    if (auto it = m.mailbox.find(key); it != m.mailbox.end()) {
      Payload payload = std::move(it->second);
      m.mailbox.erase(it);
      return payload;
    }
    const std::string waiting = str(to_string(type), " for step ", step, tag ? str(" (part ", tag, ")") : "");
    if (l.dead) throw Error(ErrorKind::kPeerLost, str(l.death, "; peer ", m.options.self, " was waiting for ", waiting));
    if (l.left)
      throw Error(ErrorKind::kPeerLost, str(l.name, " finished and left before sending ", waiting));
    if (m.changed.wait_until(lock, deadline) == std::cv_status::timeout &&
        m.mailbox.find(key) == m.mailbox.end())
      throw Error(ErrorKind::kTimeout, str(l.name, " sent no ", waiting, " within ", timeout_s, " s",
                                           timeout_s < m.options.peer_timeout_s ? " (adaptive deadline)" : " (--peer-timeout)",
                                           "; peer ", m.options.self, " gives up"));
  }
}

std::optional<Payload> Network::try_receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag) {
  Impl& m = *impl_;
  Link& l = m.link(peer);
  std::lock_guard lock(m.mutex);
  if (auto it = m.mailbox.find(std::make_tuple(peer, static_cast<int>(type), step, tag)); it != m.mailbox.end()) {
    Payload payload = std::move(it->second);
    m.mailbox.erase(it);
    return payload;
  }
  // A peer that finished cleanly is not lost: it simply has nothing more to say.
  if (l.dead && !l.left) throw Error(ErrorKind::kPeerLost, l.death);
  return std::nullopt;
}

void Network::drop(int peer, const std::string& why) {
  Impl& m = *impl_;
  Link& l = m.link(peer);
  auto done = std::make_shared<std::promise<void>>();
  asio::post(m.io, [&m, &l, why, done] {
    {
      std::lock_guard lock(m.mutex);
      if (!l.dead) {
        l.dead = true;
        l.death = why;
      }
      l.dropped = true;
      for (auto it = m.mailbox.begin(); it != m.mailbox.end();)  // nothing more is read from it
        it = std::get<0>(it->first) == l.peer ? m.mailbox.erase(it) : std::next(it);
    }
    boost::system::error_code ignored;
    l.socket.close(ignored);
    l.timer.cancel();
    for (Outgoing& out : l.queue) out.state->finish(why);
    l.queue.clear();
    l.writing = false;
    m.changed.notify_all();
    done->set_value();
  });
  done->get_future().wait_for(std::chrono::seconds(5));
}

double Network::silence_s(int peer) const {
  std::lock_guard lock(impl_->mutex);
  return std::chrono::duration<double>(Clock::now() - impl_->link(peer).last_heard).count();
}

void Network::readmit(int peer) {
  std::lock_guard lock(impl_->mutex);
  impl_->link(peer).dropped = false;
}

int Network::rejoins(int peer) const {
  std::lock_guard lock(impl_->mutex);
  return impl_->link(peer).rejoins;
}

bool Network::alive(int peer) const {
  std::lock_guard lock(impl_->mutex);
  const Link& l = impl_->link(peer);
  return l.connected && !l.dead && !l.left;
}

void Network::close() {
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.mutex);
    if (m.closed) return;
  }
  std::vector<SendHandle> goodbyes;
  for (auto& [peer, link] : m.links) {
    bool live;
    {
      std::lock_guard lock(m.mutex);
      live = link->connected && !link->dead;
    }
    if (live) goodbyes.push_back(send(peer, MessageType::kGoodbye, 0, 0, {}, false));
  }
  for (auto& g : goodbyes) {
    try {
      g.wait();
    } catch (const Error&) {
    }
  }
  m.stop_links([](Link& link, boost::system::error_code& ignored) {
    link.socket.shutdown(tcp::socket::shutdown_send, ignored);  // FIN after what is queued
    link.timer.cancel();
    if (link.heartbeat) link.heartbeat->cancel();
  });
}

void Network::abort() {
  impl_->stop_links([](Link& link, boost::system::error_code& ignored) {
    link.socket.set_option(asio::socket_base::linger(true, 0), ignored);  // RST, not FIN
    link.socket.close(ignored);
  });
}

void Network::recycle(Payload payload) {
  constexpr std::size_t kPoolLimit = 16;
  std::lock_guard lock(impl_->mutex);
  if (impl_->pool.size() < kPoolLimit && payload.capacity() > 0) impl_->pool.push_back(std::move(payload));
}

int Network::self() const { return impl_->options.self; }
const std::vector<int>& Network::links() const { return impl_->options.links; }

LinkCounters Network::counters(int peer) const {
  std::lock_guard lock(impl_->mutex);
  return impl_->link(peer).counters;
}

LinkCounters Network::total_counters() const {
  std::lock_guard lock(impl_->mutex);
  LinkCounters total;
  for (auto& [peer, link] : impl_->links) {
    total.bytes_sent += link->counters.bytes_sent;
    total.bytes_received += link->counters.bytes_received;
    total.messages_sent += link->counters.messages_sent;
    total.messages_received += link->counters.messages_received;
  }
  return total;
}

std::string Network::peer_name(int peer) const { return impl_->name_of(peer); }

}  // namespace peertrain::net
