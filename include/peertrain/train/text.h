// The byte-level text the `gpt` model trains on: the English text of Debian's `fortunes`
// package, split into training and validation text deterministically (every 20th fortune
// is held out), and the per-peer sampler of training windows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace peertrain::train {

inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

struct TextCorpus {
  std::string train;
  std::string validation;
  int files = 0;
  int fortunes = 0;
};

// Reads every regular file of dir (not the .dat indexes, not the .u8 links, not
// subdirectories), in name order, and splits each at its "%" lines. Throws Error naming
// the directory when it is missing or holds no text.
TextCorpus load_fortunes(const std::string& dir = kFortunesDir);
// The same split, applied to text given directly (tests).
TextCorpus split_fortunes(const std::string& text);

// Windows of seq + 1 tokens (inputs and their next tokens) from one peer's shard of the
// tokenized training text: the tokens are cut into blocks of kShardBlock dealt round-robin
// to the peers (block b to peer b mod peers), and each step draws `batch` random window
// starts from this peer's shard. The starts of step s depend only on (seed, s), so a
// resumed run draws the same windows. The text overload reads bytes as tokens.
inline constexpr std::size_t kShardBlock = 4096;
class TextSampler {
 public:
  TextSampler(const std::vector<std::int32_t>& tokens, int peers, int peer, int batch, int seq, std::uint64_t seed);
  TextSampler(const std::string& text, int peers, int peer, int batch, int seq, std::uint64_t seed);
  // tokens and targets: batch × seq, sequence-major.
  void next(std::int32_t* tokens, std::int32_t* targets);
  long long steps_drawn() const { return steps_; }
  void restore(long long steps_drawn);  // throws Error when negative
  std::size_t shard_bytes() const { return shard_size_; }

 private:
  std::vector<std::int32_t> shard_;
  std::size_t shard_size_ = 0;
  int batch_, seq_;
  std::uint64_t seed_;
  long long steps_ = 0;
};

// The validation set as whole windows: at most max_windows non-overlapping windows of
// seq + 1 tokens, spread evenly over the validation tokens (a whole number of windows
// apart). Throws when the text is shorter than one window. target_bytes counts the bytes
// of text the targets stand for (token_bytes), which bits per byte divides by.
struct TextWindows {
  int count = 0;
  int seq = 0;
  std::vector<std::int32_t> bytes, targets;  // count × seq each (token ids)
  double target_bytes = 0;
};
TextWindows validation_windows(const std::vector<std::int32_t>& tokens, int seq, int max_windows,
                               const std::vector<int>& token_bytes);
TextWindows validation_windows(const std::string& text, int seq, int max_windows);  // bytes as tokens

}  // namespace peertrain::train
