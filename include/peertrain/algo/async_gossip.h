// AD-PSGD's gossip (Lian, Zhang, Zhang, Liu, ICML 2018, "Asynchronous Decentralized
// Parallel Stochastic Gradient Descent"): there is no global step. Each peer, at its own
// pace, averages its parameters with one neighbour chosen at random, x_i = x_j ←
// (x_i + x_j)/2, while its own gradient steps keep landing on x. A straggler then slows
// only the averagings it takes part in, not every peer's step as in D-PSGD.
//
// One thread per peer serves the protocol; the trainer's thread computes. Messages go
// between neighbours as one ordered stream per direction (type kAverage, step = the
// stream's sequence number):
//   request(x_i)   i asks j to average; i starts no other averaging until it is answered;
//   accept(avg)    j has set x_j ← avg = (x_j + x_i)/2 and sends avg; i sets x_i ← avg plus
//                  whatever its own gradient steps added since it sent x_i;
//   refuse         j is itself waiting for an answer; i's x stays as it was;
//   done           the run is over; j answers nothing more (an open request counts refused).
// Every message also carries the sender's view of how many samples each peer has trained
// on (an elementwise maximum, so the views only grow): the run ends when a peer's view
// reaches the sample budget, or at the time budget, and its "done" carries the ending to
// its neighbours, and theirs to theirs.
//
// Atomic and deadlock-free. A peer waiting for an answer refuses every request but one:
// when two peers ask each other at once, the lower rank serves the higher rank's request
// and the higher rank refuses the lower's, so exactly one of the two averagings happens.
// A peer never waits on anything but an answer, and answers every request at once
// without waiting, so no cycle of waits can form. Averagings at one peer are therefore
// never interleaved: with no gradient steps, the final parameters are exactly the serial
// product of the pairwise averagings in an order consistent with every peer's log (the
// tests replay it). The sum of the x_i is kept by every averaging (x̄ moves only by the
// gradients).
//
// A neighbour whose link breaks, or who leaves a request unanswered for the peer timeout,
// is lost: this peer stops choosing it and goes on with the others.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "peertrain/core/clock.h"
#include "peertrain/core/rng.h"
#include "peertrain/core/work.h"
#include "peertrain/net/transport.h"

namespace peertrain::algo {

struct AsyncGossipOptions {
  std::vector<int> neighbours;
  int peers = 0;             // n: every peer's sample count is carried
  double sample_budget = 0;  // the run ends when the known total reaches it; 0: no budget
  double time_budget_s = 0;  // or this long after construction; 0: no limit
  std::uint64_t seed = 1;    // the choice of partners
  bool keep_log = false;     // record every averaging, in order (tests)
};

struct AsyncGossipStats {
  long long requested = 0;  // averagings this peer asked for
  long long averaged = 0;   // of those, answered with an average
  long long refused = 0;    // answered "busy", or "done"
  long long served = 0;     // requests of neighbours this peer averaged
  long long declined = 0;   // requests of neighbours refused while waiting for an answer
  long long crossed = 0;    // a neighbour asked while this peer was asking it
  long long skipped = 0;    // steps ending while an averaging was still under way
  double exchange_s = 0;    // request to answer, summed over this peer's requests
};

class AsyncGossip {
 public:
  // x is shared with the trainer's thread, which holds x_mutex whenever it reads or
  // writes x; the protocol thread starts at once.
  AsyncGossip(net::Transport& network, std::span<float> x, std::mutex& x_mutex, AsyncGossipOptions options);
  ~AsyncGossip();  // stop()s
  AsyncGossip(const AsyncGossip&) = delete;
  AsyncGossip& operator=(const AsyncGossip&) = delete;

  // The trainer, after a local step of `samples` examples, not holding x_mutex: counts
  // them and, unless an averaging is still under way, asks a random live neighbour for one.
  void step_done(long long samples);
  // The run is over: the known total reached the budget, the time ran out, or a
  // neighbour said "done".
  bool finished() const;
  // The samples this peer knows of, all peers together (a lower bound of the true total).
  double known_samples() const;
  // Waits for the answer to an open request, tells every live neighbour "done", and ends
  // the protocol thread. x is not touched afterwards. Idempotent.
  void stop();

  // Neighbours given up on, with the reason.
  std::vector<std::pair<int, std::string>> lost() const;
  AsyncGossipStats stats() const;
  // keep_log: the partner of every averaging this peer took part in, in order.
  std::vector<int> log() const;

 private:
  enum class Kind : std::uint32_t { kRequest = 1, kAccept = 2, kRefuse = 3, kDone = 4 };
  void serve();  // the protocol thread
  void handle(int from, const net::Payload& payload);
  // A message with this peer's counts and `values`; x_mutex held.
  net::Payload message(Kind kind, std::span<const float> values = {}) const;
  void send(int to, net::SendBuffer payload);              // x_mutex held
  void lose(int peer, const std::string& why, bool drop);  // x_mutex held
  void check_finished();                                   // x_mutex held
  void reap_sends();                                       // x_mutex held
  std::string name(int peer) const;

  net::Transport& network_;
  std::span<float> x_;
  std::mutex& mutex_;  // the trainer's x_mutex: guards x and everything below
  AsyncGossipOptions options_;
  const int self_;
  const SteadyClock::time_point start_;
  Rng rng_;

  std::vector<int> live_;  // neighbours still averaging
  std::vector<std::pair<int, std::string>> lost_;
  std::vector<std::uint64_t> counts_;                  // samples per peer, as far as this peer knows
  std::vector<std::uint64_t> send_seq_, receive_seq_;  // per peer, the streams' next numbers
  int awaiting_ = -1;                                  // the neighbour asked, until it answers
  SteadyClock::time_point asked_at_;
  std::shared_ptr<net::Payload> request_;  // the open request: its x is what the answer is relative to
  std::vector<Work> sends_;
  bool finished_ = false, stopping_ = false, stopped_ = false;
  AsyncGossipStats stats_;
  std::vector<int> log_;
  std::thread thread_;
};

}  // namespace peertrain::algo
