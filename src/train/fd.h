// A file descriptor closed on every path out (the checkpoint's files, the data cache's
// mapped copies, the tokenizer's training text), and a write that finishes what it starts.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <span>
#include <string>

#include "peertrain/core/error.h"

namespace peertrain::train {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now and reports whether close succeeded (it can report a delayed write error).
  bool close() {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0;
  }

 private:
  int fd_;
};

// Writes every byte (a write may take fewer; EINTR is retried); Error(kIo) naming `path`.
inline void write_all(int fd, std::span<const std::byte> bytes, const std::string& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorKind::kIo, str(path, ": write failed: ", std::strerror(errno)));
    }
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace peertrain::train
