// NcclGroup against ThreadGroup, its serial oracle: at world size 1 every operation on fresh
// random data must give ThreadGroup's bits exactly (both only copy); over every GPU of the
// machine the all-reduce of small integers in float must be the exact sum, and a ring
// exchange must deliver every message. Each check counts the wrong elements, as nccl-tests
// does. Then the argument checks, abort and timeouts. Every test skips itself where there
// is no CUDA device.
#include "peertrain/comm/nccl_group.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "peertrain/comm/thread_group.h"
#include "peertrain/core/error.h"

namespace peertrain::comm {
namespace {

const std::vector<std::size_t> kCounts = {1, 7, 1001, std::size_t{1} << 20};

void check_cuda(cudaError_t result, const char* call) {
  ASSERT_EQ(result, cudaSuccess) << call << ": " << cudaGetErrorString(result);
}

// A float buffer in device memory on one device, filled from and read back to the host.
class DeviceBuffer {
 public:
  DeviceBuffer(std::size_t count, int device) : count_(count) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    if (count > 0) check_cuda(cudaMalloc(&data_, count * sizeof(float)), "cudaMalloc");
  }
  ~DeviceBuffer() {
    if (data_) (void)cudaFree(data_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  std::span<float> span() { return {static_cast<float*>(data_), count_}; }

  void upload(const std::vector<float>& values) {
    ASSERT_EQ(values.size(), count_);
    if (count_ == 0) return;
    check_cuda(cudaMemcpy(data_, values.data(), count_ * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    // A copy from pageable memory may return before its DMA ends, and the group's streams
    // do not wait for the legacy stream: finish it before an operation reads the buffer.
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  std::vector<float> download() const {
    std::vector<float> values(count_);
    if (count_ > 0)
      check_cuda(cudaMemcpy(values.data(), data_, count_ * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return values;
  }

 private:
  void* data_ = nullptr;
  std::size_t count_;
};

std::vector<float> random_values(std::size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (auto& v : values) v = uniform(rng);
  return values;
}

long long count_wrong(const std::vector<float>& got, const std::vector<float>& expected) {
  if (got.size() != expected.size()) return static_cast<long long>(std::max(got.size(), expected.size()));
  long long wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != expected[i]) ++wrong;
  return wrong;
}

float value(int rank, std::size_t i) { return static_cast<float>((rank + 1) * 1000 + static_cast<int>(i % 97)); }

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

TEST(NcclGroup, AWorldOfOneMatchesThreadGroupExactly) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  NcclGroup nccl({0}, "nccl test group");
  ThreadGroup threads(1, "thread test group");
  Group& g = nccl.member(0);
  Group& oracle = threads.member(0);
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  for (std::size_t count : kCounts) {
    SCOPED_TRACE(::testing::Message() << "count=" << count << " seed=" << seed);

    {  // all_reduce
      const auto input = random_values(count, rng);
      auto expected = input;
      oracle.all_reduce(expected);
      DeviceBuffer data(count, 0);
      data.upload(input);
      g.all_reduce(data.span());
      EXPECT_EQ(count_wrong(data.download(), expected), 0) << "all_reduce";
    }
    for (bool in_place : {false, true}) {  // all_gather
      const auto mine = random_values(count, rng);
      std::vector<float> expected(count, -1.0f);
      DeviceBuffer all(count, 0), own(count, 0);
      std::span<const float> device_mine = own.span();
      if (in_place) {
        expected = mine;
        oracle.all_gather(std::span<const float>(expected), expected);
        all.upload(mine);
        device_mine = all.span();
      } else {
        oracle.all_gather(mine, expected);
        all.upload(std::vector<float>(count, -1.0f));
        own.upload(mine);
      }
      g.all_gather(device_mine, all.span());
      EXPECT_EQ(count_wrong(all.download(), expected), 0) << "all_gather in_place=" << in_place;
    }
    for (bool in_place : {false, true}) {  // reduce_scatter
      const auto input = random_values(count, rng);
      auto oracle_all = input;
      std::vector<float> oracle_out(count);
      std::span<float> oracle_mine = in_place ? std::span<float>(oracle_all) : std::span<float>(oracle_out);
      oracle.reduce_scatter(oracle_all, oracle_mine);
      const std::vector<float> expected(oracle_mine.begin(), oracle_mine.end());
      DeviceBuffer all(count, 0), out(count, 0);
      all.upload(input);
      std::span<float> mine = in_place ? all.span() : out.span();
      g.reduce_scatter(all.span(), mine);
      EXPECT_EQ(count_wrong(in_place ? all.download() : out.download(), expected), 0)
          << "reduce_scatter in_place=" << in_place;
    }
    {  // broadcast
      const auto input = random_values(count, rng);
      auto expected = input;
      oracle.broadcast(expected, 0);
      DeviceBuffer data(count, 0);
      data.upload(input);
      g.broadcast(data.span(), 0);
      EXPECT_EQ(count_wrong(data.download(), expected), 0) << "broadcast";
    }
    {  // a message to oneself, receive posted first
      const auto message = random_values(count, rng);
      std::vector<float> expected(count, -1.0f);
      {
        Work r = oracle.irecv(0, 4, expected);
        Work s = oracle.isend(0, 4, message);
        r.wait();
        s.wait();
      }
      DeviceBuffer in(count, 0), out(count, 0);
      in.upload(std::vector<float>(count, -1.0f));
      out.upload(message);
      Work r = g.irecv(0, 4, in.span());
      Work s = g.isend(0, 4, out.span());
      r.wait();
      s.wait();
      EXPECT_EQ(count_wrong(in.download(), expected), 0) << "isend/irecv to self";
    }
    oracle.barrier();
    g.barrier();
  }
}

TEST(NcclGroup, AllReduceOverEveryDeviceIsTheExactSum) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  // With one GPU this is the world-of-one check again; with more, one thread per rank.
  std::vector<int> devices(n);
  for (int d = 0; d < n; ++d) devices[d] = d;
  NcclGroup group(devices, "every device");
  ASSERT_EQ(group.size(), n);
  for (std::size_t count : kCounts) {
    SCOPED_TRACE(::testing::Message() << "size=" << n << " count=" << count);
    std::atomic<long long> wrong{0};
    std::exception_ptr first;
    std::mutex mutex;
    std::vector<std::thread> threads;
    for (int rank = 0; rank < n; ++rank)
      threads.emplace_back([&, rank] {
        try {
          DeviceBuffer data(count, devices[rank]);
          std::vector<float> input(count);
          for (std::size_t i = 0; i < count; ++i) input[i] = value(rank, i);
          data.upload(input);
          group.member(rank).all_reduce(data.span());
          const auto got = data.download();
          for (std::size_t i = 0; i < count; ++i) {
            float expected = 0;
            for (int r = 0; r < n; ++r) expected += value(r, i);
            if (got[i] != expected) ++wrong;
          }
        } catch (...) {
          std::lock_guard lock(mutex);
          if (!first) first = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    if (first) std::rethrow_exception(first);
    EXPECT_EQ(wrong.load(), 0) << wrong.load() << " wrong elements";
  }
}

TEST(NcclGroup, ARingExchangeOverEveryDeviceDeliversInOrder) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  if (n < 2) GTEST_SKIP() << "needs two CUDA devices, found " << n;
  std::vector<int> devices(n);
  for (int d = 0; d < n; ++d) devices[d] = d;
  NcclGroup group(devices, "ring");
  std::atomic<long long> wrong{0};
  std::exception_ptr first;
  std::mutex mutex;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank)
    threads.emplace_back([&, rank] {
      try {
        Group& g = group.member(rank);
        const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        for (std::size_t count : kCounts) {
          DeviceBuffer out(count, devices[rank]), in(count, devices[rank]);
          std::vector<float> values(count);
          for (std::size_t i = 0; i < count; ++i) values[i] = value(rank, i);
          out.upload(values);
          // NCCL runs one member's operations in order: alternate which goes first, or
          // every rank would wait on a partner queued behind its own first operation.
          Work s, r;
          if (rank % 2 == 0) {
            s = g.isend(next, 0, out.span());
            r = g.irecv(prev, 0, in.span());
          } else {
            r = g.irecv(prev, 0, in.span());
            s = g.isend(next, 0, out.span());
          }
          r.wait();
          s.wait();
          const auto got = in.download();
          for (std::size_t i = 0; i < count; ++i)
            if (got[i] != value(prev, i)) ++wrong;
        }
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
  EXPECT_EQ(wrong.load(), 0) << wrong.load() << " wrong elements";
}

TEST(NcclGroup, ADeviceListedTwiceIsRejected) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  std::string message;
  EXPECT_EQ(kind_of([] { NcclGroup({0, 0}, "twice"); }, &message), ErrorKind::kInvalidArgument);
  EXPECT_NE(message.find("device 0"), std::string::npos) << message;
  EXPECT_NE(message.find("twice"), std::string::npos) << message;
}

TEST(NcclGroup, ADeviceOutOfRangeIsRejected) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  std::string message;
  EXPECT_EQ(kind_of([&] { NcclGroup({n}, "too far"); }, &message), ErrorKind::kInvalidArgument);
  EXPECT_NE(message.find(str("device ", n)), std::string::npos) << message;
  EXPECT_NE(message.find(str("[0, ", n, ")")), std::string::npos) << message;
  EXPECT_EQ(kind_of([] { NcclGroup({-1}, "negative"); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of([] { NcclGroup({}, "empty"); }), ErrorKind::kInvalidArgument);
}

TEST(NcclGroup, AbortFailsEveryLaterOperation) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  NcclGroup group({0}, "aborted group");
  Group& g = group.member(0);
  DeviceBuffer data(16, 0), in(16, 0);
  data.upload(std::vector<float>(16, 1.0f));
  g.all_reduce(data.span());  // the group works before
  // A pending receive fails at once too.
  Work pending = g.irecv(0, 1, in.span());
  g.abort("worker 0 ran out of memory");
  std::string message;
  EXPECT_EQ(kind_of([&] { pending.wait(5.0); }), ErrorKind::kPeerLost);
  EXPECT_EQ(kind_of([&] { g.all_reduce(data.span()); }, &message), ErrorKind::kPeerLost);
  EXPECT_NE(message.find("worker 0 ran out of memory"), std::string::npos) << message;
  EXPECT_NE(message.find("aborted group"), std::string::npos) << message;
  EXPECT_EQ(kind_of([&] { g.barrier(); }), ErrorKind::kPeerLost);
  EXPECT_EQ(kind_of([&] { g.send(0, 1, data.span()); }), ErrorKind::kPeerLost);
}

TEST(NcclGroup, AMismatchedSizeIsRejectedAndTheGroupGoesOn) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  NcclGroup group({0}, "size group");
  Group& g = group.member(0);
  DeviceBuffer mine(5, 0), all(7, 0);
  std::string message;
  EXPECT_EQ(kind_of([&] { g.all_gather(mine.span(), all.span()); }, &message), ErrorKind::kInvalidArgument);
  EXPECT_NE(message.find("all_gather"), std::string::npos) << message;
  EXPECT_EQ(kind_of([&] { g.reduce_scatter(all.span(), mine.span()); }), ErrorKind::kInvalidArgument);
  // Overlapping, but not at this rank's part.
  DeviceBuffer both(10, 0);
  EXPECT_EQ(kind_of([&] { g.all_gather(both.span().subspan(1, 5), both.span().subspan(0, 5)); }),
            ErrorKind::kInvalidArgument);
  // Host memory would fault on the GPU: refused before NCCL sees it.
  std::vector<float> host(4, 1.0f);
  EXPECT_EQ(kind_of([&] { g.all_reduce(host, 1.0); }, &message), ErrorKind::kInvalidArgument);
  EXPECT_NE(message.find("host memory"), std::string::npos) << message;

  mine.upload({1, 2, 3, 4, 5});
  g.all_reduce(mine.span());
  EXPECT_EQ(mine.download(), (std::vector<float>{1, 2, 3, 4, 5}));
  EXPECT_THROW(group.member(1), Error);
  EXPECT_THROW(group.stream(1), Error);
  EXPECT_NE(group.stream(0), nullptr);
}

TEST(NcclGroup, AMessageToOneselfWithoutPartnerTimesOutAndIsWithdrawn) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  NcclGroup group({0}, "stage 0 sequence group");
  Group& g = group.member(0);
  DeviceBuffer in(4, 0), out(4, 0), later(4, 0);
  in.upload(std::vector<float>(4, -1.0f));
  out.upload(std::vector<float>(4, 5.0f));
  std::string message;
  EXPECT_EQ(kind_of([&] { g.recv(0, 7, in.span(), 0.2); }, &message), ErrorKind::kTimeout);
  EXPECT_NE(message.find("stage 0 sequence group"), std::string::npos) << message;
  EXPECT_NE(message.find("irecv"), std::string::npos) << message;
  // Withdrawn: the next message goes to the next receive, and the group is not aborted.
  Work r = g.irecv(0, 7, later.span());
  g.send(0, 7, out.span());
  r.wait();
  EXPECT_EQ(later.download(), std::vector<float>(4, 5.0f));
  EXPECT_EQ(in.download(), std::vector<float>(4, -1.0f));
  g.barrier();
}

TEST(NcclGroup, AReceiveWhosePartnerNeverComesTimesOutAndAbortsTheGroup) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  if (n < 2) GTEST_SKIP() << "needs two CUDA devices, found " << n;
  NcclGroup group({0, 1}, "pair");
  DeviceBuffer in(8, 1), data(8, 0);
  std::string message;
  EXPECT_EQ(kind_of([&] { group.member(1).recv(0, 0, in.span(), 0.2); }, &message), ErrorKind::kTimeout);
  EXPECT_NE(message.find("rank 1 irecv from rank 0"), std::string::npos) << message;
  // NCCL cannot withdraw the receive from the GPU, so the whole group is gone.
  EXPECT_EQ(kind_of([&] { group.member(0).all_reduce(data.span(), 10.0); }), ErrorKind::kPeerLost);
}

}  // namespace
}  // namespace peertrain::comm
