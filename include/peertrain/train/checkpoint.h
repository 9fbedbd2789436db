// Checkpoints of one peer's training state, so that a run stopped at any step can resume
// on the same trajectory. Every peer writes its own file per checkpointed step,
// dir/peer-<id>-step-<step>.ckpt; a run resumes from the newest step for which every peer's
// file is present and valid, because the peers' states at one step only make sense together
// (D-PSGD mixes them; the step tags every message).
//
// File format, version 2 or 3, little-endian, 144-byte header:
//   magic "PTCKPT01" | version u32 | header_bytes u32 | peer u32 | peers u32 |
//   fingerprint u64 | run_id u64 | step u64 |
//   sampler epoch i64 | sampler position u64 | sampler batches_drawn i64 |
//   loss_sum f64 | loss_count i64 | wall_s f64 | compute_s f64 | comm_wait_s f64 |
//   bytes_sent u64 | bytes_received u64 | parameters u64 | optimizer_state u64
// then the parameters (f32 × parameters), the optimizer's state (f32 × optimizer_state:
// SGD's momentum, as long as the parameters; Adam's two moments and its step count), and a
// trailer over every byte before it: version 2, a u64 checksum (net::checksum_payload),
// against accidents; version 3, written under --secret-file, a 32-byte MAC under the run's
// key (net::file_mac, HMAC-SHA256), against forgery too. A reader with the key accepts
// only version 3, one without it refuses version 3 (it cannot check it). Version 1 files
// (a 136-byte header without optimizer_state, the state as long as the parameters) are
// read too, without a key.
//
// A file is written to a temporary name in the same directory, fsynced, renamed over its
// final name and the directory fsynced, so a crash leaves either the whole file or none
// (and perhaps a "*.tmp" that nothing reads). Reading checks the size the header implies
// against the file's length before allocating anything, then the checksum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "peertrain/net/auth.h"
#include "peertrain/train/data.h"

namespace peertrain::train {

inline constexpr std::uint32_t kCheckpointVersion = 2;     // with a checksum
inline constexpr std::uint32_t kCheckpointMacVersion = 3;  // with a MAC under the run's key
inline constexpr std::size_t kCheckpointHeaderBytes = 144;

// Everything a peer needs to continue after `step` completed steps.
struct CheckpointState {
  // Which run and which peer: a resumed run checks them against its own.
  std::uint32_t peer = 0;
  std::uint32_t peers = 0;
  std::uint64_t fingerprint = 0;  // topology::Topology::fingerprint()
  std::uint64_t run_id = 0;
  std::uint64_t step = 0;  // steps completed; the resumed run's first step has this index
  BatchSampler::State sampler;
  // The training-loss accumulators since the last evaluation.
  double loss_sum = 0;
  long long loss_count = 0;
  // Cumulative counters for the metrics, so a resumed run reports the whole run's totals.
  double wall_s = 0, compute_s = 0, comm_wait_s = 0;
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  std::vector<float> params;    // the peer's x
  std::vector<float> optimizer_state;  // Optimizer::state(): for SGD its momentum, for Adam m, v and t

  bool operator==(const CheckpointState&) const = default;
};

// dir/peer-<peer>-step-<step>.ckpt
std::string checkpoint_path(const std::string& dir, std::uint32_t peer, std::uint64_t step);

// Writes state to checkpoint_path(dir, state.peer, state.step) atomically (see above),
// creating dir if needed, and returns that path. Throws Error(kInvalidArgument) for a state
// that could not be read back (peer ≥ peers, negative counters) and
// Error(kIo) naming the file when the disk refuses. With a key, the file ends in a MAC
// under it (version 3).
std::string write_checkpoint(const std::string& dir, const CheckpointState& state,
                             const std::optional<net::Secret>& key = std::nullopt);

// Reads and validates one file: its length, magic, version, the sizes the header claims
// against the file's length, the checksum and the fields' ranges. Throws Error naming the
// file and what was wrong: kIo when it cannot be read (missing, a directory), kParse when it
// is not a valid checkpoint (empty, truncated, bad magic, checksum or MAC mismatch, a file
// without a MAC read with a key, one with a MAC read without it, ...).
CheckpointState read_checkpoint(const std::string& path, const std::optional<net::Secret>& key = std::nullopt);

// What checkpoints of a resumable run must carry; 0 accepts any value.
struct CheckpointMatch {
  std::uint64_t fingerprint = 0;
  std::uint64_t run_id = 0;
  std::uint64_t parameters = 0;
  std::optional<net::Secret> key = std::nullopt;  // --secret-file: only files MAC'd under it count
};

// The newest step for which every peer 0..peers−1 has a valid checkpoint in dir whose
// header agrees with its name, with `peers`, with `match` and with the other peers' files
// (fingerprint, run id, parameter count); std::nullopt when there is none, or no dir.
// A file that fails validation or disagrees is skipped with a log::warn naming it, never
// fatal; temporary files and names not of the form above are ignored. Reads every file of
// each step it considers, newest first. Throws Error(kIo) only when dir cannot be listed.
std::optional<std::uint64_t> latest_complete_step(const std::string& dir, int peers, const CheckpointMatch& match = {});

// Removes every peer's checkpoints older than the newest `keep` complete steps (as
// latest_complete_step judges them) and returns how many files it removed. Keeps
// everything while fewer than `keep` steps are complete, never touches newer, still
// incomplete steps (peers may be writing them) or a temporary file whose writer may still
// rename it (it removes those a crash left: no process of this machine has the writer's
// pid, and the file is 10 minutes old), and tolerates files that vanish meanwhile, so peers
// may prune concurrently. Checkpoint files are written readable by their owner only.
std::size_t prune_checkpoints(const std::string& dir, int peers, int keep, const CheckpointMatch& match = {});

}  // namespace peertrain::train
