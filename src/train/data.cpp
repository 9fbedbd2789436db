// The IDX reader, the partitions over peers and the batch sampler (see data.h).
//
// IDX (LeCun's MNIST format): a big-endian header — magic, then one 32-bit size per
// dimension — and the unsigned bytes. zlib's gzread reads gzip and plain files alike. The
// reader never allocates what a header claims: bytes are read in chunks, so a header that
// lies about its size ends in a "truncated" error, not in a huge allocation. A gzip file's
// decompressed copy is kept in the cache, as a plain IDX file read by the same checks, its
// pixels mapped rather than read: the peers of a launch share its pages instead of each
// zero-filling, copying and faulting in 47 MB (most of a small run's start-up).
#include "peertrain/train/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <mutex>
#include <map>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <optional>

#include "peertrain/core/cache_dir.h"
#include "peertrain/core/error.h"
#include "peertrain/core/log.h"
#include "peertrain/core/rng.h"
#include "fd.h"

namespace peertrain::train {
namespace {

constexpr std::uint32_t kImagesMagic = 2051;  // unsigned bytes, 3 dimensions
constexpr std::uint32_t kLabelsMagic = 2049;  // unsigned bytes, 1 dimension
constexpr std::uint32_t kMaxExamples = 1u << 28;
constexpr std::uint32_t kMaxFeatures = 1u << 24;
// What an images file may hold in all. A gzip file can claim, and inflate to, far more than
// it is long (a few MB of zeros become terabytes); past this the file is refused before a
// byte is inflated. Fashion-MNIST holds 47 MB.
constexpr std::uint64_t kMaxPixelBytes = std::uint64_t{1} << 32;

class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    errno = 0;  // gzopen leaves it 0 when it failed for want of memory
    file_ = gzopen(path.c_str(), "rb");
    if (!file_)
      throw Error(ErrorKind::kIo, str(path, ": cannot open: ", errno ? std::strerror(errno) : "out of memory"));
    gzbuffer(file_, 1 << 18);
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Appends up to count bytes to out; returns how many were read (fewer only at the end).
  std::size_t read(std::size_t count, std::vector<std::uint8_t>& out) {
    constexpr std::size_t kChunk = 1 << 20;
    std::size_t total = 0;
    while (total < count) {
      const std::size_t want = std::min(kChunk, count - total);
      const std::size_t at = out.size();
      out.resize(at + want);
      const int got = gzread(file_, out.data() + at, static_cast<unsigned>(want));
      if (got < 0) {
        int code = 0;
        throw Error(ErrorKind::kIo, str(path_, ": read failed: ", gzerror(file_, &code)));
      }
      out.resize(at + static_cast<std::size_t>(got));
      total += static_cast<std::size_t>(got);
      if (static_cast<std::size_t>(got) < want) break;
    }
    return total;
  }

  std::vector<std::uint32_t> header(std::uint32_t magic, int dimensions, const char* kind) {
    std::vector<std::uint8_t> bytes;
    const std::size_t size = 4 * (1 + static_cast<std::size_t>(dimensions));
    if (read(size, bytes) < size)
      throw Error(ErrorKind::kParse,
                  str(path_, ": truncated: expected a ", size, "-byte IDX header, got ", bytes.size(), " bytes"));
    std::vector<std::uint32_t> words(1 + dimensions);
    for (std::size_t i = 0; i < words.size(); ++i)
      words[i] = (std::uint32_t{bytes[4 * i]} << 24) | (std::uint32_t{bytes[4 * i + 1]} << 16) |
                 (std::uint32_t{bytes[4 * i + 2]} << 8) | bytes[4 * i + 3];
    if (words[0] != magic)
      throw Error(ErrorKind::kParse, str(path_, ": not an IDX ", kind, " file: magic number ", words[0], ", expected ",
                                         magic));
    return {words.begin() + 1, words.end()};
  }

  // Whether the file is plain (read as it is) rather than gzip.
  bool direct() { return gzdirect(file_) == 1; }

  void expect_end(std::size_t count, const char* what) {
    std::vector<std::uint8_t> extra;
    if (read(1, extra) > 0)
      throw Error(ErrorKind::kParse, str(path_, ": unexpected bytes after the last of ", count, " ", what));
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

// Fisher–Yates with peertrain::Rng, so a seed gives the same order on every platform.
void shuffle(std::vector<int>& values, Rng& rng) {
  for (std::size_t i = values.size(); i > 1; --i) std::swap(values[i - 1], values[rng.uniform_below(i)]);
}

// log of a Gamma(shape, 1) draw. Marsaglia and Tsang (2000), "A simple method for generating
// gamma variables"; for shape < 1 the boost Gamma(shape) = Gamma(shape + 1) · U^(1/shape),
// kept in logs because U^(1/shape) underflows for the small shapes that skewed partitions use.
double log_gamma_sample(double shape, Rng& rng) {
  double log_boost = 0;
  if (shape < 1) {
    double u = rng.uniform();
    while (u <= 0) u = rng.uniform();
    log_boost = std::log(u) / shape;
    shape += 1;
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = rng.normal();
    double v = 1 + c * x;
    if (v <= 0) continue;
    v = v * v * v;
    const double u = rng.uniform();
    if (u < 1 - 0.0331 * x * x * x * x || std::log(u) < 0.5 * x * x + d * (1 - v + std::log(v)))
      return std::log(d * v) + log_boost;
  }
}

std::uint64_t mix(std::uint64_t seed, std::uint64_t salt) {
  std::uint64_t z = seed ^ (salt + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The bytes [offset, offset + count) of a plain file, count > 0, mapped read-only; the file
// must end there. nullptr where the file system cannot map it: the caller reads it instead.
// Used for the cache's own copies only, which are replaced by rename and never rewritten in
// place (a file shortened under a mapping would fault its reader).
std::shared_ptr<const std::uint8_t> map_exactly(const std::string& path, std::size_t offset, std::size_t count,
                                                std::uint32_t examples) {
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw Error(ErrorKind::kIo, str(path, ": cannot open: ", std::strerror(errno)));
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) throw Error(ErrorKind::kIo, str(path, ": cannot stat: ", std::strerror(errno)));
  const auto size = static_cast<std::size_t>(info.st_size);
  if (size < offset + count)
    throw Error(ErrorKind::kParse,
                str(path, ": truncated: expected ", count, " pixel bytes, got ", size > offset ? size - offset : 0));
  if (size > offset + count)
    throw Error(ErrorKind::kParse, str(path, ": unexpected bytes after the last of ", examples, " images"));
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);  // outlives the descriptor
  if (base == MAP_FAILED) {
    log::debug(path, ": cannot map (", std::strerror(errno), "); reading it instead");
    return nullptr;
  }
  return {static_cast<const std::uint8_t*>(base) + offset, [base, size](const std::uint8_t*) { ::munmap(base, size); }};
}

void check_peers(int peers, const char* where) {
  if (peers < 1) throw Error(ErrorKind::kInvalidArgument, str(where, ": peers ", peers, " must be at least 1"));
}

// Reads and checks an IDX pair from its files, gzip-compressed or plain; map_images: map a
// plain images file instead of reading it (for the cache's copies, see map_exactly).
IdxBytes read_idx_files(const std::string& images_path, const std::string& labels_path, const IdxOptions& options,
                        bool map_images = false) {
  GzReader images(images_path);
  const auto dims = images.header(kImagesMagic, 3, "image");
  const std::uint32_t count = dims[0];
  if (count > kMaxExamples || dims[1] == 0 || dims[2] == 0 || std::uint64_t{dims[1]} * dims[2] > kMaxFeatures)
    throw Error(ErrorKind::kParse, str(images_path, ": implausible dimensions ", count, " x ", dims[1], " x ", dims[2],
                                       " (at most ", kMaxExamples, " images of ", kMaxFeatures, " pixels)"));
  if (std::uint64_t{count} * dims[1] * dims[2] > kMaxPixelBytes)
    throw Error(ErrorKind::kParse, str(images_path, ": claims ", count, " images of ", dims[1], " x ", dims[2],
                                       " pixels, more than the ", kMaxPixelBytes >> 30, " GiB an IDX file may hold"));
  IdxBytes data;
  data.classes = options.classes;
  data.rows = static_cast<int>(dims[1]);
  data.features = static_cast<int>(std::size_t{dims[1]} * dims[2]);
  const std::size_t pixels = std::size_t{count} * static_cast<std::size_t>(data.features);
  constexpr std::size_t kHeaderBytes = 16;  // magic and 3 dimensions
  std::shared_ptr<const std::uint8_t> mapped;
  if (map_images && pixels > 0 && images.direct()) mapped = map_exactly(images_path, kHeaderBytes, pixels, count);
  if (mapped) {
    data.pixels = {mapped.get(), pixels};
    data.storage = std::move(mapped);
  } else {
    auto buffer = std::make_shared<std::vector<std::uint8_t>>();
    if (images.read(pixels, *buffer) < pixels)
      throw Error(ErrorKind::kParse,
                  str(images_path, ": truncated: expected ", pixels, " pixel bytes, got ", buffer->size()));
    images.expect_end(count, "images");
    data.pixels = *buffer;
    data.storage = std::move(buffer);
  }

  GzReader label_file(labels_path);
  const std::uint32_t label_count = label_file.header(kLabelsMagic, 1, "label")[0];
  if (label_count != count)
    throw Error(ErrorKind::kParse,
                str(labels_path, ": has ", label_count, " labels but ", images_path, " has ", count, " images"));
  std::vector<std::uint8_t> label_bytes;
  if (label_file.read(count, label_bytes) < count)
    throw Error(ErrorKind::kParse,
                str(labels_path, ": truncated: expected ", count, " label bytes, got ", label_bytes.size()));
  label_file.expect_end(count, "labels");
  data.labels.resize(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    if (label_bytes[i] >= options.classes)
      throw Error(ErrorKind::kParse, str(labels_path, ": label ", int{label_bytes[i]}, " of example ", i,
                                         " is outside [0, ", options.classes, ")"));
    data.labels[i] = label_bytes[i];
  }
  return data;
}

// The last 8 bytes of a gzip file: the CRC-32 and the length (mod 2^32) of what it holds.
struct GzipTrailer {
  std::uint32_t crc = 0;
  std::uint32_t size = 0;
};

// nullopt when the file is not gzip (or cannot be read).
std::optional<GzipTrailer> gzip_trailer(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char magic[2] = {}, tail[8] = {};
  if (!in.read(reinterpret_cast<char*>(magic), 2) || magic[0] != 0x1f || magic[1] != 0x8b) return std::nullopt;
  if (!in.seekg(-8, std::ios::end) || !in.read(reinterpret_cast<char*>(tail), 8)) return std::nullopt;
  auto le32 = [&](int at) {
    return std::uint32_t{tail[at]} | std::uint32_t{tail[at + 1]} << 8 | std::uint32_t{tail[at + 2]} << 16 |
           std::uint32_t{tail[at + 3]} << 24;
  };
  return GzipTrailer{le32(0), le32(4)};
}

// An IDX header: the magic number and the dimensions, big-endian.
std::vector<std::uint8_t> idx_header(std::uint32_t magic, std::initializer_list<std::uint32_t> dims) {
  std::vector<std::uint8_t> out;
  auto put = [&](std::uint32_t word) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(word >> shift));
  };
  put(magic);
  for (std::uint32_t d : dims) put(d);
  return out;
}

// An IDX file's contents, rebuilt from what was read, against a gzip trailer.
struct IdxContents {
  std::vector<std::uint8_t> header;
  std::span<const std::uint8_t> data;
  bool matches(const GzipTrailer& t) const {
    const auto crc = crc32_z(crc32_z(0, header.data(), header.size()), data.data(), data.size());
    return crc == t.crc && static_cast<std::uint32_t>(header.size() + data.size()) == t.size;
  }
};

// The decompressed copies of a gzip IDX pair in the cache, named after each file's gzip
// trailer, and used only when their own CRC-32 and length match that trailer: a replaced
// file gets a new name, and a damaged or half-written copy is never taken for the data.
// A labels file that is not gzip is read where it is.
class DecompressedCopies {
 public:
  // nullopt when the images are not gzip: there is nothing to save.
  static std::optional<DecompressedCopies> of(const std::string& cache_dir, const std::string& images,
                                              const std::string& labels) {
    const std::optional<GzipTrailer> images_trailer = gzip_trailer(images);
    if (!images_trailer) return std::nullopt;
    DecompressedCopies copies;
    copies.images_trailer_ = *images_trailer;
    copies.labels_trailer_ = gzip_trailer(labels);
    copies.images_ = name(cache_dir, images, *images_trailer);
    copies.labels_ = copies.labels_trailer_ ? name(cache_dir, labels, *copies.labels_trailer_) : labels;
    return copies;
  }

  // The pair from the copies; nullopt when there are none, or they do not match.
  std::optional<IdxBytes> read(const IdxOptions& options) const {
    std::error_code error;
    if (!std::filesystem::exists(images_, error) || !std::filesystem::exists(labels_, error)) return std::nullopt;
    IdxBytes data = read_idx_files(images_, labels_, options, /*map_images=*/true);
    std::vector<std::uint8_t> label_bytes;
    if (!images_of(data).matches(images_trailer_) ||
        (labels_trailer_ && !labels_of(data, label_bytes).matches(*labels_trailer_))) {
      log::warn(images_, ": the cached copy does not match its original; reading the original again");
      return std::nullopt;
    }
    return data;
  }

  // Saves the pair read from the originals. Nothing is saved from a file whose trailer
  // does not describe what was read (a gzip of several members).
  void write(const IdxBytes& data) const {
    if (const IdxContents images = images_of(data); images.matches(images_trailer_)) save(images_, images);
    std::vector<std::uint8_t> label_bytes;
    if (const IdxContents labels = labels_of(data, label_bytes); labels_trailer_ && labels.matches(*labels_trailer_))
      save(labels_, labels);
  }

 private:
  static std::string name(const std::string& cache_dir, const std::string& path, const GzipTrailer& t) {
    std::string stem = std::filesystem::path(path).filename().string();
    if (stem.ends_with(".gz")) stem.resize(stem.size() - 3);
    return str(cache_dir, "/idx/", stem, "-", std::hex, t.crc, "-", t.size);
  }

  // What the pair's two files held, rebuilt from what was read.
  static IdxContents images_of(const IdxBytes& data) {
    const auto rows = static_cast<std::uint32_t>(data.rows);
    return {idx_header(kImagesMagic, {static_cast<std::uint32_t>(data.size()), rows,
                                      static_cast<std::uint32_t>(data.features) / rows}),
            data.pixels};
  }
  static IdxContents labels_of(const IdxBytes& data, std::vector<std::uint8_t>& bytes) {
    bytes.assign(data.labels.begin(), data.labels.end());
    return {idx_header(kLabelsMagic, {static_cast<std::uint32_t>(data.size())}), bytes};
  }

  // Through a unique temporary name and a rename, so that a reader finds the whole copy or
  // none. A copy that cannot be written costs the next run the decompression, nothing more.
  static void save(const std::string& file, const IdxContents& contents) {
    std::error_code error;
    std::filesystem::create_directories(std::filesystem::path(file).parent_path(), error);
    std::string partial = file + ".partial.XXXXXX";
    const int fd = ::mkstemp(partial.data());
    if (fd < 0) return log::debug(file, ": cannot write the decompressed copy: ", std::strerror(errno));
    bool written = true;
    for (std::span<const std::uint8_t> part : {std::span<const std::uint8_t>(contents.header), contents.data})
      while (written && !part.empty()) {
        const ssize_t n = ::write(fd, part.data(), part.size());
        written = n > 0;
        if (written) part = part.subspan(static_cast<std::size_t>(n));
      }
    written = (::close(fd) == 0) && written;
    if (written) std::filesystem::rename(partial, file, error);
    if (!written || error) {
      std::filesystem::remove(partial, error);
      log::debug(file, ": cannot write the decompressed copy; the next run decompresses again");
    }
  }

  DecompressedCopies() = default;

  GzipTrailer images_trailer_;
  std::optional<GzipTrailer> labels_trailer_;  // nullopt: the labels are read where they are
  std::string images_, labels_;
};

}  // namespace

IdxBytes read_idx(const std::string& images_path, const std::string& labels_path, const IdxOptions& options) {
  if (options.classes < 1 || options.classes > 256 || !(options.std > 0))
    throw Error(ErrorKind::kInvalidArgument,
                str("IDX options: classes ", options.classes, " must be in [1, 256] and std ", options.std, " > 0"));
  // zlib costs a peer 0.45 s on Fashion-MNIST's training images, and every peer of every
  // launch reads the same files: the decompressed copies cost 40 ms to check. The cache
  // never fails a run: whatever goes wrong with it, the originals are read.
  std::optional<DecompressedCopies> copies;
  if (!options.cache_dir.empty()) {
    try {
      copies = DecompressedCopies::of(options.cache_dir, images_path, labels_path);
      if (copies)
        if (auto data = copies->read(options)) return std::move(*data);
    } catch (const std::exception& e) {
      log::warn("ignoring the cached copy of ", images_path, ": ", e.what());
    }
  }
  IdxBytes data = read_idx_files(images_path, labels_path, options);
  if (copies) {
    try {
      copies->write(data);
    } catch (const std::exception& e) {
      log::debug("cannot keep a decompressed copy of ", images_path, ": ", e.what());
    }
  }
  return data;
}

Dataset to_dataset(const IdxBytes& bytes, std::span<const int> examples, const IdxOptions& options) {
  const auto features = static_cast<std::size_t>(bytes.features);
  if (bytes.features < 1 || bytes.pixels.size() != static_cast<std::size_t>(bytes.size()) * features)
    throw Error(ErrorKind::kInvalidArgument, str("IDX data: ", bytes.pixels.size(), " pixels for ", bytes.size(),
                                                 " examples of ", bytes.features, " features"));
  Dataset data;
  data.features = bytes.features;
  data.classes = bytes.classes;
  data.inputs.resize(examples.size() * features);
  data.labels.resize(examples.size());
  const float scale = 1.0f / (255.0f * options.std);
  const float shift = options.mean / options.std;
  for (std::size_t j = 0; j < examples.size(); ++j) {
    const int example = examples[j];
    if (example < 0 || example >= bytes.size())
      throw Error(ErrorKind::kInvalidArgument,
                  str("IDX data: example ", example, " is outside the ", bytes.size(), " examples read"));
    const std::uint8_t* in = bytes.pixels.data() + static_cast<std::size_t>(example) * features;
    float* out = data.inputs.data() + j * features;
    for (std::size_t i = 0; i < features; ++i) out[i] = static_cast<float>(in[i]) * scale - shift;
    data.labels[j] = bytes.labels[example];
  }
  return data;
}

Dataset to_dataset(const IdxBytes& bytes, const IdxOptions& options) {
  std::vector<int> all(static_cast<std::size_t>(bytes.size()));
  std::iota(all.begin(), all.end(), 0);
  return to_dataset(bytes, all, options);
}

Dataset load_idx(const std::string& images_path, const std::string& labels_path, const IdxOptions& options) {
  return to_dataset(read_idx(images_path, labels_path, options), options);
}

// Read (and its checksum verified) once per process and kept: a simulated cluster's
// hundreds of peers share it, and the pixels are a mapping of the cached file.
IdxBytes read_fashion_mnist(const std::string& dir, bool train) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, bool>, IdxBytes> read;
  std::lock_guard lock(mutex);
  if (auto it = read.find({dir, train}); it != read.end()) return it->second;
  const std::string prefix = dir + (train ? "/train" : "/t10k");
  IdxOptions options;
  options.cache_dir = user_cache_dir();
  IdxBytes bytes = read_idx(prefix + "-images-idx3-ubyte.gz", prefix + "-labels-idx1-ubyte.gz", options);
  read.emplace(std::pair{dir, train}, bytes);
  return bytes;
}

Dataset load_fashion_mnist(const std::string& dir, bool train) { return to_dataset(read_fashion_mnist(dir, train)); }

std::shared_ptr<const Dataset> shared_fashion_mnist_test(const std::string& dir) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<const Dataset>> held;
  std::lock_guard lock(mutex);
  if (auto existing = held[dir].lock()) return existing;
  auto loaded = std::make_shared<const Dataset>(load_fashion_mnist(dir, false));
  held[dir] = loaded;
  return loaded;
}

std::vector<std::vector<int>> partition_iid(int num_examples, int peers, std::uint64_t seed) {
  check_peers(peers, "iid partition");
  if (num_examples < peers)
    throw Error(ErrorKind::kInvalidArgument,
                str("iid partition: ", num_examples, " examples cannot give each of ", peers, " peers one"));
  std::vector<int> order(num_examples);
  std::iota(order.begin(), order.end(), 0);
  Rng rng(seed);
  shuffle(order, rng);
  std::vector<std::vector<int>> shards(peers);
  for (int p = 0; p < peers; ++p) {
    const auto begin = order.begin() + static_cast<std::int64_t>(num_examples) * p / peers;
    const auto end = order.begin() + static_cast<std::int64_t>(num_examples) * (p + 1) / peers;
    shards[p].assign(begin, end);
    std::sort(shards[p].begin(), shards[p].end());
  }
  return shards;
}

namespace {

// One draw: for each class, its (shuffled) examples cut by proportions from Dir(alpha).
std::vector<std::vector<int>> draw_dirichlet(std::vector<std::vector<int>>& by_class, int peers, double alpha,
                                             Rng& rng) {
  const int classes = static_cast<int>(by_class.size());
  std::vector<std::vector<int>> shards(peers);
  std::vector<double> log_weights(peers);
  for (int c = 0; c < classes; ++c) {
    std::vector<int>& members = by_class[c];
    shuffle(members, rng);
    // Normalize the gamma draws in log space: with small alpha most of them underflow.
    for (auto& w : log_weights) w = log_gamma_sample(alpha, rng);
    const double top = *std::max_element(log_weights.begin(), log_weights.end());
    double total = 0;
    for (double w : log_weights) total += std::exp(w - top);
    // Cut at the rounded cumulative proportions, so the shares add up to the class exactly
    // (the cuts only move forward because the cumulative sum does).
    const double size = static_cast<double>(members.size());
    double cumulative = 0;
    std::size_t begin = 0;
    for (int p = 0; p < peers; ++p) {
      cumulative += std::exp(log_weights[p] - top) / total;
      const std::size_t end = p + 1 == peers ? members.size()
                                             : std::min(members.size(), static_cast<std::size_t>(
                                                                            std::llround(cumulative * size)));
      shards[p].insert(shards[p].end(), members.begin() + begin, members.begin() + end);
      begin = end;
    }
  }
  return shards;
}

}  // namespace

std::vector<std::vector<int>> partition_dirichlet(const std::vector<std::int32_t>& labels, int classes, int peers,
                                                  double alpha, std::uint64_t seed, std::size_t min_examples) {
  check_peers(peers, "dirichlet partition");
  if (!(alpha > 0) || !std::isfinite(alpha))
    throw Error(ErrorKind::kInvalidArgument, str("dirichlet partition: alpha ", alpha, " must be positive"));
  if (classes < 1) throw Error(ErrorKind::kInvalidArgument, str("dirichlet partition: classes ", classes, " < 1"));
  std::vector<std::vector<int>> by_class(classes);
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0 || labels[i] >= classes)
      throw Error(ErrorKind::kInvalidArgument,
                  str("dirichlet partition: label ", labels[i], " of example ", i, " is outside [0, ", classes, ")"));
    by_class[labels[i]].push_back(static_cast<int>(i));
  }
  Rng rng(seed);
  // Redrawn (the stream goes on) until every peer holds min_examples, as NIID-Bench's
  // partitioner does: a peer with less than a batch cannot train at all.
  constexpr int kDraws = 100;
  std::size_t best = 0;
  for (int draw = 0; draw < kDraws; ++draw) {
    auto shards = draw_dirichlet(by_class, peers, alpha, rng);
    std::size_t smallest = shards[0].size();
    for (const auto& shard : shards) smallest = std::min(smallest, shard.size());
    best = std::max(best, smallest);
    if (smallest < std::max<std::size_t>(min_examples, 1)) continue;
    for (auto& shard : shards) std::sort(shard.begin(), shard.end());
    return shards;
  }
  throw Error(
      ErrorKind::kInvalidArgument,
      str("dirichlet partition: in ", kDraws, " draws with alpha ", alpha, " and seed ", seed,
          " no draw gave each of the ", peers, " peers at least ", std::max<std::size_t>(min_examples, 1),
          " examples (the best gave ", best, "); use a larger alpha, fewer peers, a smaller --batch or another seed"));
}

BatchSampler::BatchSampler(const Dataset& data, std::vector<int> shard, int batch, std::uint64_t seed)
    : data_(&data), shard_(std::move(shard)), batch_(batch), seed_(seed) {
  if (batch_ < 1) throw Error(ErrorKind::kInvalidArgument, str("batch sampler: batch ", batch_, " must be positive"));
  if (shard_.size() < static_cast<std::size_t>(batch_))
    throw Error(ErrorKind::kInvalidArgument,
                str("batch sampler: a shard of ", shard_.size(), " examples has no full batch of ", batch_));
  for (int index : shard_)
    if (index < 0 || index >= data.size())
      throw Error(ErrorKind::kInvalidArgument,
                  str("batch sampler: example ", index, " is outside the data set of ", data.size()));
  shuffle_for_epoch();
}

void BatchSampler::shuffle_for_epoch() {
  order_.resize(shard_.size());
  std::iota(order_.begin(), order_.end(), 0);
  Rng rng(mix(seed_, static_cast<std::uint64_t>(epoch_)));
  shuffle(order_, rng);
}

void BatchSampler::restore(const State& state) {
  if (state.epoch == kFromBatchesDrawn && state.position == 0 && state.batches_drawn >= 0) {
    const long long per_epoch = batches_per_epoch();
    const long long b = state.batches_drawn;
    // next() opens a new epoch only when it draws, so after a whole epoch the position is
    // at its end, not at the start of the next.
    State derived{0, 0, b};
    if (b > 0) {
      derived.epoch = static_cast<int>((b - 1) / per_epoch);
      derived.position = static_cast<std::size_t>(((b - 1) % per_epoch + 1) * batch_);
    }
    return restore(derived);
  }
  if (state.epoch < 0 || state.batches_drawn < 0 || state.position > shard_.size() ||
      state.position % static_cast<std::size_t>(batch_) != 0)
    throw Error(ErrorKind::kInvalidArgument,
                str("batch sampler: cannot restore epoch ", state.epoch, ", position ", state.position, ", ",
                    state.batches_drawn, " batches drawn into a sampler of ", shard_.size(), " examples in batches of ",
                    batch_, " (the position must be a multiple of the batch within the shard)"));
  epoch_ = state.epoch;
  position_ = state.position;
  batches_drawn_ = state.batches_drawn;
  shuffle_for_epoch();
}

void BatchSampler::next(float* inputs, std::int32_t* labels) {
  if (position_ + batch_ > order_.size()) {
    ++epoch_;
    position_ = 0;
    shuffle_for_epoch();
  }
  const std::size_t features = static_cast<std::size_t>(data_->features);
  for (int j = 0; j < batch_; ++j) {
    const int example = shard_[order_[position_ + j]];
    std::copy_n(data_->inputs.data() + example * features, features, inputs + j * features);
    labels[j] = data_->labels[example];
  }
  position_ += batch_;
  ++batches_drawn_;
}

}  // namespace peertrain::train
