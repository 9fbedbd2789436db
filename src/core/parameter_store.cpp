#include "peertrain/core/parameter_store.h"

#include "peertrain/core/error.h"

namespace peertrain {

std::size_t ParameterStore::add(std::string name, Eigen::Index rows, Eigen::Index cols) {
  PEERTRAIN_CHECK(!finalized_, "cannot add '", name, "' after finalize()");
  PEERTRAIN_CHECK(rows >= 0 && cols >= 0, "slice '", name, "' has shape ", rows, "x", cols);
  slices_.push_back({std::move(name), total_, rows, cols});
  total_ += slices_.back().size();
  return slices_.size() - 1;
}

void ParameterStore::finalize() {
  PEERTRAIN_CHECK(!finalized_, "finalize() called twice");
  buffer_.assign(total_, 0.0f);
  finalized_ = true;
}

const ParameterSlice& ParameterStore::slice(std::size_t index) const {
  PEERTRAIN_CHECK(index < slices_.size(), "slice ", index, " of ", slices_.size());
  return slices_[index];
}

std::size_t ParameterStore::index_of(const std::string& name) const {
  for (std::size_t i = 0; i < slices_.size(); ++i)
    if (slices_[i].name == name) return i;
  throw Error(ErrorKind::kInvalidArgument, str("no parameter named '", name, "'"));
}

ParameterStore::MatrixMap ParameterStore::view(std::size_t index) {
  PEERTRAIN_CHECK(finalized_, "view() before finalize()");
  const ParameterSlice& s = slice(index);
  return MatrixMap(buffer_.data() + s.offset, s.rows, s.cols);
}

}  // namespace peertrain
