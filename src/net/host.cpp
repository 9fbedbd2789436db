// A peer runs on this machine when its host resolves to one of this machine's interface
// addresses. Comparing names alone misses the common case of a run across machines, where
// every host is given by its address (10.0.0.1) and `launch` runs on each of them.
#include "peertrain/net/host.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace peertrain::net {
namespace {

// An address as comparable bytes: the family, then the IPv4 or IPv6 address. IPv4 mapped
// into IPv6 compares as IPv4.
std::string address_key(const sockaddr* address) {
  if (address == nullptr) return {};
  if (address->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(address);
    return std::string("4") + std::string(reinterpret_cast<const char*>(&v4->sin_addr), sizeof v4->sin_addr);
  }
  if (address->sa_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(address);
    if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr))
      return std::string("4") + std::string(reinterpret_cast<const char*>(&v6->sin6_addr) + 12, 4);
    return std::string("6") + std::string(reinterpret_cast<const char*>(&v6->sin6_addr), sizeof v6->sin6_addr);
  }
  return {};
}

bool is_loopback(const sockaddr* address) {
  if (address->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr) >> 24) == 127;
  if (address->sa_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&a) || (IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127);
  }
  return false;
}

std::vector<std::string> interface_addresses() {
  std::vector<std::string> keys;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return keys;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    auto key = address_key(i->ifa_addr);
    if (!key.empty()) keys.push_back(std::move(key));
  }
  freeifaddrs(list);
  return keys;
}

}  // namespace

namespace {

// Numeric form of an address (inet_ntop), or empty.
std::string numeric(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text, sizeof text);
  else if (address->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, text, sizeof text);
  return text;
}

using Resolved = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;
Resolved resolve(const std::string& host, int family) {
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  if (host.empty() || getaddrinfo(host.c_str(), nullptr, &hints, &resolved) != 0) return {nullptr, freeaddrinfo};
  return {resolved, freeaddrinfo};
}

}  // namespace

std::string listen_address(const std::string& host) {
  if (host == "0.0.0.0" || host == "::") return "0.0.0.0";
  if (host == "localhost") return "127.0.0.1";
  const Resolved resolved = resolve(host, AF_INET);  // the transport listens on IPv4
  if (!resolved) return host;
  const auto local = interface_addresses();
  auto is_mine = [&](const sockaddr* a) {
    const auto key = address_key(a);
    for (const auto& m : local)
      if (key == m) return true;
    return false;
  };
  bool all_loopback = true;
  for (const addrinfo* a = resolved.get(); a != nullptr; a = a->ai_next)
    if (!is_loopback(a->ai_addr)) {
      all_loopback = false;
      if (is_mine(a->ai_addr)) return numeric(a->ai_addr);
    }
  char name[256] = {};
  if (all_loopback && gethostname(name, sizeof name - 1) == 0 && host == name && host != numeric(resolved->ai_addr))
    return "0.0.0.0";
  return all_loopback ? numeric(resolved->ai_addr) : host;
}

bool loopback_only(const std::string& host) {
  if (host == "localhost") return true;
  const Resolved resolved = resolve(host, AF_UNSPEC);
  if (!resolved) return false;
  for (const addrinfo* a = resolved.get(); a != nullptr; a = a->ai_next)
    if (!is_loopback(a->ai_addr)) return false;
  return true;
}

bool names_this_machine(const std::string& host) {
  if (host.empty()) return false;
  if (host == "localhost" || host == "0.0.0.0" || host == "::") return true;
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0 && host == name) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &resolved) != 0) return false;
  const std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owner(resolved, freeaddrinfo);
  const auto local = interface_addresses();
  for (const addrinfo* a = resolved; a != nullptr; a = a->ai_next) {
    if (is_loopback(a->ai_addr)) return true;
    const auto key = address_key(a->ai_addr);
    for (const auto& mine : local)
      if (!key.empty() && key == mine) return true;
  }
  return false;
}

}  // namespace peertrain::net
