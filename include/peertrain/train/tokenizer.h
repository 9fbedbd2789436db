// What the gpt model reads: bytes (a vocabulary of 256), or subword pieces of a
// sentencepiece BPE vocabulary trained on the training text (--tokenizer sentencepiece
// --vocab-size N). Validation reports bits per byte either way, so runs with different
// vocabularies compare: the loss in bits over the bytes the predicted tokens stand for.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace peertrain::train {

enum class TokenizerKind { kBytes, kSentencePiece };

// "bytes" | "sentencepiece"; anything else throws Error(kInvalidArgument) naming `flag`.
TokenizerKind parse_tokenizer(std::string_view text, std::string_view flag = "--tokenizer");
std::string_view to_string(TokenizerKind kind);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual int vocab_size() const = 0;
  // Lossless: every byte of `text` is covered by exactly one token.
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  // How many bytes of text token `id` stands for.
  virtual int token_bytes(std::int32_t id) const = 0;
  virtual std::string describe() const = 0;
};

std::unique_ptr<Tokenizer> make_byte_tokenizer();

// A BPE vocabulary of `vocab_size` pieces trained on `text` by sentencepiece, with byte
// fallback and no normalization so that encoding is lossless and every byte has a token.
// The model is kept in `dir` as sentencepiece-<hash of text and size>.model and loaded
// from there when the same text and size come back; processes sharing `dir` take turns
// through a lock file, so it is trained once. Training is single-threaded, hence the same
// model on every machine. Throws Error naming --vocab-size when the text cannot give that
// many pieces, and naming `dir` when it cannot be written.
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& text, int vocab_size,
                                                        const std::string& dir);

// The directory a run keeps its tokenizer in: `out_dir`/tokenizer, or, with no out_dir,
// $XDG_CACHE_HOME/peertrain (~/.cache/peertrain); with neither HOME nor XDG_CACHE_HOME,
// /tmp/peertrain-<uid>, made mode 0700 and used only while it is a directory this user
// owns that nobody else can write (not a link another user planted): Error(kIo) otherwise.
std::string tokenizer_dir(const std::string& out_dir);

}  // namespace peertrain::train
