// The membership protocol's messages as pure functions: encode and decode, every decoder
// checked against the number of peers and fuzzed (tests/fuzz/membership_fuzz.cpp). All
// travel as MessageType::kMembership, told apart by tag:
//
//   report (tag 0, numbered per sender → receiver): peers a peer counts lost.
//     step u64 | count u32 | ids u32… | reason (u32 length, text)
//   announcement (tag 2, numbered per sender): the coordinator's membership, and its whole
//     record so that any survivor can take over from it.
//     epoch u32 | switch step u64 | stop u32 | lost count u32 | ids u32… |
//     joins count u32 | (peer u32, donor u32)… |
//     failures count u32 | (peer u32, step u64, reason)… |
//     rejoins count u32 | (peer u32, step u64, donor u32)… |
//     takeovers count u32 | (peer u32, step u64, from u32)…
//   rejoin request (tag 1, step 0): version u32
//   rejoin answer (tag 1, step 0): status u32 | announcement u64 | epoch u32 |
//     switch step u64 | donor u32 | coordinator u32 | reason (u32 length, text)
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "peertrain/net/transport.h"

namespace peertrain::train {

inline constexpr std::uint32_t kReportTag = 0;
inline constexpr std::uint32_t kRejoinTag = 1;
inline constexpr std::uint32_t kAnnounceTag = 2;
inline constexpr std::uint32_t kRejoinVersion = 2;
inline constexpr std::size_t kMaxReasonBytes = 400;

struct Failure {
  int peer = 0;
  std::uint64_t step = 0;  // the step at which a peer gave up on it
  std::string reason;
};

struct Rejoin {
  int peer = 0;
  std::uint64_t step = 0;  // the first step it trained again
  int donor = 0;           // the neighbour whose parameters it took
};

// A survivor that took over coordinating the run.
struct Takeover {
  int peer = 0;
  std::uint64_t step = 0;  // the step at which it took over
  int from = 0;            // the coordinator it replaced
};

struct LostReport {
  std::uint64_t step = 0;
  std::vector<int> peers;
  std::string reason;
};

// What a coordinator has decided, and everything it knows of the run's history.
struct Announcement {
  std::uint32_t epoch = 0;  // how many coordinators were lost before this one
  std::uint64_t switch_step = 0;
  bool stop = false;        // the graph split and --on-split stop: everyone stops
  std::vector<int> lost;    // the peers left out from switch_step on
  std::vector<Rejoin> joins;  // peers back at switch_step (step unused)
  std::vector<Failure> failures;
  std::vector<Rejoin> rejoins;
  std::vector<Takeover> takeovers;
};

// What a peer that follows `coordinator` at `epoch` makes of an announcement `a` from
// `claimant`, another peer, which claims to coordinate: a takeover.
//  - kStale: an older epoch, or the same epoch without counting our coordinator lost.
//  - kNotSuccessor: the claimant is not the lowest peer left: a lower one is live in our
//    view (`counted_lost` says who we count lost) and not counted lost by the claim.
//  - kAdopt: a newer epoch from the rightful successor; or, at the same epoch, a claim
//    that counts our coordinator lost. Two peers that took over at once claim the same
//    epoch; the higher one must have counted the lower one lost to take over at all (a
//    successor counts every lower id lost), so the tie goes to it everywhere, whichever
//    claim a peer reads first, and the lower one, named lost, steps down.
enum class ClaimVerdict { kAdopt, kStale, kNotSuccessor };
ClaimVerdict judge_claim(int claimant, const Announcement& a, int coordinator, std::uint32_t epoch,
                         const std::vector<int>& counted_lost);
const char* to_string(ClaimVerdict verdict);

enum class RejoinStatus : std::uint32_t { kAccepted = 0, kRefused = 1, kAskCoordinator = 2 };

struct RejoinAnswer {
  RejoinStatus status = RejoinStatus::kAccepted;
  std::uint64_t announcement = 0;  // the sequence number of the announcement that takes it back
  std::uint32_t epoch = 0;
  std::uint64_t switch_step = 0;
  int donor = 0;
  int coordinator = 0;  // who to ask (kAskCoordinator), or who answered
  std::string reason;   // why not (kRefused)
};

net::Payload encode_report(const LostReport& report);
net::Payload encode_announcement(const Announcement& a);
net::Payload encode_rejoin_request();
net::Payload encode_rejoin_answer(const RejoinAnswer& answer);

// Each throws Error(kParse) naming `from` when the bytes are not such a message for a run
// of `peers` peers (truncated, a peer id out of range, a count the bytes cannot hold).
LostReport decode_report(std::span<const std::byte> bytes, int peers, const std::string& from);
Announcement decode_announcement(std::span<const std::byte> bytes, int peers, const std::string& from);
void decode_rejoin_request(std::span<const std::byte> bytes, const std::string& from);
RejoinAnswer decode_rejoin_answer(std::span<const std::byte> bytes, int peers, const std::string& from);

}  // namespace peertrain::train
