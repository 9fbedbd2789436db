// Training data: the IDX reader for (Fashion-)MNIST, the partition of a data set's examples
// over peers (iid, or non-iid with Dirichlet label proportions as in Hsu et al. 2019,
// "Measuring the Effects of Non-Identical Data Distribution for Federated Visual
// Classification"), and the per-peer batch sampler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace peertrain::train {

struct Dataset {
  int features = 0;
  int classes = 0;
  std::vector<float> inputs;  // size() × features, example-major: example i at inputs[i * features]
  std::vector<std::int32_t> labels;
  int size() const { return static_cast<int>(labels.size()); }
};

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// How load_idx turns bytes into model inputs: pixel / 255, then (x − mean) / std. The
// defaults are Fashion-MNIST's training-set statistics.
struct IdxOptions {
  int classes = 10;  // labels must lie in [0, classes)
  float mean = 0.2860f;
  float std = 0.3530f;
  // Where a gzip file's decompressed copy is kept for the next reader ("": nowhere). The
  // copy is named after the file's gzip trailer (the CRC-32 and length of its contents),
  // written only once the file has passed every check, and read only while its own CRC-32
  // and length match that trailer; otherwise the original is read and the copy rewritten.
  // Nothing that goes wrong with the cache fails a read.
  std::string cache_dir;
};

// An IDX pair as read, before its pixels become floats, so that a peer converts only its
// own shard.
struct IdxBytes {
  int classes = 0;                       // labels lie in [0, classes)
  int rows = 0;                          // of each image
  int features = 0;                      // pixels of each image
  std::span<const std::uint8_t> pixels;  // size() × features, example-major, held by storage
  std::vector<std::int32_t> labels;
  std::shared_ptr<const void> storage;  // what pixels points into: a buffer, or a mapped file
  int size() const { return static_cast<int>(labels.size()); }
};

// Reads an IDX3 image file (magic 2051) and an IDX1 label file (magic 2049), gzip-compressed
// or plain. Checks the magic numbers, the dimensions, that the counts agree, truncation and
// trailing bytes, and the label range; each error names the file and what was wrong.
IdxBytes read_idx(const std::string& images_path, const std::string& labels_path, const IdxOptions& options = {});
// The examples given (in that order), or all of them, as model inputs.
Dataset to_dataset(const IdxBytes& bytes, std::span<const int> examples, const IdxOptions& options = {});
Dataset to_dataset(const IdxBytes& bytes, const IdxOptions& options = {});
// read_idx, then to_dataset of every example.
Dataset load_idx(const std::string& images_path, const std::string& labels_path, const IdxOptions& options = {});

// {train|t10k}-images-idx3-ubyte.gz and the matching labels file from dir, decompressed
// once into user_cache_dir()/idx and read from there afterwards (every peer of every
// launch reads these files: zlib cost each one 0.45 s).
IdxBytes read_fashion_mnist(const std::string& dir, bool train);
Dataset load_fashion_mnist(const std::string& dir, bool train);
// The test set as floats, one copy for every peer of this process that asks while another
// holds it: a simulated cluster (sim/cluster.h) runs hundreds of peers in one process.
std::shared_ptr<const Dataset> shared_fashion_mnist_test(const std::string& dir);

// Example indices for each peer (each peer's list sorted). iid: a seeded shuffle cut into
// equal contiguous shares whose sizes differ by at most one.
std::vector<std::vector<int>> partition_iid(int num_examples, int peers, std::uint64_t seed);
// Non-iid: for each class, proportions over the peers are drawn from Dir(alpha) and the
// class's (shuffled) examples are cut accordingly. Small alpha gives each peer few classes;
// large alpha approaches iid. Deterministic in seed. A draw that leaves a peer fewer than
// min_examples (at least 1; the trainer asks for one batch) is drawn again, from the same
// stream, up to 100 times, and then an error names alpha, the peers and the best draw; a
// first draw that satisfies it is the partition.
std::vector<std::vector<int>> partition_dirichlet(const std::vector<std::int32_t>& labels, int classes, int peers,
                                                  double alpha, std::uint64_t seed, std::size_t min_examples = 1);

// Draws batches from one peer's shard, in an order reshuffled every epoch. The order of
// epoch e depends only on (seed, e), so callers give each peer its own seed (mixing in the
// peer id) and a run resumed at an epoch sees the same batches. The last partial batch of
// an epoch is dropped.
class BatchSampler {
 public:
  // data must outlive the sampler.
  BatchSampler(const Dataset& data, std::vector<int> shard, int batch, std::uint64_t seed);

  // Copies the next batch into inputs (features × batch, column-major: one example per
  // column) and labels (batch); starts a new epoch when this one has no full batch left.
  void next(float* inputs, std::int32_t* labels);

  int epoch() const { return epoch_; }  // of the batch drawn last (0 before the first)
  int batches_per_epoch() const { return static_cast<int>(shard_.size()) / batch_; }
  long long batches_drawn() const { return batches_drawn_; }

  // Where the sampler stands, for checkpoints. The epoch's order is not part of it: it is a
  // function of (seed, epoch), so restore() recomputes it.
  struct State {
    int epoch = 0;
    std::size_t position = 0;  // examples of this epoch's order already drawn
    long long batches_drawn = 0;
    bool operator==(const State&) const = default;
  };
  State state() const { return {epoch_, position_, batches_drawn_}; }
  // The state after `batches` batches drawn from the start, for a sampler that did not
  // draw them (a peer that rejoins a run at that step): restore() works out the epoch and
  // position from its shard and batch.
  static State after_batches(long long batches) { return {kFromBatchesDrawn, 0, batches}; }
  static constexpr int kFromBatchesDrawn = -2147483647 - 1;  // no real epoch
  // Continues from a state taken from a sampler over the same shard, batch and seed: the
  // batches that follow are the ones that sampler would have drawn. Throws Error when the
  // state cannot belong to this sampler (negative, past the shard, not on a batch boundary).
  void restore(const State& state);

 private:
  void shuffle_for_epoch();

  const Dataset* data_;
  std::vector<int> shard_;
  std::vector<int> order_;  // this epoch's permutation of shard_
  int batch_;
  std::uint64_t seed_;
  int epoch_ = 0;
  std::size_t position_ = 0;
  long long batches_drawn_ = 0;
};

}  // namespace peertrain::train
