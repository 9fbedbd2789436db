// All parameters of a model replica live in one contiguous float buffer. Layers see
// Eigen::Map views into named slices of it, so gossip, all-reduce and checkpoints move
// one buffer instead of many small tensors.
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace peertrain {

struct ParameterSlice {
  std::string name;
  std::size_t offset = 0;
  Eigen::Index rows = 0;
  Eigen::Index cols = 0;
  std::size_t size() const { return static_cast<std::size_t>(rows * cols); }
};

class ParameterStore {
 public:
  using MatrixMap = Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>>;

  // Reserves a rows×cols column-major slice; returns its index. Only before finalize().
  std::size_t add(std::string name, Eigen::Index rows, Eigen::Index cols);
  // Allocates the buffer (zero-filled). After this, views stay valid for the store's life.
  void finalize();

  bool finalized() const { return finalized_; }
  std::size_t size() const { return total_; }
  std::span<float> flat() { return {buffer_.data(), buffer_.size()}; }
  std::span<const float> flat() const { return {buffer_.data(), buffer_.size()}; }
  const std::vector<ParameterSlice>& slices() const { return slices_; }
  const ParameterSlice& slice(std::size_t index) const;
  std::size_t index_of(const std::string& name) const;  // throws Error if unknown

  MatrixMap view(std::size_t index);

 private:
  std::vector<ParameterSlice> slices_;
  std::vector<float> buffer_;
  std::size_t total_ = 0;
  bool finalized_ = false;
};

}  // namespace peertrain
