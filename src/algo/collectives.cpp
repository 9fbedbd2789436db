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

AllreduceAlgo parse_allreduce_algo(std::string_view name) {
  for (auto a : {AllreduceAlgo::kRing, AllreduceAlgo::kTree, AllreduceAlgo::kRecursiveDoubling})
    if (to_string(a) == name) return a;
  throw Error(ErrorKind::kInvalidArgument, str("--allreduce-algo '", name, "' is not one of ring, tree, rd"));
}

std::string_view to_string(AllreduceAlgo algo) {
  switch (algo) {
    case AllreduceAlgo::kRing:
      return "ring";
    case AllreduceAlgo::kTree:
      return "tree";
    case AllreduceAlgo::kRecursiveDoubling:
      return "rd";
  }
  return "?";
}

namespace {

constexpr std::uint32_t kRdTag = 1u << 20, kTreeTag = 2u << 20;

int position_of(const net::Transport& network, const std::vector<int>& peers) {
  const auto at = std::find(peers.begin(), peers.end(), network.self()) - peers.begin();
  PEERTRAIN_CHECK(at < static_cast<std::ptrdiff_t>(peers.size()), "peer ", network.self(), " is not in the all-reduce");
  return static_cast<int>(at);
}

int floor_pow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// data += the peer's vector with this tag; the send of ours overlaps the receive.
void exchange_add(net::Transport& network, int peer, std::uint64_t step, std::uint32_t tag, std::span<float> data) {
  auto send = network.send(peer, net::MessageType::kReduceChunk, step, tag, net::as_bytes(data));
  net::Payload in = network.receive(peer, net::MessageType::kReduceChunk, step, tag);
  expect_size(network, peer, in, data.size_bytes(), "an all-reduce vector", step);
  send.wait();  // before data changes under the send
  const auto* values = reinterpret_cast<const float*>(in.data());
  for (std::size_t i = 0; i < data.size(); ++i) data[i] += values[i];
  network.recycle(std::move(in));
}

void receive_into(net::Transport& network, int peer, std::uint64_t step, std::uint32_t tag, std::span<float> data,
                  bool add) {
  net::Payload in = network.receive(peer, net::MessageType::kReduceChunk, step, tag);
  expect_size(network, peer, in, data.size_bytes(), "an all-reduce vector", step);
  const auto* values = reinterpret_cast<const float*>(in.data());
  if (add)
    for (std::size_t i = 0; i < data.size(); ++i) data[i] += values[i];
  else
    std::copy_n(values, data.size(), data.data());
  network.recycle(std::move(in));
}

void send_all(net::Transport& network, int peer, std::uint64_t step, std::uint32_t tag, std::span<const float> data) {
  network.send(peer, net::MessageType::kReduceChunk, step, tag, net::as_bytes(data)).wait();
}

}  // namespace

void rd_allreduce(net::Transport& network, const std::vector<int>& peers, std::uint64_t step, std::span<float> data) {
  const int n = static_cast<int>(peers.size());
  const int me = position_of(network, peers);
  if (n == 1 || data.empty()) return;
  const int p2 = floor_pow2(n), extra = n - p2;
  // The first 2·extra positions pair up: the even one hands its vector to the odd one.
  if (me < 2 * extra && me % 2 == 0) {
    send_all(network, peers[static_cast<std::size_t>(me + 1)], step, kRdTag, data);
    receive_into(network, peers[static_cast<std::size_t>(me + 1)], step, kRdTag + 63, data, false);
    return;
  }
  if (me < 2 * extra) receive_into(network, peers[static_cast<std::size_t>(me - 1)], step, kRdTag, data, true);
  const int virtual_me = me < 2 * extra ? me / 2 : me - extra;
  auto real = [&](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  std::uint32_t round = 1;
  for (int mask = 1; mask < p2; mask <<= 1, ++round)
    exchange_add(network, peers[static_cast<std::size_t>(real(virtual_me ^ mask))], step, kRdTag + round, data);
  if (me < 2 * extra) send_all(network, peers[static_cast<std::size_t>(me - 1)], step, kRdTag + 63, data);
}

void tree_allreduce(net::Transport& network, const std::vector<int>& peers, std::uint64_t step, std::span<float> data) {
  const int n = static_cast<int>(peers.size());
  const int me = position_of(network, peers);
  if (n == 1 || data.empty()) return;
  auto peer = [&](int position) { return peers[static_cast<std::size_t>(position)]; };
  // Reduce: in round k a position with bit k set sends to the one without it and is done.
  int mask = 1;
  std::uint32_t round = 0;
  for (; mask < n; mask <<= 1, ++round) {
    if (me & mask) {
      send_all(network, peer(me - mask), step, kTreeTag + round, data);
      break;
    }
    if (me + mask < n) receive_into(network, peer(me + mask), step, kTreeTag + round, data, true);
  }
  // Broadcast: the same tree backwards; a position first hears from its parent.
  if (me != 0) receive_into(network, peer(me - mask), step, kTreeTag + 32 + round, data, false);
  for (mask >>= 1; mask > 0; mask >>= 1) {
    --round;
    if (me + mask < n) send_all(network, peer(me + mask), step, kTreeTag + 32 + round, data);
  }
}

void allreduce(AllreduceAlgo algo, net::Transport& network, const std::vector<int>& peers, std::uint64_t step,
               std::span<float> data) {
  switch (algo) {
    case AllreduceAlgo::kRing:
      return ring_allreduce(network, peers, step, data);
    case AllreduceAlgo::kTree:
      return tree_allreduce(network, peers, step, data);
    case AllreduceAlgo::kRecursiveDoubling:
      return rd_allreduce(network, peers, step, data);
  }
}

std::vector<int> allreduce_partners(AllreduceAlgo algo, int n, int self) {
  std::vector<int> out;
  if (n == 1) return out;
  if (algo == AllreduceAlgo::kRing) {
    out = {(self + 1) % n, (self + n - 1) % n};
  } else if (algo == AllreduceAlgo::kTree) {
    for (int mask = 1; mask < n; mask <<= 1) {
      if (self & mask) {
        out.push_back(self - mask);
        break;
      }
      if (self + mask < n) out.push_back(self + mask);
    }
  } else {
    const int p2 = floor_pow2(n), extra = n - p2;
    if (self < 2 * extra) out.push_back(self % 2 == 0 ? self + 1 : self - 1);
    if (!(self < 2 * extra && self % 2 == 0)) {
      const int v = self < 2 * extra ? self / 2 : self - extra;
      for (int mask = 1; mask < p2; mask <<= 1) {
        const int w = v ^ mask;
        out.push_back(w < extra ? 2 * w + 1 : w + extra);
      }
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  std::erase(out, self);
  return out;
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
