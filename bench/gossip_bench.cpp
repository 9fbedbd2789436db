// Gossip exchange benchmark: three peers on a ring (two neighbours each), as threads of
// this process on loopback, exchange a 10 MB parameter vector. Reported: time per
// exchange and the aggregate loopback traffic of all peers, to set against iperf3 on
// loopback (bench/gossip_vs_iperf3.sh runs both). Target: at least 80% of
// iperf3's loopback rate. Two variants: the transport alone, and the D-PSGD exchange with
// its mix; each over loopback TCP alone (second argument 0, which iperf3 compares with)
// and with the payloads through shared memory (1, the default for peers on one host).
#include <benchmark/benchmark.h>

#include <barrier>
#include <functional>
#include <thread>

#include "test_support/cluster.h"
#include "peertrain/algo/gossip.h"

namespace {

using namespace peertrain;
constexpr int kPeers = 3;

using Exchange = std::function<void(long long step)>;
// Builds peer `rank`'s exchange on its connected network and its parameter vector.
using MakeExchange = std::function<Exchange(int rank, net::Transport& network, std::vector<float>& x)>;

// Runs the three peers in lockstep; rank 0 is timed by Google Benchmark.
void run_ring(benchmark::State& state, const MakeExchange& make) {
  const std::size_t floats = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  const auto endpoints = testing::loopback_endpoints(kPeers);
  const long long iterations = state.max_iterations;
  std::barrier sync(kPeers);
  auto run = [&](int rank, benchmark::State* timed) {
    std::vector<int> links = {(rank + 1) % kPeers, (rank + 2) % kPeers};
    std::sort(links.begin(), links.end());
    auto options = testing::options_for(rank, endpoints, links, floats * sizeof(float) + 64);
    options.shared_memory = state.range(1) != 0;
    auto network_owner = net::make_tcp_transport(options);
    net::Transport& network = *network_owner;
    network.connect();
    std::vector<float> x(floats, static_cast<float>(rank));
    const Exchange exchange = make(rank, network, x);
    for (int warmup = 0; warmup < 3; ++warmup) exchange(warmup);
    sync.arrive_and_wait();
    long long step = 3;
    if (timed) {
      for (auto _ : *timed) exchange(step++);
    } else {
      for (; step < 3 + iterations; ++step) exchange(step);
    }
    network.close();
  };
  std::thread peer1(run, 1, nullptr), peer2(run, 2, nullptr);
  run(0, &state);
  peer1.join();
  peer2.join();
  state.counters["loopback_total_Gbitps"] = benchmark::Counter(
      kPeers * 2 * static_cast<double>(floats * sizeof(float)) * 8 / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_GossipExchange(benchmark::State& state) {
  const auto topology = topology::parse_topology("graph: {generator: ring, n: 3}", "bench", ".");
  run_ring(state, [&](int rank, net::Transport& network, std::vector<float>& x) {
    auto gossip = std::make_shared<algo::Gossip>(network, algo::mixing_rows(topology, rank));
    return [gossip, &x](long long step) {
      gossip->start(step, x);
      gossip->finish(x);
    };
  });
}

// The same traffic without the mix: what the transport alone reaches.
void BM_TransferOnly(benchmark::State& state) {
  run_ring(state, [](int rank, net::Transport& network, std::vector<float>& x) {
    const std::vector<int> peers = {(rank + 1) % kPeers, (rank + 2) % kPeers};
    return [peers, &network, &x](long long step) {
      std::vector<Work> sends;
      for (int peer : peers) sends.push_back(network.send(peer, net::MessageType::kParameters, step, 0, net::as_bytes(x)));
      for (int peer : peers) network.recycle(network.receive(peer, net::MessageType::kParameters, step, 0));
      for (auto& s : sends) s.wait();
    };
  });
}

}  // namespace

BENCHMARK(BM_TransferOnly)
    ->Args({10 << 20, 0})
    ->Args({10 << 20, 1})
    ->Iterations(40)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_GossipExchange)
    ->Args({10 << 20, 0})
    ->Args({10 << 20, 1})
    ->Iterations(40)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_MAIN();
