// GELU with the tanh approximation (GPT-2; torch's approximate='tanh') and its derivative,
// as Eigen array expressions (internal to the model module). One definition serves the
// whole-tensor passes (layers.h) and the GEMM's epilogue (gemm.h), which applies them to
// a column of its output while it is still in L1, so the fused and the separate paths
// give the same floats.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>

namespace peertrain::model::gelu {

constexpr float kScale = 0.7978845608028654f;  // √(2/π)
constexpr float kCube = 0.044715f;

// y = GELU(x) over count floats.
inline void forward(const float* x, float* y, std::ptrdiff_t count) {
  const Eigen::Map<const Eigen::ArrayXf> a(x, count);
  Eigen::Map<Eigen::ArrayXf>(y, count) = 0.5f * a * (1.0f + (kScale * (a + kCube * a.cube())).tanh());
}

// dx = dy · GELU'(x) over count floats; dx may be dy. Blocks of kBlock keep the tanh
// temporary in L1 (on the stack) instead of a whole-tensor allocation.
template <int kBlock = 4096>
inline void backward(const float* x, const float* dy, float* dx, std::ptrdiff_t count) {
  Eigen::Array<float, Eigen::Dynamic, 1, 0, kBlock, 1> t;
  for (std::ptrdiff_t at = 0; at < count; at += kBlock) {
    const std::ptrdiff_t len = std::min<std::ptrdiff_t>(kBlock, count - at);
    const Eigen::Map<const Eigen::ArrayXf> a(x + at, len);
    t = (kScale * (a + kCube * a.cube())).tanh();
    Eigen::Map<Eigen::ArrayXf>(dx + at, len) =
        Eigen::Map<const Eigen::ArrayXf>(dy + at, len) *
        (0.5f * (1.0f + t) + 0.5f * a * (1.0f - t.square()) * kScale * (1.0f + 3.0f * kCube * a.square()));
  }
}

// GCC 12 warns that Eigen's tanh (its min and max intrinsics) reads an uninitialized
// vector once it is unrolled here: their definitions start from _mm512_undefined_ps(),
// whose every lane they overwrite.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The same over exactly N floats: fixed-size, so Eigen unrolls it into N/16 packets with no
// loop or size dispatch (the GEMM's epilogue, a 32-row column of its tile at a time).
template <int N>
inline void forward_fixed(const float* x, float* y) {
  using A = Eigen::Array<float, N, 1>;
  const Eigen::Map<const A> a(x);
  Eigen::Map<A> out(y);
  out = 0.5f * a * (1.0f + (kScale * (a + kCube * a.cube())).tanh());
}

template <int N>
inline void backward_fixed(const float* x, const float* dy, float* dx) {
  using A = Eigen::Array<float, N, 1>;
  const Eigen::Map<const A> a(x);
  const A t = (kScale * (a + kCube * a.cube())).tanh();
  Eigen::Map<A> out(dx);
  out = Eigen::Map<const A>(dy) *
        (0.5f * (1.0f + t) + 0.5f * a * (1.0f - t.square()) * kScale * (1.0f + 3.0f * kCube * a.square()));
}

#pragma GCC diagnostic pop

}  // namespace peertrain::model::gelu
