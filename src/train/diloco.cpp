// DiLoCo (Douillard et al. 2023) and Streaming DiLoCo (Douillard et al. 2025) as a step
// algorithm: the inner steps are the run's own optimizer with no communication; every H
// steps a fragment's pseudo-gradient Δ = θ_outer − θ_local is averaged over the peers and
// the outer optimizer (Nesterov SGD: b ← μb + Δ̄, θ_outer ← θ_outer − η(Δ̄ + μb)) applies
// it. The average is an all-reduce, a server, or one gossip round with W; the exchange
// may overlap the τ inner steps that follow (the ring advances between them, gossip and
// the server's messages travel meanwhile), and may travel quantized with error feedback.
#include <optional>

#include "peertrain/algo/collectives.h"
#include "peertrain/algo/quantize.h"
#include "peertrain/algo/ring_reduction.h"
#include "peertrain/algo/sparse_code.h"
#include "peertrain/core/clock.h"
#include "peertrain/core/error.h"
#include "peertrain/core/log.h"
#include "membership.h"
#include "step_algorithm.h"

namespace peertrain::train {
namespace {

using Clock = RunClock;  // simulated seconds on a simulated cluster

// How a pseudo-gradient travels: dense in a QuantFormat, or as SparseLoCo's top-k (sparse > 0).
struct OuterCodec {
  algo::QuantFormat format = algo::QuantFormat::kNone;
  double sparse = 0;

  // v's message; read_back (v's size) gets what its receivers decode.
  net::Payload encode(std::span<const float> v, std::span<float> read_back) const {
    if (sparse > 0) return algo::sparse_encode(sparse, v, read_back);
    net::Payload bytes;
    algo::quantize(format, v, bytes, read_back);
    return bytes;
  }
  // out += weight · the decoded message (scratch: out's size).
  void add(std::span<const std::byte> bytes, float weight, std::span<float> out, std::vector<float>& scratch,
           const std::string& from) const {
    if (sparse > 0) return algo::sparse_decode_add(sparse, bytes, weight, out, from);
    scratch.resize(out.size());
    algo::dequantize(format, bytes, scratch, false, from);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] += weight * scratch[i];
  }
};

// Averages one fragment's vector over the peers: begun after an inner step, ended after
// the one τ steps later. `v` is this peer's contribution and, after end(), the average;
// it must stay valid in between. Each quantization error this peer makes is added to
// `residual` (v's size, or empty without compression).
class OuterAverage {
 public:
  virtual ~OuterAverage() = default;
  // outer: the fragment's θ_outer (v = θ_outer − θ_local + the residual).
  virtual void begin(long long step, std::span<float> v, std::span<float> residual, std::span<const float> outer) = 0;
  virtual void progress() {}
  virtual void end() = 0;
  // A round a lost peer broke: drop what is under way (its sends end with their links).
  virtual void abandon() {}
  // The peers of the next rounds (the survivors, after a loss); the all-reduce's and the
  // all-gather's, every peer's own list in the same order.
  virtual void set_peers(std::vector<int> peers) { (void)peers; }
};

// An all-reduce over every peer, then ÷ n: the ring moves between inner steps
// (algo::RingReduction); tree and recursive doubling run at end().
class AllreduceAverage final : public OuterAverage {
 public:
  AllreduceAverage(net::Transport& network, int peers, algo::AllreduceAlgo algo, algo::QuantFormat format)
      : network_(network), algo_(algo), format_(format), peers_(static_cast<std::size_t>(peers)) {
    for (int p = 0; p < peers; ++p) peers_[static_cast<std::size_t>(p)] = p;
  }
  void begin(long long step, std::span<float> v, std::span<float> residual, std::span<const float>) override {
    key_ = static_cast<std::uint64_t>(step);
    v_ = v;
    if (algo_ == algo::AllreduceAlgo::kRing) {
      ring_.emplace(network_, peers_, key_, v, format_, residual);
      ring_->progress();
    }
  }
  void progress() override {
    if (ring_) ring_->progress();
  }
  void abandon() override { ring_.reset(); }
  void set_peers(std::vector<int> peers) override { peers_ = std::move(peers); }
  void end() override {
    if (ring_) {
      ring_->finish();
      ring_.reset();
    } else {
      algo::allreduce(algo_, network_, peers_, key_, v_);
    }
    const float inverse_n = 1.0f / static_cast<float>(peers_.size());
    for (float& value : v_) value *= inverse_n;
  }

 private:
  net::Transport& network_;
  algo::AllreduceAlgo algo_;
  algo::QuantFormat format_;
  std::vector<int> peers_;
  std::uint64_t key_ = 0;
  std::span<float> v_;
  std::optional<algo::RingReduction> ring_;
};

// A server on peer 0: every other peer sends its vector at begin() and reads the average
// back at end(); peer 0 adds them in fp32 at its end() and sends the average to all.
class ServerAverage final : public OuterAverage {
 public:
  ServerAverage(net::Transport& network, int rank, int peers, algo::QuantFormat format)
      : network_(network), rank_(rank), peers_(peers), format_(format) {}
  void begin(long long step, std::span<float> v, std::span<float> residual, std::span<const float>) override {
    key_ = static_cast<std::uint64_t>(step);
    v_ = v;
    residual_ = residual;
    if (rank_ == 0) return;
    send_ = network_.send(0, net::MessageType::kReduceChunk, key_, kPushTag, encode(v, 1.0f));
  }
  void end() override {
    if (rank_ != 0) {
      send_.wait();
      net::Payload in = network_.receive(0, net::MessageType::kReduceChunk, key_, kPullTag);
      algo::dequantize(format_, in, v_, false, network_.peer_name(0));
      network_.recycle(std::move(in));
      return;
    }
    for (int p = 1; p < peers_; ++p) {
      net::Payload in = network_.receive(p, net::MessageType::kReduceChunk, key_, kPushTag);
      algo::dequantize(format_, in, v_, true, network_.peer_name(p));
      network_.recycle(std::move(in));
    }
    const float inverse_n = 1.0f / static_cast<float>(peers_);
    for (float& value : v_) value *= inverse_n;
    // The average's own rounding counts n times in this peer's residual: the next average
    // divides it by n again.
    const net::Payload average = encode(v_, static_cast<float>(peers_));
    std::copy(read_back_.begin(), read_back_.end(), v_.begin());
    std::vector<Work> sends;
    for (int p = 1; p < peers_; ++p)
      sends.push_back(network_.send(p, net::MessageType::kReduceChunk, key_, kPullTag, average));
    for (Work& w : sends) w.wait();
  }

 private:
  static constexpr std::uint32_t kPushTag = 3u << 20, kPullTag = kPushTag + 1;

  // v as the wire carries it; the error, times `weight`, goes to the residual.
  net::Payload encode(std::span<const float> v, float weight) {
    net::Payload bytes;
    read_back_.resize(v.size());
    algo::quantize(format_, v, bytes, read_back_);
    if (!residual_.empty())
      for (std::size_t i = 0; i < v.size(); ++i) residual_[i] += weight * (v[i] - read_back_[i]);
    return bytes;
  }

  net::Transport& network_;
  int rank_, peers_;
  algo::QuantFormat format_;
  std::uint64_t key_ = 0;
  std::span<float> v_, residual_;
  std::vector<float> read_back_;
  Work send_;
};

// SparseLoCo's all-gather: every peer sends its sparse message to every other and adds
// all n decoded vectors in fp32, in rank order (its own decoded from its own message), so
// that every peer ends with bitwise the same average.
class AllGatherAverage final : public OuterAverage {
 public:
  AllGatherAverage(net::Transport& network, int rank, int peers, OuterCodec codec)
      : network_(network), rank_(rank), codec_(codec) {
    for (int p = 0; p < peers; ++p) peers_.push_back(p);
  }
  void abandon() override { sends_.clear(); }
  void set_peers(std::vector<int> peers) override { peers_ = std::move(peers); }
  void begin(long long step, std::span<float> v, std::span<float> residual, std::span<const float>) override {
    key_ = static_cast<std::uint64_t>(step);
    v_ = v;
    read_back_.resize(v.size());
    message_ = codec_.encode(v, read_back_);
    if (!residual.empty())
      for (std::size_t i = 0; i < v.size(); ++i) residual[i] += v[i] - read_back_[i];
    for (int p : peers_)
      if (p != rank_) sends_.push_back(network_.send(p, net::MessageType::kReduceChunk, key_, kTag, message_));
  }
  void end() override {
    std::fill(v_.begin(), v_.end(), 0.0f);
    for (int p : peers_) {
      if (p == rank_) {
        codec_.add(message_, 1.0f, v_, scratch_, "this peer");
        continue;
      }
      net::Payload in = network_.receive(p, net::MessageType::kReduceChunk, key_, kTag);
      codec_.add(in, 1.0f, v_, scratch_, network_.peer_name(p));
      network_.recycle(std::move(in));
    }
    for (Work& w : sends_) w.wait();
    sends_.clear();
    const float inverse_n = 1.0f / static_cast<float>(peers_.size());
    for (float& value : v_) value *= inverse_n;
  }

 private:
  static constexpr std::uint32_t kTag = 4u << 20;
  net::Transport& network_;
  int rank_;
  std::vector<int> peers_;
  OuterCodec codec_;
  std::uint64_t key_ = 0;
  std::span<float> v_;
  net::Payload message_;
  std::vector<float> read_back_, scratch_;
  std::vector<Work> sends_;
};

// One gossip round with this peer's row of W over the local models: each peer sends its
// θ_local = θ_outer − Δ and takes Δ̄_i = θ_outer,i − Σ_j W_ij θ_local,j. The outer
// parameters are then mixed too (Δ̄_i = Σ_j W_ij Δ_j + θ_outer,i − Σ_j W_ij θ_outer,j), so
// the peers' θ_outer contract towards each other as D-PSGD's x do; averaging the Δ alone
// would leave their differences to drift. With W = J and equal θ_outer it is the
// all-reduce's average. fp32 only (--outer-compression is for the all-reduce).
class GossipAverage final : public OuterAverage {
 public:
  explicit GossipAverage(algo::Gossip& gossip) : gossip_(gossip) {}
  void begin(long long step, std::span<float> v, std::span<float>, std::span<const float> outer) override {
    v_ = v;
    outer_ = outer;
    model_.resize(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) model_[i] = outer[i] - v[i];
    gossip_.start(static_cast<std::uint64_t>(step), model_);
  }
  void end() override {
    gossip_.finish(model_);  // mixes in place, as D-PSGD's atc step does
    for (std::size_t i = 0; i < v_.size(); ++i) v_[i] = outer_[i] - model_[i];
  }

 private:
  algo::Gossip& gossip_;
  std::span<float> v_;
  std::span<const float> outer_;
  std::vector<float> model_;
};

class Diloco final : public StepAlgorithm {
 public:
  Diloco(StepContext c, const OuterConfig& o, std::size_t parameters, std::unique_ptr<OuterAverage> average)
      : c_(std::move(c)),
        o_(o),
        average_(std::move(average)),
        fragments_(group_fragments(
            c_.layers.empty() ? std::vector<std::pair<std::size_t, std::size_t>>{{0, parameters}} : c_.layers,
            o.fragments)),
        momentum_(o.momentum > 0 ? parameters : 0, 0.0f),
        pending_(parameters),
        residual_(o.compression != algo::QuantFormat::kNone || o.sparse > 0 ? parameters : 0, 0.0f) {
    for (int p = 0; p < c_.peers; ++p) peers_.push_back(p);
  }

  void start(long long step, std::span<float> x) override {
    if (outer_.empty()) outer_.assign(x.begin(), x.end());  // θ_0, which every peer shares
    if (survives()) {
      if (auto rows = c_.membership->poll(static_cast<std::uint64_t>(step), x)) {
        if (gossips())
          c_.gossip->set_rows(std::move(*rows));
        else
          regroup(step, x);
      }
    }
    progress(step);
  }

  StepTiming finish(long long step, std::span<float> x, std::span<float> grads, Optimizer& optimizer) override {
    StepTiming t;
    const auto begin = Clock::now();
    optimizer.step(x, grads);
    t.compute_s = seconds_since(begin);
    const long long done = step + 1;
    progress(step);
    if (in_flight_ && (done >= lands_at_ || done == c_.total_steps)) land(step, x, t);
    const int fragment = fragment_due(done);
    if (fragment >= 0 && broken_) {
      await_regroup(step + 1, x);  // (the regroup's x is the next step's)
    } else if (fragment >= 0) {
      send(step, fragment, x, t);
      if (in_flight_ && (o_.overlap == 0 || done == c_.total_steps)) land(step, x, t);
    }
    return t;
  }

 private:
  bool gossips() const { return o_.exchange == OuterExchange::kGossip; }
  // Over gossip the rounds leave a lost neighbour out (algo::Gossip); over the all-reduce
  // and the all-gather a round a loss breaks is abandoned, and the survivors regroup.
  bool survives() const { return o_.exchange != OuterExchange::kPs && c_.membership; }

  void progress(long long step) {
    if (!in_flight_) return;
    try {
      average_->progress();
    } catch (const Error& e) {
      abandon(step, e);
    }
  }

  // A loss broke the round under way: the outer step of its fragment is skipped (the next
  // round's Δ = θ_outer − θ_local still holds this round's progress), and the peers whose
  // links are down are reported, so that the membership agrees on them.
  void abandon(long long step, const Error& e) {
    if (!survives() || gossips() ||
        (e.kind() != ErrorKind::kPeerLost && e.kind() != ErrorKind::kTimeout && e.kind() != ErrorKind::kParse))
      throw e;
    average_->abandon();
    in_flight_ = false;
    std::vector<std::pair<int, std::string>> lost;
    for (int p : peers_)
      if (p != c_.rank && !c_.network.alive(p)) lost.emplace_back(p, e.what());
    log::warn("diloco: the outer average of fragment ", fragment_, " begun after step ", sent_at_,
              " is abandoned: ", e.what());
    if (!lost.empty()) c_.membership->report_lost(static_cast<std::uint64_t>(step), lost);
    broken_ = true;
  }

  // A fragment is due while the group is broken: no round until the membership's switch.
  // Waiting here for its announcement keeps this peer, whose rounds would fail at once,
  // from running ahead past the agreed step; a switch already due is made now.
  void await_regroup(long long step, std::span<float> x) {
    if (!c_.membership->await_switch(static_cast<std::uint64_t>(step), 4 * c_.network.peer_timeout_s())) return;
    if (c_.membership->poll(static_cast<std::uint64_t>(step), x)) regroup(step, x);
  }

  // At a step the membership agreed on after a loss: the next rounds go over the survivors,
  // and every survivor takes the lowest one's outer state, so that they agree again on
  // θ_outer and its momentum whatever rounds the loss broke for some of them only.
  void regroup(long long step, std::span<float> x) {
    if (in_flight_) {
      StepTiming ignored;
      land(step - 1, x, ignored);
    }
    broken_ = false;
    peers_.clear();
    for (int p = 0; p < c_.peers; ++p)
      if (!c_.membership->is_lost(p)) peers_.push_back(p);
    average_->set_peers(peers_);
    const std::uint64_t key = c_.membership->last_switch_step();  // the agreed step: a late peer's too
    constexpr std::uint32_t kRegroupTag = 5u << 20;
    // θ_outer, then the momentum (when there is one): a message each.
    const std::vector<std::span<float>> state = {outer_, momentum_};
    const std::uint32_t parts = momentum_.empty() ? 1 : 2;
    if (c_.rank == peers_.front()) {
      std::vector<Work> sends;
      for (std::size_t i = 1; i < peers_.size(); ++i)
        for (std::uint32_t k = 0; k < parts; ++k)
          sends.push_back(c_.network.send(peers_[i], net::MessageType::kReduceChunk, key, kRegroupTag + k,
                                          net::as_bytes(std::span<const float>(state[k]))));
      for (Work& w : sends) w.wait();
      return;
    }
    for (std::uint32_t k = 0; k < parts; ++k) {
      net::Payload in = c_.network.receive_while_alive(peers_.front(), net::MessageType::kReduceChunk, key,
                                                       kRegroupTag + k, 4 * c_.network.peer_timeout_s());
      algo::dequantize(algo::QuantFormat::kNone, in, state[k], false, c_.network.peer_name(peers_.front()));
    }
    log::info("diloco: regrouped at step ", step, " over ", peers_.size(), " peers, with peer ", peers_.front(),
              "'s outer state");
  }

  // The fragment whose exchange begins after `done` inner steps: fragment f at done ≡
  // ⌊(f + 1)·H/F⌋ (mod H), so each is synchronised every H steps and one about every H/F.
  int fragment_due(long long done) const {
    const long long h = o_.inner_steps, f = static_cast<long long>(fragments_.size());
    const long long phase = done % h == 0 ? h : done % h;
    for (long long k = 0; k < f; ++k)
      if (phase == (k + 1) * h / f) return static_cast<int>(k);
    return -1;
  }

  void send(long long step, int fragment, std::span<const float> x, StepTiming& t) {
    const auto begin = Clock::now();
    const auto [offset, size] = fragments_[static_cast<std::size_t>(fragment)];
    const std::span<float> v = std::span<float>(pending_).subspan(offset, size);
    std::span<float> residual;
    for (std::size_t i = offset; i < offset + size; ++i) pending_[i] = outer_[i] - x[i];
    if (!residual_.empty()) {
      residual = std::span<float>(residual_).subspan(offset, size);
      for (std::size_t i = 0; i < size; ++i) {
        v[i] += residual[i];  // error feedback: what earlier rounds did not deliver
        residual[i] = 0;
      }
    }
    in_flight_ = true;
    fragment_ = fragment;
    sent_at_ = step + 1;
    lands_at_ = sent_at_ + o_.overlap;
    try {
      average_->begin(step, v, residual, std::span<const float>(outer_).subspan(offset, size));
    } catch (const Error& e) {
      abandon(step, e);
    }
    t.compute_s += seconds_since(begin);
  }

  // The average is in: the outer step on the fragment, then θ_local takes it in.
  void land(long long step, std::span<float> x, StepTiming& t) {
    auto begin = Clock::now();
    try {
      average_->end();
    } catch (const Error& e) {
      t.wait_s += seconds_since(begin);
      return abandon(step, e);
    }
    t.wait_s += seconds_since(begin);
    begin = Clock::now();
    const auto [offset, size] = fragments_[static_cast<std::size_t>(fragment_)];
    const float lr = o_.lr, mu = o_.momentum;
    const bool replace = step + 1 == sent_at_;  // nothing moved since: no local share to keep
    const float keep = replace ? 0.0f : o_.mix;
    for (std::size_t i = offset; i < offset + size; ++i) {
      const float g = pending_[i];
      float u = g;
      if (mu > 0) {
        momentum_[i] = mu * momentum_[i] + g;
        u = o_.nesterov ? g + mu * momentum_[i] : momentum_[i];
      }
      outer_[i] -= lr * u;
      x[i] = replace ? outer_[i] : keep * x[i] + (1 - keep) * outer_[i];
    }
    in_flight_ = false;
    t.compute_s += seconds_since(begin);
    if (!gossips()) return;
    if (c_.trace) c_.trace(step, c_.gossip->applied_row());
    if (!c_.gossip->newly_lost().empty())
      c_.membership->report_lost(static_cast<std::uint64_t>(step), c_.gossip->newly_lost());
  }

  StepContext c_;
  OuterConfig o_;
  std::unique_ptr<OuterAverage> average_;
  std::vector<std::pair<std::size_t, std::size_t>> fragments_;
  std::vector<float> outer_, momentum_, pending_, residual_;  // θ_outer, b, Δ (then Δ̄), error feedback
  std::vector<int> peers_;                                    // of the all-reduce and the all-gather
  bool broken_ = false;                                       // a loss broke a round: none until the survivors regroup
  bool in_flight_ = false;
  int fragment_ = 0;
  long long sent_at_ = 0, lands_at_ = 0;
};

}  // namespace

std::vector<std::pair<std::size_t, std::size_t>> group_fragments(
    const std::vector<std::pair<std::size_t, std::size_t>>& layers, int fragments) {
  const auto count = static_cast<std::size_t>(fragments);
  if (fragments < 1 || count > layers.size())
    throw Error(ErrorKind::kInvalidArgument,
                str("--fragments ", fragments, ": the model has ", layers.size(), " layers to group into fragments"));
  std::size_t total = 0;
  for (const auto& layer : layers) total += layer.second;
  std::vector<std::pair<std::size_t, std::size_t>> out;
  std::size_t next = 0;
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t first = next, target = total * (k + 1) / count;
    // At least one layer each, and enough left for the fragments after this one.
    const std::size_t last_allowed = layers.size() - (count - k);
    std::size_t end_layer = first;
    while (end_layer < last_allowed && layers[end_layer].first + layers[end_layer].second < target) ++end_layer;
    if (k + 1 == count) end_layer = layers.size() - 1;
    const std::size_t offset = layers[first].first;
    out.emplace_back(offset, layers[end_layer].first + layers[end_layer].second - offset);
    next = end_layer + 1;
  }
  return out;
}

std::unique_ptr<StepAlgorithm> make_diloco(const TrainConfig& config, StepContext context, std::size_t parameters) {
  const OuterConfig& o = config.outer;
  if (o.inner_steps < 1) throw Error(ErrorKind::kInvalidArgument, str("--inner-steps ", o.inner_steps, " is below 1"));
  if (o.fragments > o.inner_steps || o.overlap >= o.inner_steps / o.fragments)
    throw Error(ErrorKind::kInvalidArgument,
                str("--fragments ", o.fragments, " --overlap ", o.overlap, ": F may not exceed --inner-steps ",
                    o.inner_steps, " and each exchange must land before the next begins (τ < ⌊H/F⌋)"));
  if (o.exchange == OuterExchange::kAllreduce && config.allreduce_algo != algo::AllreduceAlgo::kRing &&
      (o.overlap > 0 || o.compression != algo::QuantFormat::kNone))
    throw Error(ErrorKind::kInvalidArgument,
                str("--allreduce-algo ", algo::to_string(config.allreduce_algo),
                    ": --overlap and --outer-compression run over the ring (--allreduce-algo ring)"));
  if ((o.sparse > 0 && o.exchange == OuterExchange::kPs) ||
      (o.exchange == OuterExchange::kGossip && (o.sparse > 0 || o.compression != algo::QuantFormat::kNone)))
    throw Error(ErrorKind::kInvalidArgument,
                "--outer-compression: sparse runs over --outer-exchange allreduce (an all-gather), int8, fp8 and int4 "
                "over allreduce or ps; gossip mixes the models in fp32");
  const OuterCodec codec{o.compression, o.sparse};
  std::unique_ptr<OuterAverage> average;
  switch (o.exchange) {
    case OuterExchange::kAllreduce:
      if (o.sparse > 0)
        average = std::make_unique<AllGatherAverage>(context.network, context.rank, context.peers, codec);
      else
        average =
            std::make_unique<AllreduceAverage>(context.network, context.peers, config.allreduce_algo, o.compression);
      break;
    case OuterExchange::kPs:
      average = std::make_unique<ServerAverage>(context.network, context.rank, context.peers, o.compression);
      break;
    case OuterExchange::kGossip:
      PEERTRAIN_CHECK(context.gossip && context.membership, "gossip DiLoCo needs the gossip and the membership");
      average = std::make_unique<GossipAverage>(*context.gossip);
      break;
  }
  return std::make_unique<Diloco>(std::move(context), o, parameters, std::move(average));
}

}  // namespace peertrain::train
