#include "peertrain/algo/compression.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "peertrain/core/codec.h"
#include "peertrain/core/error.h"

namespace peertrain::algo {
namespace {

// kind (1 byte), bits (1 byte), n (u32).
constexpr std::size_t kHeader = 6;

int levels(int bits) { return (1 << (bits - 1)) - 1; }

// QSGD's variance factor for a bucket of d at s levels: E‖Q(v)‖² ≤ τ‖v‖², τ = 1 + ω.
float qsgd_tau(std::size_t d, int s) {
  const double dd = static_cast<double>(d), ss = s;
  return static_cast<float>(1.0 + std::min(dd / (ss * ss), std::sqrt(dd) / ss));
}

std::size_t buckets(std::size_t n) { return (n + kQuantBucket - 1) / kQuantBucket; }

// A little-endian bit stream of fixed-width fields.
class BitWriter {
 public:
  explicit BitWriter(std::vector<std::byte>& out) : out_(out) {}
  void put(std::uint32_t value, int width) {
    acc_ |= static_cast<std::uint64_t>(value) << used_;
    used_ += width;
    while (used_ >= 8) {
      out_.push_back(static_cast<std::byte>(acc_ & 0xff));
      acc_ >>= 8;
      used_ -= 8;
    }
  }
  void flush() {
    if (used_ > 0) out_.push_back(static_cast<std::byte>(acc_ & 0xff));
    acc_ = 0;
    used_ = 0;
  }

 private:
  std::vector<std::byte>& out_;
  std::uint64_t acc_ = 0;
  int used_ = 0;
};

class BitReader {
 public:
  explicit BitReader(std::span<const std::byte> in) : in_(in) {}
  std::uint32_t get(int width) {
    while (used_ < width) {
      acc_ |= static_cast<std::uint64_t>(in_[at_++]) << used_;  // the caller checked the length
      used_ += 8;
    }
    const auto v = static_cast<std::uint32_t>(acc_ & ((1ull << width) - 1));
    acc_ >>= width;
    used_ -= width;
    return v;
  }

 private:
  std::span<const std::byte> in_;
  std::size_t at_ = 0;
  std::uint64_t acc_ = 0;
  int used_ = 0;
};

std::size_t packed_bytes(std::size_t n, int width) { return (n * static_cast<std::size_t>(width) + 7) / 8; }

void put_varint(codec::Writer& w, std::uint32_t v) {
  while (v >= 0x80) {
    w.u8(static_cast<std::uint8_t>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  w.u8(static_cast<std::uint8_t>(v));
}

// Random-k's indices: k distinct of n, sorted, from the seed alone (Floyd's sampling).
std::vector<std::uint32_t> random_indices(std::size_t n, std::size_t k, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::uint8_t> taken(n, 0);
  for (std::size_t j = n - k; j < n; ++j) {
    const auto t = static_cast<std::size_t>(rng.uniform_below(j + 1));
    taken[taken[t] ? j : t] = 1;
  }
  std::vector<std::uint32_t> idx;
  idx.reserve(k);
  for (std::size_t i = 0; i < n; ++i)
    if (taken[i]) idx.push_back(static_cast<std::uint32_t>(i));
  return idx;
}

// Top-k's indices, sorted: the k entries of largest magnitude (ties at the threshold
// taken in index order), found with one selection over the magnitudes.
std::vector<std::uint32_t> top_indices(std::span<const float> v, std::size_t k) {
  if (k == 0) return {};
  std::vector<float> mag(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) mag[i] = std::fabs(v[i]);
  std::nth_element(mag.begin(), mag.begin() + static_cast<std::ptrdiff_t>(v.size() - k), mag.end());
  const float threshold = mag[v.size() - k];
  std::size_t above = 0;
  for (float m : mag) above += m > threshold ? 1 : 0;
  std::size_t ties = k - above;
  std::vector<std::uint32_t> idx;
  idx.reserve(k);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const float m = std::fabs(v[i]);
    if (m > threshold || (m == threshold && ties > 0 && (ties--, true))) idx.push_back(static_cast<std::uint32_t>(i));
  }
  return idx;
}

}  // namespace

std::string Compression::describe() const {
  switch (kind) {
    case CompressionKind::kNone:
      return "none";
    case CompressionKind::kTopK:
      return str("top-k:", fraction);
    case CompressionKind::kRandomK:
      return str("random-k:", fraction);
    case CompressionKind::kQsgd:
      return str("qsgd:", bits);
    case CompressionKind::kSign:
      return "sign";
  }
  return "?";
}

std::size_t Compression::kept(std::size_t n) const {
  if (n == 0) return 0;
  return std::clamp<std::size_t>(static_cast<std::size_t>(std::ceil(fraction * static_cast<double>(n) - 1e-9)), 1, n);
}

double Compression::default_gossip_step() const {
  switch (kind) {
    case CompressionKind::kNone:
      return 1.0;
    case CompressionKind::kTopK:
      return fraction >= 1 ? 1.0 : std::clamp(10 * fraction, 0.01, 0.2);
    case CompressionKind::kRandomK:
      return std::clamp(fraction, 0.005, 1.0);
    case CompressionKind::kQsgd:
      return 1.0 / qsgd_tau(kQuantBucket, levels(bits));
    case CompressionKind::kSign:
      return 0.5;
  }
  return 1.0;
}

std::size_t Compression::max_bytes(std::size_t n) const {
  const std::size_t k = kept(n);
  switch (kind) {
    case CompressionKind::kNone:
      return kHeader + 4 * n;
    case CompressionKind::kTopK:
      return kHeader + 4 + 5 * k + 4 * k;
    case CompressionKind::kRandomK:
      return kHeader + 4 + 8 + 4 * k;
    case CompressionKind::kQsgd:
      return kHeader + 4 * buckets(n) + packed_bytes(n, bits);
    case CompressionKind::kSign:
      return kHeader + 4 * buckets(n) + packed_bytes(n, 1);
  }
  return 0;
}

Compression parse_compression(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return Error(ErrorKind::kInvalidArgument, str("--compression '", text, "': ", why));
  };
  const auto colon = text.find(':');
  const std::string_view name = text.substr(0, colon);
  const std::string_view arg = colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
  Compression c;
  if (name == "none" || name == "sign") {
    if (colon != std::string_view::npos) throw bad(str(name, " takes no parameter"));
    c.kind = name == "none" ? CompressionKind::kNone : CompressionKind::kSign;
    return c;
  }
  if (name == "top-k" || name == "random-k") {
    c.kind = name == "top-k" ? CompressionKind::kTopK : CompressionKind::kRandomK;
    double f = 0;
    const auto [p, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), f);
    if (arg.empty() || ec != std::errc() || p != arg.data() + arg.size())
      throw bad(str(name, " needs the fraction of entries kept, e.g. ", name, ":0.01"));
    if (!(f > 0 && f <= 1)) throw bad(str("the fraction ", arg, " is outside (0, 1]"));
    c.fraction = f;
    return c;
  }
  if (name == "qsgd") {
    c.kind = CompressionKind::kQsgd;
    int b = 0;
    const auto [p, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), b);
    if (arg.empty() || ec != std::errc() || p != arg.data() + arg.size())
      throw bad("qsgd needs the bits per element, e.g. qsgd:8");
    if (b < 2 || b > 16) throw bad(str(b, " bits: qsgd needs 2 to 16 (a sign bit and at least one bit of level)"));
    c.bits = b;
    return c;
  }
  throw bad("not one of none, top-k:F, random-k:F, qsgd:BITS, sign");
}

std::vector<std::byte> compress(const Compression& c, std::span<const float> v, Rng& rng) {
  const std::size_t n = v.size();
  codec::Writer w(c.max_bytes(n));
  w.u8(static_cast<std::uint8_t>(c.kind)).u8(static_cast<std::uint8_t>(c.bits)).u32(static_cast<std::uint32_t>(n));
  switch (c.kind) {
    case CompressionKind::kNone:
      w.floats(v);
      break;
    case CompressionKind::kTopK: {
      const std::size_t k = c.kept(n);
      w.u32(static_cast<std::uint32_t>(k));
      const auto idx = top_indices(v, k);
      std::uint32_t next = 0;  // gaps: index − (previous index + 1)
      for (std::uint32_t i : idx) {
        put_varint(w, i - next);
        next = i + 1;
      }
      for (std::uint32_t i : idx) w.floats(v.subspan(i, 1));
      break;
    }
    case CompressionKind::kRandomK: {
      const std::size_t k = c.kept(n);
      w.u32(static_cast<std::uint32_t>(k));
      const std::uint64_t seed = rng.next_u64();
      w.u64(seed);
      for (std::uint32_t i : random_indices(n, k, seed)) w.floats(v.subspan(i, 1));
      break;
    }
    case CompressionKind::kQsgd:
    case CompressionKind::kSign: {
      const bool sign = c.kind == CompressionKind::kSign;
      const int width = sign ? 1 : c.bits;
      const int s = sign ? 1 : levels(c.bits);
      std::vector<float> scales(buckets(n));
      for (std::size_t b = 0; b < scales.size(); ++b) {
        const std::size_t lo = b * kQuantBucket, hi = std::min(n, lo + kQuantBucket);
        double acc = 0;
        for (std::size_t i = lo; i < hi; ++i) acc += sign ? std::fabs(v[i]) : static_cast<double>(v[i]) * v[i];
        scales[b] = static_cast<float>(sign ? acc / static_cast<double>(hi - lo) : std::sqrt(acc));
      }
      w.floats(scales);
      std::vector<std::byte> out = w.take();  // the packed fields close the message
      BitWriter bits(out);
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t negative = std::signbit(v[i]) ? 1u : 0u;
        if (sign) {
          bits.put(negative, 1);
          continue;
        }
        const float norm = scales[i / kQuantBucket];
        std::uint32_t level = 0;
        if (norm > 0) {
          const double r = std::fabs(v[i]) / norm * s;  // in [0, s]
          const double floor = std::floor(r);
          level = static_cast<std::uint32_t>(floor) + (rng.uniform() < r - floor ? 1u : 0u);
          level = std::min<std::uint32_t>(level, static_cast<std::uint32_t>(s));
        }
        bits.put(negative | (level << 1), width);
      }
      bits.flush();
      return out;
    }
  }
  return w.take();
}

void decompress_add(const Compression& c, std::span<const std::byte> bytes, float weight, std::span<float> out,
                    const std::string& from) {
  const std::size_t n = out.size();
  const std::string what = str("compressed parameters (", c.describe(), ") from ", from);
  codec::Reader r(bytes, what);
  const auto head = r.bytes(2);
  const std::uint32_t length = r.u32();
  if (head[0] != static_cast<std::byte>(c.kind) || head[1] != static_cast<std::byte>(c.bits) || length != n)
    throw Error(ErrorKind::kParse, str(what, ": a message of kind ", static_cast<int>(head[0]), ", parameter ",
                                       static_cast<int>(head[1]), " and ", length, " elements; expected kind ",
                                       static_cast<int>(c.kind), ", parameter ", c.bits, " and ", n));
  auto float_at = [](const std::byte* p) {
    float f;
    std::memcpy(&f, p, sizeof f);
    return f;
  };
  auto expect_end = [&] {
    if (!r.done()) throw Error(ErrorKind::kParse, str(what, ": ", r.left(), " bytes past the end of the message"));
  };
  switch (c.kind) {
    case CompressionKind::kNone: {
      const auto values = r.bytes(4 * n);
      for (std::size_t i = 0; i < n; ++i) out[i] += weight * float_at(values.data() + 4 * i);
      return expect_end();
    }
    case CompressionKind::kTopK: {
      const std::uint32_t k = r.u32();
      if (k != c.kept(n)) throw Error(ErrorKind::kParse, str(what, ": ", k, " entries, expected ", c.kept(n)));
      std::vector<std::uint32_t> idx(k);
      std::uint64_t next = 0;
      for (std::uint32_t e = 0; e < k; ++e) {
        std::uint64_t gap = 0;
        for (int shift = 0;; shift += 7) {
          if (shift > 28) throw Error(ErrorKind::kParse, str(what, ": index ", e, " is not a valid varint"));
          const auto byte = static_cast<std::uint8_t>(r.bytes(1)[0]);
          gap |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
          if (!(byte & 0x80)) break;
        }
        next += gap;
        if (next >= n) throw Error(ErrorKind::kParse, str(what, ": index ", next, " is outside 0..", n - 1));
        idx[e] = static_cast<std::uint32_t>(next++);
      }
      const auto values = r.bytes(4 * static_cast<std::size_t>(k));
      for (std::uint32_t e = 0; e < k; ++e) out[idx[e]] += weight * float_at(values.data() + 4 * e);
      return expect_end();
    }
    case CompressionKind::kRandomK: {
      const std::uint32_t k = r.u32();
      if (k != c.kept(n)) throw Error(ErrorKind::kParse, str(what, ": ", k, " entries, expected ", c.kept(n)));
      const std::uint64_t seed = r.u64();
      const auto values = r.bytes(4 * static_cast<std::size_t>(k));
      expect_end();
      const auto idx = random_indices(n, k, seed);
      for (std::uint32_t e = 0; e < k; ++e) out[idx[e]] += weight * float_at(values.data() + 4 * e);
      return;
    }
    case CompressionKind::kQsgd:
    case CompressionKind::kSign: {
      const bool sign = c.kind == CompressionKind::kSign;
      const int width = sign ? 1 : c.bits;
      const int s = sign ? 1 : levels(c.bits);
      const auto scales = r.floats(buckets(n));
      const auto packed = r.bytes(packed_bytes(n, width));
      expect_end();
      BitReader bits(packed);
      for (std::size_t b = 0; b < scales.size(); ++b) {
        const std::size_t lo = b * kQuantBucket, hi = std::min(n, lo + kQuantBucket);
        if (!std::isfinite(scales[b]) || scales[b] < 0)
          throw Error(ErrorKind::kParse, str(what, ": bucket ", b, " has the scale ", scales[b]));
        // qsgd: |v| ≈ norm · level / s, scaled by 1/τ to make it a contraction.
        const float unit = sign ? scales[b] : scales[b] / (static_cast<float>(s) * qsgd_tau(hi - lo, s));
        for (std::size_t i = lo; i < hi; ++i) {
          const std::uint32_t field = bits.get(width);
          const float magnitude = sign ? unit : unit * static_cast<float>(field >> 1);
          if (!sign && (field >> 1) > static_cast<std::uint32_t>(s))
            throw Error(ErrorKind::kParse, str(what, ": element ", i, " has level ", field >> 1, " of ", s));
          out[i] += weight * ((field & 1u) ? -magnitude : magnitude);
        }
      }
      return;
    }
  }
}

}  // namespace peertrain::algo
