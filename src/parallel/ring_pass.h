// The ring both RingAttention modes are built from, private to src/parallel: units of data
// (a K/V tile with its positions, or a whole K chunk) start on their home rank and hop
// rank → rank + 1 until every rank has seen each; optional accumulators (dK, dV) travel
// with them, each rank adding its share, and the sums come back home after the full circle.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "peertrain/comm/group.h"
#include "peertrain/core/aligned.h"

namespace peertrain::parallel::detail {

// The bytes a call's own buffers hold, and their largest total.
class MemoryMeter {
 public:
  void reset() { current_ = peak_ = 0; }
  void add(std::size_t bytes) {
    current_ += bytes;
    peak_ = std::max(peak_, current_);
  }
  void remove(std::size_t bytes) { current_ -= bytes; }
  std::size_t peak() const { return peak_; }

 private:
  std::size_t current_ = 0, peak_ = 0;
};

// A buffer of T whose bytes count against a meter while it lives.
template <typename T>
class Tracked {
 public:
  Tracked(MemoryMeter& meter, std::size_t count) : meter_(meter), data_(count) { meter_.add(bytes()); }
  ~Tracked() { meter_.remove(bytes()); }
  Tracked(const Tracked&) = delete;
  Tracked& operator=(const Tracked&) = delete;
  T* data() { return data_.data(); }
  const T* data() const { return data_.data(); }
  std::size_t size() const { return data_.size(); }
  T& operator[](std::size_t i) { return data_[i]; }
  std::size_t bytes() const { return data_.size() * sizeof(T); }

 private:
  MemoryMeter& meter_;
  AlignedVector<T> data_;  // Eigen reads it: core/aligned.h
};

// Memory allocated elsewhere on a call's behalf (the block kernels' score tiles, at the
// full size they may reach), counted while this lives.
class Counted {
 public:
  Counted(MemoryMeter& meter, std::size_t bytes) : meter_(meter), bytes_(bytes) { meter_.add(bytes_); }
  ~Counted() { meter_.remove(bytes_); }
  Counted(const Counted&) = delete;
  Counted& operator=(const Counted&) = delete;

 private:
  MemoryMeter& meter_;
  std::size_t bytes_;
};

// A run of 4-byte words (floats, or positions as ints) as it lives on its home rank.
struct Part {
  const void* data = nullptr;
  std::size_t words = 0;
};

struct RingPassSpec {
  int units = 0;
  int parts = 0;         // travelling inputs of each unit
  int accumulators = 0;  // travelling sums of each unit
  // Where part p of unit u lives on this (its home) rank. Every rank's units have the same
  // sizes; only the data differ.
  std::function<Part(int unit, int part)> source;
  // Where the sum of accumulator a of unit u lands on its home rank.
  std::function<std::span<float>(int unit, int accumulator)> home;
  // Rank r at hop h holds unit u of rank r − h: `parts` point at its words (cast back to
  // float or int), `sums` at zeroed accumulators that compute adds this rank's share to.
  std::function<void(int unit, int hop, const std::vector<const void*>& parts, const std::vector<float*>& sums)>
      compute;
};

// Runs the pass with every rank of the group (each calls it with the same units, in the
// same order; tag_base keeps passes apart). Buffers are double: a unit's successor is
// received while it is being computed on. On any failure the group is aborted, so the
// others stop at once, and the error is rethrown.
void ring_pass(comm::Group& group, double timeout_s, int tag_base, MemoryMeter& meter, const RingPassSpec& spec);

// The bytes ring_pass allocates for units of these sizes (words per part and per
// accumulator, at their largest) on a ring of `ranks`: for planned_peak_bytes.
std::size_t ring_pass_bytes(int ranks, const std::vector<std::size_t>& part_words,
                            const std::vector<std::size_t>& accumulator_words);

}  // namespace peertrain::parallel::detail
