#include "peertrain/net/faulty.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <queue>
#include <set>
#include <thread>

#include "peertrain/core/error.h"
#include "peertrain/core/log.h"

namespace peertrain::net {
namespace {

using Clock = std::chrono::steady_clock;

class FaultyTransport final : public Transport {
 public:
  FaultyTransport(std::unique_ptr<Transport> inner, std::vector<Fault> faults)
      : inner_(std::move(inner)), faults_(std::move(faults)), worker_([this] { deliver_delayed(); }) {}
  ~FaultyTransport() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  void connect() override { inner_->connect(); }

  Work send(int peer, MessageType type, std::uint64_t step, std::uint32_t tag, SendBuffer payload, bool shaped) override {
    if (const Fault* f = match(peer, type, step, {Fault::kKill})) {
      // Once per link: a drop is a round trip to the I/O thread, and the link stays dead.
      bool first;
      {
        std::lock_guard lock(mutex_);
        first = killed_.insert(peer).second;
      }
      if (first)
        inner_->drop(peer, str("injected fault: the link to ", inner_->peer_name(peer), " was killed at step ", f->from_step));
      return inner_->send(peer, type, step, tag, std::move(payload), shaped);  // fails: the link is dead
    }
    if (match(peer, type, step, {Fault::kDrop})) return Work::completed();  // lost on the way, silently
    if (const Fault* f = match(peer, type, step, {Fault::kDelay})) {
      // Held back by the worker, then sent; the copy makes the caller's bytes free at once.
      const auto bytes = payload.bytes();
      auto state = std::make_shared<Work::State>(str("delayed ", to_string(type), " for step ", step), inner_->peer_timeout_s());
      {
        std::lock_guard lock(mutex_);
        delayed_.push({Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(f->delay_s)),
                       sequence_++, peer, type, step, tag, Payload(bytes.begin(), bytes.end()), shaped, state});
      }
      cv_.notify_all();
      return Work(state);
    }
    return inner_->send(peer, type, step, tag, std::move(payload), shaped);
  }

  Payload receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag, double timeout_s) override {
    Payload p = inner_->receive(peer, type, step, tag, timeout_s);
    corrupt_check(peer, type, step);
    return p;
  }
  std::optional<Payload> try_receive(int peer, MessageType type, std::uint64_t step, std::uint32_t tag) override {
    auto p = inner_->try_receive(peer, type, step, tag);
    if (p) corrupt_check(peer, type, step);
    return p;
  }

  void drop(int peer, const std::string& why) override { inner_->drop(peer, why); }
  void readmit(int peer) override { inner_->readmit(peer); }
  int rejoins(int peer) const override { return inner_->rejoins(peer); }
  bool alive(int peer) const override { return inner_->alive(peer); }
  double silence_s(int peer) const override { return inner_->silence_s(peer); }
  double live_silence_s() const override { return inner_->live_silence_s(); }
  std::string link_report(int peer) const override { return inner_->link_report(peer); }
  std::vector<std::string> lost_links() override { return inner_->lost_links(); }
  void recycle(Payload payload) override { inner_->recycle(std::move(payload)); }
  void close() override { inner_->close(); }
  void abort() override { inner_->abort(); }
  int self() const override { return inner_->self(); }
  const std::vector<int>& links() const override { return inner_->links(); }
  LinkCounters counters(int peer) const override { return inner_->counters(peer); }
  LinkCounters total_counters() const override { return inner_->total_counters(); }
  std::string peer_name(int peer) const override { return inner_->peer_name(peer); }
  double peer_timeout_s() const override { return inner_->peer_timeout_s(); }

 private:
  const Fault* match(int peer, MessageType type, std::uint64_t step, std::initializer_list<Fault::Action> actions) const {
    for (const Fault& f : faults_) {
      if (std::find(actions.begin(), actions.end(), f.action) == actions.end()) continue;
      if ((f.peer < 0 || f.peer == peer) && (!f.type || *f.type == type) && step >= f.from_step && step <= f.to_step)
        return &f;
    }
    return nullptr;
  }

  void corrupt_check(int peer, MessageType type, std::uint64_t step) {
    if (!match(peer, type, step, {Fault::kCorrupt})) return;
    const std::string why = str("bad frame from ", inner_->peer_name(peer), ": checksum mismatch on a ", to_string(type),
                                " frame for step ", step, " (injected fault); closing the link");
    log::error(why);
    inner_->drop(peer, why);
    throw Error(ErrorKind::kPeerLost, why);
  }

  struct Delayed {
    Clock::time_point due;
    std::uint64_t sequence;
    int peer;
    MessageType type;
    std::uint64_t step;
    std::uint32_t tag;
    Payload payload;
    bool shaped;
    std::shared_ptr<Work::State> state;
    bool operator>(const Delayed& o) const { return std::tie(due, sequence) > std::tie(o.due, o.sequence); }
  };

  void deliver_delayed() {
    std::unique_lock lock(mutex_);
    while (true) {
      if (stopping_) {
        const auto gone = std::make_exception_ptr(Error(ErrorKind::kPeerLost, "the transport was closed"));
        while (!delayed_.empty()) {
          delayed_.top().state->complete(gone);
          delayed_.pop();
        }
        return;
      }
      if (delayed_.empty()) {
        cv_.wait(lock);
        continue;
      }
      // A copy: the wait reads its deadline after relocking, when a send may have grown
      // the queue and moved its elements.
      const Clock::time_point due = delayed_.top().due;
      if (cv_.wait_until(lock, due) != std::cv_status::timeout || Clock::now() < due) continue;
      Delayed d = std::move(const_cast<Delayed&>(delayed_.top()));
      delayed_.pop();
      lock.unlock();
      try {
        inner_->send(d.peer, d.type, d.step, d.tag, std::move(d.payload), d.shaped).wait();
        d.state->complete();
      } catch (...) {
        d.state->complete(std::current_exception());
      }
      lock.lock();
    }
  }

  std::unique_ptr<Transport> inner_;
  std::vector<Fault> faults_;
  std::set<int> killed_;  // links this decorator killed; guarded by mutex_
  std::mutex mutex_;
  std::condition_variable cv_;
  std::priority_queue<Delayed, std::vector<Delayed>, std::greater<>> delayed_;
  std::uint64_t sequence_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<Transport> make_faulty_transport(std::unique_ptr<Transport> inner, std::vector<Fault> faults) {
  return std::make_unique<FaultyTransport>(std::move(inner), std::move(faults));
}

}  // namespace peertrain::net
