// The TCP transport's connections: dialing with retries, accepting strangers within
// bounds, and the handshake's I/O (its decisions are handshake.cpp's pure functions).
#include <cerrno>
#include <cstring>

#include "peertrain/core/error.h"
#include "peertrain/core/log.h"
#include "peertrain/net/host.h"
#include "tcp_link.h"

namespace peertrain::net {
namespace {

Clock::duration seconds(double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); }

// A timer that closes a socket whose handshake has not finished in time: a silent
// stranger, or a peer that stopped mid-handshake, does not hold a socket forever.
std::shared_ptr<asio::steady_timer> handshake_timer(asio::io_context& io, std::shared_ptr<tcp::socket> socket) {
  auto timer = std::make_shared<asio::steady_timer>(io, seconds(kHandshakeTimeoutS));
  timer->async_wait([socket](boost::system::error_code ec) {
    if (!ec) {
      boost::system::error_code ignore;
      socket->close(ignore);
    }
  });
  return timer;
}

// Reads one whole frame on a socket that is not yet a link (the handshake).
template <typename Done>
void read_frame(std::shared_ptr<tcp::socket> socket, std::uint32_t sender, std::uint64_t max_payload, const std::string& name,
                Done done) {
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

// Writes a handshake frame (checksummed, never authenticated) and calls done(ec).
template <typename Done>
void write_frame(TcpCore& core, tcp::socket& socket, MessageType type, Payload payload, const std::string& to, Done done) {
  auto frame = std::make_shared<Outgoing>(core.make_frame(type, 0, 0, std::move(payload), false, to));
  std::array<asio::const_buffer, 2> buffers = {asio::buffer(frame->header),
                                               asio::buffer(frame->payload.bytes().data(), frame->payload.bytes().size())};
  asio::async_write(socket, buffers, [frame, done](boost::system::error_code ec, std::size_t) { done(ec); });
}

}  // namespace

// --- dialing -------------------------------------------------------------------------

void TcpCore::dial_all(Clock::time_point deadline) {
  for (auto& [peer, link] : links)
    if (peer > options.self || options.rejoin) dial(*link, deadline);
}

void TcpCore::refuse_fatally(const std::string& why) {
  {
    std::lock_guard lock(mutex);
    if (fatal.empty()) fatal = why;
  }
  changed.notify_all();
}

void TcpCore::dial(Link& l, Clock::time_point deadline) {
  auto socket = std::make_shared<tcp::socket>(io);
  auto resolver = std::make_shared<tcp::resolver>(io);
  const Endpoint& e = options.endpoints.at(static_cast<std::size_t>(l.peer));
  resolver->async_resolve(e.host, std::to_string(e.port), [this, &l, deadline, socket, resolver](
                                                             boost::system::error_code ec, tcp::resolver::results_type results) {
    if (ec) return retry_dial(l, deadline, str("cannot resolve: ", ec.message()));
    asio::async_connect(*socket, results, [this, &l, deadline, socket](boost::system::error_code ec2, const tcp::endpoint&) {
      {
        std::lock_guard lock(mutex);
        if (ec2 != asio::error::connection_refused) l.refused_since.reset();
        else if (!l.refused_since) l.refused_since = Clock::now();
      }
      if (ec2) return retry_dial(l, deadline, ec2.message());
      send_hello(l, deadline, socket);
    });
  });
}

void TcpCore::retry_dial(Link& l, Clock::time_point deadline, const std::string& why) {
  {
    std::lock_guard lock(mutex);
    if (closed || l.dead) return;  // dead before connecting: a rejoin counted it gone
    last_refusal = str("could not reach ", l.name, ": ", why);  // connect() names the latest problem
    if (Clock::now() >= deadline) {
      changed.notify_all();
      return;
    }
  }
  auto timer = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(100));
  timer->async_wait([this, &l, deadline, timer](boost::system::error_code ec) {
    if (!ec) dial(l, deadline);
  });
}

void TcpCore::send_hello(Link& l, Clock::time_point deadline, std::shared_ptr<tcp::socket> socket) {
  handshake::Hello hello{kProtocolVersion, static_cast<std::uint32_t>(options.self), static_cast<std::uint32_t>(l.peer),
                         options.fingerprint, options.run_id};
  if (options.secret) {
    hello.flags = handshake::kFlagAuthenticated;
    hello.nonce = random_nonce();
  }
  if (options.rejoin) hello.flags |= handshake::kFlagRejoin;
  // The dialer's side of the handshake is bounded too: a peer that accepts the connection
  // and then says nothing (stopped, overloaded) costs one time-out, then a fresh try.
  auto timer = handshake_timer(io, socket);
  write_frame(*this, *socket, MessageType::kHello, handshake::encode_hello(hello), l.name,
              [this, &l, deadline, socket, hello, timer](boost::system::error_code ec) {
                if (ec) return retry_dial(l, deadline, ec.message());
                read_frame(socket, static_cast<std::uint32_t>(l.peer), handshake::kMaxReplyBytes, l.name,
                           [this, &l, deadline, socket, hello, timer](const std::string& error, FrameHeader h, Payload bytes) {
                             if (!error.empty())
                               return retry_dial(l, deadline, str("handshake with ", l.name, ": ", error));
                             if (h.type != MessageType::kHelloReply)
                               return refuse_fatally(str(l.name, " answered the handshake with a ", to_string(h.type), " frame"));
                             handshake::Reply reply;
                             try {
                               reply = handshake::decode_reply(bytes, l.name);
                             } catch (const Error& e) {
                               return refuse_fatally(e.what());
                             }
                             if (reply.status == handshake::ReplyStatus::kRetry) {  // it has not dropped our old self yet
                               timer->cancel();
                               boost::system::error_code ignore;
                               socket->close(ignore);
                               return retry_dial(l, deadline, str(l.name, " answered: ", reply.reason));
                             }
                             if (reply.status == handshake::ReplyStatus::kRefused) {
                               log::error(l.name, " refused us: ", reply.reason);
                               return refuse_fatally(str(l.name, " refused the connection: ", reply.reason));
                             }
                             if (!options.secret) {
                               timer->cancel();
                               return established(l, std::move(*socket));
                             }
                             prove_as_dialer(l, deadline, socket, hello, reply, timer);
                           });
              });
}

// The acceptor proved it holds the key; now we prove it, then the link is authenticated.
void TcpCore::prove_as_dialer(Link& l, Clock::time_point deadline, std::shared_ptr<tcp::socket> socket,
                              const handshake::Hello& hello, const handshake::Reply& reply,
                              std::shared_ptr<asio::steady_timer> timer) {
  if (!reply.authenticated)
    return refuse_fatally(str(l.name, " answered without authentication; it was not started with --secret-file"));
  HandshakeContext context{static_cast<std::uint32_t>(options.self), static_cast<std::uint32_t>(l.peer), hello.nonce,
                           reply.acceptor_nonce, options.fingerprint, options.run_id};
  if (!verify_handshake_proof(*options.secret, Role::kAcceptor, context, reply.proof))
    return refuse_fatally(str(l.name, " failed authentication: its proof does not match our --secret-file (do both "
                                      "peers use the same key?)"));
  const Proof mine = handshake_proof(*options.secret, Role::kDialer, context);
  Payload proof(kProofBytes);
  std::memcpy(proof.data(), mine.data(), kProofBytes);
  write_frame(*this, *socket, MessageType::kHelloProof, std::move(proof), l.name,
              [this, &l, deadline, socket, context, timer](boost::system::error_code ec) {
                if (ec) return retry_dial(l, deadline, str("sending our proof to ", l.name, " failed: ", ec.message()));
                timer->cancel();
                l.auth = std::make_unique<FrameAuthenticator>(*options.secret, context, Role::kDialer);
                established(l, std::move(*socket));
              });
}

// --- accepting -----------------------------------------------------------------------

void TcpCore::listen() {
  const Endpoint& me = options.endpoints[static_cast<std::size_t>(options.self)];
  // The topology's address, not every interface: a peer the file puts on 127.0.0.1 is
  // not reachable from the network (net/host.h says which address a name means).
  const std::string address = listen_address(me.host);
  try {
    boost::system::error_code bad;
    const auto ip = boost::asio::ip::make_address_v4(address, bad);
    if (bad)
      throw Error(ErrorKind::kIo, str("peer ", options.self, " cannot listen on ", me.host, ":", me.port, ": '",
                                      me.host, "' names no IPv4 address of this machine"));
    tcp::endpoint bind_to(ip, static_cast<unsigned short>(me.port));
    acceptor.open(bind_to.protocol());
    acceptor.set_option(tcp::acceptor::reuse_address(true));
    acceptor.bind(bind_to);
    acceptor.listen();
  } catch (const boost::system::system_error& e) {
    throw Error(ErrorKind::kIo, str("peer ", options.self, " cannot listen on ", address, ":", me.port, " (", me.host,
                                    "): ", e.code().message()));
  }
  accept_next();
}

void TcpCore::accept_next() {
  auto socket = std::make_shared<tcp::socket>(io);
  acceptor.async_accept(*socket, [this, socket](boost::system::error_code ec) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      {
        std::lock_guard lock(mutex);
        if (closed) return;
      }
      // Out of descriptors (or buffers): the pending connection stays in the backlog and
      // the next accept would fail at once, so wait, doubling up to a second, instead of
      // spinning on the thread that carries the training traffic.
      const bool exhausted = ec.value() == EMFILE || ec.value() == ENFILE || ec.value() == ENOBUFS || ec.value() == ENOMEM;
      accept_backoff_s = exhausted ? std::clamp(accept_backoff_s * 2, 0.01, 1.0) : 0.01;
      long long held = 0;
      if (accept_line.ready(held))
        log::warn("accepting a connection failed: ", ec.message(), held ? str(" (and ", held, " more times)") : "",
                  "; retrying in ", accept_backoff_s, " s");
      auto timer = std::make_shared<asio::steady_timer>(io, seconds(accept_backoff_s));
      timer->async_wait([this, timer](boost::system::error_code ec2) {
        if (!ec2) accept_next();
      });
      return;
    }
    accept_backoff_s = 0;
    accept_next();
    boost::system::error_code ignored;
    const auto remote = socket->remote_endpoint(ignored);
    const std::string address = remote.address().to_string();
    const std::string from = str(address, ":", remote.port());
    std::string why;
    if (!admission.admit(address, why)) {
      socket->close(ignored);
      long long held = 0;
      if (stranger_line.ready(held))
        log::warn("refused strangers: ", why, " (", kMaxPendingHandshakes, " in all, ", kMaxPendingPerAddress,
                  " per address); ", held + 1, " connection", held ? "s" : "", " refused since the last such line, ",
                  admission.refused(), " in all");
      return;
    }
    // The slot is given back when the last handler of this handshake is done with it.
    std::shared_ptr<void> slot(nullptr, [this, address](void*) { admission.release(address); });
    handshake(socket, slot, from);
  });
}

void TcpCore::handshake(std::shared_ptr<tcp::socket> socket, std::shared_ptr<void> slot, const std::string& from) {
  auto timer = handshake_timer(io, socket);
  // The sender is unknown until the header is read; peek at it, then check it properly.
  auto header = std::make_shared<HeaderBytes>();
  asio::async_read(*socket, asio::buffer(*header), [this, socket, header, from, timer, slot](boost::system::error_code ec,
                                                                                            std::size_t) {
    if (ec) return;
    std::uint32_t claimed = 0;
    std::memcpy(&claimed, header->data() + 8, 4);
    FrameExpectations expect{claimed, handshake::kHelloBytes, str("a peer at ", from)};
    FrameHeader h;
    try {
      h = decode_header(*header, expect);
      if (h.type != MessageType::kHello || h.length != handshake::kHelloBytes)
        throw Error(ErrorKind::kPeerLost, str("expected a hello frame from ", from, ", got ", to_string(h.type)));
    } catch (const Error& e) {
      long long held = 0;
      if (stranger_line.ready(held))
        log::warn("refused a connection: ", e.what(), held ? str(" (", held, " more refusals since the last line)") : "");
      boost::system::error_code ignore;
      socket->close(ignore);
      return;
    }
    auto payload = std::make_shared<Payload>(handshake::kHelloBytes);
    asio::async_read(*socket, asio::buffer(*payload), [this, socket, h, payload, expect, from, timer, slot](
                                                          boost::system::error_code ec2, std::size_t) {
      if (ec2) return;
      handshake::Hello hello;
      try {
        verify_checksum(h, *payload, expect);
        hello = handshake::decode_hello(*payload, from);
      } catch (const Error& e) {
        log::warn("refused a connection: ", e.what());
        boost::system::error_code ignore;
        socket->close(ignore);
        return;
      }
      answer_hello(socket, hello, from, timer, slot);
    });
  });
}

handshake::Verdict TcpCore::admit_hello(const handshake::Hello& hello) {
  const auto it = links.find(static_cast<int>(hello.peer));
  handshake::LinkView view;
  if (it != links.end()) {
    const Link& l = *it->second;
    view = {true, l.connected, l.dead, l.left, l.dropped};
  }
  return handshake::check_hello(hello, {static_cast<std::uint32_t>(options.self), options.fingerprint, options.run_id,
                                        options.secret.has_value()},
                                view);
}

void TcpCore::answer_hello(std::shared_ptr<tcp::socket> socket, const handshake::Hello& hello, const std::string& from,
                           std::shared_ptr<asio::steady_timer> timer, std::shared_ptr<void> slot) {
  handshake::Verdict verdict;
  {
    std::lock_guard lock(mutex);
    verdict = admit_hello(hello);
  }
  if (verdict.status == handshake::ReplyStatus::kRetry) {
    log::debug("peer ", hello.peer, " from ", from, " asks to rejoin: ", verdict.reason, "; it will retry");
  } else if (!verdict.accepted()) {
    log::error("refused peer ", hello.peer, " from ", from, ": ", verdict.reason);
    std::lock_guard lock(mutex);
    last_refusal = str("refused peer ", hello.peer, " from ", from, ": ", verdict.reason);
  }
  const bool authenticate = verdict.accepted() && options.secret.has_value();
  HandshakeContext context{hello.peer, static_cast<std::uint32_t>(options.self), hello.nonce, {}, options.fingerprint,
                           options.run_id};
  handshake::Reply reply{verdict.status, verdict.reason};
  if (authenticate) {
    reply.authenticated = true;
    context.acceptor_nonce = reply.acceptor_nonce = random_nonce();
    reply.proof = handshake_proof(*options.secret, Role::kAcceptor, context);
  }
  const int peer = static_cast<int>(hello.peer);
  const bool accepted = verdict.accepted();
  // Checked again under the lock just before the link is made: the reply (and the proof)
  // took a round trip, during which another connection may have claimed this peer.
  auto establish = [this, socket, hello, from, timer, peer](std::unique_ptr<FrameAuthenticator> auth) {
    handshake::Verdict again;
    {
      std::lock_guard lock(mutex);
      again = admit_hello(hello);
    }
    boost::system::error_code ignore;
    if (!again.accepted()) {
      log::error("refused peer ", peer, " from ", from, " after its handshake: ", again.reason);
      socket->close(ignore);
      return;
    }
    timer->cancel();
    Link& l = *links.at(peer);
    if (auth) l.auth = std::move(auth);
    established(l, std::move(*socket));
  };
  write_frame(*this, *socket, MessageType::kHelloReply, handshake::encode_reply(reply), from,
              [this, socket, peer, accepted, authenticate, context, from, timer, slot, establish](boost::system::error_code ec) {
                if (ec || !accepted) {
                  boost::system::error_code ignore;
                  socket->close(ignore);
                  return;
                }
                if (!authenticate) return establish(nullptr);
                // The dialer must now prove it holds the key too; the handshake timer still runs.
                read_frame(socket, static_cast<std::uint32_t>(peer), kProofBytes, str("peer ", peer, " at ", from),
                           [this, socket, peer, context, from, slot, establish](const std::string& error, FrameHeader h,
                                                                                Payload proof) {
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
                             establish(std::make_unique<FrameAuthenticator>(*options.secret, context, Role::kAcceptor));
                           });
              });
}

}  // namespace peertrain::net
