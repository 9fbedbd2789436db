// One training step's communication and update, as each algorithm does it. The trainer's
// loop is the same for all of them:
//
//   algorithm.start(step, x);                       // what overlaps the gradient
//   loss = task.compute_gradient(x, grads);
//   timing = algorithm.finish(step, x, grads, optimizer);
//
// Adding an algorithm means one class here and a line in make_step_algorithm().
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "peertrain/algo/gossip.h"
#include "peertrain/net/transport.h"
#include "peertrain/train/optimizer.h"
#include "peertrain/train/trainer.h"

namespace peertrain::train {

class Membership;

// Where a step's time went, besides the gradient: the optimizer's arithmetic, and waiting
// on other peers.
struct StepTiming {
  double compute_s = 0;
  double wait_s = 0;
};

class StepAlgorithm {
 public:
  virtual ~StepAlgorithm() = default;
  // Before the gradient is computed; x is x_k. Starts what may overlap the gradient.
  virtual void start(long long step, std::span<float> x) {
    (void)step;
    (void)x;
  }
  // After it: exchanges with the other peers and applies the optimizer to x (grads may be
  // overwritten on the way).
  virtual StepTiming finish(long long step, std::span<float> x, std::span<float> grads, Optimizer& optimizer) = 0;
};

// What the algorithms work with. D-PSGD uses the gossip and the membership (owned by the
// trainer, which also flushes the gossip at the end and reads who is lost); `trace` is
// called with the row of W each D-PSGD step applied (--mixing-trace).
struct StepContext {
  net::Transport& network;
  int rank = 0;
  int peers = 0;
  algo::Gossip* gossip = nullptr;
  Membership* membership = nullptr;
  std::function<void(long long, const algo::MixingRow&)> trace;
  const topology::Topology* topology = nullptr;  // d2: W's smallest eigenvalue; choco: is it time-varying
  long long total_steps = 0;                     // diloco: the last step finishes the exchanges under way
  std::vector<std::pair<std::size_t, std::size_t>> layers;  // diloco: Task::layer_ranges(), for --fragments
};

// The algorithm of config.algorithm with its options (--update, --compression,
// --gossip-step, --allreduce-algo).
std::unique_ptr<StepAlgorithm> make_step_algorithm(const TrainConfig& config, StepContext context,
                                                   std::size_t parameters);

// DiLoCo and Streaming DiLoCo (train/diloco.cpp; TrainConfig::outer).
std::unique_ptr<StepAlgorithm> make_diloco(const TrainConfig& config, StepContext context, std::size_t parameters);

// Stochastic Gradient Push and Epidemic Learning (train/directed_steps.cpp).
std::unique_ptr<StepAlgorithm> make_sgp(const TrainConfig& config, StepContext context, std::size_t parameters);
std::unique_ptr<StepAlgorithm> make_epidemic(const TrainConfig& config, StepContext context, std::size_t parameters);

// Streaming DiLoCo's fragments: the layers grouped, in order, into `fragments` contiguous
// ranges (offset, size) of about equal size. Throws Error(kInvalidArgument) when there are
// fewer layers than fragments.
std::vector<std::pair<std::size_t, std::size_t>> group_fragments(
    const std::vector<std::pair<std::size_t, std::size_t>>& layers, int fragments);

// D² needs W's eigenvalues above −1/3 (Tang et al. 2018, Assumption 1); for a W whose
// smallest is not (the ring of even n with Metropolis weights has exactly −1/3), it mixes
// with (I + W)/2, whose smallest eigenvalue is (1 + λ_min)/2 ≥ 0. Row by row.
std::vector<algo::MixingRow> lazy_rows(std::vector<algo::MixingRow> rows);

}  // namespace peertrain::train
