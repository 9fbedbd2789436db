// The tokenizers: bytes, and a sentencepiece BPE trained on a small text. Encoding is
// lossless (the tokens' byte counts add up to the text), the model is kept and reused,
// and a vocabulary the text cannot fill is named by its flag.
#include "peertrain/train/tokenizer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <string>

#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "peertrain/train/text.h"

namespace peertrain::train {
namespace {

// A few hundred lines of words from a small lexicon, with digits, punctuation, blank lines
// and a tab: enough for BPE to find merges, and every byte kind the corpus has.
std::string sample_text() {
  const char* words[] = {"the",  "peer",   "gossip", "averages", "with", "its",   "neighbours",
                         "and",  "trains", "a",      "replica",  "on",   "shard", "of",
                         "data", "ring",   "torus",  "spectral", "gap"};
  Rng rng(4);
  std::string text;
  for (int line = 0; line < 600; ++line) {
    const int n = 3 + static_cast<int>(rng.uniform_below(9));
    for (int w = 0; w < n; ++w) {
      if (w > 0) text += rng.uniform_below(20) == 0 ? "\t" : " ";
      text += words[rng.uniform_below(std::size(words))];
    }
    text += rng.uniform_below(3) == 0 ? ", 2017.\n" : ".\n";
    if (line % 50 == 0) text += "\n";
  }
  return text;
}

std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

int covered_bytes(const Tokenizer& t, const std::vector<std::int32_t>& ids) {
  int bytes = 0;
  for (std::int32_t id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, t.vocab_size());
    bytes += t.token_bytes(id);
  }
  return bytes;
}

TEST(Tokenizer, BytesAreTheirOwnTokens) {
  const auto t = make_byte_tokenizer();
  EXPECT_EQ(t->vocab_size(), 256);
  const std::string text = "a\xff\n ";
  EXPECT_EQ(t->encode(text), (std::vector<std::int32_t>{'a', 255, '\n', ' '}));
  EXPECT_EQ(parse_tokenizer("sentencepiece"), TokenizerKind::kSentencePiece);
  EXPECT_THROW(parse_tokenizer("wordpiece"), Error);
}

TEST(Tokenizer, SentencePieceIsLosslessShorterAndKept) {
  const std::string text = sample_text();
  const auto dir = fresh_dir("peertrain-tokenizer");
  const auto t = make_sentencepiece_tokenizer(text, 400, dir.string());
  EXPECT_EQ(t->vocab_size(), 400);
  const auto ids = t->encode(text);
  EXPECT_EQ(covered_bytes(*t, ids), static_cast<int>(text.size()));
  EXPECT_LT(ids.size() * 2, text.size()) << "BPE should merge the lexicon's words";
  // Bytes it never saw in training still have tokens (byte fallback).
  const std::string unseen = "Zürich {~}\n\x01";
  EXPECT_EQ(covered_bytes(*t, t->encode(unseen)), static_cast<int>(unseen.size()));
  // Kept in the directory, and loaded from there the second time: the same file, the
  // same tokens.
  std::vector<std::filesystem::path> models;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".model") models.push_back(entry.path());
  ASSERT_EQ(models.size(), 1u);
  const auto written = std::filesystem::last_write_time(models[0]);
  const auto again = make_sentencepiece_tokenizer(text, 400, dir.string());
  EXPECT_EQ(again->encode(text), ids);
  EXPECT_EQ(std::filesystem::last_write_time(models[0]), written);
  // Validation windows count the bytes their targets stand for.
  std::vector<int> token_bytes(400);
  for (int id = 0; id < 400; ++id) token_bytes[static_cast<std::size_t>(id)] = t->token_bytes(id);
  const TextWindows w = validation_windows(ids, 16, 8, token_bytes);
  double bytes = 0;
  for (std::int32_t target : w.targets) bytes += t->token_bytes(target);
  EXPECT_EQ(w.target_bytes, bytes);
  EXPECT_GT(w.target_bytes, static_cast<double>(w.targets.size()));
  std::filesystem::remove_all(dir);
}

TEST(Tokenizer, AVocabularyTheTextCannotFillNamesTheFlag) {
  const auto dir = fresh_dir("peertrain-tokenizer-big");
  try {
    make_sentencepiece_tokenizer("tiny text\n", 5000, dir.string());
    ADD_FAILURE() << "a 5000-piece vocabulary from ten bytes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--vocab-size 5000"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_sentencepiece_tokenizer("text\n", 100, dir.string()), Error);
  std::filesystem::remove_all(dir);
}

// Without HOME or XDG_CACHE_HOME the tokenizer lives in /tmp/peertrain-<uid>, mode 0700,
// never in a fixed shared name another user could have made first.
TEST(Tokenizer, TheTmpFallbackIsAPrivateDirectoryOfThisUser) {
  const std::string home = std::getenv("HOME") ? std::getenv("HOME") : "";
  const std::string xdg = std::getenv("XDG_CACHE_HOME") ? std::getenv("XDG_CACHE_HOME") : "";
  ::unsetenv("HOME");
  ::unsetenv("XDG_CACHE_HOME");
  const std::string dir = tokenizer_dir("");
  if (!home.empty()) ::setenv("HOME", home.c_str(), 1);
  if (!xdg.empty()) ::setenv("XDG_CACHE_HOME", xdg.c_str(), 1);
  EXPECT_EQ(dir, "/tmp/peertrain-" + std::to_string(::getuid()));
  struct stat info {};
  ASSERT_EQ(::lstat(dir.c_str(), &info), 0);
  EXPECT_TRUE(S_ISDIR(info.st_mode));
  EXPECT_EQ(info.st_mode & 0077, 0u) << "the fallback is open to other users";
  EXPECT_EQ(tokenizer_dir("runs/x"), "runs/x/tokenizer");
}

// A link planted where the tokenizer writes its training text is refused, not followed.
TEST(Tokenizer, ALinkAtTheTrainingTextsNameIsNotFollowed) {
  const auto dir = fresh_dir("peertrain-tokenizer-link");
  std::filesystem::create_directories(dir);
  const auto target = dir / "elsewhere.txt";
  std::ofstream(target) << "untouched";
  // The training text's name comes from the text and the options: a first call, which
  // cannot train on so little text, leaves its lock file, and so shows the name.
  try {
    make_sentencepiece_tokenizer("tiny\n", 5000, dir.string());  // fails to train, leaves its .lock
  } catch (const Error&) {
  }
  std::string stem;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".lock") stem = entry.path().stem().string();
  ASSERT_FALSE(stem.empty());
  std::filesystem::create_symlink(target, dir / (stem + ".txt"));
  try {
    make_sentencepiece_tokenizer("tiny\n", 5000, dir.string());
    ADD_FAILURE() << "trained through a link";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write the training text"), std::string::npos) << e.what();
  }
  std::ifstream in(target);
  std::string content;
  std::getline(in, content);
  EXPECT_EQ(content, "untouched");
  std::filesystem::remove_all(dir);
}

TEST(TextSampler, TokensAndBytesOverloadsAgree) {
  const std::string text = sample_text();
  const auto tokens = make_byte_tokenizer()->encode(text);
  TextSampler a(text, 3, 1, 4, 16, 9), b(tokens, 3, 1, 4, 16, 9);
  std::vector<std::int32_t> xa(64), ya(64), xb(64), yb(64);
  for (int step = 0; step < 3; ++step) {
    a.next(xa.data(), ya.data());
    b.next(xb.data(), yb.data());
    EXPECT_EQ(xa, xb);
    EXPECT_EQ(ya, yb);
  }
}

}  // namespace
}  // namespace peertrain::train
