// Which host names in a topology file stand for this machine.
#pragma once

#include <string>

namespace peertrain::net {

// True when `host` (a name or an address, as a topology file's peers give it) reaches this
// machine: a loopback address, this machine's host name, or a name or address that resolves
// to an address of one of this machine's network interfaces. A name that does not resolve
// is not this machine.
bool names_this_machine(const std::string& host);

// The address a peer listens on for `host`, numeric: the address itself; 127.0.0.1 for
// localhost; 0.0.0.0 (every interface) only for 0.0.0.0, ::, or a name of this machine
// that resolves to loopback alone (Debian maps the host name to 127.0.1.1) and so names
// no interface another host could dial; else the first address `host` resolves to that is
// one of this machine's interfaces (a non-loopback one first). A host that resolves to
// none of them is returned as given, and binding it fails with an error naming it.
std::string listen_address(const std::string& host);

// True when `host` resolves to loopback addresses only: nobody on another machine can
// reach a peer listening there.
bool loopback_only(const std::string& host);

}  // namespace peertrain::net
