// The measure every serial-twin test compares by: ‖got − want‖ / ‖want‖, summed in double.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>

namespace peertrain {

// Where `want` is all zero (one key per query makes dq and dk exactly zero; a ReLU can zero
// a small C) it is the absolute error. Sizes that differ are an infinite error.
template <typename A, typename B>
double normalized_error(const A& got, const B& want) {
  const auto n = static_cast<std::size_t>(want.size());
  if (static_cast<std::size_t>(got.size()) != n) return std::numeric_limits<double>::infinity();
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i];
    diff += (g - w) * (g - w);
    norm += w * w;
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

}  // namespace peertrain
