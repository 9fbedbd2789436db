// The tasks make_task builds (train/task.h), and what they share.
#pragma once

#include <memory>
#include <numeric>
#include <vector>

#include "peertrain/train/task.h"
#include "peertrain/train/trainer.h"

namespace peertrain::train {

// This peer's shard of the Fashion-MNIST training set, kept alone: 32 peers on one
// machine would otherwise hold 32 copies of the whole set (188 MB each).
struct Shard {
  Dataset data;
  int full_size = 0;  // examples of the whole training set
};
Shard load_shard(const TrainConfig& config, int peers, int rank);

// 0, 1, ..., size - 1: every example of a shard, the order a sampler starts from.
inline std::vector<int> all_positions(int size) {
  std::vector<int> positions(size);
  std::iota(positions.begin(), positions.end(), 0);
  return positions;
}

std::unique_ptr<Task> make_mlp_task(const TrainConfig& config, int peers, int rank);
std::unique_ptr<Task> make_transformer_task(const TrainConfig& config, int peers, int rank);

}  // namespace peertrain::train
