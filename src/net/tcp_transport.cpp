// The TCP transport: reading and writing frames on established links, failing links, and
// the Transport interface over them. Dialing, accepting and the handshake are in
// tcp_connect.cpp; the handshake's decisions in handshake.cpp.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstring>
#include <future>
#include <set>

#include "peertrain/core/error.h"
#include "peertrain/core/log.h"
#include "peertrain/net/host.h"
#include "tcp_link.h"

namespace peertrain::net {

namespace {
// The frames that set up a link's shared memory: not the caller's traffic.
bool transport_own(MessageType type) { return type == MessageType::kRingOffer || type == MessageType::kRingAccept; }
}  // namespace

bool TcpCore::mark_lost(Link& l, const std::string& why) {
  if (l.dead) return false;
  l.dead = true;
  l.death = why;
  lost_order.push_back(l.peer);
  return true;
}

const Link* TcpCore::first_lost() const {
  for (int peer : lost_order) {
    const Link& l = *links.at(peer);
    if (l.dead && !l.left) return &l;
  }
  return nullptr;
}

Link& TcpCore::link(int peer) {
  auto it = links.find(peer);
  if (it == links.end())
    throw Error(ErrorKind::kInvalidArgument, str("peer ", options.self, " has no link to peer ", peer));
  return *it->second;
}

std::string TcpCore::name_of(int peer) const {
  const Endpoint& e = options.endpoints.at(static_cast<std::size_t>(peer));
  return str("peer ", peer, " (", e.host, ":", e.port, ")");
}

// --- failure -------------------------------------------------------------------------

// Closes the link's socket on the I/O thread; the caller does not hold the mutex.
void TcpCore::close_socket(Link& l) {
  {
    std::lock_guard lock(mutex);
    l.fd = -1;
  }
  boost::system::error_code ignored;
  l.socket.close(ignored);
}

void TcpCore::fail_link(Link& l, const std::string& why) {
  bool already_dead = false;
  std::string death;
  {
    std::lock_guard lock(mutex);
    already_dead = !mark_lost(l, why);
    death = l.death;
  }
  const auto lost = std::make_exception_ptr(Error(ErrorKind::kPeerLost, death));
  if (already_dead) {
    // A link that died quietly (the peer said goodbye and closed) may still hold queued
    // sends; end them now, or each wait() on them would run to its time-out. A write still
    // in flight keeps its frame: its completion handler pops it.
    auto first = l.queue.begin();
    if (l.writing && first != l.queue.end()) ++first;
    for (auto it = first; it != l.queue.end(); ++it) it->state->complete(lost);
    l.queue.erase(first, l.queue.end());
    forget_rings(l);
    changed.notify_all();
    return;
  }
  if (!closed) log::error(why);
  // Closing the socket on this thread ends every read and write of it: the reactor touches
  // a write's buffers only on this thread, so the queue's bytes are free once it is closed.
  close_socket(l);
  forget_rings(l);
  l.timer.cancel();
  l.read_timer.cancel();
  if (l.heartbeat) l.heartbeat->cancel();
  for (Outgoing& out : l.queue) out.state->complete(lost);
  l.queue.clear();
  l.writing = false;
  changed.notify_all();
}

// Marks the transport closed, then, on the I/O thread, closes the acceptor and applies
// `how` to every link; waits (at most 5 s) for that to have happened.
void TcpCore::stop_links(void (*how)(Link&, boost::system::error_code&)) {
  {
    std::lock_guard lock(mutex);
    closed = true;
  }
  auto done = std::make_shared<std::promise<void>>();
  asio::post(io, [this, how, done] {
    boost::system::error_code ignored;
    acceptor.close(ignored);
    {
      std::lock_guard lock(mutex);  // no report reads a descriptor `how` may close
      for (auto& [peer, link] : links) link->fd = -1;
    }
    for (auto& [peer, link] : links) how(*link, ignored);
    done->set_value();
  });
  done->get_future().wait_for(std::chrono::seconds(5));
}

// --- reading -------------------------------------------------------------------------

void TcpCore::start_read(Link& l) {
  const std::uint64_t generation = l.generation;
  asio::async_read(l.socket, asio::buffer(l.header_in), [this, &l, generation](boost::system::error_code ec, std::size_t) {
    if (generation != l.generation) return;
    if (ec) return read_failed(l, ec);
    try {
      l.pending = decode_header(l.header_in, {.sender = static_cast<std::uint32_t>(l.peer),
                                              .max_payload = options.max_payload_bytes,
                                              .peer_name = l.name,
                                              .shared_allowed = true});
    } catch (const Error& e) {
      return fail_link(l, e.what());
    }
    {
      std::lock_guard lock(mutex);
      if (l.payload_in.capacity() < l.pending.length) l.payload_in = mailbox.reuse(l.pending.length);
    }
    l.payload_in.resize(l.pending.length);  // bounded by decode_header's length check
    const MessageType type = l.pending.type;
    if (l.pending.shared) {
      // Only the caller's payloads of kSharedMinBytes and more ever go through a ring.
      const char* wrong = !l.ring_in                                                  ? "but the link has no ring"
                          : transport_own(type) || l.pending.length < kSharedMinBytes ? "which no sender puts there"
                                                                                      : nullptr;
      l.ring_in_offset = wrong ? -1 : l.ring_in->next(l.pending.length);
      if (l.ring_in_offset < 0)
        return fail_link(l, str("bad frame from ", l.name, ": a ", to_string(type), " frame for step ", l.pending.step,
                                " puts its ", l.pending.length, " bytes in shared memory, ",
                                wrong ? wrong : "more than the link's ring holds", "; closing the link"));
    }
    const bool data =
        type == MessageType::kParameters || type == MessageType::kGradients || type == MessageType::kReduceChunk;
    if (data && options.node_ingress_mbps > 0) return read_payload_shaped(l, generation, 0);
    if (l.pending.shared) {
      const std::span<const std::byte> shared(l.ring_in->data() + l.ring_in_offset, l.payload_in.size());
      if (l.auth) {
        std::memcpy(l.payload_in.data(), shared.data(), shared.size());
        l.ring_in->release();
        return payload_read(l);
      }
      const std::uint64_t sum = copy_and_checksum(shared, l.payload_in.data());
      l.ring_in->release();
      try {
        verify_checksum(l.pending, sum, {static_cast<std::uint32_t>(l.peer), options.max_payload_bytes, l.name});
      } catch (const Error& e) {
        return fail_link(l, e.what());
      }
      return deliver(l);
    }
    asio::async_read(l.socket, asio::buffer(l.payload_in), TransferAll{},
                     [this, &l, generation](boost::system::error_code ec2, std::size_t) {
                       if (generation != l.generation) return;
                       if (ec2) return read_failed(l, ec2);
                       payload_read(l);
                     });
  });
}

// The receiving card's capacity (node_ingress_mbps): the payload of a data frame is read
// in pieces, each once the card every link shares would carry it; meanwhile the
// bytes wait in the socket, and TCP's flow control holds the sender back, as a full card
// would. Control frames (handshake, membership, heartbeats, reports) are read at once,
// like the unshaped sends.
void TcpCore::read_payload_shaped(Link& l, std::uint64_t generation, std::size_t done) {
  if (done == l.payload_in.size()) return payload_read(l);
  const double mbps = options.node_ingress_mbps;
  const std::size_t piece = std::min(shaped_piece(mbps), l.payload_in.size() - done);
  // Cut-through: the sender held the piece for its whole time on its own wire, during which
  // it was also coming in on this card, so the card's reservation starts a piece's time ago
  // and a lone flow crosses both cards in one serialization time, as through a switch;
  // several flows into one card queue on it.
  const auto now = Clock::now();
  const auto due = ingress_wire.reserve(now - WireClock::busy(mbps, piece), mbps, piece);
  if (due <= now) return read_piece(l, generation, done, piece);
  l.read_timer.expires_at(due);
  l.read_timer.async_wait([this, &l, generation, done, piece](boost::system::error_code ec) {
    if (!ec && generation == l.generation) read_piece(l, generation, done, piece);
  });
}

void TcpCore::read_piece(Link& l, std::uint64_t generation, std::size_t done, std::size_t piece) {
  if (l.pending.shared) {  // the piece is in the ring already: the card's wait was its arrival
    if (!l.ring_in) return;  // the link failed while this piece waited for the card
    std::memcpy(l.payload_in.data() + done, l.ring_in->data() + l.ring_in_offset + done, piece);
    if (done + piece == l.payload_in.size()) l.ring_in->release();
    return read_payload_shaped(l, generation, done + piece);
  }
  asio::async_read(l.socket, asio::buffer(l.payload_in.data() + done, piece), TransferAll{},
                   [this, &l, generation, done, piece](boost::system::error_code ec, std::size_t) {
                     if (generation != l.generation) return;
                     if (ec) return read_failed(l, ec);
                     read_payload_shaped(l, generation, done + piece);
                   });
}

void TcpCore::payload_read(Link& l) {
  if (l.auth) {
    if (!l.auth->verify(l.header_in, l.payload_in))
      return fail_link(l,
                       str("bad frame from ", l.name, ": authentication failed on a ", to_string(l.pending.type),
                           " frame for step ", l.pending.step, " (forged, corrupted or replayed); closing the link"));
  } else {
    try {
      verify_checksum(l.pending, l.payload_in, {static_cast<std::uint32_t>(l.peer), options.max_payload_bytes, l.name});
    } catch (const Error& e) {
      return fail_link(l, e.what());
    }
  }
  deliver(l);
}

void TcpCore::read_failed(Link& l, const boost::system::error_code& ec) {
  {
    std::lock_guard lock(mutex);
    if (l.left || closed) {
      l.dead = true;
      l.death = str(l.name, " finished and closed its connection");
      changed.notify_all();
      return;
    }
  }
  fail_link(l, ec == asio::error::eof ? str(l.name, " closed the connection (it exited or crashed)")
                                      : str("lost ", l.name, ": ", ec.message()));
}

void TcpCore::deliver(Link& l) {
  const FrameHeader& h = l.pending;
  bool duplicate = false;
  std::string flood;
  {
    std::lock_guard lock(mutex);
    if (!transport_own(h.type)) {
      l.counters.bytes_received += kHeaderBytes + h.length;
      ++l.counters.messages_received;
    }
    l.last_heard = Clock::now();
    if (h.type == MessageType::kGoodbye) {
      l.left = true;
    } else if (h.type == MessageType::kHeartbeat || transport_own(h.type)) {
      // nothing to deliver: hearing a heartbeat was the point; the rings are the transport's
    } else {
      flood = mailbox.over_limit(l.peer, l.payload_in.size());
      if (flood.empty()) duplicate = !mailbox.put(Mailbox::key(l.peer, h.type, h.step, h.tag), std::move(l.payload_in));
      l.payload_in = Payload();
    }
  }
  if (!flood.empty())
    return fail_link(l, str("bad traffic from ", l.name, ": ", flood, " at its ", to_string(h.type), " for step ",
                            h.step, "; closing the link"));
  if (duplicate)
    return fail_link(l, str("bad frame from ", l.name, ": a second ", to_string(h.type), " for step ", h.step,
                            " (part ", h.tag, "); closing the link"));
  if (h.type == MessageType::kRingOffer || h.type == MessageType::kRingAccept) {
    if (h.type == MessageType::kRingOffer)
      accept_ring(l, l.payload_in);
    else
      ring_accepted(l, l.payload_in);
    std::lock_guard lock(mutex);
    if (l.dead) return;  // a bad offer or answer failed the link
  }
  changed.notify_all();
  start_read(l);
}

// --- writing -------------------------------------------------------------------------

void TcpCore::enqueue(Link& l, Outgoing out) {
  {
    std::lock_guard lock(mutex);
    if (l.dead) {
      out.state->complete(std::make_exception_ptr(Error(ErrorKind::kPeerLost, l.death)));
      return;
    }
  }
  finish_header(l, out);
  // Signed here, on the I/O thread, so that signing order is wire order.
  if (l.auth) l.auth->sign(out.header, out.payload.bytes());
  l.queue.push_back(std::move(out));
  if (!l.writing) write_next(l);
}

void TcpCore::write_next(Link& l) {
  if (l.queue.empty()) {
    l.writing = false;
    return;
  }
  l.writing = true;
  Outgoing& out = l.queue.front();
  const auto payload = out.payload.bytes();
  const double node_mbps = options.node_bandwidth_mbps;
  const bool shaped = out.shaped && (l.shaping.latency_ms > 0 || l.shaping.bandwidth_mbps > 0 || node_mbps > 0);
  const std::uint64_t generation = l.generation;
  const bool shared = out.ring_offset >= 0;
  if (!shaped) {
    std::array<asio::const_buffer, 2> buffers = {asio::buffer(out.header),
                                                 asio::buffer(payload.data(), shared ? 0 : payload.size())};
    asio::async_write(l.socket, buffers, TransferAll{},
                      [this, &l, generation](boost::system::error_code ec, std::size_t) {
                        if (generation != l.generation) return;
                        // The socket was busy with these bytes: a shaped frame queued behind
                        // them was not held by its wire, which owes it no catch-up for that.
                        l.wire.free_at = std::max(l.wire.free_at, Clock::now());
                        wrote(l, ec, true);
                      });
    return;
  }
  const auto now = Clock::now();
  if (now < out.ready_at) {  // one-way latency
    l.timer.expires_at(out.ready_at);
    l.timer.async_wait([this, &l, generation](boost::system::error_code ec) {
      if (!ec && generation == l.generation) write_next(l);  // not a wait from before a rejoin
    });
    return;
  }
  const std::size_t total = kHeaderBytes + payload.size();
  const double link_mbps = l.shaping.bandwidth_mbps;
  // A shared frame holds its wires whole: no byte of it is on the socket to be paced, and
  // its last byte is through when it would have been in pieces.
  const std::size_t piece =
      shared ? total - out.written : std::min(shaped_piece(std::max(link_mbps, node_mbps)), total - out.written);
  // Two wires, the link's and the card's shared by every link: the piece reserves both once
  // and goes when its last byte would be through the slower.
  if (!l.piece_due && (link_mbps > 0 || node_mbps > 0)) {
    Clock::time_point due = now;
    if (link_mbps > 0) due = std::max(due, l.wire.reserve_from(out.ready_at, now, link_mbps, piece));
    if (node_mbps > 0) due = std::max(due, node_wire.reserve_from(out.ready_at, now, node_mbps, piece));
    l.piece_due = due;
  }
  if (l.piece_due && now < *l.piece_due) {
    l.timer.expires_at(*l.piece_due);
    l.timer.async_wait([this, &l, generation](boost::system::error_code ec) {
      if (!ec && generation == l.generation) write_next(l);  // not a wait from before a rejoin
    });
    return;
  }
  l.piece_due.reset();
  if (shared) {
    asio::async_write(l.socket, asio::buffer(out.header), TransferAll{},
                      [this, &l, generation](boost::system::error_code ec, std::size_t) {
                        if (generation != l.generation) return;
                        if (ec) return wrote(l, ec, true);
                        if (l.queue.empty()) return wrote(l, ec, false);  // fail_link ended the frame meanwhile
                        wrote(l, ec, true);
                      });
    return;
  }
  std::vector<asio::const_buffer> buffers;
  std::size_t from = out.written, left = piece;
  if (from < kHeaderBytes) {
    const std::size_t n = std::min(left, kHeaderBytes - from);
    buffers.push_back(asio::buffer(out.header.data() + from, n));
    from += n;
    left -= n;
  }
  if (left > 0) buffers.push_back(asio::buffer(payload.data() + (from - kHeaderBytes), left));
  asio::async_write(l.socket, buffers, TransferAll{},
                    [this, &l, piece, generation](boost::system::error_code ec, std::size_t) {
                      if (generation != l.generation) return;
                      if (ec) return wrote(l, ec, true);
                      if (l.queue.empty()) return wrote(l, ec, false);  // fail_link ended the frame meanwhile
                      Outgoing& o = l.queue.front();
                      o.written += piece;
                      wrote(l, ec, o.written == kHeaderBytes + o.payload.bytes().size());
                    });
}

void TcpCore::wrote(Link& l, const boost::system::error_code& ec, bool frame_done) {
  if (ec) {
    l.writing = false;  // this write is over: fail_link may end its frame with the rest
    {
      // After its goodbye the peer closes: a write that fails then is its finish, not a
      // loss (as read_failed tells them apart); fail_link below only ends the queued sends.
      std::lock_guard lock(mutex);
      if (l.left && !l.dead) {
        l.dead = true;
        l.death = str(l.name, " finished and closed its connection");
      }
    }
    return fail_link(l, str("sending to ", l.name, " failed: ", ec.message()));
  }
  l.last_write = Clock::now();
  if (frame_done && !l.queue.empty()) {  // empty: fail_link already ended this frame
    Outgoing done = std::move(l.queue.front());
    l.queue.pop_front();
    {
      std::lock_guard lock(mutex);
      if (!transport_own(done.fields.type)) {  // the counters are the caller's traffic
        l.counters.bytes_sent += kHeaderBytes + done.payload.bytes().size();
        ++l.counters.messages_sent;
        if (done.ring_offset >= 0) ++l.counters.messages_shared;
      }
    }
    done.state->complete();
  }
  write_next(l);
}

Outgoing TcpCore::make_frame(MessageType type, std::uint64_t step, std::uint32_t tag, SendBuffer payload, bool shaped,
                             const std::string& to, bool authenticated, bool may_share) {
  FrameHeader h;
  h.type = type;
  h.sender = static_cast<std::uint32_t>(options.self);
  h.tag = tag;
  h.step = step;
  h.length = payload.bytes().size();
  Outgoing out;
  // Else the tag replaces the checksum. A large payload's is computed on the I/O thread
  // (finish_header), off the caller's, and while it is copied if it goes through the ring.
  // Only send() passes may_share: the handshake's frames, written directly and never
  // queued, always get theirs here.
  if (!authenticated && may_share && payload.bytes().size() >= kSharedMinBytes) {
    out.sum_pending = true;
  } else if (!authenticated) {
    out.payload_sum = checksum_payload(payload.bytes());
    h.checksum = frame_checksum(h, out.payload_sum);
  }
  out.fields = h;
  out.header = encode_header(h);
  out.payload = std::move(payload);
  out.state = std::make_shared<Work::State>(str("sending ", to_string(type), " for step ", step, " to ", to),
                                            options.peer_timeout_s);
  out.shaped = shaped;
  return out;
}

void TcpCore::established(Link& l, tcp::socket socket) {
  boost::system::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  {
    std::lock_guard lock(mutex);
    if (l.connected) {  // a peer we dropped came back (rejoin): a fresh link
      ++l.generation;
      ++l.rejoins;
      l.dead = l.left = false;  // still `dropped` until the caller readmit()s it
      l.death.clear();
      mailbox.forget(l.peer);  // what the old process sent
      l.queue.clear();
      l.writing = false;
      l.wire = {};
      l.piece_due.reset();
      log::info(l.name, " rejoined: its link is up again");
    }
  }
  {
    boost::system::error_code local_ec, remote_ec;
    const auto local = socket.local_endpoint(local_ec);
    const auto remote = socket.remote_endpoint(remote_ec);
    l.loopback = !local_ec && !remote_ec && local.address().is_loopback() && remote.address().is_loopback();
  }
  l.timer.cancel();
  l.read_timer.cancel();
  close_socket(l);
  l.socket = std::move(socket);
  {
    std::lock_guard lock(mutex);
    l.fd = l.socket.native_handle();
    l.connected = true;
    l.settled = false;  // until the ring exchange is over (tcp_link.h)
    l.last_heard = Clock::now();
  }
  log::debug("connected to ", l.name);
  changed.notify_all();
  start_read(l);
  offer_ring(l);
  l.heartbeat = std::make_unique<asio::steady_timer>(io);
  schedule_heartbeat(l);
}

// --- shared memory (shared_ring.h) ----------------------------------------------------

// Each connection starts on TCP alone. Each side offers the ring its payloads would take,
// or none (not on loopback, shared memory off, or no segment to be had), and answers the
// other's. On every link, not only those this side sees on loopback: behind a relay (a
// container's port forwarding) one end may see loopback and the other not, and each must
// still know what to wait for.
void TcpCore::offer_ring(Link& l) {
  forget_rings(l);  // a rejoined peer's old rings go with its old connection
  l.ring_offer_seen = false;
  if (options.shared_memory && l.loopback) {
    const std::size_t bytes = options.shared_ring_bytes > 0
                                  ? options.shared_ring_bytes
                                  : std::max<std::size_t>(std::size_t{1} << 20, 2 * options.max_payload_bytes);
    try {
      l.ring_out = SharedRing::create(bytes);
    } catch (const Error& e) {
      log::warn("payloads to ", l.name, " stay on TCP: ", e.what());
    }
  }
  l.ring_out_answered = !l.ring_out;  // nobody answers "none"
  const auto offer = (l.ring_out ? l.ring_out->offer() : SharedRing::Offer{}).encode();
  enqueue(l, make_frame(MessageType::kRingOffer, 0, 0, Payload(offer.begin(), offer.end()), false, l.name,
                        options.secret.has_value()));
}

void TcpCore::accept_ring(Link& l, std::span<const std::byte> bytes) {
  SharedRing::Offer offer;
  if (!SharedRing::Offer::decode(bytes, offer) || l.ring_offer_seen)
    return fail_link(
        l, str("bad frame from ", l.name, ": ", l.ring_offer_seen ? "a second ring offer" : "a malformed ring offer",
               " (", bytes.size(), " bytes); closing the link"));
  l.ring_offer_seen = true;
  if (offer.capacity > 0) {  // a ring: map it (it can only be on this host), or decline (nonce 0)
    // Only over loopback can the offer be for this host; elsewhere it would make this
    // process open whatever /proc/PID/fd/FD a remote peer names.
    std::string why = l.loopback ? "--shared-memory off here" : "the link is not over loopback";
    if (options.shared_memory && l.loopback) l.ring_in = SharedRing::open(offer, why);
    if (!l.ring_in) log::info("payloads from ", l.name, " stay on TCP: ", why);
    const std::uint64_t nonce = l.ring_in ? offer.nonce : 0;
    std::array<std::byte, 8> answer{};
    std::memcpy(answer.data(), &nonce, 8);
    enqueue(l, make_frame(MessageType::kRingAccept, 0, 0, Payload(answer.begin(), answer.end()), false, l.name,
                          options.secret.has_value()));
  }
  settle_if_done(l);
}

void TcpCore::ring_accepted(Link& l, std::span<const std::byte> bytes) {
  std::uint64_t nonce = 0;
  if (bytes.size() == 8) std::memcpy(&nonce, bytes.data(), 8);
  const char* wrong = bytes.size() != 8     ? "a malformed answer to a ring offer"
                      : l.ring_out_answered ? "a second answer to a ring offer"
                      : !l.ring_out         ? "an answer to a ring offer this side did not make"
                      : nonce != 0 && nonce != l.ring_out->offer().nonce
                          ? "an answer naming another ring than the one offered"
                          : nullptr;
  if (wrong) return fail_link(l, str("bad frame from ", l.name, ": ", wrong, "; closing the link"));
  l.ring_out_answered = true;
  if (nonce != 0) {
    l.shares = true;
    log::debug("payloads to ", l.name, " go through shared memory (", l.ring_out->capacity(), " bytes)");
  } else {
    l.ring_out.reset();  // declined
  }
  settle_if_done(l);
}

void TcpCore::forget_rings(Link& l) {
  l.shares = false;
  l.ring_out.reset();
  l.ring_in.reset();
}

void TcpCore::settle_if_done(Link& l) {
  if (!l.ring_offer_seen || !l.ring_out_answered) return;
  {
    std::lock_guard lock(mutex);
    l.settled = true;
  }
  changed.notify_all();
}

// The header's last fields, on the I/O thread, in wire order. A large payload goes through
// the ring once the peer mapped it and the ring has room (claims are made here, and the
// receiver mirrors them), copied in now, before its wires hold it; otherwise inline.
void TcpCore::finish_header(Link& l, Outgoing& out) {
  const auto payload = out.payload.bytes();
  if (l.shares.load(std::memory_order_relaxed) && payload.size() >= kSharedMinBytes)
    out.ring_offset = l.ring_out->claim(payload.size());
  if (out.ring_offset < 0 && !out.sum_pending) return;  // as make_frame encoded it
  if (out.ring_offset >= 0) {
    out.fields.shared = true;
    std::byte* to = l.ring_out->data() + out.ring_offset;
    if (options.secret)
      std::memcpy(to, payload.data(), payload.size());
    else
      out.payload_sum = copy_and_checksum(payload, to);
  } else {
    out.payload_sum = checksum_payload(payload);
  }
  if (!options.secret) out.fields.checksum = frame_checksum(out.fields, out.payload_sum);
  out.header = encode_header(out.fields);
}

void TcpCore::schedule_heartbeat(Link& l) {
  l.heartbeat->expires_after(std::chrono::seconds(1));
  l.heartbeat->async_wait([this, &l](boost::system::error_code ec) {
    if (ec) return;
    {
      std::lock_guard lock(mutex);
      if (closed || l.dead || l.left) return;
    }
    if (!l.writing && l.queue.empty() && Clock::now() - l.last_write > std::chrono::milliseconds(900))
      enqueue(l, make_frame(MessageType::kHeartbeat, 0, 0, {}, false, l.name, options.secret.has_value()));
    schedule_heartbeat(l);
  });
}

// --- the Transport -------------------------------------------------------------------

namespace {

// The kernel's view of a link (TCP_INFO), for the errors that give up on a peer: a peer
// that stopped answering shows its acknowledgements still coming; a cable that is out, or
// one that came back while TCP's retransmission timer backs off (0.2, 0.6, 1.4, 3.0 s …),
// shows data unacknowledged, the backoff and the timer.
// The caller holds the core's mutex, under which l.fd is the open descriptor or -1.
std::string tcp_report(const Link& l) {
  if (l.fd < 0) return {};
  tcp_info info{};
  socklen_t size = sizeof info;
  if (getsockopt(l.fd, IPPROTO_TCP, TCP_INFO, &info, &size) != 0) return {};
  char text[320];
  std::snprintf(text, sizeof text,
                " (TCP to %s: last data from it %.1f s ago, last acknowledgement %.1f s ago, last data to it %.1f s "
                "ago; unacknowledged segments %u, resent in a row %u, retransmission timer %.2f s after %u "
                "backoffs, round trip %.1f ± %.1f ms)",
                l.name.c_str(), info.tcpi_last_data_recv / 1e3, info.tcpi_last_ack_recv / 1e3,
                info.tcpi_last_data_sent / 1e3, info.tcpi_unacked, static_cast<unsigned>(info.tcpi_retransmits),
                info.tcpi_rto / 1e6, static_cast<unsigned>(info.tcpi_backoff), info.tcpi_rtt / 1e3,
                info.tcpi_rttvar / 1e3);
  return text;
}

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(TcpOptions options) : core_(std::make_shared<TcpCore>(std::move(options))) {
    TcpCore& m = *core_;
    const int self = m.options.self;
    PEERTRAIN_CHECK(self >= 0 && self < static_cast<int>(m.options.endpoints.size()), "self ", self, " of ",
                    m.options.endpoints.size(), " endpoints");
    const std::size_t largest = static_cast<std::size_t>(m.options.max_payload_bytes);
    m.mailbox.set_limits({.bytes_per_sender = m.options.max_unread_bytes > 0 ? m.options.max_unread_bytes
                                                                             : 16 * largest + (std::size_t{64} << 20),
                          .messages_per_sender =
                              m.options.max_unread_messages > 0 ? m.options.max_unread_messages : std::size_t{65536}});
    for (int peer : m.options.links) {
      auto l = std::make_unique<Link>(m.io);
      l->peer = peer;
      l->name = m.name_of(peer);
      if (m.options.shaping) l->shaping = m.options.shaping(peer);
      m.links.emplace(peer, std::move(l));
    }
    const Endpoint& me = m.options.endpoints[static_cast<std::size_t>(self)];
    if (!m.options.secret && !loopback_only(me.host))
      log::warn("peer ", self, " listens on ", me.host, ":", me.port,
                " without --secret-file: anyone who reaches that "
                "address can dial in, and the frames are not authenticated. Give every peer the same key "
                "(peertrain keygen KEY, then --secret-file KEY) for a run across machines (docs/net.md)");
    m.listen();
    m.thread = std::thread([&m] {
      try {
        m.io.run();
      } catch (const std::exception& e) {
        log::error("the I/O thread stopped: ", e.what());
      }
      m.io_running = false;
    });
  }

  ~TcpTransport() override {
    TcpCore& m = *core_;
    // Only an explicit close() says goodbye: a transport destroyed by an exception must
    // look to its neighbours like the failure it is, not like a clean finish.
    bool clean;
    {
      std::lock_guard lock(m.mutex);
      clean = m.closed;
    }
    if (!clean) {
      try {
        abort();
      } catch (...) {
      }
    }
    m.work.reset();
    m.io.stop();
    if (m.thread.joinable()) m.thread.join();
    // Sends nobody will write any more: end them, so their Works do not wait out a time-out.
    const auto gone = std::make_exception_ptr(Error(ErrorKind::kPeerLost, "the transport was closed"));
    for (auto& [peer, link] : m.links)
      for (Outgoing& out : link->queue) out.state->complete(gone);
  }

  void connect() override {
    TcpCore& m = *core_;
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(m.options.connect_timeout_s));
    asio::post(m.io, [&m, deadline] { m.dial_all(deadline); });
    std::unique_lock lock(m.mutex);
    // Connected, and the ring exchange over (tcp_link.h), or already lost (its wait says so).
    auto ready = [](const Link& l) { return l.connected && (l.settled || l.dead); };
    auto all_connected = [&] {
      for (auto& [peer, link] : m.links)
        if (!ready(*link)) return false;
      return true;
    };
    // A rejoining peer does not wait for a process that is gone: a link whose every dial
    // has been refused for kGoneAfter (nobody listens on that port) is counted dead once
    // another link is up, and the run's membership counts that peer lost. A peer that is
    // unreachable (no answer at all) or answers "not yet" is waited for as before.
    constexpr auto kGoneAfter = std::chrono::seconds(3);
    auto gone = [&](const Link& l) {
      return m.options.rejoin && !l.connected && l.refused_since && Clock::now() - *l.refused_since >= kGoneAfter;
    };
    auto settled = [&] {
      bool any = false;
      for (auto& [peer, link] : m.links) {
        if (ready(*link))
          any = true;
        else if (!gone(*link)) return false;
      }
      return any;
    };
    while (m.fatal.empty() && !all_connected() && !settled() && Clock::now() < deadline)
      m.changed.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(100)));
    if (m.fatal.empty() && !all_connected() && settled())
      for (auto& [peer, link] : m.links)
        if (gone(*link)) {
          m.mark_lost(*link, str("nobody listens at ", link->name, " (its process is gone; found while rejoining)"));
          link->dropped = true;  // a restarted process for it may rejoin us
          log::warn(link->name, " refuses every connection: its process is gone; rejoining without it");
        }
    if (!m.fatal.empty()) throw Error(ErrorKind::kPeerLost, str("peer ", m.options.self, ": ", m.fatal));
    if (!all_connected() && !settled()) {
      std::string missing;
      for (auto& [peer, link] : m.links)
        if (!ready(*link))
          missing += (missing.empty() ? "" : ", ") + link->name +
                     (link->connected ? " (connected, but it never answered the shared-memory setup)" : "");
      throw Error(ErrorKind::kTimeout, str("peer ", m.options.self, " could not connect to ", missing, " within ",
                                           m.options.connect_timeout_s, " s",
                                           m.last_refusal.empty() ? "" : " (last problem: " + m.last_refusal + ")"));
    }
  }

  Work send(int peer, MessageType type, std::uint64_t step, std::uint32_t tag, SendBuffer payload, bool shaped) override {
    TcpCore& m = *core_;
    Link& l = m.link(peer);
    PEERTRAIN_CHECK(payload.bytes().size() <= m.options.max_payload_bytes, "payload of ", payload.bytes().size(),
                    " bytes exceeds ", m.options.max_payload_bytes);
    Outgoing out = m.make_frame(type, step, tag, std::move(payload), shaped, l.name, m.options.secret.has_value(),
                                l.shares.load(std::memory_order_relaxed));
    out.ready_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(l.shaping.latency_ms / 1000.0));
    out.state->cancel = cancel_hook(l, out.state);
    Work work(out.state);
    asio::post(m.io, [&m, &l, out = std::move(out)]() mutable { m.enqueue(l, std::move(out)); });
    return work;
  }

  Payload receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag, double timeout_s) override {
    TcpCore& m = *core_;
    Link& l = m.link(peer);
    const auto key = Mailbox::key(peer, type, step, tag);
    timeout_s = std::min(timeout_s, m.options.peer_timeout_s);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    std::unique_lock lock(m.mutex);
    while (true) {
      if (auto payload = m.mailbox.take(key)) return std::move(*payload);
      const std::string waiting = str(to_string(type), " for step ", step, tag ? str(" (part ", tag, ")") : "");
      if (l.dead) throw Error(ErrorKind::kPeerLost, str(l.death, "; peer ", m.options.self, " was waiting for ", waiting));
      if (l.left) throw Error(ErrorKind::kPeerLost, str(l.name, " finished and left before sending ", waiting));
      if (m.options.every_link_needed)
        if (const Link* lost = m.first_lost())
          throw Error(ErrorKind::kPeerLost, str(lost->death, "; peer ", m.options.self, " stops waiting for ", waiting,
                                                " from ", l.name, ": this run needs every peer"));
      if (m.changed.wait_until(lock, deadline) == std::cv_status::timeout && !m.mailbox.has(key))
        throw Error(ErrorKind::kTimeout,
                    str(l.name, " sent no ", waiting, " within ", timeout_s, " s",
                        timeout_s < m.options.peer_timeout_s ? " (adaptive deadline)" : " (--peer-timeout)", "; peer ",
                        m.options.self, " gives up", tcp_report(l)));
    }
  }

  std::optional<Payload> try_receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag) override {
    TcpCore& m = *core_;
    Link& l = m.link(peer);
    std::lock_guard lock(m.mutex);
    if (auto payload = m.mailbox.take(Mailbox::key(peer, type, step, tag))) return payload;
    if (l.dead && !l.left) throw Error(ErrorKind::kPeerLost, l.death);
    return std::nullopt;
  }

  std::optional<Arrival> receive_any(std::span<const Wanted> wanted, double timeout_s) override {
    TcpCore& m = *core_;
    std::vector<Link*> links;
    for (const Wanted& w : wanted) links.push_back(&m.link(w.peer));
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    std::unique_lock lock(m.mutex);
    while (true) {
      for (std::size_t i = 0; i < wanted.size(); ++i) {
        const Wanted& w = wanted[i];
        if (auto payload = m.mailbox.take(Mailbox::key(w.peer, w.type, w.step, w.tag)))
          return Arrival{i, std::move(*payload), false, {}};
        const Link& l = *links[i];
        if (l.dead) return Arrival{i, {}, true, l.death};
        if (l.left) return Arrival{i, {}, true, str(l.name, " finished and left")};
      }
      if (m.changed.wait_until(lock, deadline) == std::cv_status::timeout) return std::nullopt;
    }
  }

  void drop(int peer, const std::string& why) override {
    TcpCore& m = *core_;
    Link& l = m.link(peer);
    auto done = std::make_shared<std::promise<void>>();
    asio::post(m.io, [&m, &l, why, done] {
      {
        std::lock_guard lock(m.mutex);
        m.mark_lost(l, why);
        l.dropped = true;
      }
      m.close_socket(l);
      m.forget_rings(l);
      l.timer.cancel();
      l.read_timer.cancel();
      const auto lost = std::make_exception_ptr(Error(ErrorKind::kPeerLost, why));
      for (Outgoing& out : l.queue) out.state->complete(lost);
      l.queue.clear();
      l.writing = false;
      m.changed.notify_all();
      done->set_value();
    });
    done->get_future().wait_for(std::chrono::seconds(5));
  }

  void readmit(int peer) override {
    std::lock_guard lock(core_->mutex);
    core_->link(peer).dropped = false;
  }
  int rejoins(int peer) const override {
    std::lock_guard lock(core_->mutex);
    return core_->link(peer).rejoins;
  }
  bool alive(int peer) const override {
    std::lock_guard lock(core_->mutex);
    const Link& l = core_->link(peer);
    return l.connected && !l.dead && !l.left;
  }
  std::string link_report(int peer) const override {
    std::lock_guard lock(core_->mutex);
    return tcp_report(core_->link(peer));
  }
  double silence_s(int peer) const override {
    std::lock_guard lock(core_->mutex);
    return std::chrono::duration<double>(Clock::now() - core_->link(peer).last_heard).count();
  }
  // A quiet link carries a heartbeat once it has not been written for 0.9 s, checked every
  // second, and a frame is heard when it has arrived whole: up to about 2 s between two
  // from a live peer, and a second more for an I/O thread kept off a busy core.
  double live_silence_s() const override { return 3.0; }
  std::vector<std::string> lost_links() override {
    TcpCore& m = *core_;
    // The reactor queues the handlers of every event one poll found before a handler
    // posted now, so once this one has run, a loss the kernel reported alongside the one
    // the caller saw has been handled too. A stopped I/O thread never runs it: the wait
    // is bounded.
    auto drained = std::make_shared<std::promise<void>>();
    auto done = drained->get_future();
    asio::post(m.io, [drained] { drained->set_value(); });
    done.wait_for(std::chrono::seconds(1));
    std::lock_guard lock(m.mutex);
    std::vector<std::string> lost;
    std::set<int> named;  // a link lost, rejoined and lost again is named once
    for (int peer : m.lost_order) {
      const Link& l = m.link(peer);
      if (l.dead && !l.left && named.insert(peer).second) lost.push_back(l.death);
    }
    return lost;
  }
  void recycle(Payload payload) override {
    std::lock_guard lock(core_->mutex);
    core_->mailbox.recycle(std::move(payload));
  }

  void close() override {
    TcpCore& m = *core_;
    {
      std::lock_guard lock(m.mutex);
      if (m.closed) return;
    }
    std::vector<Work> goodbyes;
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
      link.read_timer.cancel();
      if (link.heartbeat) link.heartbeat->cancel();
    });
  }

  void abort() override {
    core_->stop_links([](Link& link, boost::system::error_code& ignored) {
      link.socket.set_option(asio::socket_base::linger(true, 0), ignored);  // RST, not FIN
      
      link.socket.close(ignored);
    });
  }

  int self() const override { return core_->options.self; }
  const std::vector<int>& links() const override { return core_->options.links; }
  LinkCounters counters(int peer) const override {
    std::lock_guard lock(core_->mutex);
    return core_->link(peer).counters;
  }
  LinkCounters total_counters() const override {
    std::lock_guard lock(core_->mutex);
    LinkCounters total;
    for (auto& [peer, link] : core_->links) total += link->counters;
    return total;
  }
  std::string peer_name(int peer) const override { return core_->name_of(peer); }
  double peer_timeout_s() const override { return core_->options.peer_timeout_s; }

 private:
  // What a send's wait() does when it runs out of time: on the I/O thread, it ends the
  // send with kTimeout and fails the link (closing the socket), so that the I/O thread has
  // let go of the send's bytes before the caller hears of the time-out and frees them.
  // It waits for that as long as the I/O thread runs, however slow: only a thread that
  // has left io.run() (and so can no longer write from the bytes) lets it return early.
  std::function<bool()> cancel_hook(Link& l, const std::shared_ptr<Work::State>& state) const {
    return [weak_core = std::weak_ptr<TcpCore>(core_), &l, weak_state = std::weak_ptr<Work::State>(state)] {
      const auto core = weak_core.lock();
      const auto me = weak_state.lock();
      if (!core || !me) return true;  // the transport is gone: its I/O thread with it
      auto done = std::make_shared<std::promise<void>>();
      asio::post(core->io, [c = core.get(), &l, me, done] {
        const std::string why = str(me->what(), " did not finish in time; closing the link to ", l.name);
        me->complete(std::make_exception_ptr(Error(ErrorKind::kTimeout, why)));
        c->fail_link(l, why);
        done->set_value();
      });
      const auto completed = done->get_future();
      while (completed.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready)
        if (!core->io_running) return true;  // the I/O thread is gone: nothing reads the bytes any more
      return false;                          // completed above
    };
  }

  std::shared_ptr<TcpCore> core_;
};

}  // namespace

std::unique_ptr<Transport> make_tcp_transport(TcpOptions options) { return std::make_unique<TcpTransport>(std::move(options)); }

}  // namespace peertrain::net
