// The evaluation rounds of PeerRun: each peer tests its model and reports to the
// coordinator, which tests x̄ and writes the metrics. Not part of the step timings.
#include <algorithm>

#include "peer_run.h"
#include "peertrain/core/error.h"

namespace peertrain::train {

void PeerRun::evaluate(long long step, double epoch, std::uint64_t round) {
  const long long done = step + 1;
  if (round == 0) round = static_cast<std::uint64_t>(done);
  const TaskEvaluation local = task_->evaluate(x_);
  const auto counters = network_->total_counters();
  Report report{static_cast<double>(done),
                epoch,
                loss_sum_ / static_cast<double>(loss_count_),
                local.accuracy,
                local.loss,
                local.bits_per_byte,
                static_cast<double>(sent_base_ + counters.bytes_sent - eval_sent_),
                static_cast<double>(received_base_ + counters.bytes_received - eval_received_),
                wall_s_,
                compute_s_,
                wait_s_};
  loss_sum_ = 0;
  loss_count_ = 0;
  std::vector<double> sent_to(static_cast<std::size_t>(n_), 0.0);
  for (int p : network_->links())
    sent_to[static_cast<std::size_t>(p)] = static_cast<double>(network_->counters(p).bytes_sent);
  // Until someone takes the report: a coordinator we cannot reach is counted lost, and
  // the next one (maybe this peer) gets it.
  while (!membership_->is_coordinator()) {
    const int to = membership_->coordinator();
    try {
      return send_report(to, round, report, sent_to);
    } catch (const Error& e) {
      if (!tolerant_) throw;
      membership_->report_lost(static_cast<std::uint64_t>(step), to, e.what());
    }
  }
  coordinate(step, round, report, std::move(sent_to));
}

void PeerRun::send_report(int to, std::uint64_t round, const Report& report, const std::vector<double>& sent_to) {
  network_->send(to, net::MessageType::kReport, round, 0, encode_report(report, sent_to, x_), false).wait();
  eval_sent_ += report_bytes_;
  // Wait until the coordinator has evaluated x̄, so that its evaluation does not land in
  // the timing of our next exchange. It may itself wait up to three times --peer-timeout
  // on a report (below), so we wait longer, while it sounds alive.
  if (tolerant_)
    network_->receive_while_alive(to, net::MessageType::kReport, round, 1, 4 * network_->peer_timeout_s());
  else
    network_->receive(to, net::MessageType::kReport, round, 1);
  eval_received_ += net::kHeaderBytes;
}

// The reports are waited for while their senders sound alive, all of them within one
// deadline of three times --peer-timeout from the round's start: just after a takeover, a
// peer may first have waited that long on the old coordinator before turning to us. One
// deadline, not one per report, so that the peers waiting on this coordinator's release
// (four times --peer-timeout) never give up on a live one. A silent sender (stopped, cut
// off, on the far side of a partition) is given up after half of --peer-timeout.
net::Payload PeerRun::receive_report(int p, std::uint64_t round, RunClock::time_point deadline) {
  if (!tolerant_) return network_->receive(p, net::MessageType::kReport, round, 0);
  const double left = std::chrono::duration<double>(deadline - RunClock::now()).count();
  return network_->receive_while_alive(p, net::MessageType::kReport, round, 0, std::max(left, 0.001));
}

void PeerRun::coordinate(long long step, std::uint64_t round, const Report& report, std::vector<double> sent_to) {
  std::vector<Report> reports(n_);  // step 0 marks a lost peer
  reports[rank_] = report;
  std::vector<std::vector<double>> links(n_);
  links[rank_] = std::move(sent_to);
  std::vector<net::Payload> others(n_);
  std::vector<std::span<const float>> xs{x_};  // this peer's, then the others' in order
  const std::vector<int>& gossip_lost = gossip_->lost();
  const auto deadline = RunClock::now() + std::chrono::duration_cast<RunClock::duration>(
                                              std::chrono::duration<double>(3 * network_->peer_timeout_s()));
  for (int p = 0; p < n_; ++p) {
    if (p == rank_ || membership_->is_lost(p) || std::count(gossip_lost.begin(), gossip_lost.end(), p)) continue;
    std::span<const float> theirs;
    try {
      others[p] = receive_report(p, round, deadline);
      reports[p] = decode_report(others[p], n_, size_, network_->peer_name(p), links[p], theirs);
    } catch (const Error& e) {
      // A peer that is gone, silent, or sends a malformed report is counted lost.
      const bool peer_fault =
          e.kind() == ErrorKind::kPeerLost || e.kind() == ErrorKind::kTimeout || e.kind() == ErrorKind::kParse;
      if (!tolerant_ || !peer_fault) throw;
      others[p].clear();
      membership_->report_lost(static_cast<std::uint64_t>(step), p, e.what());
      continue;
    }
    xs.push_back(theirs);
  }
  // Alone: we were cut off rather than everyone else failing (membership.h); write nothing.
  membership_->stop_if_cut_off(static_cast<std::uint64_t>(step));
  std::vector<float> average;
  const double consensus = consensus_distance(xs, average);
  const TaskEvaluation avg = task_->evaluate(average);
  recorder_if_coordinator(step)->record(reports, links, avg.accuracy, avg.bits_per_byte, consensus, *membership_);
  std::vector<Work> released;
  for (int p = 0; p < n_; ++p)
    if (!others[p].empty()) {
      eval_received_ += report_bytes_;
      released.push_back(network_->send(p, net::MessageType::kReport, round, 1, {}, false));
      eval_sent_ += net::kHeaderBytes;
    }
  for (auto& r : released) {
    try {
      r.wait();
    } catch (const Error&) {
      if (!tolerant_) throw;
    }
  }
}

}  // namespace peertrain::train
