// peertrain keygen: writes a fresh key file for --secret-file (32 random bytes as hex),
// readable by its owner alone, and refuses to overwrite one.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "commands.h"
#include "options.h"
#include "peertrain/core/error.h"
#include "peertrain/net/auth.h"

namespace peertrain::cli {

int run_keygen(int argc, char** argv) {
  cxxopts::Options options("peertrain keygen", "Write a new key file for --secret-file: 32 random bytes as hex, mode 600.");
  options.add_options()("file", "the key file to create (it must not exist)", cxxopts::value<std::string>())(
      "h,help", "show this help");
  options.parse_positional({"file"});
  options.positional_help("FILE");
  cxxopts::ParseResult args;
  if (auto code = parse_or_exit(options, argc, argv, &args)) return *code;
  if (!args.count("file")) {
    std::fprintf(stderr, "error: keygen needs the key file to write (see 'peertrain keygen --help')\n");
    return 2;
  }
  const std::string path = args["file"].as<std::string>();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, S_IRUSR | S_IWUSR);
  if (fd < 0)
    throw Error(ErrorKind::kIo, str("cannot create key file ", path, ": ", std::strerror(errno),
                                    errno == EEXIST ? " (keygen never overwrites a key; remove it first)" : ""));
  const std::string text = net::Secret::generate().hex() + "\n";
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!written) throw Error(ErrorKind::kIo, str("cannot write key file ", path));
  std::printf("wrote a new key to %s; give every peer of the run a copy (--secret-file %s)\n", path.c_str(), path.c_str());
  return 0;
}

}  // namespace peertrain::cli
