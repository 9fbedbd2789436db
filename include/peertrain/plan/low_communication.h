// The compute utilisation of DiLoCo and Streaming DiLoCo (compute time over step time),
// after the compute-utilisation model in the appendix of Charles et al. 2025 ("Scaling
// laws for DiLoCo"): every H inner steps of compute C each peer takes part in an exchange
// of the model that takes T on the links.
//   data-parallel (H = 1) and DiLoCo block for it:   u = H·C / (H·C + T);
//   Streaming DiLoCo sends F fragments of T/F each, overlapping τ inner steps:
//                                                      u = H·C / (H·C + F·max(0, T/F − τ·C)).
// Over a ring all-reduce of n peers at bandwidth B and latency L, T = b/4 · W/B + 2(n − 1)·L,
// W = 2(n − 1)/n · S the bytes each peer sends for a model of S fp32 bytes and b the bytes a
// value travels as. The bandwidth a utilisation u needs follows by solving for B; none
// reaches u when the latency alone exceeds the time u leaves for the exchange.
#pragma once

#include <optional>
#include <string>

namespace peertrain::plan {

struct LowCommunication {
  std::string name;
  int inner_steps = 1;  // H; 1: data-parallel
  int fragments = 1;    // F
  int overlap = 0;      // τ
  double bytes_per_value = 4;
};

// exchange_s: T, one exchange of the whole model in fp32 (scaled here by bytes_per_value/4).
double compute_utilisation(const LowCommunication& method, double compute_s, double exchange_s);

// The bandwidth (bytes/s) at which the ring all-reduce of `peers` gives utilisation
// `target` in (0, 1); none when latency_s alone rules it out.
std::optional<double> bandwidth_for_utilisation(const LowCommunication& method, double target, double compute_s,
                                                double model_bytes, int peers, double latency_s);

}  // namespace peertrain::plan
