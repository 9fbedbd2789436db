// The measure every serial-twin test compares by: ‖got − want‖ / ‖want‖, summed in double.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>

namespace peertrain {

namespace normalized_error_detail {
struct ErrorSums {
  double diff = 0, norm = 0;
  bool sizes_differ = false;
};
template <typename A, typename B>
ErrorSums error_sums(const A& got, const B& want) {
  ErrorSums e;
  const auto n = static_cast<std::size_t>(want.size());
  e.sizes_differ = static_cast<std::size_t>(got.size()) != n;
  for (std::size_t i = 0; i < n && !e.sizes_differ; ++i) {
    const double g = got[i], w = want[i];
    e.diff += (g - w) * (g - w);
    e.norm += w * w;
  }
  return e;
}
}  // namespace normalized_error_detail

// Infinite (so every comparison fails) where the sizes differ, and where `want` is all
// zero: a comparison against zeros proves nothing.
template <typename A, typename B>
double normalized_error(const A& got, const B& want) {
  const auto e = normalized_error_detail::error_sums(got, want);
  if (e.sizes_differ || e.norm == 0) return std::numeric_limits<double>::infinity();
  return std::sqrt(e.diff / e.norm);
}

// The same, but the absolute error where `want` is legitimately all zero: one key per query
// makes dq and dk exactly zero; a ReLU can zero a small C.
template <typename A, typename B>
double normalized_or_absolute_error(const A& got, const B& want) {
  const auto e = normalized_error_detail::error_sums(got, want);
  if (e.sizes_differ) return std::numeric_limits<double>::infinity();
  return e.norm > 0 ? std::sqrt(e.diff / e.norm) : std::sqrt(e.diff);
}

}  // namespace peertrain
