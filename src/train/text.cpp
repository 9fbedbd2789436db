#include "peertrain/train/text.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"

namespace peertrain::train {
namespace {

constexpr int kValidationEvery = 20;  // 5% of the fortunes, spread over every file

}  // namespace

TextCorpus split_fortunes(const std::string& text) {
  TextCorpus corpus;
  std::istringstream in(text);
  std::string line, fortune;
  auto close_fortune = [&] {
    if (fortune.empty()) return;
    ((corpus.fortunes % kValidationEvery == kValidationEvery - 1) ? corpus.validation : corpus.train) += fortune;
    ++corpus.fortunes;
    fortune.clear();
  };
  while (std::getline(in, line)) {
    if (line == "%") {
      close_fortune();
    } else {
      fortune += line;
      fortune += '\n';
    }
  }
  close_fortune();
  return corpus;
}

TextCorpus load_fortunes(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(ErrorKind::kIo, str(dir, ": no such directory; the gpt model trains on Debian's fortunes text "
                                         "(apt-get install fortunes), or name another with --text-dir"));
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const auto& path = entry.path();
    if (entry.is_symlink() || !entry.is_regular_file() || path.extension() == ".dat") continue;
    files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  TextCorpus corpus;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in) throw Error(ErrorKind::kIo, str(path.string(), ": cannot read"));
    TextCorpus part = split_fortunes(text.str());
    corpus.train += part.train;
    corpus.validation += part.validation;
    corpus.fortunes += part.fortunes;
    ++corpus.files;
  }
  if (corpus.train.empty() || corpus.validation.empty())
    throw Error(ErrorKind::kParse, str(dir, ": no fortunes found (", files.size(), " files)"));
  return corpus;
}

namespace {

std::vector<std::int32_t> byte_tokens(const std::string& text) {
  std::vector<std::int32_t> ids(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

}  // namespace

TextSampler::TextSampler(const std::string& text, int peers, int peer, int batch, int seq, std::uint64_t seed)
    : TextSampler(byte_tokens(text), peers, peer, batch, seq, seed) {}

TextSampler::TextSampler(const std::vector<std::int32_t>& tokens, int peers, int peer, int batch, int seq,
                         std::uint64_t seed)
    : batch_(batch), seq_(seq), seed_(seed) {
  if (peers <= 0 || peer < 0 || peer >= peers || batch <= 0 || seq <= 0)
    throw Error(ErrorKind::kInvalidArgument,
                str("text sampler: peer ", peer, " of ", peers, ", batch ", batch, ", seq ", seq));
  // Blocks dealt round-robin, not one contiguous cut per peer: the files differ in topic
  // (art, computers, …), so contiguous shards would give each peer its own subjects.
  for (std::size_t block = static_cast<std::size_t>(peer) * kShardBlock; block < tokens.size();
       block += static_cast<std::size_t>(peers) * kShardBlock)
    shard_.insert(shard_.end(), tokens.begin() + static_cast<std::ptrdiff_t>(block),
                  tokens.begin() + static_cast<std::ptrdiff_t>(std::min(block + kShardBlock, tokens.size())));
  shard_size_ = shard_.size();
  if (shard_size_ < static_cast<std::size_t>(seq) + 2)
    throw Error(ErrorKind::kInvalidArgument,
                str("--seq ", seq, ": each of the ", peers, " peers' shards of the ", tokens.size(),
                    "-token training text holds only ", shard_size_, " tokens, less than one window"));
}

void TextSampler::next(std::int32_t* tokens, std::int32_t* targets) {
  // A fresh generator per step: the windows of step s do not depend on the steps before.
  Rng rng(seed_ * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(steps_));
  const std::size_t starts = shard_size_ - static_cast<std::size_t>(seq_);  // window of seq + 1 fits
  for (int b = 0; b < batch_; ++b) {
    const std::size_t start = rng.uniform_below(starts);
    for (int t = 0; t < seq_; ++t) {
      tokens[b * seq_ + t] = shard_[start + t];
      targets[b * seq_ + t] = shard_[start + t + 1];
    }
  }
  ++steps_;
}

void TextSampler::restore(long long steps_drawn) {
  if (steps_drawn < 0) throw Error(ErrorKind::kParse, str("text sampler: cannot restore to step ", steps_drawn));
  steps_ = steps_drawn;
}

TextWindows validation_windows(const std::string& text, int seq, int max_windows) {
  return validation_windows(byte_tokens(text), seq, max_windows, std::vector<int>(256, 1));
}

TextWindows validation_windows(const std::vector<std::int32_t>& tokens, int seq, int max_windows,
                               const std::vector<int>& token_bytes) {
  const auto window = static_cast<std::size_t>(seq) + 1;
  if (seq <= 0 || tokens.size() < window)
    throw Error(ErrorKind::kInvalidArgument, str("--seq ", seq, ": the validation text (", tokens.size(),
                                                 " tokens) holds no window of seq + 1 tokens"));
  TextWindows w;
  w.seq = seq;
  const std::size_t fit = tokens.size() / window;
  w.count = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(max_windows), fit));
  // Spread over the whole text, not its first files: the files differ in subject.
  const std::size_t stride = fit / static_cast<std::size_t>(w.count) * window;
  for (int i = 0; i < w.count; ++i)
    for (int t = 0; t < seq; ++t) {
      w.bytes.push_back(tokens[i * stride + t]);
      const std::int32_t target = tokens[i * stride + t + 1];
      w.targets.push_back(target);
      w.target_bytes += token_bytes.at(static_cast<std::size_t>(target));
    }
  return w;
}

}  // namespace peertrain::train
