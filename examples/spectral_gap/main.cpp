// Reads a topology file and prints the spectral gap of its mixing matrix W, using the
// installed peertrain package (peertrain::topology).
#include <cstdio>
#include <exception>

#include "peertrain/topology/spectrum.h"
#include "peertrain/topology/topology.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s TOPOLOGY.yaml\n", argv[0]);
    return 2;
  }
  try {
    const peertrain::topology::Topology t = peertrain::topology::load_topology_file(argv[1]);
    const peertrain::topology::Spectrum s = peertrain::topology::analyze_spectrum(t.mixing, t.graph);
    std::printf("%s: %d peers, spectral gap %.6f (lambda2 %.6f, %s)\n", t.name.c_str(), t.num_peers(), s.spectral_gap,
                s.lambda2, s.solver.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
