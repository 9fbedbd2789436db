// The IDX reader on small files written here (gzip and plain, valid and broken), the real
// Fashion-MNIST when it is installed, the partitions over peers and the batch sampler.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "peertrain/core/error.h"
#include "peertrain/train/data.h"

namespace peertrain::train {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

void put_u32(Bytes& out, std::uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(value >> shift));
}

Bytes image_file(std::uint32_t magic, std::uint32_t count, std::uint32_t rows, std::uint32_t cols, std::size_t pixels) {
  Bytes out;
  put_u32(out, magic);
  put_u32(out, count);
  put_u32(out, rows);
  put_u32(out, cols);
  for (std::size_t i = 0; i < pixels; ++i) out.push_back(static_cast<std::uint8_t>(i * 37 % 256));
  return out;
}

Bytes pixels_of(const IdxBytes& data) { return {data.pixels.begin(), data.pixels.end()}; }

Bytes label_file(std::uint32_t magic, std::uint32_t count, const Bytes& labels) {
  Bytes out;
  put_u32(out, magic);
  put_u32(out, count);
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

class IdxFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("peertrain_data_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const Bytes& bytes, bool gzip) {
    const std::string path = (dir_ / name).string();
    if (gzip) {
      gzFile f = gzopen(path.c_str(), "wb");
      EXPECT_NE(f, nullptr);
      EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
      gzclose(f);
    } else {
      std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    }
    return path;
  }

  // Loads and returns the error message, or "" when loading succeeded.
  static std::string load_error(const std::string& images, const std::string& labels) {
    try {
      load_idx(images, labels);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
};

TEST_F(IdxFiles, ReadsGzipAndPlainFilesAlike) {
  for (bool gzip : {true, false}) {
    const std::string images = write("images", image_file(2051, 3, 2, 2, 12), gzip);
    const std::string labels = write("labels", label_file(2049, 3, {4, 0, 9}), gzip);
    const Dataset data = load_idx(images, labels);
    EXPECT_EQ(data.size(), 3);
    EXPECT_EQ(data.features, 4);
    EXPECT_EQ(data.classes, 10);
    EXPECT_EQ(data.labels, (std::vector<std::int32_t>{4, 0, 9}));
    ASSERT_EQ(data.inputs.size(), 12u);
    // Pixel i is i·37 mod 256; example 1, pixel 1 is byte 5 = 185.
    EXPECT_NEAR(data.inputs[0], (0 / 255.0 - 0.2860) / 0.3530, 1e-6);
    EXPECT_NEAR(data.inputs[5], (185 / 255.0 - 0.2860) / 0.3530, 1e-6);
  }
}

TEST_F(IdxFiles, EachBrokenFileIsReportedWithItsName) {
  const std::string images = write("good-images.gz", image_file(2051, 3, 2, 2, 12), true);
  const std::string labels = write("good-labels.gz", label_file(2049, 3, {1, 2, 3}), true);
  ASSERT_EQ(load_error(images, labels), "");
  struct Case {
    std::string name;
    std::string images, labels;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"wrong image magic", write("magic-images.gz", image_file(2049, 3, 2, 2, 12), true), labels,
       "magic-images.gz: not an IDX image file: magic number 2049, expected 2051"},
      {"wrong label magic", images, write("magic-labels", label_file(2051, 3, {1, 2, 3}), false),
       "magic-labels: not an IDX label file: magic number 2051, expected 2049"},
      {"truncated pixels", write("short-images.gz", image_file(2051, 3, 2, 2, 11), true), labels,
       "short-images.gz: truncated: expected 12 pixel bytes, got 11"},
      {"truncated header", write("header-images", Bytes{0, 0, 8, 3, 0, 0}, false), labels,
       "header-images: truncated: expected a 16-byte IDX header, got 6 bytes"},
      {"truncated labels", images, write("short-labels.gz", label_file(2049, 3, {1, 2}), true),
       "short-labels.gz: truncated: expected 3 label bytes, got 2"},
      {"count mismatch", images, write("four-labels.gz", label_file(2049, 4, {1, 2, 3, 4}), true),
       "four-labels.gz: has 4 labels but " + images + " has 3 images"},
      {"label out of range", images, write("big-label.gz", label_file(2049, 3, {1, 10, 3}), true),
       "big-label.gz: label 10 of example 1 is outside [0, 10)"},
      {"trailing bytes", write("long-images", image_file(2051, 3, 2, 2, 13), false), labels,
       "long-images: unexpected bytes after the last of 3 images"},
      {"zero width", write("flat-images", image_file(2051, 3, 0, 2, 0), false), labels,
       "flat-images: implausible dimensions 3 x 0 x 2"},
      {"a header claiming 2^28 pixels each", write("huge-images", image_file(2051, 1, 1u << 14, 1u << 14, 4), false),
       labels, "huge-images: implausible dimensions"},
      // Each dimension plausible, their product 2^40 bytes: refused before anything is
      // inflated (a gzip bomb's few MB would otherwise become a terabyte).
      {"a header claiming a terabyte", write("bomb-images.gz", image_file(2051, 1u << 20, 1u << 10, 1u << 10, 4), true),
       labels, "bomb-images.gz: claims 1048576 images of 1024 x 1024 pixels, more than the 4 GiB"},
      {"missing file", (dir_ / "absent.gz").string(), labels, "absent.gz: cannot open: No such file or directory"},
  };
  for (const Case& c : cases) {
    const std::string message = load_error(c.images, c.labels);
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.name << ": got \"" << message << "\"";
  }
}

// The cache holds the decompressed copy of a gzip pair, is what the next read returns, and
// is never taken for the data once it no longer matches the original's gzip trailer.
TEST_F(IdxFiles, GzipFilesAreReadFromTheirDecompressedCopyWhileItMatches) {
  IdxOptions options;
  options.cache_dir = (dir_ / "cache").string();
  const Bytes pixels = image_file(2051, 3, 2, 2, 12);
  const std::string images = write("images.gz", pixels, true);
  const std::string labels = write("labels.gz", label_file(2049, 3, {4, 0, 9}), true);
  const IdxBytes first = read_idx(images, labels, options);
  std::vector<fs::path> copies;
  for (const auto& entry : fs::directory_iterator(dir_ / "cache" / "idx")) copies.push_back(entry.path());
  ASSERT_EQ(copies.size(), 2u);
  std::sort(copies.begin(), copies.end());  // images-…, then labels-…
  ASSERT_EQ(copies[0].filename().string().rfind("images-", 0), 0u) << copies[0];
  // The copy is the plain IDX file the gzip held, byte for byte.
  std::ifstream copy(copies[0], std::ios::binary);
  EXPECT_EQ(Bytes(std::istreambuf_iterator<char>(copy), {}), pixels);

  // The next read comes from the copy: with the original's compressed bytes spoiled (its
  // size and trailer kept), the original no longer reads, but the pair still does.
  {
    std::fstream spoil(images, std::ios::binary | std::ios::in | std::ios::out);
    spoil.seekp(12);
    spoil.write("\xff\xff\xff\xff", 4);
  }
  EXPECT_THROW(read_idx(images, labels), Error);
  EXPECT_EQ(pixels_of(read_idx(images, labels, options)), pixels_of(first));
  write("images.gz", pixels, true);

  // A copy that no longer matches the trailer is read around, and written again: a changed
  // pixel, then a truncated file.
  Bytes altered = pixels;
  altered[16] = 200;
  std::ofstream(copies[0], std::ios::binary).write(reinterpret_cast<const char*>(altered.data()), altered.size());
  EXPECT_EQ(pixels_of(read_idx(images, labels, options)), pixels_of(first));
  std::ifstream rewritten(copies[0], std::ios::binary);
  EXPECT_EQ(Bytes(std::istreambuf_iterator<char>(rewritten), {}), pixels);
  fs::resize_file(copies[0], 10);
  EXPECT_EQ(pixels_of(read_idx(images, labels, options)), pixels_of(first));
  EXPECT_EQ(fs::file_size(copies[0]), pixels.size());

  // A changed original is another file: its own copy, its own bytes.
  const std::string changed = write("images.gz", image_file(2051, 3, 1, 4, 12), true);
  const IdxBytes again = read_idx(changed, labels, options);
  EXPECT_EQ(again.rows, 1);
  EXPECT_EQ(again.features, 4);
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir_ / "cache" / "idx")) ++entries;
  EXPECT_EQ(entries, 3u);

  // A broken original leaves nothing behind, and its error names it.
  const std::string broken = write("broken.gz", image_file(2051, 3, 2, 2, 11), true);
  try {
    read_idx(broken, labels, options);
    ADD_FAILURE() << "a truncated file was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("broken.gz: truncated"), std::string::npos) << e.what();
  }
  for (const auto& entry : fs::directory_iterator(dir_ / "cache" / "idx"))
    EXPECT_EQ(entry.path().filename().string().find("broken"), std::string::npos) << entry.path();
}

// Whether this process maps the file (a line of /proc/self/maps ends with its path).
bool mapped(const fs::path& file) {
  const std::string name = file.string();
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.size() > name.size() && line.ends_with(name) && line[line.size() - name.size() - 1] == ' ') return true;
  return false;
}

// The peers of a launch read the same copy: its pixels are mapped, not copied, for as long
// as something holds them, and a copy that does not end where its header says is not used.
TEST_F(IdxFiles, TheDecompressedCopysPixelsAreMappedWhileHeld) {
  IdxOptions options;
  options.cache_dir = (dir_ / "cache").string();
  const Bytes pixels = image_file(2051, 3, 2, 2, 12);
  const std::string images = write("images.gz", pixels, true);
  const std::string labels = write("labels.gz", label_file(2049, 3, {4, 0, 9}), true);
  const Bytes want = pixels_of(read_idx(images, labels, options));  // decompresses and writes the copy
  fs::path copy;
  for (const auto& entry : fs::directory_iterator(dir_ / "cache" / "idx"))
    if (entry.path().filename().string().starts_with("images-")) copy = entry.path();
  ASSERT_FALSE(copy.empty());
  {
    IdxBytes held = read_idx(images, labels, options);
    EXPECT_TRUE(mapped(copy));
    const IdxBytes shared = held;  // copies share the mapping
    held = IdxBytes{};
    EXPECT_TRUE(mapped(copy));
    EXPECT_EQ(pixels_of(shared), want);
  }
  EXPECT_FALSE(mapped(copy));
  // One byte too many: the copy is read around (and written again), never mapped short.
  std::ofstream(copy, std::ios::binary | std::ios::app).put('\0');
  EXPECT_EQ(pixels_of(read_idx(images, labels, options)), want);
  EXPECT_EQ(fs::file_size(copy), pixels.size());
}

TEST_F(IdxFiles, PlainLabelsBesideGzipImagesAreReadWhereTheyAre) {
  IdxOptions options;
  options.cache_dir = (dir_ / "cache").string();
  const std::string images = write("images.gz", image_file(2051, 3, 2, 2, 12), true);
  const std::string labels = write("labels", label_file(2049, 3, {4, 0, 9}), false);
  for (int read = 0; read < 2; ++read)
    EXPECT_EQ(read_idx(images, labels, options).labels, (std::vector<std::int32_t>{4, 0, 9}));
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_ / "cache" / "idx")) names.push_back(entry.path().filename());
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(names[0].rfind("images-", 0), 0u) << names[0];
}

// A cache that cannot be used costs the decompression, never the read.
TEST_F(IdxFiles, ACacheThatCannotBeUsedNeverFailsARead) {
  const std::string images = write("images.gz", image_file(2051, 3, 2, 2, 12), true);
  const std::string labels = write("labels.gz", label_file(2049, 3, {4, 0, 9}), true);
  write("a-file", Bytes{1, 2, 3}, false);
  for (const std::string& cache : {(dir_ / "a-file").string(),  // a regular file where a folder belongs
                                   (dir_ / std::string(5000, 'x')).string()}) {  // a name too long for the system
    IdxOptions options;
    options.cache_dir = cache;
    for (int read = 0; read < 2; ++read)
      EXPECT_EQ(read_idx(images, labels, options).labels, (std::vector<std::int32_t>{4, 0, 9})) << cache.size();
  }
}

TEST_F(IdxFiles, AShardBecomesInputsOfItsOwnExamplesOnly) {
  const std::string images = write("images", image_file(2051, 3, 2, 2, 12), false);
  const std::string labels = write("labels", label_file(2049, 3, {4, 0, 9}), false);
  const IdxBytes bytes = read_idx(images, labels);
  const Dataset all = to_dataset(bytes);
  const std::vector<int> examples = {2, 0};
  const Dataset shard = to_dataset(bytes, examples);
  ASSERT_EQ(shard.size(), 2);
  EXPECT_EQ(shard.labels, (std::vector<std::int32_t>{9, 4}));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(shard.inputs[i], all.inputs[8 + i]);
    EXPECT_EQ(shard.inputs[4 + i], all.inputs[i]);
  }
  const std::vector<int> outside = {3};
  EXPECT_THROW(to_dataset(bytes, outside), Error);
}

TEST(FashionMnist, LoadsBothSplitsWhenInstalled) {
  if (!fs::exists(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << kFashionMnistDir << " is not installed (Debian package dataset-fashion-mnist)";
  const Dataset train = load_fashion_mnist(kFashionMnistDir, true);
  const Dataset test = load_fashion_mnist(kFashionMnistDir, false);
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.features, 784);
  // The first labels of each split, as published with the data set.
  EXPECT_EQ((std::vector<std::int32_t>(train.labels.begin(), train.labels.begin() + 5)),
            (std::vector<std::int32_t>{9, 0, 0, 3, 0}));
  EXPECT_EQ((std::vector<std::int32_t>(test.labels.begin(), test.labels.begin() + 5)),
            (std::vector<std::int32_t>{9, 2, 1, 1, 6}));
  // Normalized with the training set's own mean and deviation.
  double sum = 0, squares = 0;
  for (float x : train.inputs) {
    sum += x;
    squares += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(train.inputs.size());
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(squares / n - (sum / n) * (sum / n)), 1.0, 0.01);
}

// Every index exactly once, over all shards.
void expect_exact_cover(const std::vector<std::vector<int>>& shards, int n) {
  std::vector<int> seen(n, 0);
  for (const auto& shard : shards)
    for (int i : shard) {
      ASSERT_GE(i, 0);
      ASSERT_LT(i, n);
      ++seen[i];
    }
  for (int i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "index " << i;
}

TEST(Partition, IidCoversEveryIndexOnceInBalancedShares) {
  for (int peers : {1, 2, 7, 13}) {
    for (int n : {13, 100, 1001}) {
      const auto shards = partition_iid(n, peers, 42);
      ASSERT_EQ(shards.size(), static_cast<std::size_t>(peers));
      expect_exact_cover(shards, n);
      std::size_t smallest = n, largest = 0;
      for (const auto& s : shards) {
        smallest = std::min(smallest, s.size());
        largest = std::max(largest, s.size());
      }
      EXPECT_LE(largest - smallest, 1u) << n << " examples over " << peers << " peers";
    }
  }
  EXPECT_EQ(partition_iid(100, 4, 1), partition_iid(100, 4, 1));
  EXPECT_NE(partition_iid(100, 4, 1), partition_iid(100, 4, 2));
  EXPECT_THROW(partition_iid(3, 4, 1), Error);
  EXPECT_THROW(partition_iid(3, 0, 1), Error);
}

std::vector<std::int32_t> balanced_labels(int n, int classes) {
  std::vector<std::int32_t> labels(n);
  for (int i = 0; i < n; ++i) labels[i] = (i * 7) % classes;
  return labels;
}

// The share of a shard that its most common label makes up, averaged over the shards.
double mean_top_label_share(const std::vector<std::vector<int>>& shards, const std::vector<std::int32_t>& labels) {
  double total = 0;
  for (const auto& shard : shards) {
    std::map<int, int> histogram;
    int top = 0;
    for (int i : shard) top = std::max(top, ++histogram[labels[i]]);
    total += static_cast<double>(top) / shard.size();
  }
  return total / shards.size();
}

TEST(Partition, DirichletCoversEveryIndexOnceDeterministicallyAndSkewsWithSmallAlpha) {
  const int n = 6000, classes = 10, peers = 8;
  const auto labels = balanced_labels(n, classes);
  const auto skewed = partition_dirichlet(labels, classes, peers, 0.1, 7);
  const auto even = partition_dirichlet(labels, classes, peers, 100.0, 7);
  expect_exact_cover(skewed, n);
  expect_exact_cover(even, n);
  EXPECT_EQ(skewed, partition_dirichlet(labels, classes, peers, 0.1, 7));
  EXPECT_NE(skewed, partition_dirichlet(labels, classes, peers, 0.1, 8));
  // With alpha 100 each shard is close to the uniform 10%; with alpha 0.1 a shard is
  // dominated by one or two classes.
  EXPECT_LT(mean_top_label_share(even, labels), 0.2);
  EXPECT_GT(mean_top_label_share(skewed, labels), 0.5);
}

TEST(Partition, DirichletReportsBadInputAndEmptyPeers) {
  const auto labels = balanced_labels(20, 2);
  EXPECT_THROW(partition_dirichlet(labels, 2, 4, 0.0, 1), Error);
  EXPECT_THROW(partition_dirichlet(labels, 2, 0, 1.0, 1), Error);
  EXPECT_THROW(partition_dirichlet({0, 1, 2}, 2, 2, 1.0, 1), Error);
  // 20 examples over 50 peers: some peer must come out empty, in every draw.
  try {
    partition_dirichlet(labels, 2, 50, 1.0, 1);
    FAIL() << "an empty peer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no draw gave each of the 50 peers at least 1 examples"), std::string::npos)
        << e.what();
  }
}

TEST(Partition, DirichletDrawsAgainUntilEveryPeerHoldsABatch) {
  const int n = 60000, classes = 10, peers = 32;  // Fashion-MNIST's size
  const auto labels = balanced_labels(n, classes);
  const auto first = partition_dirichlet(labels, classes, peers, 0.1, 2);
  std::size_t smallest = n;
  for (const auto& shard : first) smallest = std::min<std::size_t>(smallest, shard.size());
  ASSERT_LT(smallest, 64u) << "this seed's first draw should leave a peer short of a batch of 64";
  // The first draw is the partition whenever it holds enough, so asking for its own
  // smallest shard changes nothing.
  EXPECT_EQ(partition_dirichlet(labels, classes, peers, 0.1, 2, smallest), first);
  const auto redrawn = partition_dirichlet(labels, classes, peers, 0.1, 2, 64);
  expect_exact_cover(redrawn, n);
  for (const auto& shard : redrawn) EXPECT_GE(shard.size(), 64u);
  EXPECT_EQ(redrawn, partition_dirichlet(labels, classes, peers, 0.1, 2, 64));  // still deterministic
}

Dataset counting_dataset(int n, int features) {
  Dataset data;
  data.features = features;
  data.classes = 10;
  for (int i = 0; i < n; ++i) {
    data.labels.push_back(i % 10);
    for (int f = 0; f < features; ++f) data.inputs.push_back(static_cast<float>(i * 100 + f));
  }
  return data;
}

TEST(BatchSampler, DrawsEachExampleOncePerEpochAndReproducesFromTheSeed) {
  const Dataset data = counting_dataset(50, 3);
  std::vector<int> shard = {1, 4, 9, 16, 25, 36, 49, 2, 3, 5, 7};  // 11 examples, batch 4: 2 batches, 3 dropped
  BatchSampler a(data, shard, 4, 99), b(data, shard, 4, 99), c(data, shard, 4, 100);
  EXPECT_EQ(a.batches_per_epoch(), 2);
  std::vector<float> xa(12), xb(12), xc(12);
  std::vector<std::int32_t> ya(4), yb(4), yc(4);
  std::vector<std::vector<int>> epochs(3);
  bool differs = false;
  for (int k = 0; k < 6; ++k) {
    a.next(xa.data(), ya.data());
    b.next(xb.data(), yb.data());
    c.next(xc.data(), yc.data());
    EXPECT_EQ(a.epoch(), k / 2);
    EXPECT_EQ(xa, xb);
    EXPECT_EQ(ya, yb);
    differs = differs || xa != xc;
    for (int j = 0; j < 4; ++j) {
      // Column j is one whole example, with its own label.
      const int example = static_cast<int>(xa[3 * j]) / 100;
      EXPECT_EQ(xa[3 * j + 2], example * 100 + 2);
      EXPECT_EQ(ya[j], example % 10);
      epochs[k / 2].push_back(example);
    }
  }
  EXPECT_EQ(a.batches_drawn(), 6);
  EXPECT_TRUE(differs) << "seeds 99 and 100 gave the same batches";
  const std::set<int> allowed(shard.begin(), shard.end());
  for (const auto& drawn : epochs) {
    EXPECT_EQ(std::set<int>(drawn.begin(), drawn.end()).size(), 8u) << "an example repeated within an epoch";
    for (int e : drawn) EXPECT_TRUE(allowed.count(e)) << e << " is not in the shard";
  }
  EXPECT_NE(epochs[0], epochs[1]) << "the order was not reshuffled";
}

TEST(BatchSampler, BadShardsAreReported) {
  const Dataset data = counting_dataset(10, 2);
  EXPECT_THROW(BatchSampler(data, {1, 2}, 3, 1), Error);
  EXPECT_THROW(BatchSampler(data, {1, 2, 10}, 2, 1), Error);
  EXPECT_THROW(BatchSampler(data, {1, 2}, 0, 1), Error);
}


// A sampler restored from state() draws what the original draws next, across epoch ends:
// 11 examples in batches of 4 give 2 batches an epoch, so 3 draws stop inside epoch 1 and
// 4 stop at its end, where the next draw starts epoch 2.
TEST(BatchSampler, RestoredStateDrawsTheSameBatches) {
  const Dataset data = counting_dataset(50, 3);
  const std::vector<int> shard = {1, 4, 9, 16, 25, 36, 49, 2, 3, 5, 7};
  for (int before : {0, 1, 2, 3, 4}) {
    BatchSampler original(data, shard, 4, 99);
    std::vector<float> xa(12), xb(12);
    std::vector<std::int32_t> ya(4), yb(4);
    for (int k = 0; k < before; ++k) original.next(xa.data(), ya.data());
    const BatchSampler::State saved = original.state();
    EXPECT_EQ(saved.batches_drawn, before);

    BatchSampler resumed(data, shard, 4, 99);
    resumed.next(xb.data(), yb.data());  // a fresh sampler that moved on, to be overwritten
    resumed.restore(saved);
    EXPECT_EQ(resumed.state(), saved);
    EXPECT_EQ(resumed.epoch(), original.epoch());
    for (int k = 0; k < 5; ++k) {
      original.next(xa.data(), ya.data());
      resumed.next(xb.data(), yb.data());
      ASSERT_EQ(xa, xb) << "after " << before << " draws, then " << k;
      ASSERT_EQ(ya, yb) << "after " << before << " draws, then " << k;
      ASSERT_EQ(resumed.epoch(), original.epoch());
    }
    EXPECT_EQ(resumed.state(), original.state());
  }
}

// A peer that rejoins at step s never drew the first s batches: after_batches(s) puts its
// sampler where one that did would stand, at an epoch's end too.
TEST(BatchSampler, AfterBatchesIsWhereDrawingThatManyLeaves) {
  const Dataset data = counting_dataset(50, 3);
  const std::vector<int> shard = {1, 4, 9, 16, 25, 36, 49, 2, 3, 5, 7};  // 2 batches an epoch
  for (int before : {0, 1, 2, 3, 4, 7}) {
    BatchSampler original(data, shard, 4, 99), rejoined(data, shard, 4, 99);
    std::vector<float> xa(12), xb(12);
    std::vector<std::int32_t> ya(4), yb(4);
    for (int k = 0; k < before; ++k) original.next(xa.data(), ya.data());
    rejoined.restore(BatchSampler::after_batches(before));
    EXPECT_EQ(rejoined.state(), original.state()) << "after " << before;
    for (int k = 0; k < 3; ++k) {
      original.next(xa.data(), ya.data());
      rejoined.next(xb.data(), yb.data());
      ASSERT_EQ(xa, xb) << "after " << before << " draws, then " << k;
    }
  }
}

TEST(BatchSampler, StatesThatCannotBelongToTheSamplerAreReported) {
  const Dataset data = counting_dataset(50, 3);
  BatchSampler sampler(data, {1, 4, 9, 16, 25, 36, 49, 2, 3, 5, 7}, 4, 99);
  const BatchSampler::State before = sampler.state();
  for (const BatchSampler::State bad : {BatchSampler::State{-1, 0, 0}, BatchSampler::State{0, 3, 0},
                                        BatchSampler::State{0, 12, 3}, BatchSampler::State{0, 0, -1}}) {
    EXPECT_THROW(sampler.restore(bad), Error) << "epoch " << bad.epoch << " position " << bad.position;
    EXPECT_EQ(sampler.state(), before) << "a refused restore changed the sampler";
  }
}

}  // namespace
}  // namespace peertrain::train
