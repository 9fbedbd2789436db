// One peer's training run: the model replica, its shard of Fashion-MNIST, the optimizer,
// and the algorithm that couples it to the others —
//   dpsgd:     x ← Σ_j W_ij x_j − u, with the exchange of x overlapping the gradient
//              (Lian et al. 2017);
//   allreduce: ring all-reduce of the gradients over every peer, then the same SGD step
//              everywhere (centralized C-PSGD);
//   ps:        a parameter server on peer 0 (C-PSGD as in the paper);
//   local:     no communication (the lower bound).
// At every evaluation each peer tests its own model and sends its metrics and parameters
// to peer 0, which evaluates the average model x̄, measures the consensus distance, and
// writes metrics.csv and summary.json. Evaluation is not counted in the step timings.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "peertrain/algo/collectives.h"
#include "peertrain/algo/compression.h"
#include "peertrain/algo/quantize.h"
#include "peertrain/model/device_model.h"
#include "peertrain/model/transformer.h"
#include "peertrain/net/transport.h"
#include "peertrain/parallel/pipeline.h"
#include "peertrain/topology/topology.h"
#include "peertrain/train/data.h"
#include "peertrain/train/optimizer.h"
#include "peertrain/train/text.h"
#include "peertrain/train/tokenizer.h"

namespace peertrain::train {

enum class Algorithm { kDpsgd, kAllreduce, kPs, kLocal, kChoco, kD2, kAdpsgd, kGt, kDiloco, kSgp, kEl };
std::string_view to_string(Algorithm algorithm);
Algorithm parse_algorithm(std::string_view name);  // throws Error naming the choices
// The algorithms that gossip with neighbours (D-PSGD, CHOCO-SGD, D², gradient tracking
// through W; SGP and Epidemic Learning over directed graphs; AD-PSGD pairwise): they
// survive a lost peer; the centralized ones stop.
bool gossips(Algorithm algorithm);

// Where the neighbours' average enters the step. cta (combine-then-adapt, Lian et al.
// 2017): x ← W·x − u, the exchange of x overlapping the gradient. atc (adapt-then-combine,
// Sayed 2014): x ← W·(x − u), the exchange after the local step, so nothing overlaps it,
// but with W = J it is exactly the all-reduce step.
enum class UpdateForm { kCta, kAtc };

// D-PSGD's momentum. local: each peer's heavy ball over its own gradients, m ← βm + g.
// quasi-global (QG-DSGDm, Lin et al., ICML 2021): the step uses βm̂ + g, and m̂ follows the
// peer's whole move, mix included: m̂ ← βm̂ + (1 − β)(x_k − x_{k+1})/η, so it carries the
// neighbours' directions too, which is what non-iid shards need.
enum class MomentumForm { kLocal, kQuasiGlobal };

// How DiLoCo averages its pseudo-gradients: an all-reduce over every peer (the paper's),
// a server on peer 0, or one gossip round with the topology's W (each peer then keeps its
// own outer state).
enum class OuterExchange { kAllreduce, kPs, kGossip };
std::string_view to_string(OuterExchange exchange);
OuterExchange parse_outer_exchange(std::string_view name);  // throws Error naming the choices

// DiLoCo (Douillard et al. 2023) and Streaming DiLoCo (Douillard et al. 2025): every peer
// takes H steps of its own optimizer, then the pseudo-gradients Δ = θ_outer − θ_local are
// averaged and an outer optimizer (Nesterov SGD) applies the average to θ_outer. With F
// fragments each range of layers is synchronised every H steps, one fragment about every H/F
// steps; an exchange overlaps the next τ inner steps and lands mixed: θ_local ← α·θ_local
// + (1 − α)·θ_outer (with τ = 0 it replaces θ_local).
struct OuterConfig {
  int inner_steps = 50;  // H
  float lr = 0.7f;
  float momentum = 0.9f;
  bool nesterov = true;
  OuterExchange exchange = OuterExchange::kAllreduce;
  int fragments = 1;                                         // F
  int overlap = 0;                                           // τ
  float mix = 0.5f;                                          // α
  algo::QuantFormat compression = algo::QuantFormat::kNone;  // the pseudo-gradient on the wire, with error feedback
  double sparse = 0;  // SparseLoCo: the fraction of each chunk kept (0: dense), with error feedback
};

// Epidemic Learning's graph each round (de Vos et al. 2023): local, every peer sends to s
// peers of its own drawing (in-degrees vary); oracle, an s-regular digraph (every peer
// hears from s). Both are drawn from the run's seed and the step (topology/digraph.h).
enum class EpidemicVariant { kLocal, kOracle };

enum class Partition { kIid, kDirichlet };

enum class ModelKind { kMlp, kGpt, kVit };
std::string_view to_string(ModelKind model);
ModelKind parse_model(std::string_view name);  // throws Error naming the choices

struct TrainConfig {
  Algorithm algorithm = Algorithm::kDpsgd;
  ModelKind model = ModelKind::kMlp;
  std::vector<int> hidden = {512, 512};  // mlp
  model::TransformerConfig transformer;  // gpt and vit (kind set from model)
  parallel::EngineConfig engine;         // gpt and vit: the workers inside the peer (--sp, --pp, …)
  model::Device device = model::Device::kCpu;  // gpt: where the gradient is computed (--device)
  model::GemmMode gemm = model::GemmMode::kTf32;  // --device cuda: GEMM precision
  std::string text_dir = kFortunesDir;   // gpt
  TokenizerKind tokenizer = TokenizerKind::kBytes;  // gpt: bytes, or sentencepiece BPE of transformer.vocab pieces
  int eval_windows = 256;                // gpt: validation windows of seq bytes
  int epochs = 5;
  long long max_steps = 0;  // 0: no cap beyond the epochs
  int batch = 32;           // per peer
  OptimizerKind optimizer = OptimizerKind::kSgd;
  LrSchedule lr_schedule = LrSchedule::kConstant;
  long long warmup_steps = 0;
  SgdConfig sgd;
  AdamConfig adam;
  std::uint64_t seed = 1;
  long long eval_every = 0;  // steps between evaluations; 0: once per epoch
  Partition partition = Partition::kIid;
  double alpha = 0.5;  // Dirichlet concentration
  std::string data_dir = kFashionMnistDir;
  double peer_timeout_s = 60;
  double connect_timeout_s = 60;
  std::string out_dir;     // where the coordinator writes metrics.csv and summary.json; empty: nowhere
  std::uint64_t run_id = 0;  // 0: derived from the configuration and the topology
  bool progress = false;   // the coordinator prints "@progress {json}" lines for `launch`
  int threads =
      1;  // per peer: the mlp's Eigen threads; a transformer's batch split (model::make_batch_parallel_engine)
  bool stop_on_split = false;  // D-PSGD: stop when lost peers split the graph (else each piece goes on)
  std::string secret_file;     // shared key: only peers holding it may join or send frames
  bool shared_memory = true;   // payloads to peers on this host through shared memory (net/tcp.h)
  long long checkpoint_every = 0;  // steps between checkpoints; 0: none
  std::string checkpoint_dir;      // where every peer writes its checkpoint files
  bool resume = false;             // start from the latest complete set in checkpoint_dir
  int max_staleness = 0;  // D-PSGD: mix neighbours' parameters up to this many steps old (0: synchronous)
  bool rejoin = false;    // this process restarts a peer the others dropped: it comes back into the run
  bool mixing_trace = false;  // D-PSGD: write the applied mixing row whenever it changes (out_dir)
  UpdateForm update = UpdateForm::kCta;                             // dpsgd, choco: --update
  MomentumForm momentum_form = MomentumForm::kLocal;                // dpsgd: --momentum-form
  algo::Compression compression;                                    // choco: --compression
  double gossip_step = 0;                                           // choco: γ; 0: the compressor's default
  algo::AllreduceAlgo allreduce_algo = algo::AllreduceAlgo::kRing;  // allreduce: --allreduce-algo
  double time_budget_s = 0;  // adpsgd: end the run after this long (0: at the sample budget of --epochs)
  OuterConfig outer;         // diloco
  int fanout = 0;            // el: s, the peers each sends to per round; 0: ⌈log₂ n⌉
  EpidemicVariant el_variant = EpidemicVariant::kLocal;  // el: --el-variant
  double choco_gamma() const { return gossip_step > 0 ? gossip_step : compression.default_gossip_step(); }
};

// Throws Error(kInvalidArgument) naming the topology when the algorithm cannot use it: a
// directed topology needs push-sum (sgp) or an algorithm that does not mix with W.
void check_algorithm_topology(const TrainConfig& config, const topology::Topology& topology);

// Whether this run's peers all-reduce: --algorithm allreduce, or DiLoCo's all-reduce
// (each peer then links to its --allreduce-algo partners).
bool all_reduces(const TrainConfig& config);

// Whether the run goes on without a lost peer: the gossiping algorithms, and DiLoCo over
// gossip, the all-reduce or the all-gather (its survivors regroup); the others stop.
bool survives_lost_peers(const TrainConfig& config);

// Whether DiLoCo's outer average is SparseLoCo's all-gather: every peer then sends to every other.
bool outer_all_gather(const TrainConfig& config);

// Whether this run's peers gossip (gossips(algorithm), or DiLoCo over gossip): such a run
// survives a lost peer.
bool gossips(const TrainConfig& config);

// The run id peers exchange in the handshake: a hash of everything that must agree.
std::uint64_t derive_run_id(const TrainConfig& config, const topology::Topology& topology);

// Makes the transport of peer `rank`, linked to `links`, in place of TCP: a simulated
// cluster (sim/cluster.h) runs every peer in one process over its own network.
using TransportFactory = std::function<std::unique_ptr<net::Transport>(int rank, const std::vector<int>& links)>;

// Where the coordinator's progress lines go (kind "progress" or "eval", and one JSON
// object): by default stdout as "@progress {json}" and "@eval {json}", which `launch` reads
// from each peer process; a simulated cluster, whose peers share one process, renders them
// itself. Set before any peer starts.
using ProgressSink = std::function<void(std::string_view kind, const std::string& json)>;
void set_progress_sink(ProgressSink sink);
void emit_progress(std::string_view kind, const std::string& json);

// Trains peer `rank` to the end, over TCP, or over `transport`'s links when given. Throws
// Error (naming the peer and step) when it fails.
void run_peer(const topology::Topology& topology, int rank, const TrainConfig& config,
              const TransportFactory& transport = {});

}  // namespace peertrain::train
