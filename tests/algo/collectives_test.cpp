// Ring all-reduce against the exact sum, over world sizes 1, 2, odd and prime, and
// payloads of 0, 1 and sizes the world size does not divide; the parameter server.
#include "peertrain/algo/collectives.h"

#include <gtest/gtest.h>

#include <numeric>

#include "../net/test_cluster.h"

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
