#include "membership_codec.h"

#include "peertrain/core/codec.h"
#include "peertrain/core/error.h"

namespace peertrain::train {
namespace {

// A history longer than this is not a run this code produced.
constexpr std::uint32_t kMaxRecords = 1u << 16;

int read_peer(codec::Reader& in, int peers) {
  const std::uint32_t id = in.u32();
  if (id >= static_cast<std::uint32_t>(peers))
    throw Error(ErrorKind::kParse, str(in.what(), " names peer ", id, " of a run of ", peers));
  return static_cast<int>(id);
}

std::vector<int> read_ids(codec::Reader& in, int peers) {
  const std::uint32_t n = in.count(4, static_cast<std::uint32_t>(peers));
  std::vector<int> ids;
  ids.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) ids.push_back(read_peer(in, peers));
  return ids;
}

void write_ids(codec::Writer& out, const std::vector<int>& ids) {
  out.u32(static_cast<std::uint32_t>(ids.size()));
  for (int id : ids) out.u32(static_cast<std::uint32_t>(id));
}

void expect_end(const codec::Reader& in) {
  if (!in.done()) throw Error(ErrorKind::kParse, str(in.what(), ": ", in.left(), " bytes left over"));
}

}  // namespace

net::Payload encode_report(const LostReport& report) {
  codec::Writer out;
  out.u64(report.step);
  write_ids(out, report.peers);
  out.sized_text(report.reason, kMaxReasonBytes);
  return out.take();
}

LostReport decode_report(std::span<const std::byte> bytes, int peers, const std::string& from) {
  codec::Reader in(bytes, str("membership report from ", from));
  LostReport r;
  r.step = in.u64();
  r.peers = read_ids(in, peers);
  r.reason = in.sized_text(kMaxReasonBytes);
  expect_end(in);
  return r;
}

net::Payload encode_announcement(const Announcement& a) {
  codec::Writer out;
  out.u32(a.epoch).u64(a.switch_step).u32(a.stop ? 1 : 0);
  write_ids(out, a.lost);
  out.u32(static_cast<std::uint32_t>(a.joins.size()));
  for (const Rejoin& j : a.joins) out.u32(static_cast<std::uint32_t>(j.peer)).u32(static_cast<std::uint32_t>(j.donor));
  out.u32(static_cast<std::uint32_t>(a.failures.size()));
  for (const Failure& f : a.failures) out.u32(static_cast<std::uint32_t>(f.peer)).u64(f.step).sized_text(f.reason, kMaxReasonBytes);
  out.u32(static_cast<std::uint32_t>(a.rejoins.size()));
  for (const Rejoin& r : a.rejoins)
    out.u32(static_cast<std::uint32_t>(r.peer)).u64(r.step).u32(static_cast<std::uint32_t>(r.donor));
  out.u32(static_cast<std::uint32_t>(a.takeovers.size()));
  for (const Takeover& t : a.takeovers)
    out.u32(static_cast<std::uint32_t>(t.peer)).u64(t.step).u32(static_cast<std::uint32_t>(t.from));
  return out.take();
}

Announcement decode_announcement(std::span<const std::byte> bytes, int peers, const std::string& from) {
  codec::Reader in(bytes, str("membership announcement from ", from));
  Announcement a;
  a.epoch = in.u32();
  a.switch_step = in.u64();
  const std::uint32_t stop = in.u32();
  if (stop > 1) throw Error(ErrorKind::kParse, str(in.what(), ": stop flag ", stop));
  a.stop = stop == 1;
  a.lost = read_ids(in, peers);
  for (std::uint32_t i = 0, n = in.count(8, static_cast<std::uint32_t>(peers)); i < n; ++i) {
    const int peer = read_peer(in, peers);
    a.joins.push_back({peer, a.switch_step, read_peer(in, peers)});
  }
  for (std::uint32_t i = 0, n = in.count(16, kMaxRecords); i < n; ++i) {
    Failure f;
    f.peer = read_peer(in, peers);
    f.step = in.u64();
    f.reason = in.sized_text(kMaxReasonBytes);
    a.failures.push_back(std::move(f));
  }
  for (std::uint32_t i = 0, n = in.count(16, kMaxRecords); i < n; ++i) {
    Rejoin r;
    r.peer = read_peer(in, peers);
    r.step = in.u64();
    r.donor = read_peer(in, peers);
    a.rejoins.push_back(r);
  }
  for (std::uint32_t i = 0, n = in.count(16, kMaxRecords); i < n; ++i) {
    Takeover t;
    t.peer = read_peer(in, peers);
    t.step = in.u64();
    t.from = read_peer(in, peers);
    a.takeovers.push_back(t);
  }
  expect_end(in);
  return a;
}

net::Payload encode_rejoin_request() { return codec::Writer().u32(kRejoinVersion).take(); }

void decode_rejoin_request(std::span<const std::byte> bytes, const std::string& from) {
  codec::Reader in(bytes, str("request to rejoin from ", from));
  const std::uint32_t version = in.u32();
  if (version != kRejoinVersion)
    throw Error(ErrorKind::kParse, str(from, " asked to rejoin with protocol version ", version, ", we speak ", kRejoinVersion));
  expect_end(in);
}

net::Payload encode_rejoin_answer(const RejoinAnswer& a) {
  codec::Writer out;
  out.u32(static_cast<std::uint32_t>(a.status)).u64(a.announcement).u32(a.epoch).u64(a.switch_step);
  out.u32(static_cast<std::uint32_t>(a.donor)).u32(static_cast<std::uint32_t>(a.coordinator));
  out.sized_text(a.reason, kMaxReasonBytes);
  return out.take();
}

RejoinAnswer decode_rejoin_answer(std::span<const std::byte> bytes, int peers, const std::string& from) {
  codec::Reader in(bytes, str("answer to our request to rejoin from ", from));
  RejoinAnswer a;
  const std::uint32_t status = in.u32();
  if (status > 2) throw Error(ErrorKind::kParse, str(in.what(), ": status ", status));
  a.status = static_cast<RejoinStatus>(status);
  a.announcement = in.u64();
  a.epoch = in.u32();
  a.switch_step = in.u64();
  a.donor = read_peer(in, peers);
  a.coordinator = read_peer(in, peers);
  a.reason = in.sized_text(kMaxReasonBytes);
  expect_end(in);
  return a;
}

ClaimVerdict judge_claim(int claimant, const Announcement& a, int coordinator, std::uint32_t epoch,
                         const std::vector<int>& counted_lost) {
  auto listed = [](const std::vector<int>& ids, int p) { return std::find(ids.begin(), ids.end(), p) != ids.end(); };
  if (a.epoch < epoch || claimant == coordinator) return ClaimVerdict::kStale;
  if (a.epoch == epoch && !listed(a.lost, coordinator)) return ClaimVerdict::kStale;
  for (int p = 0; p < claimant; ++p)
    if (!listed(counted_lost, p) && !listed(a.lost, p)) return ClaimVerdict::kNotSuccessor;
  return ClaimVerdict::kAdopt;
}

const char* to_string(ClaimVerdict verdict) {
  switch (verdict) {
    case ClaimVerdict::kAdopt:
      return "adopted";
    case ClaimVerdict::kStale:
      return "stale";
    case ClaimVerdict::kNotSuccessor:
      return "not from the lowest peer left";
  }
  return "?";
}

}  // namespace peertrain::train
