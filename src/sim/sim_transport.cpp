#include "sim_transport.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "peertrain/core/error.h"

namespace peertrain::sim {
namespace {

namespace s4u = simgrid::s4u;
using net::MessageType;
using net::Payload;

struct Message {
  enum class Kind : std::uint8_t { kData, kGoodbye, kClosed, kDropped };
  Kind kind = Kind::kData;
  MessageType type = MessageType::kParameters;
  std::uint64_t step = 0;
  std::uint32_t tag = 0;
  net::SharedPayload bytes;  // kData: every neighbour's message of one send may share them
  std::string why;  // kClosed, kDropped
};

using Key = std::tuple<MessageType, std::uint64_t, std::uint32_t>;

// A message on its link, and the one before it while that is still under way: SimGrid
// starts a message only once the one before has arrived (add_successor), and a message not
// yet started cannot be waited on, so a wait goes through the queue from its oldest.
struct Queued {
  s4u::CommPtr comm;
  std::shared_ptr<Queued> before;
};

struct Link {
  int peer = -1;
  s4u::Mailbox* out = nullptr;
  s4u::Mailbox* in = nullptr;
  bool receiver_set = false;
  s4u::CommPtr last_send;    // the link's newest message: the next one starts after it
  std::shared_ptr<Queued> newest;  // the same, with the messages it waits behind
  s4u::CommPtr pending_get;  // at most one posted receive, kept across time-outs
  Message* incoming = nullptr;
  std::map<Key, net::SharedPayload> arrived;
  bool goodbye = false;  // the peer finished cleanly
  std::string lost;      // why the link is lost (closed by the peer, dropped); empty: it is not
  net::LinkCounters counters;
};

class SimTransport final : public net::Transport {
 public:
  SimTransport(Fabric& fabric, int rank, const std::vector<int>& links) : fabric_(fabric), rank_(rank), links_(links) {
    std::sort(links_.begin(), links_.end());
    index_.assign(static_cast<std::size_t>(fabric.peers), -1);
    state_.resize(links_.size());
    for (std::size_t k = 0; k < links_.size(); ++k) {
      const int peer = links_[k];
      index_[static_cast<std::size_t>(peer)] = static_cast<int>(k);
      state_[k].peer = peer;
      state_[k].out = Fabric::mailbox(rank, peer);
      state_[k].in = Fabric::mailbox(peer, rank);
    }
  }

  ~SimTransport() override {
    // A peer that unwinds on an error closes its links as a dying process's sockets close;
    // one whose host failed says nothing.
    if (closed_ || fabric_.failed(rank_)) return;
    try {
      notify_all(Message::Kind::kClosed, str("peer ", rank_, " stopped on an error"));
    } catch (...) {
    }
  }

  void connect() override { SimCall call(fabric_, rank_); }

  Work send(int peer, MessageType type, std::uint64_t step, std::uint32_t tag, net::SendBuffer payload,
            bool shaped) override {
    SimCall call(fabric_, rank_);
    Link& l = link(peer);
    if (!l.lost.empty())
      return Work::completed(std::make_exception_ptr(
          Error(ErrorKind::kPeerLost, str(peer_name(peer), " is lost (", l.lost, "); cannot send ", to_string(type)))));
    if (fabric_.cut(rank_, peer)) {
      // A pulled cable: the bytes leave, as into a socket's buffer, and never arrive.
      l.counters.bytes_sent += net::kHeaderBytes + payload.bytes().size();
      ++l.counters.messages_sent;
      return Work::completed();
    }
    auto* m = new Message{Message::Kind::kData, type, step, tag, snapshot(payload), {}};
    l.counters.bytes_sent += net::kHeaderBytes + m->bytes->size();
    ++l.counters.messages_sent;
    // Control traffic (evaluation reports, measurements) is not part of the network's
    // time in a real run either: it costs only the route's latency here.
    const std::uint64_t simulated_bytes = shaped ? net::kHeaderBytes + m->bytes->size() : 0;
    s4u::CommPtr comm = post(l, m, simulated_bytes);
    if (!payload.owner()) snapshot_.last_send = comm;
    std::shared_ptr<Queued> queued = l.newest;
    auto state = std::make_shared<Work::State>(
        [=, this] { return str(to_string(type), " for step ", step, " to ", peer_name(peer)); },
        fabric_.peer_timeout_s);
    Work::State* s = state.get();
    Fabric* fabric = &fabric_;
    const int rank = rank_;
    state->drive = [queued, s, fabric, rank](double timeout_s) {
      SimCall call(*fabric, rank, false);
      try {
        if (arrived(*queued, timeout_s)) s->complete();
      } catch (const simgrid::Exception& e) {
        s->complete(std::make_exception_ptr(Error(ErrorKind::kPeerLost, str(s->what(), " failed: ", e.what()))));
      }
    };
    state->cancel = [comm] {
      comm->cancel();
      return true;
    };
    return Work(std::move(state));
  }

  Payload receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag, double timeout_s) override {
    return net::unshare(receive_shared(peer, type, step, tag, timeout_s));
  }

  net::SharedPayload receive_shared(int peer, MessageType type, std::uint64_t step, std::uint32_t tag,
                                    double timeout_s) override {
    SimCall call(fabric_, rank_);
    Link& l = link(peer);
    const double limit = std::min(timeout_s, fabric_.peer_timeout_s);
    const double deadline = s4u::Engine::get_clock() + limit;
    for (;;) {
      if (auto payload = take(l, {type, step, tag})) return payload;
      if (!l.lost.empty()) throw Error(ErrorKind::kPeerLost, str(peer_name(peer), " is lost: ", l.lost));
      if (l.goodbye)
        throw Error(ErrorKind::kPeerLost, str(peer_name(peer), " finished and closed its link before sending ",
                                              to_string(type), " for step ", step));
      const double left = deadline - s4u::Engine::get_clock();
      if (left <= 0)
        throw Error(ErrorKind::kTimeout, str("no ", to_string(type), " for step ", step, " from ", peer_name(peer),
                                             " within ", limit, " s (simulated)"));
      post_receive(l);
      // wait_any_for leaves a receive that timed out posted (wait_for would end it), so a
      // message already on its way is not lost.
      if (s4u::Comm::wait_any_for({l.pending_get}, left) < 0) continue;
      absorb(l);
    }
  }

  std::optional<Payload> try_receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag) override {
    SimCall call(fabric_, rank_);
    Link& l = link(peer);
    // The membership polls every link at every step: a link with nothing posted and
    // nothing arrived costs no call into SimGrid's kernel.
    for (;;) {
      if (!l.pending_get) {
        if (!l.in->ready()) break;
        post_receive(l);
      }
      if (!l.pending_get->test()) break;
      absorb(l);
    }
    if (auto payload = take(l, {type, step, tag})) return net::unshare(std::move(payload));
    if (!l.lost.empty()) throw Error(ErrorKind::kPeerLost, str(peer_name(peer), " is lost: ", l.lost));
    return std::nullopt;
  }

  std::optional<Arrival> receive_any(std::span<const Wanted> wanted, double timeout_s) override {
    SimCall call(fabric_, rank_);
    const double deadline = s4u::Engine::get_clock() + timeout_s;
    for (;;) {
      std::vector<s4u::CommPtr> gets;
      std::vector<Link*> owners;
      for (std::size_t i = 0; i < wanted.size(); ++i) {
        const Wanted& w = wanted[i];
        Link& l = link(w.peer);
        if (auto payload = take(l, {w.type, w.step, w.tag}))
          return Arrival{i, net::unshare(std::move(payload)), false, {}};
        if (!l.lost.empty() || l.goodbye)
          return Arrival{i, {}, true, l.lost.empty() ? str(peer_name(w.peer), " finished") : l.lost};
        if (std::find(owners.begin(), owners.end(), &l) != owners.end()) continue;
        post_receive(l);
        gets.push_back(l.pending_get);
        owners.push_back(&l);
      }
      const double left = deadline - s4u::Engine::get_clock();
      if (left <= 0 || gets.empty()) return std::nullopt;
      const ssize_t got = s4u::Comm::wait_any_for(gets, left);
      if (got < 0) continue;
      absorb(*owners[static_cast<std::size_t>(got)]);
    }
  }

  void drop(int peer, const std::string& why) override {
    Link& l = link(peer);
    if (!l.lost.empty()) return;
    l.lost = why;
    lost_.push_back(str(peer_name(peer), ": ", why));
    if (fabric_.failed(rank_)) return;
    SimCall call(fabric_, rank_, false);
    post(l, new Message{Message::Kind::kDropped, MessageType::kGoodbye, 0, 0, {}, why}, 0);
  }
  void recycle(Payload payload) override { fabric_.give_buffer(std::move(payload)); }
  void readmit(int) override {}
  int rejoins(int) const override { return 0; }
  bool alive(int peer) const override {
    const Link& l = state_[static_cast<std::size_t>(slot(peer))];
    return l.lost.empty() && !l.goodbye && !fabric_.failed(peer) && !fabric_.cut(rank_, peer);
  }
  double silence_s(int peer) const override {
    // Silent since its host failed, or since the cable between us was cut.
    double since = fabric_.failed(peer) ? fabric_.failed_at_s(peer) : -1;
    if (fabric_.cut(rank_, peer) && (since < 0 || fabric_.cut_at_s(rank_, peer) < since))
      since = fabric_.cut_at_s(rank_, peer);
    return since < 0 ? 0 : s4u::Engine::get_clock() - since;
  }
  std::vector<std::string> lost_links() override { return lost_; }

  void close() override {
    if (closed_) return;
    SimCall call(fabric_, rank_, false);
    notify_all(Message::Kind::kGoodbye, {});
    // Flushed, as a socket's close flushes what is queued: the last message of each link.
    for (Link& l : state_)
      if (l.last_send) try {
          l.last_send->wait_for(fabric_.peer_timeout_s);
        } catch (const simgrid::Exception&) {
        }
    closed_ = true;
  }
  void abort() override {
    if (closed_) return;
    SimCall call(fabric_, rank_, false);
    notify_all(Message::Kind::kClosed, str("peer ", rank_, " stopped"));
  }

  int self() const override { return rank_; }
  const std::vector<int>& links() const override { return links_; }
  net::LinkCounters counters(int peer) const override { return state_[static_cast<std::size_t>(slot(peer))].counters; }
  net::LinkCounters total_counters() const override {
    net::LinkCounters total;
    for (const Link& l : state_) total += l.counters;
    return total;
  }
  std::string peer_name(int peer) const override { return str("peer ", peer, " (simulated host peer-", peer, ")"); }
  double peer_timeout_s() const override { return fabric_.peer_timeout_s; }

 private:
  int slot(int peer) const {
    const int k = peer >= 0 && peer < fabric_.peers ? index_[static_cast<std::size_t>(peer)] : -1;
    if (k < 0) throw Error(ErrorKind::kInvalidArgument, str("peer ", rank_, " has no link to peer ", peer));
    return k;
  }
  Link& link(int peer) { return state_[static_cast<std::size_t>(slot(peer))]; }

  // Started (or waiting for the message before it) and not yet ended.
  // Whether the message and the ones before it on its link arrived within timeout_s
  // (simulated; 0: without waiting), taking them oldest first.
  static bool arrived(const Queued& message, double timeout_s) {
    std::vector<s4u::CommPtr> queue;
    for (const Queued* q = &message; q && under_way(q->comm); q = q->before.get()) queue.push_back(q->comm);
    const double deadline = s4u::Engine::get_clock() + timeout_s;
    for (auto c = queue.rbegin(); c != queue.rend(); ++c) {
      if (timeout_s <= 0) {
        if (!(*c)->test()) return false;
        continue;
      }
      const double left = deadline - s4u::Engine::get_clock();
      if (left <= 0 || s4u::Comm::wait_any_for({*c}, left) < 0) return false;
    }
    return true;
  }

  static bool under_way(const s4u::CommPtr& comm) {
    if (!comm) return false;
    const auto state = comm->get_state();
    return state != s4u::Activity::State::FINISHED && state != s4u::Activity::State::FAILED &&
           state != s4u::Activity::State::CANCELED;
  }

  // Starts a message on its link, after the link's previous one.
  s4u::CommPtr post(Link& l, Message* m, std::uint64_t simulated_bytes) {
    if (!l.receiver_set) {
      // Its receiver takes each message as it arrives, posted or not: the transfer starts
      // at once, as TCP's does, not when the receiver asks.
      l.out->set_receiver(fabric_.actors[static_cast<std::size_t>(l.peer)]);
      l.receiver_set = true;
    }
    s4u::CommPtr comm = l.out->put_init(m, simulated_bytes);
    if (const double rate = fabric_.rate(rank_, l.peer); rate > 0) comm->set_rate(rate);
    auto queued = std::make_shared<Queued>(Queued{comm, nullptr});
    if (under_way(l.last_send)) {
      l.last_send->add_successor(comm);
      comm->vetoable_start();
      queued->before = l.newest;
      // The queue keeps only what is under way.
      for (Queued* q = queued.get(); q->before; q = q->before.get())
        if (!under_way(q->before->comm)) {
          q->before.reset();
          break;
        }
    } else {
      comm->start();
    }
    l.last_send = comm;
    l.newest = std::move(queued);
    return comm;
  }

  void post_receive(Link& l) {
    if (!l.pending_get) l.pending_get = l.in->get_async<Message>(&l.incoming);
  }

  // Files the message the link's posted receive got.
  void absorb(Link& l) {
    l.pending_get = nullptr;
    std::unique_ptr<Message> m(l.incoming);
    l.incoming = nullptr;
    switch (m->kind) {
      case Message::Kind::kData:
        l.counters.bytes_received += net::kHeaderBytes + m->bytes->size();
        ++l.counters.messages_received;
        l.arrived[{m->type, m->step, m->tag}] = std::move(m->bytes);
        break;
      case Message::Kind::kGoodbye:
        l.goodbye = true;
        break;
      case Message::Kind::kClosed:
      case Message::Kind::kDropped:
        if (l.lost.empty()) {
          l.lost = m->why;
          lost_.push_back(str(peer_name(l.peer), ": ", m->why));
        }
        break;
    }
  }

  static net::SharedPayload take(Link& l, const Key& key) {
    auto it = l.arrived.find(key);
    if (it == l.arrived.end()) return nullptr;
    net::SharedPayload payload = std::move(it->second);
    l.arrived.erase(it);
    return payload;
  }

  // The bytes a send carries. Owned bytes are taken as they are. Borrowed ones are copied
  // once and the copy shared by the next sends of the same bytes (gossip sends x to every
  // neighbour) for as long as one of those sends is under way: the caller keeps borrowed
  // bytes unchanged while each send is under way, so while one is, they are the same.
  net::SharedPayload snapshot(const net::SendBuffer& payload) {
    if (payload.owner()) return payload.owner();
    const auto bytes = payload.bytes();
    Snapshot& last = snapshot_;
    const bool same = last.bytes && last.data == bytes.data() && last.size == bytes.size() && under_way(last.last_send);
    if (same) return last.bytes;
    if (last.bytes && last.bytes.use_count() == 1) fabric_.give_buffer(std::move(*last.bytes));
    Payload copy = fabric_.take_buffer();
    copy.assign(bytes.begin(), bytes.end());
    last = Snapshot{std::make_shared<Payload>(std::move(copy)), bytes.data(), bytes.size(), nullptr};
    return last.bytes;
  }

  void notify_all(Message::Kind kind, const std::string& why) {
    for (Link& l : state_)
      if (l.lost.empty() && !fabric_.failed(l.peer) && !fabric_.cut(rank_, l.peer))
        post(l, new Message{kind, MessageType::kGoodbye, 0, 0, {}, why}, 0);
    closed_ = true;
  }

  Fabric& fabric_;
  const int rank_;
  std::vector<int> links_;
  std::vector<int> index_;
  std::vector<Link> state_;
  std::vector<std::string> lost_;
  bool closed_ = false;
  struct Snapshot {
    net::SharedPayload bytes;
    const std::byte* data = nullptr;  // what was copied
    std::size_t size = 0;
    s4u::CommPtr last_send;  // the newest send that carries it
  } snapshot_;
};

}  // namespace

std::unique_ptr<net::Transport> make_sim_transport(Fabric& fabric, int rank, const std::vector<int>& links) {
  return std::make_unique<SimTransport>(fabric, rank, links);
}

}  // namespace peertrain::sim
