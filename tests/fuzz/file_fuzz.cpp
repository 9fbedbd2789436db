// libFuzzer target: the readers of files a user may be handed, the checkpoint reader
// (train/checkpoint.h) and the IDX reader (train/data.h), each either reading or throwing
// peertrain::Error naming the file — never a crash, a read past the file, or an allocation
// (or a decompression) as large as the header claims. The first byte picks the reader:
// even, the rest is one checkpoint, read without a key and with one; odd, the rest is split
// at the next two bytes into an image file and a label file (plain, or gzip when they
// start like one).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "peertrain/core/error.h"
#include "peertrain/net/auth.h"
#include "peertrain/train/checkpoint.h"
#include "peertrain/train/data.h"

namespace {

const std::string kDir = "/tmp/peertrain-file-fuzz-" + std::to_string(::getpid());

std::string write(const std::string& name, const std::uint8_t* data, std::size_t size) {
  const std::string path = kDir + "-" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) __builtin_trap();
  if (size && std::fwrite(data, 1, size, f) != size) __builtin_trap();
  std::fclose(f);
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace peertrain;
  if (size < 1) return 0;
  if (data[0] % 2 == 0) {
    const std::string path = write("ckpt", data + 1, size - 1);
    static const std::optional<net::Secret> key = net::Secret::generate();
    for (const auto& with : {std::optional<net::Secret>(), key}) {
      try {
        const train::CheckpointState s = train::read_checkpoint(path, with);
        if (s.peer >= s.peers) __builtin_trap();
      } catch (const Error&) {
      }
    }
    ::unlink(path.c_str());
    return 0;
  }
  if (size < 3) return 0;
  const std::size_t rest = size - 3;
  const std::size_t split = ((std::size_t{data[1]} << 8) | data[2]) % (rest + 1);
  const std::string images = write("images", data + 3, split);
  const std::string labels = write("labels", data + 3 + split, rest - split);
  try {
    const train::IdxBytes idx = train::read_idx(images, labels);
    if (idx.pixels.size() != static_cast<std::size_t>(idx.size()) * static_cast<std::size_t>(idx.features))
      __builtin_trap();
    for (std::int32_t label : idx.labels)
      if (label < 0 || label >= idx.classes) __builtin_trap();
  } catch (const Error&) {
  }
  ::unlink(images.c_str());
  ::unlink(labels.c_str());
  return 0;
}
