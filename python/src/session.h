// One Python process's peer (docs/python.md): the topology file, the TCP links to every
// other peer (authenticated with a secret file when given), and the collectives a
// training script calls: gossip with the neighbours through W, all-reduce, broadcast,
// barrier and the consensus distance. No pybind11 here; module.cpp binds it.
//
// Every peer must call the collectives in the same order, as with MPI or BlueFog: the
// n-th call of a process is matched with the n-th call of the others (its sequence number
// keys the messages). Calls run one at a time, in order, on one worker thread, so a
// non-blocking call returns at once and a later blocking one waits behind it.
//
// A neighbour lost during a neighbour all-reduce (its link breaks, or it sends nothing
// within the peer timeout) is dropped, as D-PSGD does in the engine: its weight moves to
// the diagonal, later calls leave it out, and lost() names it. The all-reduce, broadcast
// and barrier need everyone: a lost peer there is an error.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "peertrain/net/transport.h"
#include "peertrain/topology/topology.h"

namespace peertrain::python {

struct SessionOptions {
  std::string topology;  // the topology file
  int rank = 0;
  std::string secret_file;  // empty: no authentication
  double peer_timeout_s = 60;
  double connect_timeout_s = 60;
};

class Session {
 public:
  // Loads the topology and connects to every other peer; throws Error naming the file,
  // the rank or the peer that refused.
  explicit Session(const SessionOptions& options);
  ~Session();  // close()
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const { return rank_; }
  int size() const { return topology_.num_peers(); }
  const topology::Topology& topology() const { return topology_; }
  std::vector<int> neighbors() const;
  // This peer's row of W: its own weight, and its neighbours'.
  double self_weight() const { return self_weight_; }
  const std::map<int, double>& neighbor_weights() const { return weights_; }
  double spectral_gap() const;  // 1 − max(|λ₂|, |λₙ|); 0 for a time-varying topology

  // Queues a call on the worker thread; the future carries its exception, if any.
  std::shared_future<void> submit(std::function<void()> call);
  // The collectives, to be called through submit() (they take the next sequence number).
  // out = self_weight·x + Σ_j w_j·x_j over the neighbours (W's row by default; src_weights
  // must name neighbours only). x and out may alias.
  void neighbor_allreduce(std::span<const float> x, std::span<float> out, std::optional<double> self_weight,
                          const std::optional<std::map<int, double>>& src_weights);
  void allreduce(std::span<float> data, bool average);
  void broadcast(std::span<float> data, int root);
  void barrier();
  // (1/n) Σ_i ‖x_i − x̄‖², the same on every peer.
  double consensus_distance(std::span<const float> x);

  // Neighbours dropped, with the reason.
  std::vector<std::pair<int, std::string>> lost() const;
  void close();

 private:
  void work();  // the worker thread
  std::vector<int> everyone_alive() const;
  bool is_lost(int peer) const;

  topology::Topology topology_;
  int rank_ = 0;
  double self_weight_ = 1;
  std::map<int, double> weights_;
  std::unique_ptr<net::Transport> network_;
  std::uint64_t sequence_ = 0;  // the worker's: the calls made so far

  mutable std::mutex mutex_;  // guards what follows
  std::condition_variable queued_;
  std::deque<std::packaged_task<void()>> calls_;
  std::vector<std::pair<int, std::string>> lost_;
  bool closing_ = false;
  std::thread worker_;
};

}  // namespace peertrain::python
