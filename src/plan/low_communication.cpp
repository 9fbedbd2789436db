#include "peertrain/plan/low_communication.h"

#include <algorithm>

#include "peertrain/core/error.h"

namespace peertrain::plan {

double compute_utilisation(const LowCommunication& m, double compute_s, double exchange_s) {
  const double work = m.inner_steps * compute_s;
  const double fragment_s = exchange_s * m.bytes_per_value / 4 / m.fragments;
  const double blocked = m.fragments * std::max(0.0, fragment_s - m.overlap * compute_s);
  return work / (work + blocked);
}

std::optional<double> bandwidth_for_utilisation(const LowCommunication& m, double target, double compute_s,
                                                double model_bytes, int peers, double latency_s) {
  PEERTRAIN_CHECK(target > 0 && target < 1, "a utilisation of ", target);
  // What u leaves for the exchanges of H steps, plus what their overlap hides.
  const double allowed = m.inner_steps * compute_s * (1 / target - 1) + m.fragments * m.overlap * compute_s;
  const double hops = 2.0 * (peers - 1);
  const double latency = m.fragments * hops * latency_s;
  if (peers < 2) return 0.0;
  if (allowed <= latency) return std::nullopt;
  const double bytes = m.bytes_per_value / 4 * hops / peers * model_bytes;
  return bytes / (allowed - latency);
}

}  // namespace peertrain::plan
