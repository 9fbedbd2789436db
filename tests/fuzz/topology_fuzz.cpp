// libFuzzer target: the topology parsers must turn any input into a Topology or a
// peertrain::Error, never a crash, a hang or an unbounded allocation.
#include <cstddef>
#include <cstdint>
#include <string>

#include "peertrain/core/error.h"
#include "peertrain/topology/formats.h"
#include "peertrain/topology/topology.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 1 << 16) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  using namespace peertrain::topology;
  try {
    // A small peer bound keeps every accepted input fast; the bound itself is tested.
    Topology t = parse_topology(text, "fuzz.yaml", "/nonexistent", 512);
    (void)t.fingerprint();
    (void)to_yaml(t);
  } catch (const peertrain::Error&) {
  }
  try {
    parse_edge_list(text, "fuzz.txt").to_graph("fuzz.txt");
  } catch (const peertrain::Error&) {
  }
  try {
    parse_matrix_market(text, "fuzz.mtx");
  } catch (const peertrain::Error&) {
  }
  return 0;
}
