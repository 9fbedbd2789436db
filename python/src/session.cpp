#include "session.h"

#include <algorithm>
#include <cmath>

#include "peertrain/algo/collectives.h"
#include "peertrain/core/error.h"
#include "peertrain/net/auth.h"
#include "peertrain/net/tcp.h"
#include "peertrain/topology/spectrum.h"

namespace peertrain::python {
namespace {

constexpr std::uint64_t kMaxTensorBytes = std::uint64_t{1} << 31;  // a message's limit
constexpr std::uint64_t kRunSalt = 0x7079746f72636821ULL;          // python peers only meet python peers

}  // namespace

Session::Session(const SessionOptions& options) : topology_(topology::load_topology_file(options.topology)) {
  const int n = topology_.num_peers();
  if (options.rank < 0 || options.rank >= n)
    throw Error(ErrorKind::kInvalidArgument,
                str("rank ", options.rank, " is not a peer of ", options.topology, " (peers 0..", n - 1, ")"));
  rank_ = options.rank;
  const topology::SparseMatrix w = topology_.mixing_at(0);
  for (topology::SparseMatrix::InnerIterator it(w, rank_); it; ++it) {
    if (it.row() == rank_)
      self_weight_ = it.value();
    else if (it.value() != 0)
      weights_[static_cast<int>(it.row())] = it.value();
  }
  net::TcpOptions tcp;
  if (!options.secret_file.empty()) tcp.secret = net::Secret::load(options.secret_file);
  tcp.self = rank_;
  for (const auto& p : topology_.peers) tcp.endpoints.push_back({p.host, p.port});
  for (int p = 0; p < n; ++p)
    if (p != rank_) tcp.links.push_back(p);  // the all-reduce and broadcast reach everyone
  tcp.fingerprint = topology_.fingerprint();
  tcp.run_id = topology_.fingerprint() ^ kRunSalt;
  tcp.connect_timeout_s = options.connect_timeout_s;
  tcp.peer_timeout_s = options.peer_timeout_s;
  tcp.max_payload_bytes = kMaxTensorBytes;
  tcp.node_bandwidth_mbps = topology_.node_bandwidth_mbps;
  tcp.node_ingress_mbps = topology_.node_ingress_mbps;
  tcp.shaping = [&t = topology_, rank = rank_](int peer) {
    const auto link = t.link(rank, peer);
    return net::LinkShaping{link.latency_ms, link.bandwidth_mbps};
  };
  network_ = net::make_tcp_transport(std::move(tcp));
  network_->connect();
  worker_ = std::thread([this] { work(); });
}

Session::~Session() {
  try {
    close();
  } catch (...) {
  }
}

std::vector<int> Session::neighbors() const {
  std::vector<int> out;
  for (const auto& [peer, weight] : weights_) out.push_back(peer);
  return out;
}

double Session::spectral_gap() const {
  if (topology_.time_varying()) return 0;
  return topology::analyze_spectrum(topology_.mixing, topology_.graph).spectral_gap;
}

std::shared_future<void> Session::submit(std::function<void()> call) {
  std::packaged_task<void()> task(std::move(call));
  std::shared_future<void> done = task.get_future().share();
  {
    std::lock_guard lock(mutex_);
    if (closing_) throw Error(ErrorKind::kInvalidArgument, "peertrain was shut down; call peertrain.init() first");
    calls_.push_back(std::move(task));
  }
  queued_.notify_one();
  return done;
}

void Session::work() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock lock(mutex_);
      queued_.wait(lock, [&] { return closing_ || !calls_.empty(); });
      if (calls_.empty()) return;
      task = std::move(calls_.front());
      calls_.pop_front();
    }
    task();  // an exception goes to the caller's future
  }
}

bool Session::is_lost(int peer) const {
  std::lock_guard lock(mutex_);
  return std::any_of(lost_.begin(), lost_.end(), [&](const auto& l) { return l.first == peer; });
}

std::vector<std::pair<int, std::string>> Session::lost() const {
  std::lock_guard lock(mutex_);
  return lost_;
}

std::vector<int> Session::everyone_alive() const {
  std::vector<int> all;
  for (int p = 0; p < size(); ++p) {
    if (is_lost(p))
      throw Error(ErrorKind::kPeerLost, str(network_->peer_name(p),
                                            " was lost earlier; the all-reduce, broadcast and "
                                            "barrier need every peer (neighbor_allreduce goes on without it)"));
    all.push_back(p);
  }
  return all;
}

void Session::neighbor_allreduce(std::span<const float> x, std::span<float> out, std::optional<double> self_weight,
                                 const std::optional<std::map<int, double>>& src_weights) {
  PEERTRAIN_CHECK(out.size() == x.size(), "output of ", out.size(), " for ", x.size());
  std::map<int, double> weights = src_weights ? *src_weights : weights_;
  for (const auto& [peer, weight] : weights)
    if (!weights_.count(peer))
      throw Error(ErrorKind::kInvalidArgument,
                  str(
                      "src_weights names peer ", peer, ", which is not a neighbour of peer ", rank_, " in ",
                      topology_.path, " (its neighbours: ",
                      [&] {
                        std::string s;
                        for (int p : neighbors()) s += (s.empty() ? "" : ", ") + std::to_string(p);
                        return s;
                      }(),
                      ")"));
  // Checked before the call takes its number: a refused call leaves the peers in step.
  const std::uint64_t call = sequence_++;
  double mine = self_weight ? *self_weight : (src_weights ? 0.0 : self_weight_);
  // Every live neighbour sends to every neighbour (it does not know our weights); what we
  // do not weigh we still take, so nothing is left behind in the mailbox.
  std::vector<Work> sends;
  for (int peer : neighbors())
    if (!is_lost(peer)) sends.push_back(network_->send(peer, net::MessageType::kParameters, call, 0, net::as_bytes(x)));
  std::vector<std::pair<double, net::Payload>> received;
  std::string mismatch;
  for (int peer : neighbors()) {
    if (is_lost(peer)) {
      if (weights.count(peer)) mine += weights[peer];  // a lost neighbour's weight stays home
      continue;
    }
    try {
      net::Payload payload = network_->receive(peer, net::MessageType::kParameters, call, 0);
      if (payload.size() != x.size_bytes()) {
        mismatch = str(network_->peer_name(peer), " sent a tensor of ", payload.size() / sizeof(float),
                       " elements to neighbor_allreduce, peer ", rank_, " has ", x.size(),
                       ": the tensors must have the same shape on every peer (call ", call, ")");
        continue;
      }
      if (weights.count(peer)) received.emplace_back(weights[peer], std::move(payload));
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kPeerLost && e.kind() != ErrorKind::kTimeout) throw;
      network_->drop(peer, str("peer ", rank_, " dropped ", network_->peer_name(peer), ": ", e.what()));
      {
        std::lock_guard lock(mutex_);
        lost_.emplace_back(peer, e.what());
      }
      if (weights.count(peer)) mine += weights[peer];
    }
  }
  for (Work& send : sends) {
    try {
      send.wait();
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kPeerLost && e.kind() != ErrorKind::kTimeout) throw;
    }
  }
  if (!mismatch.empty()) throw Error(ErrorKind::kInvalidArgument, mismatch);
  // The mix is bandwidth-bound: two neighbours per pass over memory, the first pass
  // writing out (which may alias x). Neighbours in graph order: the same floats whatever
  // the order of arrival.
  const std::size_t n = x.size();
  const float self = static_cast<float>(mine);
  auto input = [&](std::size_t k) { return reinterpret_cast<const float*>(received[k].second.data()); };
  auto weight = [&](std::size_t k) { return static_cast<float>(received[k].first); };
  std::size_t k = 0;
  if (received.size() >= 2) {
    const float* a = input(0);
    const float* b = input(1);
    const float wa = weight(0), wb = weight(1);
    for (std::size_t i = 0; i < n; ++i) out[i] = self * x[i] + wa * a[i] + wb * b[i];
    k = 2;
  } else if (received.size() == 1) {
    const float* a = input(0);
    const float wa = weight(0);
    for (std::size_t i = 0; i < n; ++i) out[i] = self * x[i] + wa * a[i];
    k = 1;
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = self * x[i];
  }
  for (; k + 2 <= received.size(); k += 2) {
    const float* a = input(k);
    const float* b = input(k + 1);
    const float wa = weight(k), wb = weight(k + 1);
    for (std::size_t i = 0; i < n; ++i) out[i] += wa * a[i] + wb * b[i];
  }
  if (k < received.size()) {
    const float* a = input(k);
    const float wa = weight(k);
    for (std::size_t i = 0; i < n; ++i) out[i] += wa * a[i];
  }
  for (auto& [w, payload] : received) network_->recycle(std::move(payload));
}

void Session::allreduce(std::span<float> data, bool average) {
  const std::uint64_t call = sequence_++;
  algo::ring_allreduce(*network_, everyone_alive(), call, data);
  if (average)
    for (float& v : data) v /= static_cast<float>(size());
}

void Session::broadcast(std::span<float> data, int root) {
  if (root < 0 || root >= size())
    throw Error(ErrorKind::kInvalidArgument, str("broadcast root ", root, " is not a peer (0..", size() - 1, ")"));
  const std::uint64_t call = sequence_++;
  const std::vector<int> all = everyone_alive();
  if (rank_ == root) {
    std::vector<Work> sends;
    for (int p : all)
      if (p != rank_) sends.push_back(network_->send(p, net::MessageType::kParameters, call, 1, net::as_bytes(data)));
    for (Work& s : sends) s.wait();
    return;
  }
  const net::Payload payload = network_->receive(root, net::MessageType::kParameters, call, 1);
  if (payload.size() != data.size_bytes())
    throw Error(ErrorKind::kInvalidArgument,
                str("broadcast: ", network_->peer_name(root), " sent ", payload.size() / sizeof(float),
                    " elements, peer ", rank_, " has ", data.size(), ": the shapes must agree"));
  std::copy_n(reinterpret_cast<const float*>(payload.data()), data.size(), data.data());
}

void Session::barrier() {
  float one = 1;
  allreduce({&one, 1}, false);
}

double Session::consensus_distance(std::span<const float> x) {
  std::vector<float> mean(x.begin(), x.end());
  allreduce(mean, true);
  double local = 0;
  for (std::size_t i = 0; i < x.size(); ++i) local += (double(x[i]) - mean[i]) * (double(x[i]) - mean[i]);
  float total = static_cast<float>(local);
  allreduce({&total, 1}, true);
  return total;
}

void Session::close() {
  {
    std::lock_guard lock(mutex_);
    if (closing_) return;
    closing_ = true;
  }
  queued_.notify_all();
  if (worker_.joinable()) worker_.join();  // the calls queued before still run
  if (network_) network_->close();
}

}  // namespace peertrain::python
