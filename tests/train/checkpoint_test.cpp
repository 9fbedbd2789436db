// Checkpoints: exact round trips of fresh random states, every kind of broken file rejected
// with its name, the search for the newest step every peer completed (missing, corrupt,
// foreign and temporary files), pruning, and a training run that stops, is restored from
// its checkpoint into fresh objects and goes on with the uninterrupted run's losses.
#include "peertrain/train/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "peertrain/model/mlp.h"
#include "peertrain/net/auth.h"
#include "peertrain/net/frame.h"
#include "peertrain/train/data.h"
#include "peertrain/train/optimizer.h"

namespace peertrain::train {
namespace {

namespace fs = std::filesystem;

// Every field different from its default and from the others, and fresh random payloads.
CheckpointState random_state(std::uint32_t peer, std::uint32_t peers, std::uint64_t step, std::size_t parameters,
                             std::uint64_t seed) {
  Rng rng(seed);
  CheckpointState s;
  s.peer = peer;
  s.peers = peers;
  s.fingerprint = rng.next_u64();
  s.run_id = rng.next_u64();
  s.step = step;
  s.sampler = {static_cast<int>(rng.uniform_below(1000)), 32 * static_cast<std::size_t>(rng.uniform_below(100)),
               static_cast<long long>(rng.uniform_below(1u << 30))};
  s.loss_sum = rng.uniform() * 100;
  s.loss_count = static_cast<long long>(rng.uniform_below(1000));
  s.wall_s = rng.uniform() * 1e4;
  s.compute_s = rng.uniform() * 1e3;
  s.comm_wait_s = rng.uniform() * 1e2;
  s.bytes_sent = rng.next_u64() >> 8;
  s.bytes_received = rng.next_u64() >> 8;
  s.params.resize(parameters);
  s.optimizer_state.resize(parameters);
  for (auto& v : s.params) v = static_cast<float>(rng.normal());
  for (auto& v : s.optimizer_state) v = static_cast<float>(rng.normal() * 1e-3);
  return s;
}

// A state as one run writes it for all its peers: the identity is shared.
CheckpointState peer_state(std::uint32_t peer, std::uint32_t peers, std::uint64_t step) {
  CheckpointState s = random_state(peer, peers, step, 37, 1000 * step + peer);
  s.fingerprint = 0xF00D;
  s.run_id = 0xBEEF;
  return s;
}

using FileBytes = std::vector<char>;

FileBytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return FileBytes(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const FileBytes& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class Checkpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("peertrain_checkpoint_test_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Reads path and returns the error, or fails the test when it reads.
  static Error read_error(const std::string& path) {
    try {
      read_checkpoint(path);
    } catch (const Error& e) {
      return e;
    }
    ADD_FAILURE() << path << " was read as a checkpoint";
    return Error(ErrorKind::kInternal, "");
  }

  std::string dir_;
};

TEST_F(Checkpoints, RoundTripsFreshRandomStatesExactly) {
  for (std::size_t parameters : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001}, std::size_t{100003}}) {
    const CheckpointState saved = random_state(2, 5, 1234 + parameters, parameters, 42 + parameters);
    const std::string path = write_checkpoint(dir_, saved);
    EXPECT_EQ(path, checkpoint_path(dir_, 2, saved.step));
    EXPECT_EQ(fs::path(path).filename(), "peer-2-step-" + std::to_string(saved.step) + ".ckpt");
    EXPECT_EQ(fs::file_size(path), kCheckpointHeaderBytes + 8 * parameters + 8);
    const CheckpointState loaded = read_checkpoint(path);
    EXPECT_TRUE(loaded == saved) << parameters << " parameters";
    EXPECT_EQ(loaded.params, saved.params);  // shows the first difference when there is one
    EXPECT_EQ(loaded.optimizer_state, saved.optimizer_state);
    EXPECT_EQ(loaded.sampler, saved.sampler);
  }
  for (const auto& entry : fs::directory_iterator(dir_))
    EXPECT_EQ(entry.path().extension(), ".ckpt") << entry.path() << " was left behind";
}

TEST_F(Checkpoints, OverwritingAStepReplacesTheFileWhole) {
  write_checkpoint(dir_, random_state(0, 1, 5, 1000, 1));
  const CheckpointState second = random_state(0, 1, 5, 10, 2);
  write_checkpoint(dir_, second);
  EXPECT_TRUE(read_checkpoint(checkpoint_path(dir_, 0, 5)) == second);
}

TEST_F(Checkpoints, EachBrokenFileIsRejectedWithItsNameAndWhatWasWrong) {
  const std::string good = write_checkpoint(dir_, random_state(1, 3, 77, 501, 9));
  const FileBytes bytes = read_bytes(good);
  ASSERT_EQ(bytes.size(), kCheckpointHeaderBytes + 8 * 501 + 8);

  struct Case {
    std::string name;
    FileBytes bytes;
    std::string expect;
  };
  auto patched = [&](std::size_t at, std::uint64_t value) {
    FileBytes b = bytes;
    std::memcpy(b.data() + at, &value, sizeof value);
    return b;
  };
  auto flipped = [&](std::size_t at) {
    FileBytes b = bytes;
    b[at] = static_cast<char>(b[at] ^ 0x10);
    return b;
  };
  FileBytes wrong_magic = bytes;
  wrong_magic[7] = '2';
  FileBytes longer = bytes;
  longer.push_back(0);
  const std::vector<Case> cases = {
      {"empty", {}, "empty"},
      {"three_bytes", FileBytes(bytes.begin(), bytes.begin() + 3), "truncated"},
      {"half_header", FileBytes(bytes.begin(), bytes.begin() + 60), "truncated"},
      {"header_only", FileBytes(bytes.begin(), bytes.begin() + kCheckpointHeaderBytes), "truncated"},
      {"one_byte_short", FileBytes(bytes.begin(), bytes.end() - 1), "truncated"},
      {"trailing_byte", longer, "trailing bytes"},
      {"wrong_magic", wrong_magic, "bad magic"},
      {"text", FileBytes{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '\n'}, "bad magic"},
      {"version_4", patched(8, 4 | (std::uint64_t{kCheckpointHeaderBytes} << 32)), "version 4"},
      {"maced_without_key", patched(8, 3 | (std::uint64_t{kCheckpointHeaderBytes} << 32)),
       "give the same --secret-file"},
      {"version_1_header", patched(8, 1 | (std::uint64_t{kCheckpointHeaderBytes} << 32)), "version 1 has 136"},
      {"flipped_parameter", flipped(kCheckpointHeaderBytes + 100), "checksum mismatch"},
      {"flipped_momentum", flipped(bytes.size() - 9), "checksum mismatch"},
      {"flipped_step", flipped(40), "checksum mismatch"},
      {"flipped_checksum", flipped(bytes.size() - 1), "checksum mismatch"},
      // A header that claims 2^60 parameters must be refused from the file's length, not
      // by trying to allocate them.
      {"huge_claim", patched(128, std::uint64_t{1} << 60), "truncated"},
      {"claims_one_fewer", patched(128, 500), "trailing bytes"},
      {"huge_state_claim", patched(136, std::uint64_t{1} << 60), "truncated"},
      {"state_one_more", patched(136, 502), "truncated"},
  };
  for (const Case& c : cases) {
    const std::string path = dir_ + "/" + c.name + ".ckpt";
    write_bytes(path, c.bytes);
    const Error e = read_error(path);
    EXPECT_EQ(e.kind(), ErrorKind::kParse) << c.name << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << c.name << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << c.name << ": " << e.what();
  }

  const std::string missing = dir_ + "/peer-0-step-1.ckpt";
  Error e = read_error(missing);
  EXPECT_EQ(e.kind(), ErrorKind::kIo);
  EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();

  const std::string directory = dir_ + "/peer-0-step-2.ckpt";
  fs::create_directories(directory);
  e = read_error(directory);
  EXPECT_EQ(e.kind(), ErrorKind::kIo);
  EXPECT_NE(std::string(e.what()).find(directory), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("directory"), std::string::npos) << e.what();
}

// Adam's state is m, v and its step count: 2N + 1 floats, not N.
TEST_F(Checkpoints, AnAdamStateRoundTripsAndRestoresTheSameNextStep) {
  const std::size_t n = 1001;
  Rng rng(11);
  std::vector<float> params(n), grads(n);
  for (auto& v : params) v = static_cast<float>(rng.normal());
  Adam adam(n, {.lr = 1e-3f});
  for (int step = 0; step < 3; ++step) {
    for (auto& g : grads) g = static_cast<float>(rng.normal());
    adam.step(params, grads);
  }
  CheckpointState saved = random_state(1, 2, 3, n, 5);
  saved.params = params;
  saved.optimizer_state.assign(adam.state().begin(), adam.state().end());
  ASSERT_EQ(saved.optimizer_state.size(), 2 * n + 1);
  const CheckpointState loaded = read_checkpoint(write_checkpoint(dir_, saved));
  EXPECT_TRUE(loaded == saved);
  Adam resumed(n, {.lr = 1e-3f});
  resumed.restore_state(loaded.optimizer_state);
  std::vector<float> next = params, resumed_next = loaded.params;
  for (auto& g : grads) g = static_cast<float>(rng.normal());
  adam.step(next, grads);
  resumed.step(resumed_next, grads);
  EXPECT_EQ(next, resumed_next);
}

// A file of format version 1 (136-byte header, the state as long as the parameters).
// Under --secret-file a checkpoint ends in a MAC under the run's key: a forger who
// rewrites the parameters and recomputes the checksum, or the MAC under another key, is
// refused, and so is a checksum-only file when the run has a key.
TEST_F(Checkpoints, UnderAKeyOnlyFilesMacdUnderItAreRead) {
  std::array<std::uint8_t, net::kSecretBytes> raw{};
  for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<std::uint8_t>(7 * i + 1);
  const auto key = std::optional(net::Secret::from_bytes(raw));
  raw[0] ^= 1;
  const auto other = std::optional(net::Secret::from_bytes(raw));
  const CheckpointState saved = random_state(1, 3, 9, 257, 5);
  const std::string path = write_checkpoint(dir_, saved, key);
  EXPECT_EQ(fs::file_size(path), kCheckpointHeaderBytes + 8 * 257 + net::kFileMacBytes);
  EXPECT_TRUE(read_checkpoint(path, key) == saved);
  auto refused = [&](const std::string& file, const std::optional<net::Secret>& with, const std::string& words) {
    try {
      read_checkpoint(file, with);
      ADD_FAILURE() << file << " was read";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kParse);
      EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(path, std::nullopt, "give the same --secret-file");
  refused(path, other, "MAC mismatch");
  FileBytes bytes = read_bytes(path);
  bytes[kCheckpointHeaderBytes + 40] ^= 0x10;  // one parameter's bit
  const std::string altered = dir_ + "/altered.ckpt";
  write_bytes(altered, bytes);
  refused(altered, key, "MAC mismatch");
  // The forger's file: the altered state written as a checksummed (keyless) checkpoint.
  CheckpointState forged = saved;
  forged.params[3] += 1;
  const std::string forged_dir = dir_ + "/forged";
  const std::string forged_path = write_checkpoint(forged_dir, forged);
  refused(forged_path, key, "carries no MAC");
  // The search for a step to resume from counts only what the key vouches for.
  for (std::uint32_t p = 0; p < 2; ++p) write_checkpoint(forged_dir, peer_state(p, 2, 20));
  for (std::uint32_t p = 0; p < 2; ++p) write_checkpoint(forged_dir, peer_state(p, 2, 10), key);
  CheckpointMatch match;
  EXPECT_EQ(latest_complete_step(forged_dir, 2, match), std::optional<std::uint64_t>(20));
  match.key = key;
  EXPECT_EQ(latest_complete_step(forged_dir, 2, match), std::optional<std::uint64_t>(10));
}

TEST_F(Checkpoints, VersionOneFilesAreStillRead) {
  const CheckpointState saved = random_state(0, 2, 9, 33, 6);
  FileBytes v2 = read_bytes(write_checkpoint(dir_, saved));
  FileBytes v1(v2.begin(), v2.begin() + 136);
  const std::uint64_t version_and_header = 1 | (std::uint64_t{136} << 32);
  std::memcpy(v1.data() + 8, &version_and_header, sizeof version_and_header);
  v1.insert(v1.end(), v2.begin() + kCheckpointHeaderBytes, v2.end() - 8);
  std::vector<std::byte> body(v1.size());
  std::memcpy(body.data(), v1.data(), v1.size());
  const std::uint64_t sum = net::checksum_payload(body);
  v1.resize(v1.size() + 8);
  std::memcpy(v1.data() + v1.size() - 8, &sum, sizeof sum);
  const std::string path = dir_ + "/peer-0-step-9.ckpt";
  write_bytes(path, v1);
  EXPECT_TRUE(read_checkpoint(path) == saved);
}

TEST_F(Checkpoints, StatesThatCouldNotBeReadBackAreRefused) {
  CheckpointState s = random_state(2, 2, 1, 10, 3);
  EXPECT_THROW(write_checkpoint(dir_, s), Error);
  s = random_state(0, 0, 1, 10, 3);
  EXPECT_THROW(write_checkpoint(dir_, s), Error);
  EXPECT_TRUE(fs::is_empty(dir_)) << "a refused state left a file";
}

TEST_F(Checkpoints, WritingCreatesTheDirectoryAndReportsOneItCannotCreate) {
  const std::string nested = dir_ + "/a/b";
  write_checkpoint(nested, random_state(0, 1, 3, 5, 4));
  EXPECT_EQ(latest_complete_step(nested, 1), std::optional<std::uint64_t>(3));
  write_bytes(dir_ + "/file", {'x'});
  try {
    write_checkpoint(dir_ + "/file/sub", random_state(0, 1, 3, 5, 4));
    FAIL() << "wrote under a regular file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find(dir_ + "/file/sub"), std::string::npos) << e.what();
  }
}

TEST_F(Checkpoints, NoDirectoryOrNoFilesMeansNoStep) {
  EXPECT_EQ(latest_complete_step(dir_ + "/absent", 3), std::nullopt);
  EXPECT_EQ(latest_complete_step(dir_, 3), std::nullopt);
  EXPECT_THROW(latest_complete_step(dir_, 0), Error);
}

// Peers 0..2: steps 10 and 20 complete; 30 misses peer 1; 40 has a corrupt file of peer 2;
// 50 has a file of peer 0 that holds step 49 under another name; 60 has peer 1 from another
// run; 70 exists only as temporary files left by a crash. The answer is 20.
TEST_F(Checkpoints, LatestCompleteStepIsTheNewestEveryPeerHasValid) {
  constexpr int kPeers = 3;
  for (std::uint64_t step : {10, 20, 30, 40, 50, 60})
    for (std::uint32_t peer = 0; peer < kPeers; ++peer)
      if (!(step == 30 && peer == 1)) write_checkpoint(dir_, peer_state(peer, kPeers, step));
  EXPECT_EQ(latest_complete_step(dir_, kPeers), std::optional<std::uint64_t>(60));

  const std::string corrupt = checkpoint_path(dir_, 2, 40);
  FileBytes bytes = read_bytes(corrupt);
  bytes[kCheckpointHeaderBytes + 3] ^= 1;
  write_bytes(corrupt, bytes);
  write_bytes(checkpoint_path(dir_, 0, 50), read_bytes(write_checkpoint(dir_, peer_state(0, kPeers, 49))));
  fs::remove(checkpoint_path(dir_, 0, 49));
  CheckpointState foreign = peer_state(1, kPeers, 60);
  foreign.run_id = 0xCAFE;
  write_checkpoint(dir_, foreign);
  for (std::uint32_t peer = 0; peer < kPeers; ++peer) {
    const std::string final_path = checkpoint_path(dir_, peer, 70);
    write_checkpoint(dir_, peer_state(peer, kPeers, 70));
    fs::rename(final_path, final_path + ".4242.tmp");  // as if the rename never happened
  }
  write_bytes(dir_ + "/peer-0-step-080.ckpt", {});  // not a name the writer makes: ignored
  write_bytes(dir_ + "/peer-3-step-90.ckpt", {});   // a peer beyond the run: ignored
  write_bytes(dir_ + "/notes.txt", {'h', 'i'});

  ::testing::internal::CaptureStderr();
  const auto latest = latest_complete_step(dir_, kPeers);
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(latest, std::optional<std::uint64_t>(20)) << warnings;
  EXPECT_NE(warnings.find(corrupt), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("checksum mismatch"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find(checkpoint_path(dir_, 0, 50)), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("disagrees"), std::string::npos) << warnings;
  EXPECT_EQ(warnings.find(".tmp"), std::string::npos) << "a temporary file was read: " << warnings;

  // Asking for this run's identity skips a whole step written by another run.
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(latest_complete_step(dir_, kPeers, {.fingerprint = 0xF00D, .run_id = 0xBEEF, .parameters = 37}),
            std::optional<std::uint64_t>(20));
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("has run id 51966, expected 48879"), std::string::npos);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(latest_complete_step(dir_, kPeers, {.run_id = 0xCAFE}), std::nullopt);
  EXPECT_EQ(latest_complete_step(dir_, kPeers, {.parameters = 38}), std::nullopt);
  ::testing::internal::GetCapturedStderr();
  // Files written by a run of 3 peers never make a step of a 2-peer run.
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(latest_complete_step(dir_, 2), std::nullopt) << "files written for 3 peers";
  ::testing::internal::GetCapturedStderr();
}

// A crash between the write and the rename leaves only "*.tmp" files; they are never
// taken for checkpoints, even when their contents are valid.
TEST_F(Checkpoints, LeftoverTemporaryFilesAreNeverRead) {
  for (std::uint32_t peer = 0; peer < 2; ++peer) {
    const std::string path = write_checkpoint(dir_, peer_state(peer, 2, 5));
    fs::rename(path, path + "." + std::to_string(1000 + peer) + ".tmp");
  }
  EXPECT_EQ(latest_complete_step(dir_, 2), std::nullopt);
  for (std::uint32_t peer = 0; peer < 2; ++peer) write_checkpoint(dir_, peer_state(peer, 2, 4));
  EXPECT_EQ(latest_complete_step(dir_, 2), std::optional<std::uint64_t>(4));
}

TEST_F(Checkpoints, PruningKeepsTheNewestCompleteStepsAndEverythingNewer) {
  constexpr int kPeers = 2;
  for (std::uint64_t step = 1; step <= 5; ++step)
    for (std::uint32_t peer = 0; peer < kPeers; ++peer) write_checkpoint(dir_, peer_state(peer, kPeers, step));
  write_checkpoint(dir_, peer_state(1, kPeers, 6));  // peer 0 has not written step 6 yet
  // Peer 0 writing step 6 now (this process), and a write a crash left behind: its writer
  // (a child that has exited) is gone and it is an hour old.
  const std::string writing = str(dir_, "/peer-0-step-6.ckpt.", ::getpid(), ".tmp");
  write_bytes(writing, {'x'});
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ::waitpid(gone, nullptr, 0);
  const std::string crashed = str(dir_, "/peer-1-step-3.ckpt.", gone, ".tmp");
  write_bytes(crashed, {'x'});
  fs::last_write_time(crashed, fs::file_time_type::clock::now() - std::chrono::hours(1));
  EXPECT_THROW(prune_checkpoints(dir_, kPeers, 0), Error);
  EXPECT_EQ(prune_checkpoints(dir_, kPeers, 6), 1u) << "only 5 steps are complete: the crashed write alone";
  EXPECT_FALSE(fs::exists(crashed));
  EXPECT_EQ(prune_checkpoints(dir_, kPeers, 2), 3u * kPeers);
  for (std::uint64_t step = 1; step <= 6; ++step)
    for (std::uint32_t peer = 0; peer < kPeers; ++peer)
      EXPECT_EQ(fs::exists(checkpoint_path(dir_, peer, step)), step >= 4 && !(step == 6 && peer == 0))
          << "peer " << peer << " step " << step;
  EXPECT_TRUE(fs::exists(writing));
  EXPECT_EQ(fs::status(checkpoint_path(dir_, 0, 5)).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(prune_checkpoints(dir_, kPeers, 2), 0u);
  EXPECT_EQ(latest_complete_step(dir_, kPeers), std::optional<std::uint64_t>(5));
}

// The trainer's recipe on one peer (local SGD on a small MLP): train, checkpoint at the end
// of step k, rebuild everything from scratch, restore, go on. The losses and the final
// parameters must be those of the uninterrupted run.
TEST_F(Checkpoints, AResumedRunFollowsTheSameTrajectory) {
  constexpr int kExamples = 70, kFeatures = 6, kClasses = 3, kBatch = 8, kSteps = 25;
  Dataset data;
  data.features = kFeatures;
  data.classes = kClasses;
  Rng rng(5);
  for (int i = 0; i < kExamples; ++i) {
    data.labels.push_back(static_cast<std::int32_t>(rng.uniform_below(kClasses)));
    for (int f = 0; f < kFeatures; ++f) data.inputs.push_back(static_cast<float>(rng.normal()) + data.labels.back());
  }
  std::vector<int> shard(kExamples);
  for (int i = 0; i < kExamples; ++i) shard[i] = i;
  const SgdConfig sgd_config{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f};

  // One peer's run from a checkpoint (or from the start) to the end; returns the losses
  // and saves a checkpoint after step `save_after` steps.
  struct Run {
    std::vector<float> losses;
    std::vector<float> final_params;
  };
  auto train = [&](const CheckpointState* resume, int save_after) {
    model::Mlp mlp({kFeatures, {16}, kClasses});
    BatchSampler sampler(data, shard, kBatch, 77);
    Sgd sgd(mlp.num_parameters(), sgd_config);
    std::vector<float> x(mlp.num_parameters()), grads(x.size());
    mlp.initialize(x, 11);
    std::uint64_t first = 0;
    double loss_sum = 0;
    long long loss_count = 0;
    if (resume) {
      first = resume->step;
      x = resume->params;
      sgd.restore_momentum(resume->optimizer_state);
      sampler.restore(resume->sampler);
      loss_sum = resume->loss_sum;
      loss_count = resume->loss_count;
    }
    Run run;
    std::vector<float> inputs(kFeatures * kBatch);
    std::vector<std::int32_t> labels(kBatch);
    for (std::uint64_t step = first; step < kSteps; ++step) {
      sampler.next(inputs.data(), labels.data());
      const float loss = mlp.forward_backward(x, inputs.data(), labels.data(), kBatch, grads);
      sgd.step(x, grads);
      loss_sum += loss;
      ++loss_count;
      run.losses.push_back(loss);
      const std::uint64_t done = step + 1;
      if (done == static_cast<std::uint64_t>(save_after)) {
        CheckpointState state;
        state.peer = 0;
        state.peers = 1;
        state.step = done;
        state.sampler = sampler.state();
        state.loss_sum = loss_sum;
        state.loss_count = loss_count;
        state.params = x;
        state.optimizer_state.assign(sgd.momentum().begin(), sgd.momentum().end());
        write_checkpoint(dir_, state);
      }
    }
    run.final_params = x;
    return run;
  };

  const Run whole = train(nullptr, -1);
  ASSERT_EQ(whole.losses.size(), static_cast<std::size_t>(kSteps));
  for (int stop : {1, 8, 9, 13}) {  // 8 batches an epoch: 8 and 9 straddle the epoch's end
    fs::remove_all(dir_);
    const Run before = train(nullptr, stop);
    const auto step = latest_complete_step(dir_, 1);
    ASSERT_EQ(step, std::optional<std::uint64_t>(stop));
    const CheckpointState state = read_checkpoint(checkpoint_path(dir_, 0, *step));
    const Run after = train(&state, -1);
    ASSERT_EQ(after.losses.size(), static_cast<std::size_t>(kSteps - stop));
    for (int k = stop; k < kSteps; ++k)
      EXPECT_NEAR(after.losses[k - stop], whole.losses[k], 1e-6) << "stopped after " << stop << ", step " << k;
    EXPECT_EQ(after.final_params, whole.final_params) << "stopped after " << stop;
    EXPECT_EQ(before.final_params, whole.final_params);
  }
}

}  // namespace
}  // namespace peertrain::train
