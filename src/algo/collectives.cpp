#include "peertrain/algo/collectives.h"

#include <algorithm>

#include "peertrain/core/error.h"

namespace peertrain::algo {
namespace {

void expect_size(const net::Transport& network, int peer, const net::Payload& payload, std::size_t bytes,
                 const char* what, std::uint64_t step) {
  if (payload.size() != bytes)
    throw Error(ErrorKind::kPeerLost, str(network.peer_name(peer), " sent ", payload.size(), " bytes of ", what,
                                          " for step ", step, ", expected ", bytes));
}

}  // namespace

void ring_allreduce(net::Transport& network, const std::vector<int>& ring, std::uint64_t step, std::span<float> data) {
  const int n = static_cast<int>(ring.size());
  const auto position = std::find(ring.begin(), ring.end(), network.self()) - ring.begin();
  PEERTRAIN_CHECK(position < n, "peer ", network.self(), " is not on the all-reduce ring");
  if (n == 1 || data.empty()) return;
  const int r = static_cast<int>(position);
  const int next = ring[(r + 1) % n], prev = ring[(r + n - 1) % n];
  // Chunk c covers [begin(c), begin(c + 1)); sizes differ by at most one element.
  auto begin = [&](int c) { return data.size() * static_cast<std::size_t>(c) / static_cast<std::size_t>(n); };
  auto chunk = [&](int c) {
    c = ((c % n) + n) % n;
    return data.subspan(begin(c), begin(c + 1) - begin(c));
  };
  for (int s = 0; s < n - 1; ++s) {  // reduce-scatter
    auto out = chunk(r - s);
    auto send = network.send(next, net::MessageType::kReduceChunk, step, static_cast<std::uint32_t>(s), net::as_bytes(out));
    auto into = chunk(r - s - 1);
    net::Payload in = network.receive(prev, net::MessageType::kReduceChunk, step, static_cast<std::uint32_t>(s));
    expect_size(network, prev, in, into.size_bytes(), "an all-reduce chunk", step);
    const auto* values = reinterpret_cast<const float*>(in.data());
    for (std::size_t i = 0; i < into.size(); ++i) into[i] += values[i];
    network.recycle(std::move(in));
    send.wait();
  }
  for (int s = 0; s < n - 1; ++s) {  // all-gather
    auto out = chunk(r + 1 - s);
    auto send = network.send(next, net::MessageType::kReduceChunk, step, static_cast<std::uint32_t>(n + s),
                             net::as_bytes(out));
    auto into = chunk(r - s);
    const net::Payload in = network.receive(prev, net::MessageType::kReduceChunk, step, static_cast<std::uint32_t>(n + s));
    expect_size(network, prev, in, into.size_bytes(), "an all-reduce chunk", step);
    std::copy_n(reinterpret_cast<const float*>(in.data()), into.size(), into.data());
    send.wait();
  }
}

void ps_push_pull(net::Transport& network, int server, std::uint64_t step, std::span<const float> grads,
                  std::span<float> params) {
  auto send = network.send(server, net::MessageType::kGradients, step, 0, net::as_bytes(grads));
  const net::Payload in = network.receive(server, net::MessageType::kParameters, step, 0);
  expect_size(network, server, in, params.size_bytes(), "parameters", step);
  std::copy_n(reinterpret_cast<const float*>(in.data()), params.size(), params.data());
  send.wait();
}

void ps_gather(net::Transport& network, const std::vector<int>& workers, std::uint64_t step, std::span<float> sum) {
  for (int worker : workers) {
    const net::Payload in = network.receive(worker, net::MessageType::kGradients, step, 0);
    expect_size(network, worker, in, sum.size_bytes(), "gradients", step);
    const auto* values = reinterpret_cast<const float*>(in.data());
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += values[i];
  }
}

void ps_broadcast(net::Transport& network, const std::vector<int>& workers, std::uint64_t step,
                  std::span<const float> params) {
  std::vector<Work> sends;
  for (int worker : workers) sends.push_back(network.send(worker, net::MessageType::kParameters, step, 0, net::as_bytes(params)));
  for (auto& send : sends) send.wait();
}

}  // namespace peertrain::algo
