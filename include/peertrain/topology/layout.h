// Where to draw each peer: a spectral layout from W's eigenvectors (Koren 2005, "Drawing
// graphs by eigenvectors"). The eigenvectors of the two largest eigenvalues below 1 are
// the smoothest non-constant functions on the graph, so neighbours land close together: a
// ring comes out as a circle, a torus as a torus' shadow, and clusters as clusters. Where
// they do not separate the peers (a complete graph, whose W has one repeated eigenvalue),
// the peers go on a circle in rank order instead.
#pragma once

#include <array>
#include <vector>

#include "peertrain/topology/topology.h"

namespace peertrain::topology {

// One (x, y) per peer, both in [-1, 1]. Dense eigensolver up to max_dense peers; larger
// graphs get the circle.
std::vector<std::array<double, 2>> spectral_layout(const Topology& topology, int max_dense = 1500);

}  // namespace peertrain::topology
