// Runs n peers as threads of one test process, each with its own TCP transport on loopback.
#pragma once

#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "peertrain/core/error.h"
#include "peertrain/net/loopback.h"
#include "peertrain/net/tcp.h"

namespace peertrain::testing {

// Ports the kernel reports free right now (bound to port 0, read back, released).
inline std::vector<int> free_ports(int n) {
  std::vector<int> ports, fds;
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    ports.push_back(ntohs(addr.sin_port));
    fds.push_back(fd);
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

inline std::vector<net::Endpoint> loopback_endpoints(int n) {
  std::vector<net::Endpoint> endpoints;
  for (int port : free_ports(n)) endpoints.push_back({"127.0.0.1", port});
  return endpoints;
}

// In-process links between every pair of n peers, as the trainer keeps them for the
// gossiping algorithms (any survivor may coordinate).
inline net::LoopbackOptions every_peer_linked(int n, double peer_timeout_s) {
  net::LoopbackOptions options{n, {}, peer_timeout_s};
  for (int i = 0; i < n; ++i) {
    std::vector<int> all;
    for (int j = 0; j < n; ++j)
      if (j != i) all.push_back(j);
    options.links.push_back(all);
  }
  return options;
}

// Calls body(rank) on n threads and rethrows the first exception any of them threw.
inline void run_peers(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::exception_ptr first;
  std::mutex mutex;
  for (int rank = 0; rank < n; ++rank)
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// Network options for `rank` of a cluster whose links are the given neighbour lists.
inline net::TcpOptions options_for(int rank, const std::vector<net::Endpoint>& endpoints, std::vector<int> links,
                                   std::uint64_t max_payload = 1 << 24) {
  net::TcpOptions o;
  o.self = rank;
  o.endpoints = endpoints;
  o.links = std::move(links);
  o.fingerprint = 0xfeed;
  o.run_id = 42;
  o.connect_timeout_s = 20;
  o.peer_timeout_s = 20;
  o.max_payload_bytes = max_payload;
  return o;
}

}  // namespace peertrain::testing
