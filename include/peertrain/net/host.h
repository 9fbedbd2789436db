// Which host names in a topology file stand for this machine.
#pragma once

#include <string>

namespace peertrain::net {

// True when `host` (a name or an address, as a topology file's peers give it) reaches this
// machine: a loopback address, this machine's host name, or a name or address that resolves
// to an address of one of this machine's network interfaces. A name that does not resolve
// is not this machine.
bool names_this_machine(const std::string& host);

}  // namespace peertrain::net
