// One peer's run (run_peer in trainer.h): what it holds between steps, and the parts of a
// run as methods. The constructor sets up the task, connects, and resumes or rejoins;
// train() is the loop. The evaluation, where every peer reports to the coordinator, is in
// peer_evaluation.cpp.
#pragma once

#include <chrono>

#include "peertrain/core/clock.h"
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "membership.h"
#include "peertrain/algo/gossip.h"
#include "peertrain/core/error.h"
#include "peertrain/net/transport.h"
#include "peertrain/train/checkpoint.h"
#include "peertrain/train/optimizer.h"
#include "peertrain/train/task.h"
#include "peertrain/train/trainer.h"
#include "recorder.h"
#include "step_algorithm.h"

namespace peertrain::train {

class PeerRun {
 public:
  PeerRun(const topology::Topology& t, int rank, const TrainConfig& config, const TransportFactory& transport = {});
  void train();
  void train_async();  // AD-PSGD: no global step (peer_async.cpp)

 private:
  using Clock = RunClock;  // simulated seconds on a simulated cluster

  void train_steps();
  // A centralized baseline's error, naming every peer lost by then (Transport::lost_links).
  Error naming_every_lost_peer(const Error& e) const;

  std::uint64_t find_resume_step() const;
  void connect(std::uint64_t resume_step);
  void connect_tcp(std::uint64_t resume_step);
  static void lower_compute_priority();
  void open_mixing_trace();
  void trace_row(long long step, const algo::MixingRow& row);
  void resume(std::uint64_t resume_step);
  void rejoin();
  // The coordinator's files: peer 0's from the start, or a survivor's from the step it
  // takes over (keeping the rows through kept_through).
  Recorder* recorder_if_coordinator(long long kept_through);
  void save(long long done);
  // peer_evaluation.cpp
  // The round's messages are keyed by `round` (default: step + 1); AD-PSGD's peers end at
  // different steps and meet in one final round.
  void evaluate(long long step, double epoch, std::uint64_t round = 0);
  void send_report(int to, std::uint64_t round, const Report& report, const std::vector<double>& sent_to);
  net::Payload receive_report(int p, std::uint64_t round, RunClock::time_point deadline);
  void coordinate(long long step, std::uint64_t round, const Report& report, std::vector<double> sent_to);
  // A straggler (the topology's stragglers) sleeps so that its gradient took `slowdown` times as long.
  void emulate_straggler(double gradient_s) const;

  const topology::Topology& t_;
  const int rank_;
  const int n_;
  const TrainConfig& config_;
  const bool tolerant_;  // D-PSGD goes on without lost peers; the baselines stop
  const TransportFactory make_transport_;  // empty: TCP
  std::unique_ptr<Task> task_;
  std::size_t size_ = 0;
  std::vector<float> x_, grads_;
  std::unique_ptr<Optimizer> optimizer_;
  long long steps_per_epoch_ = 0, total_steps_ = 0, eval_every_ = 0;
  CheckpointMatch match_;
  std::unique_ptr<net::Transport> network_;
  std::unique_ptr<algo::Gossip> gossip_;
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<StepAlgorithm> algorithm_;
  std::unique_ptr<Recorder> recorder_;
  std::ofstream mixing_trace_;  // --mixing-trace: the row this peer applied, each time it changes
  std::string last_trace_row_;

  // The run's running totals (a resume restores them from the checkpoint).
  long long first_step_ = 0;
  double wall_s_ = 0, compute_s_ = 0, wait_s_ = 0, loss_sum_ = 0;
  long long loss_count_ = 0;
  std::uint64_t sent_base_ = 0, received_base_ = 0;  // bytes of the run before a resume
  // Evaluation traffic is left out of the byte counts, so they show training traffic only.
  std::uint64_t eval_sent_ = 0, eval_received_ = 0, report_bytes_ = 0;
};

}  // namespace peertrain::train
