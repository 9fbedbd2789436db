#include "peertrain/train/tokenizer.h"

#include <fcntl.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "fd.h"
#include "peertrain/core/cache_dir.h"
#include "peertrain/core/error.h"
#include "peertrain/core/log.h"

namespace peertrain::train {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  int vocab_size() const override { return 256; }
  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> ids(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  int token_bytes(std::int32_t) const override { return 1; }
  std::string describe() const override { return "bytes"; }
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& model_path, int vocab_size) : path_(model_path) {
    const auto status = processor_.Load(model_path);
    if (!status.ok())
      throw Error(ErrorKind::kIo, str(model_path, ": cannot load the sentencepiece model: ", status.ToString()));
    if (processor_.GetPieceSize() != vocab_size)
      throw Error(ErrorKind::kParse,
                  str(model_path, ": holds ", processor_.GetPieceSize(), " pieces, expected ", vocab_size));
    bytes_.resize(static_cast<std::size_t>(vocab_size));
    for (int id = 0; id < vocab_size; ++id) {
      // A byte-fallback piece <0xAB> is one byte; "▁" (U+2581, 3 bytes) is the space it
      // replaced; control pieces (<unk>, <s>, </s>) never come out of encode.
      if (processor_.IsByte(id)) {
        bytes_[id] = 1;
        continue;
      }
      if (processor_.IsControl(id) || processor_.IsUnknown(id)) continue;
      const std::string piece = processor_.IdToPiece(id);
      int n = 0;
      for (std::size_t i = 0; i < piece.size();) {
        if (piece.compare(i, 3, "\xe2\x96\x81") == 0) {
          ++n;
          i += 3;
        } else {
          ++n;
          ++i;
        }
      }
      bytes_[id] = n;
    }
  }
  int vocab_size() const override { return processor_.GetPieceSize(); }
  std::vector<std::int32_t> encode(std::string_view text) const override {
    // sentencepiece reads its input as lines; encoding line by line keeps each newline a
    // byte token and the whole text covered.
    std::vector<std::int32_t> ids;
    const int newline = processor_.PieceToId("<0x0A>");
    std::size_t start = 0;
    while (start <= text.size()) {
      const std::size_t end = std::min(text.find('\n', start), text.size());
      std::vector<int> line;
      const auto status = processor_.Encode(text.substr(start, end - start), &line);
      if (!status.ok()) throw Error(ErrorKind::kInternal, str("sentencepiece encode: ", status.ToString()));
      ids.insert(ids.end(), line.begin(), line.end());
      if (end == text.size()) break;
      ids.push_back(newline);
      start = end + 1;
    }
    return ids;
  }
  int token_bytes(std::int32_t id) const override { return bytes_.at(static_cast<std::size_t>(id)); }
  std::string describe() const override { return str("sentencepiece BPE, ", vocab_size(), " pieces (", path_, ")"); }

 private:
  sentencepiece::SentencePieceProcessor processor_;
  std::string path_;
  std::vector<int> bytes_;
};

std::uint64_t fnv1a(std::string_view text, std::uint64_t h = 1469598103934665603ULL) {
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// Holds an exclusive lock on a file while it lives.
class FileLock {
 public:
  // O_NOFOLLOW: a link planted at the lock's name is refused, not followed.
  explicit FileLock(const std::string& path) : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW, 0600)) {
    if (fd_ < 0 || ::flock(fd_, LOCK_EX) != 0) throw Error(ErrorKind::kIo, str(path, ": cannot lock"));
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

}  // namespace

TokenizerKind parse_tokenizer(std::string_view text, std::string_view flag) {
  if (text == "bytes") return TokenizerKind::kBytes;
  if (text == "sentencepiece") return TokenizerKind::kSentencePiece;
  throw Error(ErrorKind::kInvalidArgument, str(flag, " '", text, "': expected bytes or sentencepiece"));
}

std::string_view to_string(TokenizerKind kind) { return kind == TokenizerKind::kBytes ? "bytes" : "sentencepiece"; }

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::string tokenizer_dir(const std::string& out_dir) {
  if (!out_dir.empty()) return out_dir + "/tokenizer";
  const std::string cache = user_cache_dir();
  if (!cache.empty()) return cache;
  // A shared /tmp: a name of this user's own, checked, never one that another user made.
  const std::string dir = str("/tmp/peertrain-", ::getuid());
  ::mkdir(dir.c_str(), 0700);
  struct stat info {};
  if (::lstat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode) || info.st_uid != ::getuid() ||
      (info.st_mode & 0077) != 0)
    throw Error(ErrorKind::kIo, str(dir,
                                    ": not a private directory of this user (a link, another owner, or open to "
                                    "others); set XDG_CACHE_HOME or give --out"));
  return dir;
}

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& text, int vocab_size,
                                                        const std::string& dir) {
  // 256 byte pieces and <unk>, <s>, </s> come first; BPE needs room for merges.
  if (vocab_size < 300)
    throw Error(
        ErrorKind::kInvalidArgument,
        str("--vocab-size ", vocab_size, ": sentencepiece needs at least 300 (256 bytes, 3 control pieces, merges)"));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(ErrorKind::kIo, str(dir, ": cannot create the tokenizer directory: ", ec.message()));
  // The options are part of the name: a model trained otherwise is another model.
  const std::string options = str(
      "--model_type=bpe --normalization_rule_name=identity --remove_extra_whitespaces=false --add_dummy_prefix=false",
      " --byte_fallback=true --split_digits=true --num_threads=1 --shuffle_input_sentence=false",
      " --max_sentence_length=1000000 --minloglevel=2");
  const std::string name =
      str("sentencepiece-", std::hex, fnv1a(options, fnv1a(text, static_cast<std::uint64_t>(vocab_size))), std::dec,
          "-", vocab_size);
  const std::string model = dir + "/" + name + ".model";
  FileLock lock(dir + "/" + name + ".lock");
  if (!std::filesystem::exists(model)) {
    const std::string input = dir + "/" + name + ".txt", prefix = dir + "/" + name + ".partial";
    {
      // Never through a link at that name: it could point anywhere this user may write.
      Fd fd(::open(input.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
      if (fd.get() < 0)
        throw Error(ErrorKind::kIo, str(input, ": cannot write the training text: ", std::strerror(errno)));
      write_all(fd.get(), std::as_bytes(std::span(text)), input);
    }
    log::info("training a sentencepiece BPE vocabulary of ", vocab_size, " pieces on ", text.size(), " bytes into ",
              model);
    const auto status = sentencepiece::SentencePieceTrainer::Train(
        str("--input=", input, " --model_prefix=", prefix, " --vocab_size=", vocab_size, " ", options));
    std::filesystem::remove(input, ec);
    if (!status.ok())
      throw Error(ErrorKind::kInvalidArgument,
                  str("--vocab-size ", vocab_size, ": sentencepiece could not train on the ", text.size(),
                      "-byte text: ", status.ToString()));
    std::filesystem::remove(prefix + ".vocab", ec);
    std::filesystem::rename(prefix + ".model", model, ec);
    if (ec) throw Error(ErrorKind::kIo, str(model, ": cannot store the sentencepiece model: ", ec.message()));
  }
  return std::make_unique<SentencePieceTokenizer>(model, vocab_size);
}

}  // namespace peertrain::train
