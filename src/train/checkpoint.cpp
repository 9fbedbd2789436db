// Checkpoint files: the encoding, the crash-safe write, validation on read, and the search
// for the newest step every peer completed (see checkpoint.h for the format).
//
// The write follows the usual POSIX recipe for replacing a file atomically: write a
// temporary file in the same directory (rename is atomic only within one file system),
// fsync it so its data is on disk before its name is, rename it over the final name, and
// fsync the directory so the rename itself survives a power loss.
#include "peertrain/train/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <span>
#include <system_error>

#include "peertrain/core/codec.h"
#include "peertrain/core/error.h"
#include "peertrain/core/log.h"
#include "peertrain/net/frame.h"
#include "fd.h"

namespace peertrain::train {
namespace {

namespace fs = std::filesystem;

// The format is little-endian; values are copied in host order, which is that on every
// platform peertrain builds for (x86-64, AArch64).
static_assert(std::endian::native == std::endian::little, "checkpoint encoding assumes a little-endian host");

constexpr char kMagic[8] = {'P', 'T', 'C', 'K', 'P', 'T', '0', '1'};
constexpr std::size_t kChecksumBytes = sizeof(std::uint64_t);
// Version 1 had no optimizer_state count: its state was as long as the parameters.
constexpr std::size_t kVersion1HeaderBytes = 136;

std::string errno_text() { return std::strerror(errno); }

// Reads up to size bytes; fewer only at the end of the file.
std::size_t read_up_to(int fd, std::byte* out, std::size_t size, const std::string& path) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, out + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorKind::kIo, str(path, ": read failed: ", errno_text()));
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

void fsync_directory(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw Error(ErrorKind::kIo, str(dir, ": cannot open the directory to sync it: ", errno_text()));
  if (::fsync(fd.get()) != 0 && errno != EINVAL)  // EINVAL: a file system that cannot sync directories
    throw Error(ErrorKind::kIo, str(dir, ": directory sync failed: ", errno_text()));
}

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::kParse, str(path, ": not a valid checkpoint: ", what));
}

// "peer-<peer>-step-<step>.ckpt", exactly as checkpoint_path writes it (no leading zeros,
// no suffix), so temporary files and strays never match.
struct NamedCheckpoint {
  std::uint32_t peer = 0;
  std::uint64_t step = 0;
};

std::string file_name(std::uint32_t peer, std::uint64_t step) { return str("peer-", peer, "-step-", step, ".ckpt"); }

std::optional<NamedCheckpoint> parse_name(const std::string& name) {
  constexpr std::string_view kPeer = "peer-", kStep = "-step-";
  if (name.rfind(kPeer, 0) != 0) return std::nullopt;
  NamedCheckpoint parsed;
  const char* begin = name.data() + kPeer.size();
  const char* end = name.data() + name.size();
  auto [after_peer, e1] = std::from_chars(begin, end, parsed.peer);
  if (e1 != std::errc() || std::string_view(after_peer, end - after_peer).rfind(kStep, 0) != 0) return std::nullopt;
  auto [after_step, e2] = std::from_chars(after_peer + kStep.size(), end, parsed.step);
  if (e2 != std::errc() || std::string_view(after_step, end - after_step) != ".ckpt") return std::nullopt;
  if (name != file_name(parsed.peer, parsed.step)) return std::nullopt;  // leading zeros
  return parsed;
}

// A checkpoint's temporary file ("<checkpoint>.<pid>.tmp") that a crash left behind: its
// writer is no process of this machine and it has not changed for kStaleTemporary. Both,
// because the directory may be shared with other hosts, whose writers' pids mean nothing
// here, and a write takes seconds, not minutes.
constexpr auto kStaleTemporary = std::chrono::minutes(10);
bool stale_temporary(const fs::path& path) {
  const std::string name = path.filename().string();
  constexpr std::string_view kTmp = ".tmp";
  if (name.size() <= kTmp.size() || name.compare(name.size() - kTmp.size(), kTmp.size(), kTmp) != 0) return false;
  const std::string stem = name.substr(0, name.size() - kTmp.size());
  const auto dot = stem.rfind('.');
  if (dot == std::string::npos || !parse_name(stem.substr(0, dot))) return false;
  pid_t pid = 0;
  const auto [end, ec] = std::from_chars(stem.data() + dot + 1, stem.data() + stem.size(), pid);
  if (ec != std::errc() || end != stem.data() + stem.size() || pid <= 0) return false;
  if (::kill(pid, 0) == 0 || errno != ESRCH) return false;  // its writer may still be at it
  std::error_code error;
  const auto changed = fs::last_write_time(path, error);
  return !error && fs::file_time_type::clock::now() - changed > kStaleTemporary;
}

// step → peer → path, for peers 0..peers−1; an absent directory has none.
std::map<std::uint64_t, std::map<std::uint32_t, std::string>, std::greater<>> list_checkpoints(const std::string& dir,
                                                                                             int peers) {
  std::map<std::uint64_t, std::map<std::uint32_t, std::string>, std::greater<>> found;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return found;
  fs::directory_iterator it(dir, ec);
  if (ec) throw Error(ErrorKind::kIo, str(dir, ": cannot list the checkpoint directory: ", ec.message()));
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) throw Error(ErrorKind::kIo, str(dir, ": cannot list the checkpoint directory: ", ec.message()));
    const auto named = parse_name(it->path().filename().string());
    if (!named || named->peer >= static_cast<std::uint32_t>(peers)) continue;
    found[named->step][named->peer] = it->path().string();
  }
  if (ec) throw Error(ErrorKind::kIo, str(dir, ": cannot list the checkpoint directory: ", ec.message()));
  return found;
}

// Whether every peer's file of one step is valid and consistent; warns about the first that
// is not.
bool step_is_complete(std::uint64_t step, const std::map<std::uint32_t, std::string>& files, int peers,
                      const CheckpointMatch& match) {
  if (files.size() != static_cast<std::size_t>(peers)) {
    log::debug("checkpoint step ", step, ": ", files.size(), " of ", peers, " peers' files present; not complete");
    return false;
  }
  struct Identity {
    std::uint32_t peer;
    std::uint64_t fingerprint, run_id, parameters;
  };
  std::optional<Identity> first;
  for (const auto& [peer, path] : files) {
    CheckpointState state;
    try {
      state = read_checkpoint(path, match.key);
    } catch (const Error& e) {
      log::warn(e.what(), "; skipping checkpoint step ", step);
      return false;
    }
    std::string problem;
    if (state.peer != peer || state.step != step)
      problem = str("holds peer ", state.peer, " at step ", state.step, ", not what its name says");
    else if (state.peers != static_cast<std::uint32_t>(peers))
      problem = str("is from a run of ", state.peers, " peers, not ", peers);
    else if (match.fingerprint && state.fingerprint != match.fingerprint)
      problem = str("has topology fingerprint ", state.fingerprint, ", expected ", match.fingerprint);
    else if (match.run_id && state.run_id != match.run_id)
      problem = str("has run id ", state.run_id, ", expected ", match.run_id);
    else if (match.parameters && state.params.size() != match.parameters)
      problem = str("has ", state.params.size(), " parameters, expected ", match.parameters);
    else if (first && (state.fingerprint != first->fingerprint || state.run_id != first->run_id ||
                       state.params.size() != first->parameters))
      problem = str("disagrees with peer ", first->peer, "'s file of the same step (fingerprint ", state.fingerprint,
                    " vs ", first->fingerprint, ", run id ", state.run_id, " vs ", first->run_id, ", ",
                    state.params.size(), " vs ", first->parameters, " parameters)");
    if (!problem.empty()) {
      log::warn(path, ": ", problem, "; skipping checkpoint step ", step);
      return false;
    }
    if (!first) first = Identity{state.peer, state.fingerprint, state.run_id, state.params.size()};
  }
  return true;
}

// Complete steps, newest first, at most `limit` of them.
std::vector<std::uint64_t> complete_steps(const std::string& dir, int peers, const CheckpointMatch& match,
                                          std::size_t limit) {
  if (peers < 1) throw Error(ErrorKind::kInvalidArgument, str("checkpoints in ", dir, ": peers ", peers, " < 1"));
  std::vector<std::uint64_t> steps;
  for (const auto& [step, files] : list_checkpoints(dir, peers)) {
    if (steps.size() == limit) break;
    if (step_is_complete(step, files, peers, match)) steps.push_back(step);
  }
  return steps;
}

}  // namespace

std::string checkpoint_path(const std::string& dir, std::uint32_t peer, std::uint64_t step) {
  return (fs::path(dir) / file_name(peer, step)).string();
}

std::string write_checkpoint(const std::string& dir, const CheckpointState& s, const std::optional<net::Secret>& key) {
  const std::string path = checkpoint_path(dir, s.peer, s.step);
  if (s.peers < 1 || s.peer >= s.peers)
    throw Error(ErrorKind::kInvalidArgument, str(path, ": cannot write peer ", s.peer, " of ", s.peers, " peers"));
  if (s.sampler.epoch < 0 || s.sampler.batches_drawn < 0 || s.loss_count < 0)
    throw Error(ErrorKind::kInvalidArgument, str(path, ": negative sampler epoch ", s.sampler.epoch, ", batches drawn ",
                                                 s.sampler.batches_drawn, " or loss count ", s.loss_count));

  codec::Writer out(kCheckpointHeaderBytes + (s.params.size() + s.optimizer_state.size()) * sizeof(float) +
                    (key ? net::kFileMacBytes : kChecksumBytes));
  out.bytes(std::as_bytes(std::span(kMagic)))
      .u32(key ? kCheckpointMacVersion : kCheckpointVersion)
      .u32(static_cast<std::uint32_t>(kCheckpointHeaderBytes))
      .u32(s.peer)
      .u32(s.peers)
      .u64(s.fingerprint)
      .u64(s.run_id)
      .u64(s.step)
      .i64(s.sampler.epoch)
      .u64(static_cast<std::uint64_t>(s.sampler.position))
      .i64(s.sampler.batches_drawn)
      .f64(s.loss_sum)
      .i64(s.loss_count)
      .f64(s.wall_s)
      .f64(s.compute_s)
      .f64(s.comm_wait_s)
      .u64(s.bytes_sent)
      .u64(s.bytes_received)
      .u64(static_cast<std::uint64_t>(s.params.size()))
      .u64(static_cast<std::uint64_t>(s.optimizer_state.size()));
  PEERTRAIN_CHECK(out.size() == kCheckpointHeaderBytes, "checkpoint header of ", out.size(), " bytes, the format says ",
                  kCheckpointHeaderBytes);
  out.floats(s.params).floats(s.optimizer_state);
  if (key) {
    const net::FileMac mac = net::file_mac(*key, out.view());
    out.bytes(std::as_bytes(std::span(mac)));
  } else {
    out.u64(net::checksum_payload(out.view()));
  }
  const std::vector<std::byte> bytes = out.take();

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(ErrorKind::kIo, str(dir, ": cannot create the checkpoint directory: ", ec.message()));
  // The pid keeps two processes that were wrongly given the same peer id off each other's
  // temporary file; the ".tmp" ending keeps it from ever being read as a checkpoint.
  const std::string temp = str(path, ".", ::getpid(), ".tmp");
  try {
    // Owner only: the parameters are the run's, not the machine's other users'.
    Fd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (fd.get() < 0) throw Error(ErrorKind::kIo, str(temp, ": cannot create: ", errno_text()));
    write_all(fd.get(), bytes, temp);
    if (::fsync(fd.get()) != 0) throw Error(ErrorKind::kIo, str(temp, ": fsync failed: ", errno_text()));
    if (!fd.close()) throw Error(ErrorKind::kIo, str(temp, ": close failed: ", errno_text()));
    if (::rename(temp.c_str(), path.c_str()) != 0)
      throw Error(ErrorKind::kIo, str(temp, ": cannot rename to ", path, ": ", errno_text()));
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  fsync_directory(dir);
  return path;
}

CheckpointState read_checkpoint(const std::string& path, const std::optional<net::Secret>& key) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw Error(ErrorKind::kIo, str(path, ": cannot open checkpoint: ", errno_text()));
  struct stat info{};
  if (::fstat(fd.get(), &info) != 0) throw Error(ErrorKind::kIo, str(path, ": cannot stat: ", errno_text()));
  if (S_ISDIR(info.st_mode)) throw Error(ErrorKind::kIo, str(path, ": is a directory, not a checkpoint file"));
  if (!S_ISREG(info.st_mode)) throw Error(ErrorKind::kIo, str(path, ": is not a regular file"));
  const auto file_size = static_cast<std::uint64_t>(info.st_size);
  if (file_size == 0) bad_file(path, "the file is empty");

  std::vector<std::byte> header(kCheckpointHeaderBytes);
  const std::size_t got = read_up_to(fd.get(), header.data(), header.size(), path);
  // A short file that starts like a checkpoint is a truncated one; anything else is not one.
  if (std::memcmp(header.data(), kMagic, std::min(got, sizeof kMagic)) != 0)
    bad_file(path, "bad magic: the file does not start with \"PTCKPT01\"");
  if (got < kCheckpointHeaderBytes)
    bad_file(path, str("truncated: ", got, " bytes, shorter than the ", kCheckpointHeaderBytes, "-byte header"));

  codec::Reader in(header, path);
  in.u64();  // the magic, checked above
  const auto version = in.u32();
  if (version < 1 || version > kCheckpointMacVersion)
    bad_file(path, str("format version ", version, "; this build reads versions 1 to ", kCheckpointMacVersion));
  const bool maced = version == kCheckpointMacVersion;
  if (key && !maced)
    bad_file(path,
             "carries no MAC (written without --secret-file): a run with a key resumes only from "
             "checkpoints MAC'd under it");
  if (!key && maced)
    bad_file(path,
             "carries a MAC under the run's key (written with --secret-file): give the same --secret-file "
             "to read it");
  const std::size_t trailer = maced ? net::kFileMacBytes : kChecksumBytes;
  const std::size_t format_header = version == 1 ? kVersion1HeaderBytes : kCheckpointHeaderBytes;
  const auto header_bytes = in.u32();
  if (header_bytes != format_header)
    bad_file(path, str("header of ", header_bytes, " bytes; version ", version, " has ", format_header));
  CheckpointState s;
  s.peer = in.u32();
  s.peers = in.u32();
  s.fingerprint = in.u64();
  s.run_id = in.u64();
  s.step = in.u64();
  const auto epoch = in.i64();
  const auto position = in.u64();
  s.sampler.batches_drawn = in.i64();
  s.loss_sum = in.f64();
  s.loss_count = in.i64();
  s.wall_s = in.f64();
  s.compute_s = in.f64();
  s.comm_wait_s = in.f64();
  s.bytes_sent = in.u64();
  s.bytes_received = in.u64();
  const auto parameters = in.u64();
  const auto state_floats = version == 1 ? parameters : in.u64();
  PEERTRAIN_CHECK(in.offset() == format_header, "decoded ", in.offset(), " header bytes of ", format_header);

  // The sizes the header claims, against the file's length, before allocating anything.
  const std::uint64_t room = file_size > format_header + trailer ? file_size - format_header - trailer : 0;
  if (parameters > room / sizeof(float) || state_floats > room / sizeof(float) - parameters)
    bad_file(path, str("truncated: the header claims ", parameters, " parameters and ", state_floats,
                       " optimizer values, which need ", format_header, " + 4 x (", parameters, " + ", state_floats,
                       ") + ", trailer, " bytes, but the file has ", file_size));
  const std::uint64_t expected = format_header + sizeof(float) * (parameters + state_floats) + trailer;
  if (file_size != expected)
    bad_file(path, str(file_size > expected ? "trailing bytes" : "truncated", ": ", parameters, " parameters and ",
                       state_floats, " optimizer values need ", expected, " bytes, but the file has ", file_size));

  std::vector<std::byte> bytes(expected);
  std::memcpy(bytes.data(), header.data(), header.size());
  const std::size_t rest = read_up_to(fd.get(), bytes.data() + header.size(), expected - header.size(), path);
  if (rest != expected - header.size())
    bad_file(path, str("truncated while reading: got ", header.size() + rest, " of ", expected, " bytes"));
  const auto body = std::span<const std::byte>(bytes).first(expected - trailer);
  if (maced) {
    net::FileMac stored{};
    std::memcpy(stored.data(), bytes.data() + expected - trailer, stored.size());
    if (!net::verify_file_mac(*key, body, stored))
      bad_file(path, "MAC mismatch: the file was altered, or written under another key");
  } else {
    std::uint64_t stored_sum;
    std::memcpy(&stored_sum, bytes.data() + expected - trailer, sizeof stored_sum);
    const std::uint64_t sum = net::checksum_payload(body);
    if (sum != stored_sum) bad_file(path, str("checksum mismatch (stored ", stored_sum, ", computed ", sum, ")"));
  }

  // Ranges a writer could not have produced: only a bug or a forged file gets here.
  if (s.peers < 1 || s.peer >= s.peers) bad_file(path, str("peer ", s.peer, " of ", s.peers, " peers"));
  if (epoch < 0 || epoch > std::numeric_limits<int>::max() || s.sampler.batches_drawn < 0 || s.loss_count < 0 ||
      position > std::numeric_limits<std::size_t>::max())
    bad_file(path, str("sampler epoch ", epoch, ", position ", position, ", batches drawn ", s.sampler.batches_drawn,
                       " or loss count ", s.loss_count, " out of range"));
  s.sampler.epoch = static_cast<int>(epoch);
  s.sampler.position = static_cast<std::size_t>(position);

  codec::Reader payload(std::span<const std::byte>(bytes).subspan(format_header), path);
  s.params = payload.floats(parameters);
  s.optimizer_state = payload.floats(state_floats);
  return s;
}

std::optional<std::uint64_t> latest_complete_step(const std::string& dir, int peers, const CheckpointMatch& match) {
  const auto steps = complete_steps(dir, peers, match, 1);
  if (steps.empty()) return std::nullopt;
  return steps.front();
}

std::size_t prune_checkpoints(const std::string& dir, int peers, int keep, const CheckpointMatch& match) {
  if (keep < 1)
    throw Error(ErrorKind::kInvalidArgument, str("checkpoints in ", dir, ": keep ", keep, " must be at least 1"));
  std::size_t removed = 0;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return 0;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    if (stale_temporary(it->path()) && ::unlink(it->path().c_str()) == 0) ++removed;
  const auto kept = complete_steps(dir, peers, match, static_cast<std::size_t>(keep));
  if (kept.size() < static_cast<std::size_t>(keep)) return removed;
  const std::uint64_t oldest_kept = kept.back();
  fs::directory_iterator it(dir, ec);
  if (ec) throw Error(ErrorKind::kIo, str(dir, ": cannot list the checkpoint directory: ", ec.message()));
  std::vector<fs::path> doomed;
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const auto named = parse_name(it->path().filename().string());
    if (named && named->peer < static_cast<std::uint32_t>(peers) && named->step < oldest_kept)
      doomed.push_back(it->path());
  }
  if (ec) throw Error(ErrorKind::kIo, str(dir, ": cannot list the checkpoint directory: ", ec.message()));
  for (const auto& path : doomed) {
    if (::unlink(path.c_str()) == 0)
      ++removed;
    else if (errno != ENOENT)  // another peer pruning at the same time got there first
      throw Error(ErrorKind::kIo, str(path.string(), ": cannot remove an old checkpoint: ", errno_text()));
  }
  return removed;
}

}  // namespace peertrain::train
