#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "peertrain/core/error.h"
#include "peertrain/train/text.h"

namespace peertrain::train {
namespace {

std::string numbered_fortunes(int count) {
  std::string text;
  for (int i = 0; i < count; ++i) text += "fortune " + std::to_string(i) + "\nsecond line\n%\n";
  return text;
}

TEST(Fortunes, EveryTwentiethFortuneIsHeldOut) {
  const TextCorpus c = split_fortunes(numbered_fortunes(40));
  EXPECT_EQ(c.fortunes, 40);
  EXPECT_NE(c.validation.find("fortune 19\n"), std::string::npos);
  EXPECT_NE(c.validation.find("fortune 39\n"), std::string::npos);
  EXPECT_EQ(c.train.find("fortune 19\n"), std::string::npos);
  EXPECT_NE(c.train.find("fortune 18\nsecond line\n"), std::string::npos);
  EXPECT_EQ(c.train.find('%'), std::string::npos) << "separators are not text";
}

TEST(Fortunes, LoadsADirectoryAndSkipsIndexesAndLinks) {
  const auto dir = std::filesystem::temp_directory_path() / "peertrain_text_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "a") << numbered_fortunes(20);
  std::ofstream(dir / "a.dat") << "binary index";
  std::filesystem::create_symlink(dir / "a", dir / "a.u8");
  const TextCorpus c = load_fortunes(dir.string());
  EXPECT_EQ(c.files, 1);
  EXPECT_EQ(c.fortunes, 20);
  EXPECT_EQ(c.train.find("binary"), std::string::npos);
  std::filesystem::remove_all(dir);
  try {
    load_fortunes(dir.string());
    FAIL() << "a missing directory was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.string()), std::string::npos) << e.what();
  }
}

TEST(TextSampler, WindowsComeFromThePeersBlocksAndTargetsAreTheNextByte) {
  // Block b of the text holds only letter b: peer 2 of 4 must see only blocks 2, 6, 10, …
  std::string text;
  for (int block = 0; block < 12; ++block) text += std::string(kShardBlock, static_cast<char>('a' + block));
  const int seq = 16, batch = 4;
  TextSampler sampler(text, 4, 2, batch, seq, 7);
  EXPECT_EQ(sampler.shard_bytes(), 3 * kShardBlock);
  std::vector<std::int32_t> bytes(batch * seq), targets(batch * seq);
  std::set<std::int32_t> seen;
  for (int step = 0; step < 50; ++step) {
    sampler.next(bytes.data(), targets.data());
    for (int i = 0; i < batch * seq; ++i) {
      seen.insert(bytes[i]);
      if (i % seq != seq - 1) {
        EXPECT_EQ(targets[i], bytes[i + 1]) << "the target is the next byte";
      }
    }
  }
  EXPECT_EQ(seen, (std::set<std::int32_t>{'c', 'g', 'k'}));
  // A resumed sampler draws the same windows.
  TextSampler again(text, 4, 2, batch, seq, 7);
  again.restore(49);
  std::vector<std::int32_t> bytes2(batch * seq), targets2(batch * seq);
  again.next(bytes2.data(), targets2.data());
  EXPECT_EQ(bytes, bytes2);
  EXPECT_THROW(TextSampler(text, 40, 39, 1, seq, 1), Error) << "a peer without a block";
  EXPECT_THROW(TextSampler(text, 4, 0, 1, 4 * static_cast<int>(kShardBlock), 1), Error) << "a shard shorter than a window";
}

TEST(TextWindows, ConsecutiveWindowsCappedAtTheMaximum) {
  const std::string text = "abcdefghij";
  const TextWindows w = validation_windows(text, 3, 100);
  EXPECT_EQ(w.count, 2);
  EXPECT_EQ(w.bytes, (std::vector<std::int32_t>{'a', 'b', 'c', 'e', 'f', 'g'}));
  EXPECT_EQ(w.targets, (std::vector<std::int32_t>{'b', 'c', 'd', 'f', 'g', 'h'}));
  const TextWindows spread = validation_windows("abcdefghijklmnop", 3, 2);  // 4 fit: every other one
  EXPECT_EQ(spread.bytes, (std::vector<std::int32_t>{'a', 'b', 'c', 'i', 'j', 'k'}));
  EXPECT_EQ(validation_windows(text, 3, 1).count, 1);
  EXPECT_THROW(validation_windows(text, 10, 1), Error);
}

}  // namespace
}  // namespace peertrain::train
