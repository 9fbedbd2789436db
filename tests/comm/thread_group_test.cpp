// ThreadGroup against exactly predictable results: small integers in float, so every order
// of summation gives the same bits, and each check counts the wrong elements (as
// nccl-tests does). Sweeps group sizes 1, 2, odd, prime, 8 × element counts 0, 1, 7, 1001;
// then point-to-point order, size mismatches, timeouts, abort, and long runs of collectives.
#include "peertrain/comm/thread_group.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "peertrain/core/error.h"

namespace peertrain::comm {
namespace {

const std::vector<int> kSizes = {1, 2, 3, 5, 8};
const std::vector<std::size_t> kCounts = {0, 1, 7, 1001};

// Runs body(rank) on one thread per rank and rethrows the first exception any threw.
void run_ranks(ThreadGroup& group, const std::function<void(Group&)>& body) {
  std::vector<std::thread> threads;
  std::exception_ptr first;
  std::mutex mutex;
  for (int rank = 0; rank < group.size(); ++rank)
    threads.emplace_back([&, rank] {
      try {
        body(group.member(rank));
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

float value(int rank, std::size_t i, int round = 0) {
  return static_cast<float>((rank + 1) * 1000 + static_cast<int>((i + round) % 97));
}

// The kind of the error body throws, or nullopt.
template <typename Body>
std::optional<ErrorKind> kind_of(Body body, std::string* message = nullptr) {
  try {
    body();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.kind();
  }
  return std::nullopt;
}

TEST(ThreadGroup, AllReduceEqualsTheExactSum) {
  for (int n : kSizes)
    for (std::size_t count : kCounts) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " count=" << count);
      ThreadGroup group(n, "test group");
      std::atomic<long long> wrong{0};
      run_ranks(group, [&](Group& g) {
        for (int round = 0; round < 3; ++round) {
          std::vector<float> data(count);
          for (std::size_t i = 0; i < count; ++i) data[i] = value(g.rank(), i, round);
          g.all_reduce(data);
          for (std::size_t i = 0; i < count; ++i) {
            float expected = 0;
            for (int r = 0; r < n; ++r) expected += value(r, i, round);
            if (data[i] != expected) ++wrong;
          }
        }
      });
      EXPECT_EQ(wrong.load(), 0) << wrong.load() << " wrong elements";
    }
}

TEST(ThreadGroup, AllGatherPlacesEveryRankAtItsOffset) {
  for (int n : kSizes)
    for (std::size_t count : kCounts)
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " count=" << count << " in_place=" << in_place);
        ThreadGroup group(n, "test group");
        std::atomic<long long> wrong{0};
        run_ranks(group, [&](Group& g) {
          std::vector<float> all(count * n, -1.0f), own(count);
          for (std::size_t i = 0; i < count; ++i) own[i] = value(g.rank(), i);
          std::span<const float> mine = own;
          if (in_place) {
            std::copy(own.begin(), own.end(), all.begin() + static_cast<std::ptrdiff_t>(g.rank() * count));
            mine = std::span<const float>(all).subspan(g.rank() * count, count);
          }
          g.all_gather(mine, all);
          for (int r = 0; r < n; ++r)
            for (std::size_t i = 0; i < count; ++i)
              if (all[r * count + i] != value(r, i)) ++wrong;
        });
        EXPECT_EQ(wrong.load(), 0) << wrong.load() << " wrong elements";
      }
}

TEST(ThreadGroup, ReduceScatterGivesEachRankTheSumOfItsPart) {
  for (int n : kSizes)
    for (std::size_t count : kCounts)
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " count=" << count << " in_place=" << in_place);
        ThreadGroup group(n, "test group");
        std::atomic<long long> wrong{0};
        run_ranks(group, [&](Group& g) {
          std::vector<float> all(count * n), out(count);
          for (std::size_t i = 0; i < all.size(); ++i) all[i] = value(g.rank(), i);
          std::span<float> mine = in_place ? std::span<float>(all).subspan(g.rank() * count, count) : out;
          g.reduce_scatter(all, mine);
          for (std::size_t i = 0; i < count; ++i) {
            float expected = 0;
            for (int r = 0; r < n; ++r) expected += value(r, g.rank() * count + i);
            if (mine[i] != expected) ++wrong;
          }
        });
        EXPECT_EQ(wrong.load(), 0) << wrong.load() << " wrong elements";
      }
}

TEST(ThreadGroup, BroadcastCopiesTheRootsBufferFromEveryRoot) {
  for (int n : kSizes)
    for (std::size_t count : kCounts) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " count=" << count);
      ThreadGroup group(n, "test group");
      std::atomic<long long> wrong{0};
      run_ranks(group, [&](Group& g) {
        for (int root = 0; root < n; ++root) {
          std::vector<float> data(count);
          for (std::size_t i = 0; i < count; ++i) data[i] = value(g.rank(), i, root);
          g.broadcast(data, root);
          for (std::size_t i = 0; i < count; ++i)
            if (data[i] != value(root, i, root)) ++wrong;
        }
      });
      EXPECT_EQ(wrong.load(), 0) << wrong.load() << " wrong elements";
    }
}

TEST(ThreadGroup, BarrierHoldsEveryoneUntilTheLastArrives) {
  for (int n : kSizes) {
    ThreadGroup group(n, "test group");
    std::atomic<int> arrived{0};
    std::atomic<long long> early{0};
    run_ranks(group, [&](Group& g) {
      for (int round = 1; round <= 20; ++round) {
        if (g.rank() == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        ++arrived;
        g.barrier();
        if (arrived.load() < round * n) ++early;
        g.barrier();  // the next round's increments wait until everyone has checked
      }
    });
    EXPECT_EQ(early.load(), 0) << "n=" << n;
  }
}

TEST(ThreadGroup, ManyConsecutiveCollectivesDoNotMix) {
  // Different sizes and kinds back to back, with a random stall: a fast rank entering the
  // next collective must not disturb a slow one still in the previous.
  for (int n : {2, 3, 8}) {
    ThreadGroup group(n, "test group");
    std::atomic<long long> wrong{0};
    run_ranks(group, [&](Group& g) {
      for (int step = 0; step < 300; ++step) {
        if ((step * 7 + g.rank() * 3) % 11 == 0) std::this_thread::yield();
        const std::size_t count = 1 + (step % 5) * 13;
        std::vector<float> data(count);
        for (std::size_t i = 0; i < count; ++i) data[i] = value(g.rank(), i, step);
        switch (step % 3) {
          case 0: {
            g.all_reduce(data);
            for (std::size_t i = 0; i < count; ++i) {
              float expected = 0;
              for (int r = 0; r < n; ++r) expected += value(r, i, step);
              if (data[i] != expected) ++wrong;
            }
            break;
          }
          case 1: {
            const int root = step % n;
            g.broadcast(data, root);
            for (std::size_t i = 0; i < count; ++i)
              if (data[i] != value(root, i, step)) ++wrong;
            break;
          }
          default: {
            std::vector<float> all(count * n);
            g.all_gather(data, all);
            for (int r = 0; r < n; ++r)
              for (std::size_t i = 0; i < count; ++i)
                if (all[r * count + i] != value(r, i, step)) ++wrong;
          }
        }
      }
    });
    EXPECT_EQ(wrong.load(), 0) << "n=" << n << ": " << wrong.load() << " wrong elements";
  }
}

TEST(ThreadGroup, MessagesOfOneTagArriveInOrderWhateverComesFirst) {
  ThreadGroup group(2, "p2p group");
  const int messages = 50;
  std::atomic<long long> wrong{0};
  run_ranks(group, [&](Group& g) {
    if (g.rank() == 0) {
      std::vector<std::vector<float>> out(2 * messages);
      std::vector<Work> sends;
      for (int m = 0; m < messages; ++m)
        for (int tag : {1, 2}) {
          auto& buffer = out[2 * m + tag - 1];
          buffer.assign(3, static_cast<float>(tag * 1000 + m));
          sends.push_back(g.isend(1, tag, buffer));
        }
      for (auto& s : sends) s.wait();
    } else {
      // Tag 2 first: the tag-1 messages wait in their queue, in order.
      for (int tag : {2, 1})
        for (int m = 0; m < messages; ++m) {
          std::vector<float> in(3);
          g.recv(0, tag, in);
          if (in[0] != static_cast<float>(tag * 1000 + m)) ++wrong;
        }
    }
  });
  EXPECT_EQ(wrong.load(), 0);

  // Receives posted before the sends, and a send to oneself.
  run_ranks(group, [&](Group& g) {
    const int peer = 1 - g.rank();
    std::vector<std::vector<float>> in(messages, std::vector<float>(7));
    std::vector<Work> recvs;
    for (int m = 0; m < messages; ++m) recvs.push_back(g.irecv(peer, 5, in[m]));
    for (int m = 0; m < messages; ++m) {
      const std::vector<float> out(7, value(g.rank(), 0, m));
      g.send(peer, 5, out);
    }
    for (int m = 0; m < messages; ++m) {
      recvs[m].wait();
      for (float x : in[m])
        if (x != value(peer, 0, m)) ++wrong;
    }
    std::vector<float> self_in(4);
    auto r = g.irecv(g.rank(), 9, self_in);
    const std::vector<float> self_out(4, 42.0f);
    g.send(g.rank(), 9, self_out);
    r.wait();
    if (self_in != self_out) ++wrong;
  });
  EXPECT_EQ(wrong.load(), 0);
}

TEST(ThreadGroup, ASizeMismatchFailsBothSides) {
  ThreadGroup group(2, "p2p group");
  std::optional<ErrorKind> kinds[2];
  std::string message;
  run_ranks(group, [&](Group& g) {
    if (g.rank() == 0) {
      const std::vector<float> out(5, 1.0f);
      kinds[0] = kind_of([&] { g.send(1, 3, out); }, &message);
    } else {
      std::vector<float> in(6);
      kinds[1] = kind_of([&] { g.recv(0, 3, in); });
    }
  });
  EXPECT_EQ(kinds[0], ErrorKind::kInvalidArgument);
  EXPECT_EQ(kinds[1], ErrorKind::kInvalidArgument);
  EXPECT_NE(message.find("p2p group"), std::string::npos) << message;
  EXPECT_NE(message.find("5 floats"), std::string::npos) << message;
  EXPECT_NE(message.find("6 floats"), std::string::npos) << message;
}

TEST(ThreadGroup, ACollectiveSizeMismatchFailsEveryRankAndTheGroupGoesOn) {
  ThreadGroup group(3, "test group");
  std::atomic<int> invalid{0};
  std::atomic<long long> wrong{0};
  run_ranks(group, [&](Group& g) {
    std::vector<float> data(g.rank() == 1 ? 6 : 5, 1.0f);
    if (kind_of([&] { g.all_reduce(data); }) == ErrorKind::kInvalidArgument) ++invalid;
    if (kind_of([&] {
          if (g.rank() == 2)
            g.barrier();
          else
            g.all_reduce(data);
        }) == ErrorKind::kInvalidArgument)
      ++invalid;
    std::vector<float> ok(4, 1.0f);
    g.all_reduce(ok);
    for (float x : ok)
      if (x != 3.0f) ++wrong;
  });
  EXPECT_EQ(invalid.load(), 6);
  EXPECT_EQ(wrong.load(), 0);
}

TEST(ThreadGroup, ARecvWhosePartnerNeverComesTimesOutAndIsWithdrawn) {
  ThreadGroup group(2, "stage 0 sequence group");
  Group& g = group.member(1);
  std::vector<float> in(4, -1.0f);
  std::string message;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(kind_of([&] { g.recv(0, 7, in, 0.2); }, &message), ErrorKind::kTimeout);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // The description is built only now, from what the receive was given.
  EXPECT_NE(message.find("thread group 'stage 0 sequence group': rank 1 irecv from rank 0 (tag 7, 4 floats)"),
            std::string::npos)
      << message;

  // The withdrawn receive must not take a later message, nor write into `in`.
  std::vector<float> later(4);
  std::thread sender([&] {
    const std::vector<float> out(4, 5.0f);
    group.member(0).send(1, 7, out);
  });
  g.recv(0, 7, later);
  sender.join();
  EXPECT_EQ(later, std::vector<float>(4, 5.0f));
  EXPECT_EQ(in, std::vector<float>(4, -1.0f));
}

TEST(ThreadGroup, ACollectiveTimeoutEndsTheOthers) {
  ThreadGroup group(3, "test group");
  std::string message;
  EXPECT_EQ(kind_of([&] { group.member(0).barrier(0.2); }, &message), ErrorKind::kTimeout);
  EXPECT_NE(message.find("rank 0 barrier"), std::string::npos) << message;
  std::vector<float> data(3);
  EXPECT_EQ(kind_of([&] { group.member(1).all_reduce(data, 10.0); }), ErrorKind::kPeerLost);
}

TEST(ThreadGroup, AbortWakesEveryWaiterAtOnce) {
  ThreadGroup group(4, "test group");
  std::optional<ErrorKind> kinds[3];
  std::string message;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> waiters;
  waiters.emplace_back([&] {
    std::vector<float> in(3);
    kinds[0] = kind_of([&] { group.member(0).recv(3, 0, in, 30.0); }, &message);
  });
  waiters.emplace_back([&] { kinds[1] = kind_of([&] { group.member(1).barrier(30.0); }); });
  waiters.emplace_back([&] {
    std::vector<float> data(10);
    kinds[2] = kind_of([&] { group.member(2).all_reduce(data, 30.0); });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  group.member(3).abort("worker 3 ran out of memory");
  for (auto& t : waiters) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  for (const auto& kind : kinds) EXPECT_EQ(kind, ErrorKind::kPeerLost);
  EXPECT_NE(message.find("worker 3 ran out of memory"), std::string::npos) << message;
  // Later operations fail too, through their request.
  const std::vector<float> out(1);
  EXPECT_EQ(kind_of([&] { group.member(3).send(0, 0, out); }), ErrorKind::kPeerLost);
}

TEST(ThreadGroup, RequestWaitRethrowsAndDestructionWaits) {
  ThreadGroup group(2, "test group");
  std::vector<float> in(2);
  {
    Work r = group.member(1).irecv(0, 1, in);
    EXPECT_FALSE(r.done());
    const std::vector<float> out(3, 1.0f);
    Work s = group.member(0).isend(1, 1, out);
    EXPECT_TRUE(s.done());
    EXPECT_EQ(kind_of([&] { r.wait(); }), ErrorKind::kInvalidArgument);
    EXPECT_EQ(kind_of([&] { r.wait(); }), ErrorKind::kInvalidArgument);  // again: same error
    EXPECT_EQ(kind_of([&] { s.wait(); }), ErrorKind::kInvalidArgument);
  }
  // A request replaced by assignment is finished first.
  std::vector<float> got(2);
  Work r = group.member(1).irecv(0, 2, got);
  std::thread sender([&] {
    const std::vector<float> out(2, 8.0f);
    group.member(0).send(1, 2, out);
  });
  r = Work();
  sender.join();
  EXPECT_EQ(got, std::vector<float>(2, 8.0f));
  EXPECT_THROW(group.member(2), Error);
  EXPECT_THROW(ThreadGroup(0, "empty"), Error);
}

}  // namespace
}  // namespace peertrain::comm
