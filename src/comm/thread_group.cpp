// ThreadGroup: the Group backend for workers that are threads of one process.
//
// Point to point is a rendezvous, as in MPI's synchronous mode: an isend or irecv with no
// partner yet waits in the FIFO queue of its (sender, receiver, tag) channel; whichever side
// comes second takes the head of the other queue and copies once, sender buffer to receiver
// buffer, outside the group's lock, so that copies of different pairs run in parallel.
//
// Collectives follow gloo's shared-memory style: every rank publishes its buffer pointers
// in its slot, all meet at a barrier, each rank then works on its own part of the result
// reading the others' buffers in place, and a second barrier ends the reads before anyone
// may touch its buffer again. The barrier is a single arrival counter: a rank's k-th barrier
// releases when the counter reaches k·size, so barriers, and with them the collectives,
// are matched by sequence number and consecutive collectives cannot mix.
#include "peertrain/comm/thread_group.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <vector>

#include "peertrain/core/error.h"
#include "peertrain/core/work.h"

namespace peertrain::comm {
namespace {

using Clock = std::chrono::steady_clock;

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kBarrier };

const char* collective_name(Collective kind) {
  switch (kind) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kAllGather: return "all_gather";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kBarrier: return "barrier";
  }
  return "collective";
}

struct PendingSend {
  std::shared_ptr<Work::State> state;
  const float* data;
  std::size_t count;
};

struct PendingRecv {
  std::shared_ptr<Work::State> state;
  float* data;
  std::size_t count;
};

struct Channel {
  std::deque<PendingSend> sends;
  std::deque<PendingRecv> recvs;
};

// What a rank passed to its current collective, read by the others between the barriers.
struct Slot {
  std::uint64_t sequence = 0;
  Collective kind = Collective::kBarrier;
  const float* in = nullptr;
  float* out = nullptr;
  std::size_t in_count = 0;
  std::size_t out_count = 0;
  int root = 0;
};

// The state every member shares. Held by shared_ptr so that a Work's cancel hook can
// outlive the ThreadGroup without touching freed memory.
struct Hub {
  Hub(int n, std::string group_name) : size(n), name(std::move(group_name)), slots(n) {}

  const int size;
  const std::string name;

  std::mutex mutex;
  std::condition_variable barrier_cv;
  bool aborted = false;
  std::string abort_reason;
  std::map<std::tuple<int, int, int>, Channel> channels;  // (sender, receiver, tag)
  std::vector<Slot> slots;
  std::uint64_t arrivals = 0;

  // Fails everything queued; callers hold the lock. Collective waiters see `aborted`.
  void abort_locked(const std::string& reason) {
    if (aborted) return;
    aborted = true;
    abort_reason = reason;
    for (auto& [key, channel] : channels) {
      for (auto& send : channel.sends)
        send.state->complete(
            std::make_exception_ptr(Error(ErrorKind::kPeerLost, str(send.state->what(), ": group aborted: ", reason))));
      for (auto& recv : channel.recvs)
        recv.state->complete(
            std::make_exception_ptr(Error(ErrorKind::kPeerLost, str(recv.state->what(), ": group aborted: ", reason))));
    }
    channels.clear();
    barrier_cv.notify_all();
  }
};

std::exception_ptr size_mismatch(const Hub& hub, int sender, int receiver, int tag, std::size_t sent,
                                 std::size_t expected) {
  return std::make_exception_ptr(
      Error(ErrorKind::kInvalidArgument,
            str("thread group '", hub.name, "': rank ", sender, " sent ", sent, " floats to rank ", receiver,
                " with tag ", tag, ", but rank ", receiver, " posted a receive of ", expected, " floats")));
}

// Second of the pair to arrive: move the bytes (or report the mismatch) and finish both.
void rendezvous(const Hub& hub, int sender, int receiver, int tag, const PendingSend& send,
                const PendingRecv& recv) {
  if (send.count != recv.count) {
    // One exception object per side: the two threads rethrow and free them independently.
    send.state->complete(size_mismatch(hub, sender, receiver, tag, send.count, recv.count));
    recv.state->complete(size_mismatch(hub, sender, receiver, tag, send.count, recv.count));
    return;
  }
  if (send.count > 0 && send.data != recv.data) std::memcpy(recv.data, send.data, send.count * sizeof(float));
  send.state->complete();
  recv.state->complete();
}

class Member final : public Group {
 public:
  Member(std::shared_ptr<Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return hub_->size; }
  std::string name() const override { return hub_->name; }

  Work isend(int peer, int tag, std::span<const float> data) override {
    check_peer(peer, "isend");
    auto state = std::make_shared<Work::State>(describe_operation("isend to", peer, tag, data.size()));
    const auto key = std::make_tuple(rank_, peer, tag);
    PendingSend send{state, data.data(), data.size()};
    std::unique_lock lock(hub_->mutex);
    if (hub_->aborted) return failed(std::move(state), lock);
    auto& channel = hub_->channels[key];
    if (channel.recvs.empty()) {
      state->cancel = make_cancel(key, state.get(), /*is_send=*/true);
      channel.sends.push_back(std::move(send));
      return Work(std::move(state));
    }
    PendingRecv recv = std::move(channel.recvs.front());
    channel.recvs.pop_front();
    lock.unlock();
    rendezvous(*hub_, rank_, peer, tag, send, recv);
    return Work(std::move(state));
  }

  Work irecv(int peer, int tag, std::span<float> data) override {
    check_peer(peer, "irecv");
    auto state = std::make_shared<Work::State>(describe_operation("irecv from", peer, tag, data.size()));
    const auto key = std::make_tuple(peer, rank_, tag);
    PendingRecv recv{state, data.data(), data.size()};
    std::unique_lock lock(hub_->mutex);
    if (hub_->aborted) return failed(std::move(state), lock);
    auto& channel = hub_->channels[key];
    if (channel.sends.empty()) {
      state->cancel = make_cancel(key, state.get(), /*is_send=*/false);
      channel.recvs.push_back(std::move(recv));
      return Work(std::move(state));
    }
    PendingSend send = std::move(channel.sends.front());
    channel.sends.pop_front();
    lock.unlock();
    rendezvous(*hub_, peer, rank_, tag, send, recv);
    return Work(std::move(state));
  }

  void all_reduce(std::span<float> data, double timeout_s) override {
    Slot slot{0, Collective::kAllReduce, data.data(), data.data(), data.size(), data.size(), 0};
    run(slot, timeout_s, [&](const std::vector<Slot>& slots) {
      // Rank r owns slice r: it sums that slice over every buffer into its own buffer. No
      // other rank reads slice r of rank r's buffer, so the in-place write is safe.
      const int n = hub_->size;
      const std::size_t lo = slice_begin(data.size(), rank_), hi = slice_begin(data.size(), rank_ + 1);
      float* mine = data.data();
      for (int other = 0; other < n; ++other) {
        if (other == rank_) continue;
        const float* theirs = slots[other].in;
        for (std::size_t i = lo; i < hi; ++i) mine[i] += theirs[i];
      }
    }, [&](const std::vector<Slot>& slots) {
      // Gather the other reduced slices from their owners. Rank s's slice s is final and
      // only read now; rank r writes only the slices s ≠ r of its own buffer, which no one
      // reads any more.
      for (int other = 0; other < hub_->size; ++other) {
        if (other == rank_) continue;
        const std::size_t lo = slice_begin(data.size(), other), hi = slice_begin(data.size(), other + 1);
        if (hi > lo) std::memcpy(data.data() + lo, slots[other].in + lo, (hi - lo) * sizeof(float));
      }
    });
  }

  void all_gather(std::span<const float> mine, std::span<float> all, double timeout_s) override {
    Slot slot{0, Collective::kAllGather, mine.data(), all.data(), mine.size(), all.size(), 0};
    run(slot, timeout_s, [&](const std::vector<Slot>& slots) {
      const std::size_t n = mine.size();
      for (int other = 0; other < hub_->size; ++other) {
        float* into = all.data() + static_cast<std::size_t>(other) * n;
        if (n > 0 && into != slots[other].in) std::memcpy(into, slots[other].in, n * sizeof(float));
      }
    });
  }

  void reduce_scatter(std::span<const float> all, std::span<float> mine, double timeout_s) override {
    Slot slot{0, Collective::kReduceScatter, all.data(), mine.data(), all.size(), mine.size(), 0};
    run(slot, timeout_s, [&](const std::vector<Slot>& slots) {
      // Element by element over every rank's part r, written once into `mine`: `mine` may
      // be part r of this rank's own `all`, which no other rank reads.
      const std::size_t n = mine.size(), offset = static_cast<std::size_t>(rank_) * n;
      for (std::size_t i = 0; i < n; ++i) {
        float sum = 0;
        for (int other = 0; other < hub_->size; ++other) sum += slots[other].in[offset + i];
        mine[i] = sum;
      }
    });
  }

  void broadcast(std::span<float> data, int root, double timeout_s) override {
    Slot slot{0, Collective::kBroadcast, data.data(), data.data(), data.size(), data.size(), root};
    run(slot, timeout_s, [&](const std::vector<Slot>& slots) {
      if (rank_ != root && !data.empty())
        std::memcpy(data.data(), slots[root].in, data.size() * sizeof(float));
    });
  }

  void barrier(double timeout_s) override {
    run(Slot{0, Collective::kBarrier}, timeout_s, [](const std::vector<Slot>&) {});
  }

  void abort(const std::string& reason) override {
    std::lock_guard lock(hub_->mutex);
    hub_->abort_locked(str("rank ", rank_, ": ", reason));
  }

 private:
  std::size_t slice_begin(std::size_t count, int slice) const {
    return count * static_cast<std::size_t>(slice) / static_cast<std::size_t>(hub_->size);
  }

  void check_peer(int peer, const char* op) const {
    if (peer < 0 || peer >= hub_->size)
      throw Error(ErrorKind::kInvalidArgument, str("thread group '", hub_->name, "': rank ", rank_, " ", op,
                                                   ": peer ", peer, " is outside [0, ", hub_->size, ")"));
  }

  Work failed(std::shared_ptr<Work::State> state, std::unique_lock<std::mutex>& lock) const {
    const std::string reason = hub_->abort_reason;
    lock.unlock();
    state->complete(
        std::make_exception_ptr(Error(ErrorKind::kPeerLost, str(state->what(), ": group aborted: ", reason))));
    return Work(std::move(state));
  }

  std::function<bool()> make_cancel(std::tuple<int, int, int> key, const Work::State* state, bool is_send) {
    return [weak = std::weak_ptr<Hub>(hub_), key, state, is_send] {
      const auto hub = weak.lock();
      if (!hub) return true;  // the group is gone, and with it any partner
      std::lock_guard lock(hub->mutex);
      const auto it = hub->channels.find(key);
      if (it == hub->channels.end()) return false;  // matched (or failed by an abort) already
      auto erase_from = [&](auto& queue) {
        const auto found =
            std::find_if(queue.begin(), queue.end(), [&](const auto& p) { return p.state.get() == state; });
        if (found == queue.end()) return false;
        queue.erase(found);
        return true;
      };
      return is_send ? erase_from(it->second.sends) : erase_from(it->second.recvs);
    };
  }

  std::string describe(Collective kind) const {
    return str("thread group '", hub_->name, "': rank ", rank_, " ", collective_name(kind), " #", sequence_);
  }

  // One barrier of this rank's sequence; the deadline is the whole collective's.
  void arrive(Collective kind, Clock::time_point deadline, double timeout_s) {
    std::unique_lock lock(hub_->mutex);
    if (hub_->aborted)
      throw Error(ErrorKind::kPeerLost, str(describe(kind), ": group aborted: ", hub_->abort_reason));
    const std::uint64_t target = ++barriers_passed_ * static_cast<std::uint64_t>(hub_->size);
    if (++hub_->arrivals >= target) {
      hub_->barrier_cv.notify_all();
      return;
    }
    const bool released = hub_->barrier_cv.wait_until(
        lock, deadline, [&] { return hub_->arrivals >= target || hub_->aborted; });
    if (hub_->arrivals >= target) return;
    if (released)  // aborted
      throw Error(ErrorKind::kPeerLost, str(describe(kind), ": group aborted: ", hub_->abort_reason));
    // The others can no longer agree with this rank on where the sequence stands: end them
    // now rather than at their own timeouts.
    const std::string message = str(describe(kind), " timed out after ", timeout_s, " s waiting for ",
                                    target - hub_->arrivals, " of ", hub_->size, " ranks");
    hub_->abort_locked(message);
    throw Error(ErrorKind::kTimeout, message);
  }

  // Every rank sees the same slots after the first barrier, so every rank reaches the same
  // verdict; an empty string means the calls match.
  std::string mismatch(const std::vector<Slot>& slots) const {
    const Slot& first = slots[0];
    const std::size_t n = static_cast<std::size_t>(hub_->size);
    for (int r = 0; r < hub_->size; ++r) {
      const Slot& s = slots[r];
      if (s.sequence != first.sequence || s.kind != first.kind)
        return str("rank 0 called ", collective_name(first.kind), " as collective #", first.sequence, " but rank ",
                   r, " called ", collective_name(s.kind), " as collective #", s.sequence);
      switch (s.kind) {
        case Collective::kAllReduce:
        case Collective::kBroadcast:
          if (s.in_count != first.in_count)
            return str("rank 0 passed ", first.in_count, " floats but rank ", r, " passed ", s.in_count);
          if (s.root != first.root || s.root < 0 || s.root >= hub_->size)
            return str("rank 0 named root ", first.root, ", rank ", r, " named root ", s.root, " (group of ",
                       hub_->size, ")");
          break;
        case Collective::kAllGather:
          if (s.out_count != s.in_count * n)
            return str("rank ", r, " passed ", s.in_count, " floats and an output of ", s.out_count,
                       ", expected ", s.in_count * n);
          if (s.in_count != first.in_count)
            return str("rank 0 passed ", first.in_count, " floats but rank ", r, " passed ", s.in_count);
          break;
        case Collective::kReduceScatter:
          if (s.in_count != s.out_count * n)
            return str("rank ", r, " passed ", s.in_count, " floats for an output of ", s.out_count,
                       ", expected ", s.out_count * n);
          if (s.out_count != first.out_count)
            return str("rank 0 asked for ", first.out_count, " floats but rank ", r, " for ", s.out_count);
          break;
        case Collective::kBarrier: break;
      }
    }
    return {};
  }

  // publish → barrier → check, compute → barrier [→ finish → barrier]. After the second
  // barrier nobody reads another rank's inputs; `finish` reads results others computed,
  // and the third barrier keeps them alive until every rank has read them.
  template <typename Compute>
  void run(Slot slot, double timeout_s, Compute compute) {
    run(slot, timeout_s, compute, nullptr);
  }

  template <typename Compute, typename Finish>
  void run(Slot slot, double timeout_s, Compute compute, Finish finish) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(std::max(timeout_s, 0.0)));
    slot.sequence = ++sequence_;
    {
      std::lock_guard lock(hub_->mutex);
      if (hub_->aborted)
        throw Error(ErrorKind::kPeerLost, str(describe(slot.kind), ": group aborted: ", hub_->abort_reason));
      hub_->slots[rank_] = slot;
    }
    arrive(slot.kind, deadline, timeout_s);
    // Slots change only before a rank's first barrier of a collective, and every rank has
    // passed it, so reading them unlocked is safe until the next barrier.
    const std::vector<Slot>& slots = hub_->slots;
    const std::string problem = mismatch(slots);
    if (!problem.empty()) {
      arrive(slot.kind, deadline, timeout_s);  // nobody may overwrite a slot others still check
      throw Error(ErrorKind::kInvalidArgument, str(describe(slot.kind), ": ", problem));
    }
    compute(slots);
    arrive(slot.kind, deadline, timeout_s);
    if constexpr (!std::is_same_v<Finish, std::nullptr_t>) {
      finish(slots);
      arrive(slot.kind, deadline, timeout_s);
    }
  }

  // What a timeout or an abort names, built only then. The hub is held weakly: a pending
  // operation's state sits in the hub's channels, and a strong hold would make a cycle.
  Work::State::Describe describe_operation(const char* verb, int peer, int tag, std::size_t floats) const {
    return [hub = std::weak_ptr<Hub>(hub_), rank = rank_, verb, peer, tag, floats] {
      const auto alive = hub.lock();
      return str("thread group '", alive ? alive->name : std::string("(gone)"), "': rank ", rank, " ", verb, " rank ",
                 peer, " (tag ", tag, ", ", floats, " floats)");
    };
  }

  std::shared_ptr<Hub> hub_;
  const int rank_;
  std::uint64_t sequence_ = 0;         // collectives this rank has entered
  std::uint64_t barriers_passed_ = 0;  // barriers this rank has entered
};

}  // namespace

struct ThreadGroup::Shared {
  std::shared_ptr<Hub> hub;
  std::vector<std::unique_ptr<Member>> members;
};

ThreadGroup::ThreadGroup(int size, std::string name) {
  if (size < 1)
    throw Error(ErrorKind::kInvalidArgument, str("thread group '", name, "': size ", size, " must be at least 1"));
  shared_ = std::make_unique<Shared>();
  shared_->hub = std::make_shared<Hub>(size, std::move(name));
  for (int rank = 0; rank < size; ++rank) shared_->members.push_back(std::make_unique<Member>(shared_->hub, rank));
}

ThreadGroup::~ThreadGroup() {
  // Works may outlive the group; fail what is still queued so nobody waits on a partner
  // that can no longer come.
  std::lock_guard lock(shared_->hub->mutex);
  shared_->hub->abort_locked("the thread group was destroyed");
}

int ThreadGroup::size() const { return shared_->hub->size; }

Group& ThreadGroup::member(int rank) {
  if (rank < 0 || rank >= size())
    throw Error(ErrorKind::kInvalidArgument,
                str("thread group '", shared_->hub->name, "': rank ", rank, " is outside [0, ", size(), ")"));
  return *shared_->members[rank];
}

}  // namespace peertrain::comm
