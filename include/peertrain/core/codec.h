// One byte codec for the wire and file formats: little-endian integers and doubles,
// fixed byte arrays and text, written to a growing buffer and read back with every read
// bounds-checked. A short or malformed input throws Error(kParse) naming what was being
// read ("hello from 10.0.0.3:41234", "membership report from peer 5"), never reads past
// the end.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "peertrain/core/error.h"

namespace peertrain::codec {

static_assert(std::endian::native == std::endian::little, "peertrain's wire formats assume a little-endian host");

class Writer {
 public:
  explicit Writer(std::size_t reserve = 0) { out_.reserve(reserve); }
  Writer& u8(std::uint8_t v) { return raw(&v, sizeof v); }
  Writer& u32(std::uint32_t v) { return raw(&v, sizeof v); }
  Writer& u64(std::uint64_t v) { return raw(&v, sizeof v); }
  Writer& i64(std::int64_t v) { return raw(&v, sizeof v); }
  Writer& f64(double v) { return raw(&v, sizeof v); }
  Writer& floats(std::span<const float> v) { return raw(v.data(), v.size_bytes()); }
  template <typename T, std::size_t N>
  Writer& bytes(const std::array<T, N>& a) {
    static_assert(sizeof(T) == 1);
    return raw(a.data(), N);
  }
  Writer& bytes(std::span<const std::byte> b) { return raw(b.data(), b.size()); }
  // Text without a length: it runs to the end of the message (the reader's rest_as_text).
  Writer& text(const std::string& s) { return raw(s.data(), s.size()); }
  // Text with a u32 length ahead of it, cut to `max` bytes (the reader's sized_text).
  Writer& sized_text(const std::string& s, std::size_t max = 1024) {
    const std::size_t n = std::min(s.size(), max);
    u32(static_cast<std::uint32_t>(n));
    return raw(s.data(), n);
  }
  std::size_t size() const { return out_.size(); }
  std::span<const std::byte> view() const { return out_; }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  Writer& raw(const void* data, std::size_t size) {
    const auto* p = static_cast<const std::byte*>(data);
    out_.insert(out_.end(), p, p + size);
    return *this;
  }
  std::vector<std::byte> out_;
};

class Reader {
 public:
  Reader(std::span<const std::byte> in, std::string what) : in_(in), what_(std::move(what)) {}
  std::uint32_t u32() { return read<std::uint32_t>(); }
  std::uint64_t u64() { return read<std::uint64_t>(); }
  std::int64_t i64() { return read<std::int64_t>(); }
  double f64() { return read<double>(); }
  std::vector<float> floats(std::size_t n) {
    if (n > left() / sizeof(float))
      throw Error(ErrorKind::kParse, str("truncated ", what_, ": ", n, " floats at offset ", at_, " of ", in_.size()));
    std::vector<float> v(n);
    if (n > 0) std::memcpy(v.data(), in_.data() + at_, n * sizeof(float));  // not on an empty vector's null data()
    at_ += n * sizeof(float);
    return v;
  }
  template <typename T, std::size_t N>
  void bytes(std::array<T, N>& a) {
    static_assert(sizeof(T) == 1);
    need(N);
    std::memcpy(a.data(), in_.data() + at_, N);
    at_ += N;
  }
  std::span<const std::byte> bytes(std::size_t n) {
    need(n);
    auto s = in_.subspan(at_, n);
    at_ += n;
    return s;
  }
  std::string rest_as_text() {
    std::string s(reinterpret_cast<const char*>(in_.data()) + at_, in_.size() - at_);
    at_ = in_.size();
    return s;
  }
  // Text written by Writer::sized_text; a length over `max` is an error, not an allocation.
  std::string sized_text(std::size_t max = 1024) {
    const std::uint32_t n = u32();
    if (n > max) throw Error(ErrorKind::kParse, str(what_, ": a text of ", n, " bytes, at most ", max, " expected"));
    const auto b = bytes(n);
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  // A count of items of at least `item_bytes` each: one the remaining bytes cannot hold
  // is an error before anything is allocated for it.
  std::uint32_t count(std::size_t item_bytes, std::uint32_t max) {
    const std::uint32_t n = u32();
    if (n > max || static_cast<std::size_t>(n) * item_bytes > left())
      throw Error(ErrorKind::kParse, str(what_, ": a count of ", n, " (at most ", max, ", with ", left(), " bytes left)"));
    return n;
  }
  std::size_t left() const { return in_.size() - at_; }
  std::size_t offset() const { return at_; }
  bool done() const { return at_ == in_.size(); }
  const std::string& what() const { return what_; }

 private:
  void need(std::size_t n) const {
    if (n > in_.size() - at_)
      throw Error(ErrorKind::kParse, str("truncated ", what_, ": ", n, " more bytes needed at offset ", at_, " of ",
                                         in_.size()));
  }
  template <typename T>
  T read() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::span<const std::byte> in_;
  std::size_t at_ = 0;
  std::string what_;
};

}  // namespace peertrain::codec
