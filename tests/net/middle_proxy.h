// A man in the middle of a two-peer run on loopback, for tests of frames altered in
// flight: peer 0 dials the proxy for peer 1, and the proxy forwards both ways, letting an
// edit change what peer 0 sends once the link is up.
#pragma once

#include <utility>  // before Asio: Boost 1.74 needs it

#include <boost/asio.hpp>
#include <array>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "test_support/cluster.h"

namespace peertrain::testing {

// Called with the bytes read from peer 0 and not yet forwarded, and the offset of their
// first in peer 0's stream; may change them, and returns how many of the last ones to hold
// back until the next read (a pattern split between reads). Hold back only what may begin
// a pattern: the handshake waits for every byte it is sent.
using StreamEdit = std::function<std::size_t(std::vector<std::byte>& held, long long offset)>;

// Peer 0 sends peer 1 a parameters frame of 1,000 floats for step 0 through the proxy;
// returns what peer 1's receive of it threw ("" if nothing). `configure` sets each rank's
// options (a secret, shared memory) beyond options_for's, with a 5 s peer timeout.
inline std::string receiver_error_through_proxy(const StreamEdit& edit,
                                                const std::function<void(int rank, net::TcpOptions&)>& configure) {
  namespace asio = boost::asio;
  auto endpoints = loopback_endpoints(3);  // [2]: the proxy, which peer 0 dials for peer 1
  asio::io_context io;
  asio::ip::tcp::acceptor middle(io,
                                 {asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(endpoints[2].port)});
  std::thread proxy([&] {
    asio::ip::tcp::socket from0(io), to1(io);
    middle.accept(from0);
    // Peer 1 may not listen yet (its thread starts beside peer 0's): retry, as a dialer does.
    const asio::ip::tcp::endpoint peer1{asio::ip::make_address("127.0.0.1"),
                                        static_cast<unsigned short>(endpoints[1].port)};
    boost::system::error_code refused;
    for (int attempt = 0; attempt < 100; ++attempt) {
      to1.connect(peer1, refused);
      if (!refused) break;
      to1.close();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    auto pump = [](asio::ip::tcp::socket& in, asio::ip::tcp::socket& out, const StreamEdit* change) {
      std::vector<std::byte> held;
      std::array<std::byte, 4096> buffer;
      long long offset = 0;  // of held[0] in the stream
      boost::system::error_code ec;
      while (true) {
        const std::size_t got = in.read_some(asio::buffer(buffer), ec);
        if (ec) break;
        held.insert(held.end(), buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(got));
        const std::size_t keep = change ? std::min((*change)(held, offset), held.size()) : 0;
        asio::write(out, asio::buffer(held.data(), held.size() - keep), ec);
        if (ec) break;
        offset += static_cast<long long>(held.size() - keep);
        held.erase(held.begin(), held.end() - static_cast<std::ptrdiff_t>(keep));
      }
      boost::system::error_code ignored;
      out.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    };
    std::thread back([&] { pump(to1, from0, nullptr); });
    pump(from0, to1, &edit);
    back.join();
  });
  std::string receiver_error;
  run_peers(2, [&](int rank) {
    std::vector<net::Endpoint> mine = {endpoints[0], rank == 0 ? endpoints[2] : endpoints[1]};
    auto o = options_for(rank, mine, {1 - rank});
    o.peer_timeout_s = 5;
    configure(rank, o);
    auto net = net::make_tcp_transport(o);
    net->connect();
    const std::vector<float> x(1000, 1.0f);
    if (rank == 0) {
      try {
        net->send(1, net::MessageType::kParameters, 0, 0, net::as_bytes(x)).wait();
        net->receive(1, net::MessageType::kParameters, 0, 0, 5);
      } catch (const Error&) {
      }
    } else {
      try {
        net->receive(0, net::MessageType::kParameters, 0, 0);
      } catch (const Error& e) {
        receiver_error = e.what();
      }
    }
    net->abort();
  });
  boost::system::error_code ignored;
  middle.close(ignored);
  proxy.join();
  return receiver_error;
}

}  // namespace peertrain::testing
