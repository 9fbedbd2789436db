// Ring all-reduce against the exact sum, over world sizes 1, 2, odd and prime, and
// payloads of 0, 1 and sizes the world size does not divide; the parameter server.
#include "peertrain/algo/collectives.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "test_support/cluster.h"
#include "peertrain/core/rng.h"
#include "peertrain/net/loopback.h"

namespace peertrain::algo {
namespace {

std::vector<int> others(int n, int self) {
  std::vector<int> v;
  for (int p = 0; p < n; ++p)
    if (p != self) v.push_back(p);
  return v;
}

std::vector<int> ring_links(int n, int self) {
  std::vector<int> v;
  if (n == 1) return v;
  v.push_back((self + 1) % n);
  if (n > 2) v.push_back((self + n - 1) % n);
  std::sort(v.begin(), v.end());
  return v;
}

TEST(RingAllreduce, EqualsTheExactSum) {
  for (int n : {1, 2, 3, 5, 8}) {
    for (std::size_t size : {0, 1, 2, 1001}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " size=" << size);
      const auto endpoints = peertrain::testing::loopback_endpoints(n);
      std::vector<int> ring(n);
      std::iota(ring.begin(), ring.end(), 0);
      std::vector<std::vector<float>> results(n);
      peertrain::testing::run_peers(n, [&](int rank) {
        auto net_owner = net::make_tcp_transport(peertrain::testing::options_for(rank, endpoints, ring_links(n, rank)));
    net::Transport& net = *net_owner;
        net.connect();
        // Small integers: every order of summation gives the exact same float.
        std::vector<float> data(size);
        for (std::size_t i = 0; i < size; ++i) data[i] = static_cast<float>((rank + 1) * 1000 + (i % 97));
        for (int round = 0; round < 2; ++round) ring_allreduce(net, ring, round, data);
        results[rank] = data;
        net.close();
      });
      long long wrong = 0;
      for (int rank = 0; rank < n; ++rank)
        for (std::size_t i = 0; i < size; ++i) {
          // After two rounds: n · Σ_r ((r+1)·1000 + i%97).
          const double one = 1000.0 * n * (n + 1) / 2 + static_cast<double>(n) * (i % 97);
          wrong += results[rank][i] != static_cast<float>(n * one);
        }
      EXPECT_EQ(wrong, 0) << "elements wrong";
    }
  }
}

TEST(ParameterServer, GathersEveryGradientAndReturnsTheParameters) {
  const int n = 5;
  const auto endpoints = peertrain::testing::loopback_endpoints(n);
  peertrain::testing::run_peers(n, [&](int rank) {
    auto net_owner = net::make_tcp_transport(peertrain::testing::options_for(rank, endpoints, rank == 0 ? others(n, 0) : std::vector<int>{0}));
    net::Transport& net = *net_owner;
    net.connect();
    std::vector<float> grads(33, static_cast<float>(rank + 1)), params(33, 0.0f);
    if (rank == 0) {
      ps_gather(net, others(n, 0), 0, grads);
      for (float g : grads) EXPECT_EQ(g, 15.0f);  // 1 + 2 + 3 + 4 + 5
      std::fill(params.begin(), params.end(), 7.0f);
      ps_broadcast(net, others(n, 0), 0, params);
    } else {
      ps_push_pull(net, 0, 0, grads, params);
      for (float p : params) EXPECT_EQ(p, 7.0f);
    }
    net.close();
  });
}

}  // namespace
}  // namespace peertrain::algo

namespace peertrain::algo {
namespace {

// Tree and recursive doubling against the exact sum in double precision, on random data,
// for powers of two and not; every peer ends with bitwise the same vector; each peer's
// links are the partners allreduce_partners() names, and they are symmetric.
TEST(LatencyOptimalAllreduce, EqualsTheExactSumOnEveryPeerBitForBit) {
  for (AllreduceAlgo algo : {AllreduceAlgo::kTree, AllreduceAlgo::kRecursiveDoubling}) {
    for (int n : {1, 2, 3, 5, 6, 8, 9}) {
      for (int p = 0; p < n; ++p)
        for (int q : allreduce_partners(algo, n, p)) {
          const auto back = allreduce_partners(algo, n, q);
          EXPECT_NE(std::find(back.begin(), back.end(), p), back.end())
              << to_string(algo) << " n=" << n << ": " << p << " → " << q << " only one way";
        }
      for (std::size_t size : {0, 1, 1001}) {
        SCOPED_TRACE(::testing::Message() << to_string(algo) << " n=" << n << " size=" << size);
        net::LoopbackOptions options{n, {}, 10};
        for (int p = 0; p < n; ++p) options.links.push_back(allreduce_partners(algo, n, p));
        net::LoopbackFabric fabric(options);
        std::vector<int> peers(n);
        std::iota(peers.begin(), peers.end(), 0);
        std::vector<std::vector<float>> inputs(n), results(n);
        for (int r = 0; r < n; ++r) {
          Rng rng(100 + r + 17 * size);
          for (std::size_t i = 0; i < size; ++i) inputs[r].push_back(static_cast<float>(rng.normal()));
        }
        peertrain::testing::run_peers(n, [&](int rank) {
          auto net = fabric.transport(rank);
          std::vector<float> data = inputs[rank];
          allreduce(algo, *net, peers, 3, data);
          results[rank] = data;
          net->close();
        });
        double err = 0, norm = 0;
        for (std::size_t i = 0; i < size; ++i) {
          double exact = 0;
          for (int r = 0; r < n; ++r) exact += inputs[r][i];
          err += (results[0][i] - exact) * (results[0][i] - exact);
          norm += exact * exact;
        }
        if (size > 0) {
          EXPECT_LT(std::sqrt(err / norm), 1e-6);
        }
        for (int r = 1; r < n && size > 0; ++r)  // memcmp: bitwise; not on the null data() of empty vectors
          EXPECT_EQ(std::memcmp(results[r].data(), results[0].data(), size * 4), 0) << "peer " << r;
      }
    }
  }
}

TEST(LatencyOptimalAllreduce, NamesAreParsedAndBadOnesNamed) {
  EXPECT_EQ(parse_allreduce_algo("rd"), AllreduceAlgo::kRecursiveDoubling);
  EXPECT_EQ(parse_allreduce_algo("tree"), AllreduceAlgo::kTree);
  try {
    parse_allreduce_algo("butterfly");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--allreduce-algo 'butterfly'"), std::string::npos) << e.what();
  }
}

// Hops on the critical path, the reason for these baselines: 2(n−1) for the ring against
// 2⌈log₂ n⌉ for the tree and ⌈log₂ n⌉ (+2 when n is not a power of two) for rd.
TEST(LatencyOptimalAllreduce, PartnersAreLogarithmic) {
  EXPECT_EQ(allreduce_partners(AllreduceAlgo::kRecursiveDoubling, 16, 5).size(), 4u);
  EXPECT_EQ(allreduce_partners(AllreduceAlgo::kTree, 16, 0).size(), 4u);
  EXPECT_EQ(allreduce_partners(AllreduceAlgo::kTree, 16, 1).size(), 1u);  // a leaf: its parent only
}

}  // namespace
}  // namespace peertrain::algo
