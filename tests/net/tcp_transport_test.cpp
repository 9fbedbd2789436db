// The transport on loopback, peers as threads: delivery, refusal, loss, timeouts, shaping.
#include "peertrain/net/tcp.h"

#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>
#include <ifaddrs.h>
#include <net/if.h>

#include <utility>  // before Asio: Boost 1.74 needs it

#include <boost/asio.hpp>
#include <atomic>
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <numeric>

#include "../../src/net/handshake.h"
#include "peertrain/core/log.h"
#include "../../src/net/shared_ring.h"
#include "../topology/test_util.h"
#include "middle_proxy.h"
#include "test_support/cluster.h"

namespace peertrain::net {
namespace {

using testing::loopback_endpoints;
using testing::options_for;
using testing::run_peers;

std::vector<float> iota(std::size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(TcpTransport, DeliversByTypeStepAndTagInAnyOrderAndCounts) {
  const auto endpoints = loopback_endpoints(3);
  run_peers(3, [&](int rank) {
    std::vector<int> links;
    for (int p = 0; p < 3; ++p)
      if (p != rank) links.push_back(p);
    auto net_owner = make_tcp_transport(options_for(rank, endpoints, links));
    Transport& net = *net_owner;
    net.connect();
    const auto big = iota(1 << 18, static_cast<float>(rank));  // 1 MiB
    const std::vector<float> one = {static_cast<float>(rank)};
    std::vector<Work> sends;
    for (int peer : links) {
      sends.push_back(net.send(peer, MessageType::kParameters, 7, 0, as_bytes(big)));
      sends.push_back(net.send(peer, MessageType::kParameters, 8, 0, as_bytes(one)));
      sends.push_back(net.send(peer, MessageType::kReduceChunk, 7, 3, {}));
    }
    for (int peer : links) {  // ask in a different order than sent
      EXPECT_TRUE(net.receive(peer, MessageType::kReduceChunk, 7, 3).empty());
      const Payload later = net.receive(peer, MessageType::kParameters, 8, 0);
      ASSERT_EQ(later.size(), 4u);
      EXPECT_EQ(reinterpret_cast<const float*>(later.data())[0], static_cast<float>(peer));
      const Payload first = net.receive(peer, MessageType::kParameters, 7, 0);
      ASSERT_EQ(first.size(), big.size() * 4);
      EXPECT_EQ(reinterpret_cast<const float*>(first.data())[1000], 1000.0f + static_cast<float>(peer));
    }
    for (auto& s : sends) s.wait(20);
    const LinkCounters c = net.total_counters();
    EXPECT_EQ(c.messages_sent, 6u);
    EXPECT_EQ(c.bytes_sent, 2 * (3 * kHeaderBytes + big.size() * 4 + 4));
    net.close();
  });
}

TEST(TcpTransport, PeersMayStartInAnyOrder) {
  const auto endpoints = loopback_endpoints(2);
  run_peers(2, [&](int rank) {
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(700));  // the acceptor is late
    auto net_owner = make_tcp_transport(options_for(rank, endpoints, {1 - rank}));
    Transport& net = *net_owner;
    net.connect();
    net.close();
  });
}

// A non-loopback IPv4 address of this machine, or empty.
std::string network_address() {
  ifaddrs* list = nullptr;
  std::string found;
  if (getifaddrs(&list) != 0) return found;
  for (const ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && !(i->ifa_flags & IFF_LOOPBACK)) {
      char text[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
      found = text;
    }
  freeifaddrs(list);
  return found;
}

TEST(TcpTransport, ListensOnTheTopologysAddressOnly) {
  const std::string outside = network_address();
  if (outside.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 address to dial";
  const auto endpoints = loopback_endpoints(1);
  auto net = make_tcp_transport(options_for(0, endpoints, {}));
  auto dial = [&](const std::string& address) {
    boost::asio::io_context io;
    boost::asio::ip::tcp::socket socket(io);
    boost::system::error_code ec;
    socket.connect({boost::asio::ip::make_address(address), static_cast<unsigned short>(endpoints[0].port)}, ec);
    return !ec;
  };
  EXPECT_TRUE(dial("127.0.0.1"));
  EXPECT_FALSE(dial(outside)) << "a peer the topology puts on 127.0.0.1 accepted a connection at " << outside;
  net->close();
}

TEST(TcpTransport, RefusesAPeerWithAnotherTopologyOrRun) {
  for (const char* what : {"fingerprint", "run id"}) {
    SCOPED_TRACE(what);
    const auto endpoints = loopback_endpoints(2);
    std::string dialer_error, acceptor_error;
    run_peers(2, [&](int rank) {
      auto o = options_for(rank, endpoints, {1 - rank});
      o.connect_timeout_s = 3;
      if (rank == 0 && std::string(what) == "fingerprint") o.fingerprint = 0xbeef;
      if (rank == 0 && std::string(what) == "run id") o.run_id = 7;
      auto net_owner = make_tcp_transport(o);
      Transport& net = *net_owner;
      try {
        net.connect();
      } catch (const Error& e) {
        (rank == 0 ? dialer_error : acceptor_error) = e.what();
      }
    });
    EXPECT_NE(dialer_error.find("refused the connection"), std::string::npos) << dialer_error;
    EXPECT_NE(dialer_error.find(what), std::string::npos) << dialer_error;
    EXPECT_NE(acceptor_error.find("refused peer 0"), std::string::npos) << acceptor_error;
  }
}

TEST(TcpTransport, AVanishedPeerIsNamedNotWaitedFor) {
  const auto endpoints = loopback_endpoints(2);
  std::string error;
  run_peers(2, [&](int rank) {
    auto net_owner = make_tcp_transport(options_for(rank, endpoints, {1 - rank}));
    Transport& net = *net_owner;
    net.connect();
    if (rank == 1) {
      net.abort();  // as if killed
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      net.receive(1, MessageType::kParameters, 0, 0);
    } catch (const Error& e) {
      error = e.what();
      EXPECT_EQ(e.kind(), ErrorKind::kPeerLost);
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));  // well inside the timeout
  });
  EXPECT_NE(error.find("peer 1 (127.0.0.1:"), std::string::npos) << error;
}

// What a centralized run's error lists (PeerRun::train): the crashed peer, not the one that
// finished and said goodbye.
TEST(TcpTransport, LostLinksNameTheCrashedPeersOnly) {
  const auto endpoints = loopback_endpoints(3);
  std::vector<std::string> lost;
  run_peers(3, [&](int rank) {
    std::vector<int> others;
    for (int p = 0; p < 3; ++p)
      if (p != rank) others.push_back(p);
    auto net = make_tcp_transport(options_for(rank, endpoints, others));
    net->connect();
    if (rank == 1) return net->abort();  // as if killed
    if (rank == 2) return net->close();
    EXPECT_THROW(net->receive(1, MessageType::kParameters, 0, 0), Error);
    EXPECT_THROW(net->receive(2, MessageType::kParameters, 0, 0), Error);
    lost = net->lost_links();
  });
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_NE(lost[0].find("peer 1 (127.0.0.1:"), std::string::npos) << lost[0];
}

// A centralized baseline (every_link_needed): peer 0 waits on peer 1, which is alive but
// will never send, because peer 2 is gone; the wait ends at once, naming peer 2.
TEST(TcpTransport, InARunThatNeedsEveryPeerALossEndsEveryWait) {
  const auto endpoints = loopback_endpoints(3);
  std::string error = "no error";
  std::atomic<bool> done{false};
  run_peers(3, [&](int rank) {
    std::vector<int> others;
    for (int p = 0; p < 3; ++p)
      if (p != rank) others.push_back(p);
    auto o = options_for(rank, endpoints, others);
    o.every_link_needed = true;
    o.peer_timeout_s = 10;  // without the option, the wait would end only here, as a timeout
    auto net = make_tcp_transport(o);
    net->connect();
    if (rank == 2) return net->abort();  // as if killed
    if (rank == 1) {
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return net->close();
    }
    try {
      net->receive(1, MessageType::kParameters, 3, 0);
    } catch (const Error& e) {
      error = e.what();
      EXPECT_EQ(e.kind(), ErrorKind::kPeerLost);
    }
    done = true;
  });
  EXPECT_NE(error.find("peer 2 (127.0.0.1:"), std::string::npos) << error;
  EXPECT_NE(error.find("stops waiting for parameters for step 3 from peer 1"), std::string::npos) << error;
}

TEST(TcpTransport, ASilentPeerTimesOut) {
  const auto endpoints = loopback_endpoints(2);
  std::string error;
  run_peers(2, [&](int rank) {
    auto o = options_for(rank, endpoints, {1 - rank});
    o.peer_timeout_s = 0.5;
    auto net_owner = make_tcp_transport(o);
    Transport& net = *net_owner;
    net.connect();
    if (rank == 0) {
      try {
        net.receive(1, MessageType::kParameters, 5, 0);
      } catch (const Error& e) {
        error = e.what();
        EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
      }
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    net.close();
  });
  EXPECT_NE(error.find("peer 1"), std::string::npos) << error;
  EXPECT_NE(error.find("step 5"), std::string::npos) << error;
  // The kernel's view of the link comes with it: nothing unacknowledged and nothing
  // resent, since the peer is up and only silent (a cut cable shows the opposite).
  EXPECT_NE(error.find("(TCP to peer 1 ("), std::string::npos) << error;
  EXPECT_NE(error.find("last data from it"), std::string::npos) << error;
  EXPECT_NE(error.find("unacknowledged segments 0, resent in a row 0,"), std::string::npos) << error;
}

TEST(TcpTransport, LeavingCleanlyIsNotAnError) {
  const auto endpoints = loopback_endpoints(2);
  std::string error;
  run_peers(2, [&](int rank) {
    auto net_owner = make_tcp_transport(options_for(rank, endpoints, {1 - rank}));
    Transport& net = *net_owner;
    net.connect();
    if (rank == 1) return net.close();
    try {
      net.receive(1, MessageType::kParameters, 0, 0);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  EXPECT_NE(error.find("finished"), std::string::npos) << error;
}

TEST(TcpTransport, AStrangerSendingGarbageIsRefusedAndHarmless) {
  const auto endpoints = loopback_endpoints(2);
  run_peers(2, [&](int rank) {
    auto net_owner = make_tcp_transport(options_for(rank, endpoints, {1 - rank}));
    Transport& net = *net_owner;
    if (rank == 1) {
      boost::asio::io_context io;
      boost::asio::ip::tcp::socket stranger(io);
      stranger.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(endpoints[1].port)});
      const std::string junk(200, 'x');
      boost::asio::write(stranger, boost::asio::buffer(junk));
    }
    net.connect();
    const std::vector<float> x = {1.0f, 2.0f};
    auto s = net.send(1 - rank, MessageType::kParameters, 1, 0, as_bytes(x));
    EXPECT_EQ(net.receive(1 - rank, MessageType::kParameters, 1, 0).size(), 8u);
    s.wait(20);
    net.close();
  });
}

TEST(TcpTransport, AnOversizedFrameClosesTheLinkWithoutAllocatingIt) {
  const auto endpoints = loopback_endpoints(2);
  std::string error;
  run_peers(2, [&](int rank) {
    // Peer 1 believes messages are at most 16 bytes; peer 0 sends 400.
    auto net_owner = make_tcp_transport(options_for(rank, endpoints, {1 - rank}, rank == 1 ? 16 : 1 << 20));
    Transport& net = *net_owner;
    net.connect();
    if (rank == 0) {
      const std::vector<float> x(100, 1.0f);
      net.send(1, MessageType::kParameters, 0, 0, as_bytes(x)).wait(20);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      return;
    }
    try {
      net.receive(0, MessageType::kParameters, 0, 0);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  EXPECT_NE(error.find("payload of 400 bytes"), std::string::npos) << error;
}

// A linked peer that sends messages nobody reads (for steps far ahead, or replays) is
// closed once its unread messages pass either cap, and the error names it and the cap.
TEST(TcpTransport, ALinkedPeerFloodingTheMailboxIsClosedAtItsCap) {
  for (const bool by_bytes : {true, false}) {
    const auto endpoints = loopback_endpoints(2);
    std::string error;
    run_peers(2, [&](int rank) {
      TcpOptions options = options_for(rank, endpoints, {1 - rank});
      options.max_unread_bytes = by_bytes ? 4096 : 0;
      options.max_unread_messages = by_bytes ? 0 : 8;
      auto net_owner = make_tcp_transport(std::move(options));
      Transport& net = *net_owner;
      net.connect();
      if (rank == 0) {
        const std::vector<float> x(100, 1.0f);  // 400 bytes each
        for (std::uint64_t step = 1000; step < 1040; ++step) {
          try {
            net.send(1, MessageType::kParameters, step, 0, as_bytes(x)).wait(20);
          } catch (const Error&) {
            break;  // closed by peer 1
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        return;
      }
      try {
        net.receive(0, MessageType::kParameters, 0, 0, 20);
      } catch (const Error& e) {
        error = e.what();
        EXPECT_EQ(e.kind(), ErrorKind::kPeerLost) << error;
      }
    });
    const std::string cap = by_bytes ? "4400 bytes unread (cap 4096)" : "9 messages unread (cap 8)";
    EXPECT_NE(error.find(cap), std::string::npos) << error;
    EXPECT_NE(error.find("peer 0"), std::string::npos) << error;
  }
}

TEST(TcpTransport, BandwidthCapAndLatencyAreEnforcedOnTheSender) {
  const auto endpoints = loopback_endpoints(2);
  run_peers(2, [&](int rank) {
    auto o = options_for(rank, endpoints, {1 - rank});
    o.shaping = [](int) { return LinkShaping{50.0, 80.0}; };  // 50 ms, 80 Mbit/s = 10 MB/s
    auto net_owner = make_tcp_transport(o);
    Transport& net = *net_owner;
    net.connect();
    const std::vector<float> x(1 << 18, 1.0f);  // 1 MiB: ≥ 0.1 s at 10 MB/s, plus 50 ms
    const auto start = std::chrono::steady_clock::now();
    auto s = net.send(1 - rank, MessageType::kParameters, 0, 0, as_bytes(x));
    net.receive(1 - rank, MessageType::kParameters, 0, 0);
    s.wait(20);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // A lower bound only: the emulated link can never be faster than its cap.
    EXPECT_GE(seconds, 0.8 * (0.05 + (1 << 20) / 10e6)) << seconds;
    net.close();
  });
}

// A lone message smaller than a token bucket's usual burst, on a link that has been idle:
// on a real link it still pays its serialization time, and so it does here (the wire clock
// saves nothing up while idle). 16 KiB at 8 Mbit/s: at least 16 ms, each of three times.
TEST(TcpTransport, AnIdleLinkSavesNoBurstForASmallMessage) {
  const auto endpoints = loopback_endpoints(2);
  run_peers(2, [&](int rank) {
    auto o = options_for(rank, endpoints, {1 - rank});
    o.shaping = [](int) { return LinkShaping{0.0, 8.0}; };  // no latency, 1 MB/s
    auto net_owner = make_tcp_transport(o);
    Transport& net = *net_owner;
    net.connect();
    const std::vector<float> x(1 << 12, 1.0f);  // 16 KiB
    for (std::uint64_t round = 0; round < 3; ++round) {
      std::this_thread::sleep_for(std::chrono::milliseconds(60));  // idle: a bucket would refill
      const auto start = std::chrono::steady_clock::now();
      if (rank == 0) {
        net.send(1, MessageType::kParameters, round, 0, as_bytes(x)).wait(20);
        net.receive(1, MessageType::kParameters, round, 1);  // the other's reply ends the round
      } else {
        net.receive(0, MessageType::kParameters, round, 0);
        net.send(0, MessageType::kParameters, round, 1, as_bytes(x)).wait(20);
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (rank == 0) {
        EXPECT_GE(seconds, 0.9 * 2 * (1 << 14) / 1e6) << "round " << round << ": " << seconds;
      }
    }
    net.close();
  });
}

TEST(TcpTransport, ANodeCapIsSharedByAllLinks) {
  const auto endpoints = loopback_endpoints(3);
  run_peers(3, [&](int rank) {
    std::vector<int> links;
    for (int p = 0; p < 3; ++p)
      if (p != rank) links.push_back(p);
    auto o = options_for(rank, endpoints, links);
    if (rank == 0) o.node_bandwidth_mbps = 80.0;  // 10 MB/s for both links together
    auto net_owner = make_tcp_transport(o);
    Transport& net = *net_owner;
    net.connect();
    const std::vector<float> x(1 << 18, 1.0f);  // 1 MiB to each of two peers
    if (rank == 0) {
      const auto start = std::chrono::steady_clock::now();
      auto a = net.send(1, MessageType::kParameters, 0, 0, as_bytes(x));
      auto b = net.send(2, MessageType::kParameters, 0, 0, as_bytes(x));
      a.wait(20);
      b.wait(20);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_GE(seconds, 0.8 * 2 * (1 << 20) / 10e6) << seconds;  // a lower bound: the card is shared
    } else {
      net.receive(0, MessageType::kParameters, 0, 0);
    }
    net.close();
  });
}

// The receiving side's card: two senders with no cap of their own share peer 0's
// node_ingress_mbps, so both messages together take at least their bytes at that rate.
TEST(TcpTransport, AnIngressCapIsSharedByAllIncomingLinks) {
  const auto endpoints = loopback_endpoints(3);
  run_peers(3, [&](int rank) {
    std::vector<int> links;
    for (int p = 0; p < 3; ++p)
      if (p != rank) links.push_back(p);
    auto o = options_for(rank, endpoints, links);
    if (rank == 0) o.node_ingress_mbps = 80.0;  // 10 MB/s for both links together
    auto net_owner = make_tcp_transport(o);
    Transport& net = *net_owner;
    // The clock starts before rank 0 connects: its I/O thread reads (shaped) from the first
    // link that is up while connect() still waits for the other, and the peers send as soon
    // as they are connected, so a clock started after connect() misses part of the transfer.
    const auto start = std::chrono::steady_clock::now();
    net.connect();
    std::vector<float> x(1 << 18);  // 1 MiB from each of two peers
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(rank * 1000 + static_cast<int>(i % 997));
    if (rank == 0) {
      const Payload a = net.receive(1, MessageType::kParameters, 0, 0);
      const Payload b = net.receive(2, MessageType::kParameters, 0, 0);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_GE(seconds, 0.8 * 2 * (1 << 20) / 10e6) << seconds;  // a lower bound: the card is shared
      // and the bytes arrive whole and in order, piece after piece
      ASSERT_EQ(a.size(), 1u << 20);
      ASSERT_EQ(b.size(), 1u << 20);
      const auto* fa = reinterpret_cast<const float*>(a.data());
      const auto* fb = reinterpret_cast<const float*>(b.data());
      for (std::size_t i = 0; i < x.size(); i += 4099) {
        EXPECT_EQ(fa[i], static_cast<float>(1000 + static_cast<int>(i % 997)));
        EXPECT_EQ(fb[i], static_cast<float>(2000 + static_cast<int>(i % 997)));
      }
    } else {
      net.send(0, MessageType::kParameters, 0, 0, as_bytes(x)).wait(20);
    }
    net.close();
  });
}

// A key of 32 bytes made from a label, so that two tests' keys differ when their labels do.
Secret secret_of(const std::string& text) {
  std::vector<std::uint8_t> key(kSecretBytes);
  for (std::size_t i = 0; i < key.size(); ++i) key[i] = static_cast<std::uint8_t>(text[i % text.size()] + i);
  return Secret::from_bytes(key);
}

TEST(TcpTransport, PeersWithTheSameSecretAuthenticateAndTalk) {
  const auto endpoints = loopback_endpoints(2);
  run_peers(2, [&](int rank) {
    auto o = options_for(rank, endpoints, {1 - rank});
    o.secret = secret_of("0123456789abcdef-shared");
    auto net_owner = make_tcp_transport(o);
    Transport& net = *net_owner;
    net.connect();
    const std::vector<float> x(1000, static_cast<float>(rank));
    for (std::uint64_t step = 0; step < 3; ++step) {
      auto s = net.send(1 - rank, MessageType::kParameters, step, 0, as_bytes(x));
      const Payload got = net.receive(1 - rank, MessageType::kParameters, step, 0);
      EXPECT_EQ(reinterpret_cast<const float*>(got.data())[999], static_cast<float>(1 - rank));
      s.wait(20);
    }
    net.close();
  });
}

TEST(TcpTransport, AProcessWithoutTheKeyCannotJoin) {
  for (const char* case_name : {"other key", "no key"}) {
    SCOPED_TRACE(case_name);
    const auto endpoints = loopback_endpoints(2);
    std::string dialer_error, acceptor_error;
    run_peers(2, [&](int rank) {
      auto o = options_for(rank, endpoints, {1 - rank});
      o.connect_timeout_s = 3;
      if (rank == 1) o.secret = secret_of("0123456789abcdef-shared");
      if (rank == 0 && std::string(case_name) == "other key") o.secret = secret_of("fedcba9876543210-wrong!");
      auto net_owner = make_tcp_transport(o);
      Transport& net = *net_owner;
      try {
        net.connect();
      } catch (const Error& e) {
        (rank == 0 ? dialer_error : acceptor_error) = e.what();
      }
    });
    if (std::string(case_name) == "other key") {
      EXPECT_NE(dialer_error.find("failed authentication"), std::string::npos) << dialer_error;
    } else {
      EXPECT_NE(dialer_error.find("we require --secret-file"), std::string::npos) << dialer_error;
    }
    EXPECT_NE(acceptor_error.find("could not connect"), std::string::npos) << acceptor_error;
  }
}

// A restarted peer comes back on a link its neighbour dropped: refused ("not yet") while
// the neighbour still counts it in, accepted after drop(), in either dialing direction;
// what the old process left in the mailbox is discarded, so the new one's messages of
// the same steps are not taken for duplicates.
TEST(TcpTransport, ADroppedPeerCanRejoinWithAFreshLink) {
  // Small payloads, and large ones, which go through the shared-memory rings: the rejoined
  // process's connection gets rings of its own (docs/net.md).
  for (const auto& variant : {std::pair{false, 16}, std::pair{true, 16}, std::pair{false, 100'000}}) {
    // Named copies, not a structured binding: the lambdas below capture them, which
    // the sanitized build's clang refuses for bindings.
    const bool keyed = variant.first;
    const int floats = variant.second;
    SCOPED_TRACE(str(keyed ? "with --secret-file" : "without a key", ", ", floats, " floats"));
    const auto endpoints = loopback_endpoints(2);
    std::promise<void> old_may_die;
    auto may_die = old_may_die.get_future();
    std::atomic<bool> dropped{false};
    std::vector<float> got;
    run_peers(2, [&](int rank) {
      auto o = options_for(rank, endpoints, {1 - rank});
      if (keyed) o.secret = secret_of("0123456789abcdef-shared");
      if (rank == 0) {
        auto net_owner = make_tcp_transport(o);
        Transport& net = *net_owner;
        net.connect();
        net.receive(1, MessageType::kParameters, 6, 0);  // step 5 is now waiting in the mailbox
        old_may_die.set_value();
        EXPECT_THROW(net.receive(1, MessageType::kParameters, 7, 0), Error);
        EXPECT_FALSE(net.alive(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the new process is knocking
        dropped = true;
        net.drop(1, "test: peer 1 is lost");
        for (int i = 0; i < 100 && !net.alive(1); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        const Payload fresh = net.receive(1, MessageType::kParameters, 5, 0);
        got.resize(fresh.size() / sizeof(float));
        std::memcpy(got.data(), fresh.data(), fresh.size());
        EXPECT_TRUE(net.alive(1));
        EXPECT_EQ(net.rejoins(1), 1);
        net.readmit(1);
        const auto reply = iota(4, 9);
        net.send(1, MessageType::kParameters, 8, 0, as_bytes(reply)).wait(20);
        net.receive(1, MessageType::kReport, 8, 0);  // it got our reply before we close
        net.close();
        return;
      }
      {
        auto old_owner = make_tcp_transport(o);
        Transport& old = *old_owner;
        old.connect();
        const auto stale = iota(static_cast<std::size_t>(floats), 100);
        old.send(0, MessageType::kParameters, 5, 0, as_bytes(stale)).wait(20);
        old.send(0, MessageType::kParameters, 6, 0, as_bytes(stale)).wait(20);
        may_die.wait();
        old.abort();  // killed
      }
      o.rejoin = true;
      auto again_owner = make_tcp_transport(o);
      Transport& again = *again_owner;
      const auto start = std::chrono::steady_clock::now();
      again.connect();
      EXPECT_TRUE(dropped.load()) << "accepted before peer 0 dropped the old link";
      EXPECT_GT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
      const auto fresh = iota(static_cast<std::size_t>(floats), 500);
      again.send(0, MessageType::kParameters, 5, 0, as_bytes(fresh)).wait(20);
      if (fresh.size() * sizeof(float) >= kSharedMinBytes) {
        EXPECT_EQ(again.counters(0).messages_shared, 1u) << "the fresh link did not get a ring of its own";
      }
      const Payload reply = again.receive(0, MessageType::kParameters, 8, 0);
      EXPECT_EQ(reply.size(), 4 * sizeof(float));
      again.send(0, MessageType::kReport, 8, 0, {}).wait(20);
      again.close();
    });
    ASSERT_EQ(got.size(), static_cast<std::size_t>(floats));
    EXPECT_EQ(got[0], 500.0f) << "the old process's message of step 5 was delivered instead of the new one's";
    EXPECT_EQ(got.back(), 500.0f + static_cast<float>(floats - 1));
  }
}

// A peer that rejoins while another peer of the run is gone (nobody listens on its port)
// goes on without it once every dial to it has been refused for a few seconds, instead of
// waiting out --connect-timeout; the gone peer's link is dead and named. Without --rejoin
// the same absence is waited for and named at the connect deadline.
TEST(TcpTransport, ARejoiningPeerGoesOnWithoutAProcessThatIsGone) {
  const auto endpoints = loopback_endpoints(3);  // nobody ever listens as peer 2
  std::promise<void> old_may_die;
  auto may_die = old_may_die.get_future();
  run_peers(2, [&](int rank) {
    if (rank == 0) {
      auto net = make_tcp_transport(options_for(0, endpoints, {1}));
      net->connect();
      net->receive(1, MessageType::kParameters, 1, 0);
      old_may_die.set_value();
      EXPECT_THROW(net->receive(1, MessageType::kParameters, 2, 0), Error);
      net->drop(1, "test: peer 1 is lost");
      for (int i = 0; i < 300 && !net->alive(1); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const Payload fresh = net->receive(1, MessageType::kParameters, 3, 0);
      EXPECT_EQ(fresh.size(), 8 * sizeof(float));
      net->send(1, MessageType::kReport, 3, 0, {}).wait(20);
      net->receive(1, MessageType::kReport, 4, 0);  // it got our reply before we close
      net->close();
      return;
    }
    {
      auto old = make_tcp_transport(options_for(1, endpoints, {0}));
      old->connect();
      const auto x = iota(8, 0);
      old->send(0, MessageType::kParameters, 1, 0, as_bytes(x)).wait(20);
      may_die.wait();
      old->abort();  // killed
    }
    auto o = options_for(1, endpoints, {0, 2});
    o.rejoin = true;
    auto again = make_tcp_transport(o);
    const auto start = std::chrono::steady_clock::now();
    again->connect();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15)) << "waited for the gone peer";
    EXPECT_TRUE(again->alive(0));
    EXPECT_FALSE(again->alive(2));
    try {
      again->receive(2, MessageType::kParameters, 3, 0, 1);
      ADD_FAILURE() << "received from a peer that never existed";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kPeerLost);
      EXPECT_NE(std::string(e.what()).find("nobody listens at peer 2"), std::string::npos) << e.what();
    }
    const auto x = iota(8, 10);
    again->send(0, MessageType::kParameters, 3, 0, as_bytes(x)).wait(20);
    again->receive(0, MessageType::kReport, 3, 0);
    again->send(0, MessageType::kReport, 4, 0, {}).wait(20);
    again->close();
  });
  // Not rejoining: peer 2's absence is an error at the deadline, naming it.
  auto o = options_for(1, endpoints, {2});
  o.connect_timeout_s = 4;
  auto fresh = make_tcp_transport(o);
  try {
    fresh->connect();
    ADD_FAILURE() << "connected to a peer that never existed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
    EXPECT_NE(std::string(e.what()).find("could not connect to peer 2"), std::string::npos) << e.what();
  }
}

// A peer restarted without --rejoin into a run under way is refused with the way out.
TEST(TcpTransport, ARestartWithoutRejoinIsRefusedNamingTheFlag) {
  const auto endpoints = loopback_endpoints(2);
  std::promise<void> old_dead;
  auto dead = old_dead.get_future();
  std::string error;
  run_peers(2, [&](int rank) {
    auto o = options_for(rank, endpoints, {1 - rank});
    if (rank == 1) {
      auto net_owner = make_tcp_transport(o);
      Transport& net = *net_owner;
      net.connect();
      EXPECT_THROW(net.receive(0, MessageType::kParameters, 0, 0), Error);
      net.drop(0, "test: peer 0 is lost");
      old_dead.set_value();
      std::this_thread::sleep_for(std::chrono::seconds(3));
      net.close();
      return;
    }
    {
      auto old_owner = make_tcp_transport(o);
      Transport& old = *old_owner;
      old.connect();
      old.abort();
    }
    dead.wait();
    o.connect_timeout_s = 2;
    auto again_owner = make_tcp_transport(o);
    Transport& again = *again_owner;
    try {
      again.connect();
    } catch (const Error& e) {
      error = e.what();
    }
  });
  EXPECT_NE(error.find("restart it with --rejoin"), std::string::npos) << error;
}

// --- a peer that misbehaves on purpose ------------------------------------------------

// Writes a handshake frame (checksummed, never authenticated) as a peer would.
void write_handshake_frame(boost::asio::ip::tcp::socket& socket, MessageType type, std::uint32_t sender,
                           const Payload& payload) {
  FrameHeader h;
  h.type = type;
  h.sender = sender;
  h.length = payload.size();
  h.checksum = frame_checksum(h, checksum_payload(payload));
  const HeaderBytes out = encode_header(h);
  boost::asio::write(socket, boost::asio::buffer(out));
  boost::asio::write(socket, boost::asio::buffer(payload));
}


// Plays peer `self` on its port: accepts one connection, answers the hello (accepted, no
// key) when `answer` is set, and then reads nothing more until `release` is set.
class FakePeer {
 public:
  FakePeer(const Endpoint& at, std::uint32_t self, bool answer)
      : acceptor_(io_, {boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(at.port)}) {
    thread_ = std::thread([this, self, answer] {
      boost::asio::ip::tcp::socket socket(io_);
      acceptor_.accept(socket);
      HeaderBytes header;
      std::array<std::byte, 64> hello;
      boost::asio::read(socket, boost::asio::buffer(header));
      boost::asio::read(socket, boost::asio::buffer(hello));
      if (answer) {
        write_handshake_frame(socket, MessageType::kHelloReply, self, Payload(4));  // status 0: accepted
        // Then, as a peer on loopback does, its ring offer (none) and its answer to ours
        // (declined, which needs no reading): the dialer's connect() waits for both.
        write_handshake_frame(socket, MessageType::kRingOffer, self, Payload(SharedRing::Offer::kBytes));
        write_handshake_frame(socket, MessageType::kRingAccept, self, Payload(8));
      }
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return released_; });  // a stopped process: reads nothing
    });
  }
  ~FakePeer() {
    {
      std::lock_guard lock(mutex_);
      released_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool released_ = false;
  std::thread thread_;
};

// A ring offer names a file of the offering process (/proc/PID/fd/FD); on a link that is
// not loopback the offer cannot be for this host, and opening it would let a remote peer
// make this process open a file of its choosing: it is declined unread (answer 0).
TEST(TcpTransport, ARingOfferIsTakenOnlyOverLoopback) {
  const std::string outside = network_address();
  if (outside.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 address";
  auto endpoints = loopback_endpoints(2);
  for (auto& e : endpoints) e.host = outside;
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor acceptor(
      io, {boost::asio::ip::make_address(outside), static_cast<unsigned short>(endpoints[1].port)});
  std::uint64_t answered = 1;
  std::thread fake([&] {  // peer 1, offering a real ring of this process
    boost::asio::ip::tcp::socket socket(io);
    acceptor.accept(socket);
    HeaderBytes header;
    std::array<std::byte, 64> hello;
    boost::asio::read(socket, boost::asio::buffer(header));
    boost::asio::read(socket, boost::asio::buffer(hello));
    write_handshake_frame(socket, MessageType::kHelloReply, 1, Payload(4));  // accepted
    const auto ring = SharedRing::create(1 << 20);
    const auto offer = ring->offer().encode();
    write_handshake_frame(socket, MessageType::kRingOffer, 1, Payload(offer.begin(), offer.end()));
    for (;;) {  // the dialer's own offer (none: not loopback), then its answer to ours
      boost::asio::read(socket, boost::asio::buffer(header));
      const FrameHeader h = decode_header(header, {0, 1 << 20, "peer 0", false});
      Payload payload(h.length);
      boost::asio::read(socket, boost::asio::buffer(payload));
      if (h.type == MessageType::kRingAccept) {
        std::memcpy(&answered, payload.data(), sizeof answered);
        return;
      }
    }
  });
  auto net = make_tcp_transport(options_for(0, endpoints, {1}));
  net->connect();
  fake.join();
  EXPECT_EQ(answered, 0u) << "the ring offered over " << outside << " was mapped";
  net->close();
}

// A send that times out against a receiver that stopped reading must leave nothing that
// reads the caller's buffer afterwards: the link is failed on the I/O thread before the
// error comes back. Freeing the buffer at once is then safe (checked under ASan by the
// sanitizer run), and the link is reported dead.
TEST(TcpTransport, ASendThatTimesOutLetsGoOfItsBytesBeforeTheCallerHears) {
  const auto endpoints = loopback_endpoints(2);
  FakePeer stalled(endpoints[1], 1, /*answer=*/true);
  auto o = options_for(0, endpoints, {1}, 64u << 20);
  auto net_owner = make_tcp_transport(o);
  Transport& net = *net_owner;
  net.connect();
  for (bool owned : {false, true}) {
    // More than the kernel's socket buffers hold on both ends: the write cannot finish.
    auto bytes = std::make_unique<Payload>(48u << 20, std::byte{7});
    std::string error;
    ErrorKind kind = ErrorKind::kInternal;
    {
      Work send = owned ? net.send(1, MessageType::kParameters, 3, 0, std::move(*bytes))
                        : net.send(1, MessageType::kParameters, 3, 0, *bytes);
      try {
        send.wait(0.5);
      } catch (const Error& e) {
        error = e.what();
        kind = e.kind();
      }
    }
    bytes.reset();  // freed at once: the I/O thread must not read it any more
    if (!owned) {
      EXPECT_EQ(kind, ErrorKind::kTimeout) << error;
      EXPECT_NE(error.find("did not finish in time"), std::string::npos) << error;
      EXPECT_NE(error.find("peer 1"), std::string::npos) << error;
    } else {
      EXPECT_EQ(kind, ErrorKind::kPeerLost) << error;  // the link died with the first send
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(net.alive(1));
  }
}

// A send that times out while the I/O thread is busy (here: blocked writing a log line
// into a full pipe) is not given up on after a few seconds: wait() returns only once the
// I/O thread has ended the send, however long that takes, so the caller never frees bytes
// the thread may still write from.
TEST(TcpTransport, ATimedOutSendWaitsForABusyIoThreadToLetGoOfItsBytes) {
  const auto endpoints = loopback_endpoints(2);
  FakePeer stalled(endpoints[1], 1, /*answer=*/true);
  auto net_owner = make_tcp_transport(options_for(0, endpoints, {1}, 64u << 20));
  Transport& net = *net_owner;
  net.connect();
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::fcntl(fds[1], F_SETFL, O_NONBLOCK);  // fill the pipe to the last byte
  const std::vector<char> fill(4096, 'x');
  while (::write(fds[1], fill.data(), fill.size()) > 0) {
  }
  while (::write(fds[1], fill.data(), 1) > 0) {
  }
  ::fcntl(fds[1], F_SETFL, 0);
  std::FILE* out = ::fdopen(fds[1], "w");
  ASSERT_NE(out, nullptr);
  std::setvbuf(out, nullptr, _IONBF, 0);
  log::set_output(out);
  // A stranger's garbage: the I/O thread refuses it and blocks writing that line.
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket stranger(io);
  stranger.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(endpoints[0].port)});
  boost::asio::write(stranger, boost::asio::buffer(std::string(kHeaderBytes, 'x')));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::atomic<bool> draining{false};
  std::thread drain([&] {
    std::this_thread::sleep_for(std::chrono::seconds(7));  // past the 5 s an early cancel gave up after
    draining = true;
    std::vector<char> sink(65536);
    while (::read(fds[0], sink.data(), sink.size()) > 0) {
    }
  });
  auto bytes = std::make_unique<Payload>(48u << 20, std::byte{7});
  ErrorKind kind = ErrorKind::kInternal;
  try {
    net.send(1, MessageType::kParameters, 3, 0, *bytes).wait(0.5);
  } catch (const Error& e) {
    kind = e.kind();
  }
  const bool after_the_thread_ran = draining;
  bytes.reset();
  log::set_output(nullptr);
  std::fclose(out);
  drain.join();
  ::close(fds[0]);
  EXPECT_EQ(kind, ErrorKind::kTimeout);
  EXPECT_TRUE(after_the_thread_ran) << "wait() returned while the I/O thread was still blocked";
}

// A Work dropped without wait() waits for its send (bounded), so an exception that
// unwinds past a send cannot leave the I/O thread reading a freed buffer either.
TEST(TcpTransport, AnUnwaitedSendIsFinishedBeforeItsHandleGoes) {
  const auto endpoints = loopback_endpoints(2);
  FakePeer stalled(endpoints[1], 1, /*answer=*/true);
  auto o = options_for(0, endpoints, {1}, 64u << 20);
  o.peer_timeout_s = 0.5;
  auto net_owner = make_tcp_transport(o);
  net_owner->connect();
  auto bytes = std::make_unique<Payload>(48u << 20, std::byte{9});
  const auto start = std::chrono::steady_clock::now();
  { Work forgotten = net_owner->send(1, MessageType::kParameters, 1, 0, *bytes); }
  bytes.reset();
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.4);
  EXPECT_FALSE(net_owner->alive(1));
}

// The dialing side of the handshake has a time-out too: an acceptor that takes the
// connection and says nothing costs one time-out per try, and connect() ends with the
// reason instead of hanging.
TEST(TcpTransport, ASilentAcceptorIsNamedNotWaitedForeverByTheDialer) {
  const auto endpoints = loopback_endpoints(2);
  FakePeer silent(endpoints[1], 1, /*answer=*/false);
  auto o = options_for(0, endpoints, {1});
  o.connect_timeout_s = kHandshakeTimeoutS + 2;
  auto net_owner = make_tcp_transport(o);
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    net_owner->connect();
  } catch (const Error& e) {
    error = e.what();
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(error.find("could not connect to peer 1"), std::string::npos) << error;
  EXPECT_NE(error.find("handshake with peer 1"), std::string::npos) << error;
  EXPECT_LT(took, o.connect_timeout_s + 5);
}

// Strangers who open many idle connections take at most kMaxPendingPerAddress handshake
// slots; the rest are closed at once, said so in a rate-limited line, and the peers still
// connect and talk.
TEST(TcpTransport, IdleStrangersAreCappedAndThePeersStillConnect) {
  const auto endpoints = loopback_endpoints(2);
  boost::asio::io_context io;
  std::vector<boost::asio::ip::tcp::socket> strangers;
  ::testing::internal::CaptureStderr();
  run_peers(2, [&](int rank) {
    auto net_owner = make_tcp_transport(options_for(rank, endpoints, {1 - rank}));
    Transport& net = *net_owner;
    if (rank == 1) {
      for (int i = 0; i < 300; ++i) {
        strangers.emplace_back(io);
        strangers.back().connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(endpoints[1].port)});
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let them be accepted first
    }
    net.connect();
    const std::vector<float> x = {1.0f, 2.0f, 3.0f};
    auto s = net.send(1 - rank, MessageType::kParameters, 1, 0, as_bytes(x));
    EXPECT_EQ(net.receive(1 - rank, MessageType::kParameters, 1, 0).size(), 12u);
    s.wait(20);
    net.close();
  });
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("refused strangers: too many handshakes open from 127.0.0.1"), std::string::npos) << log;
  // One line per ten seconds, not one per connection.
  std::size_t lines = 0;
  for (std::size_t at = log.find("refused strangers"); at != std::string::npos; at = log.find("refused strangers", at + 1))
    ++lines;
  EXPECT_LE(lines, 2u) << log;
}

}  // namespace
}  // namespace peertrain::net

namespace peertrain::net {
namespace {

// A dialer that claims to be peer 0 and holds another key: its hello is answered, its
// proof is not, and the accepting side names the refusal (who, from where, why).
TEST(TcpTransport, ADialerWithTheWrongKeyIsRefusedAndNamedByTheAcceptor) {
  const auto endpoints = testing::loopback_endpoints(2);
  std::string acceptor_error;
  std::thread acceptor([&] {
    auto o = testing::options_for(1, endpoints, {0});
    o.secret = secret_of("0123456789abcdef-shared");
    o.connect_timeout_s = 3;
    auto net = make_tcp_transport(o);
    try {
      net->connect();
    } catch (const Error& e) {
      acceptor_error = e.what();
    }
  });
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket socket(io);
  for (int tries = 0; tries < 100; ++tries) {  // until the acceptor listens
    boost::system::error_code ec;
    socket.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(endpoints[1].port)}, ec);
    if (!ec) break;
    socket.close();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  handshake::Hello hello;
  hello.peer = 0;
  hello.target = 1;
  hello.fingerprint = 0xfeed;
  hello.run_id = 42;
  hello.flags = handshake::kFlagAuthenticated;
  hello.nonce = random_nonce();
  write_handshake_frame(socket, MessageType::kHello, 0, handshake::encode_hello(hello));
  HeaderBytes header;
  boost::asio::read(socket, boost::asio::buffer(header));
  const FrameHeader h = decode_header(header, {1, handshake::kMaxReplyBytes, "the acceptor"});
  Payload reply(h.length);
  boost::asio::read(socket, boost::asio::buffer(reply));
  EXPECT_EQ(handshake::decode_reply(reply, "the acceptor").status, handshake::ReplyStatus::kAccepted);
  write_handshake_frame(socket, MessageType::kHelloProof, 0, Payload(kProofBytes, std::byte{0x5a}));  // not our key's
  acceptor.join();
  EXPECT_NE(acceptor_error.find("refused peer 0 from 127.0.0.1"), std::string::npos) << acceptor_error;
  EXPECT_NE(acceptor_error.find("authentication failed"), std::string::npos) << acceptor_error;
}

// A man in the middle flips one bit of a parameters frame on an established,
// authenticated link: the receiver rejects the frame, names the sender and the frame, and
// closes the link; nothing tampered is delivered.
TEST(TcpTransport, ATamperedFrameOnAnAuthenticatedLinkIsRejectedAndNamed) {
  const std::string receiver_error = testing::receiver_error_through_proxy(
      [](std::vector<std::byte>& held, long long offset) -> std::size_t {
        constexpr long long kFlipAt = 3000;  // past the handshake, inside the first parameters frame
        if (kFlipAt >= offset && kFlipAt < offset + static_cast<long long>(held.size()))
          held[static_cast<std::size_t>(kFlipAt - offset)] ^= std::byte{1};
        return 0;
      },
      [](int, TcpOptions& o) { o.secret = secret_of("0123456789abcdef-shared"); });
  EXPECT_NE(receiver_error.find("bad frame from peer 0"), std::string::npos) << receiver_error;
  EXPECT_NE(receiver_error.find("authentication failed on a parameters frame for step 0"), std::string::npos)
      << receiver_error;
}

}  // namespace
}  // namespace peertrain::net
