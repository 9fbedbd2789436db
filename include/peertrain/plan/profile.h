// Profiles for the step-time simulator (plan/simulator.h): what one worker's passes cost on
// this machine, measured once per shape and kept in a cache file keyed by the machine and
// the build.
//
// A unit's cost is measured as the engine runs it: sp × tp threads with real groups (ring
// attention over the sequence ranks, the blocks' all-reduces over the tensor ranks), one
// thread each (or, for a peer's only worker, OpenMP over every core), four micro-batches'
// forwards and then their backwards (so a backward finds its activations out of the
// caches, as in a pipeline), every pass started on all workers at once and timed by the
// wall clock: the mesh alone on the machine, its collectives' waits included. The median
// over a few repetitions; a pass of the pipeline is the sum of its units'. The blocks of
// a model are alike, so one is measured for all.
// Alongside: the bytes each unit keeps for its backward (activations, and the B pass's
// stash), the machine's memory-copy rate and the cost of an in-peer message, and a step's
// fixed overhead (threads, groups) per worker count.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "peertrain/model/transformer.h"
#include "peertrain/parallel/pipeline.h"
#include "peertrain/parallel/ring_attention.h"

namespace peertrain::plan {

// The median of repeated timings (the upper one of an even count; 0 for none): what every
// measurement of the planner reports.
double median(std::vector<double> values);

// kVocabOutput: vocabulary parallelism's output layer on one stage (vocab_parallel.h): its
// shard's S pass (logits, statistics; vocab-1 also the input gradient) as forward_s and its
// T pass (the shard's weight gradient; vocab-2 also the input gradient) as backward_s, the
// barriers' communication left out (the simulator adds it); activation_bytes, what S
// keeps for T.
enum class UnitKind { kEmbedding, kBlock, kHead, kVocabOutput };

// One unit's passes on one worker of a stage mesh, for one micro-batch.
struct UnitCost {
  // Wall time, the mesh alone on the machine (its collectives' waits included).
  double forward_s = 0, backward_s = 0;                // the fused backward
  double backward_input_s = 0, backward_weight_s = 0;  // split (zero-bubble schedules)
  // Of that, one worker's CPU time: the rest is waiting, which leaves the cores to others.
  double forward_cpu_s = 0, backward_cpu_s = 0, backward_input_cpu_s = 0, backward_weight_cpu_s = 0;
  double activation_bytes = 0;  // kept from forward to backward
  double stash_bytes = 0;       // kept from B to W
};

// The model's part of a cache key: its kind, width, heads, tokens, vocabulary or classes,
// tied head and MLP ratio (not its depth: a unit is one layer's).
std::string model_key(const model::TransformerConfig& config);

// What a unit's cost depends on.
struct UnitShape {
  UnitKind unit = UnitKind::kBlock;
  int microbatch = 1;  // sequences
  int sp = 1, tp = 1;
  parallel::SequenceSplit split = parallel::SequenceSplit::kZigzag;
  // The peer's only worker: its GEMMs fan out over every core (the engine leaves OpenMP
  // alone then), timed by the wall clock. Otherwise every worker is one thread.
  bool solo = false;
  // Vocabulary parallelism: 0 none, 1 vocab-1, 2 vocab-2. The embedding and head units are
  // measured without the vocabulary when it is not 0 (the stages share it; the simulator
  // asks with 1 for either mode), and kVocabOutput's shard holds vocab / vocab_ranks rows.
  int vocab_parallel = 0;
  int vocab_ranks = 1;
  std::string key(const model::TransformerConfig& config) const;
};

// What an oversubscribed peer's pass costs beyond its profile. pass_s: CPU seconds (at full
// speed, so shared out among the runnable threads like the pass's own work) of the hand-off
// that starts a forward or backward pass: the switch to the woken thread and the caches it
// refills. sync_s: seconds every rank of a mesh with more ranks than cores waits for a core
// at each ring step or all-reduce inside a pass.
struct Contention {
  double pass_s = 0;  // per forward or backward pass, CPU work
  double sync_s = 0;  // per ring step or all-reduce inside a pass
};

// Measured once per cache: the machine's communication inside a peer.
struct MachineCosts {
  int cores = 1;
  double copy_bytes_per_s = 0;            // one thread's memcpy rate on buffers larger than the caches
  double message_s = 0;                   // one point-to-point message between two threads, empty
  std::map<int, double> step_overhead_s;  // per worker count: a pipeline step beyond its passes
  // A pass's own cost in the engine beyond its units: receiving, sending, waking the thread
  // that waits for it. Measured as a pipeline of passes that compute next to nothing.
  double pass_overhead_s = 0;
  // Per count n of threads computing at once (1 … 2 · cores): how much more CPU time each
  // takes for the same work than alone (shared caches and memory bandwidth; beyond the
  // cores, time-sharing one, each evicting the other's working set).
  std::vector<double> slowdown;
  double slowdown_at(int threads) const;
  // Per worker count above the cores and calibration model (contention_key): what
  // oversubscribed threads lose to the scheduler at each hand-off, which the profiles, taken
  // with a mesh alone and its threads started together, do not show (simulator.h's
  // contention_costs).
  std::map<std::string, Contention> contention;
  // Per thread count P: what one barrier of P threads that compute between barriers costs
  // beyond their work (vocabulary parallelism's S and T passes end in one). Small while P
  // fits the cores; a scheduler's wake-up or more once it does not.
  std::map<int, double> barrier_s;
};

// The median time of a real engine step of this strategy (random tokens or images, after
// one warm-up step): what a calibration compares the simulator with, and what plan
// --measure times its best candidates by.
double measure_engine_step_s(const model::TransformerConfig& config, const parallel::EngineConfig& engine, int batch,
                             int steps);

class Profiler {
 public:
  // cache_path: the cache, a text file (empty: no cache, measure every time). The file holds
  // entries of this machine and build only; another's are dropped on save.
  // The rounds over the unit shapes a search measures (plan --profile-rounds).
  static constexpr int kDefaultRounds = 7;

  explicit Profiler(std::string cache_path = default_cache_path(), int repetitions = kDefaultRounds);

  const UnitCost& unit(const model::TransformerConfig& config, const UnitShape& shape);
  const MachineCosts& machine();
  double step_overhead_s(int workers);
  // The calibrated contention under contention_key's key (null when not measured yet);
  // set_contention keeps a measured one (the cache saves it).
  const Contention* contention(const std::string& key) const;
  double barrier_s(int threads);  // measured once per thread count (MachineCosts::barrier_s)
  void set_contention(const std::string& key, Contention costs);

  // Figures from elsewhere (tests; another machine's measurements), used instead of measuring.
  void set_unit(const model::TransformerConfig& config, const UnitShape& shape, const UnitCost& cost);
  void set_machine(const MachineCosts& machine);

  // Deferring (on between defer_units(true) and (false)): unit() notes each shape the cache
  // lacks and answers a stand-in cost instead of measuring it. measure_deferred() then
  // measures every noted shape in `repetitions` rounds, one repetition of each a round, in
  // an order rotated every round, and keeps each figure's median over the rounds. Measured
  // one after another instead, each shape's repetitions fall in one spell of the machine's
  // speed; on a shared host whose speed moves by 20 % within seconds, strategies built of
  // different shapes then compare one spell with another (docs/plan.md). A search run
  // once deferring, to learn the shapes it needs, then again on the measured figures,
  // compares them all at the machine's typical speed.
  void defer_units(bool on) { deferring_ = on; }
  // The number measured. each_round (may be empty): called before each round, also when
  // nothing was deferred — for progress, or for measurements of one's own that should see
  // the same spells of the machine as the units (the contention calibration's steps).
  using EachRound = std::function<void(int round, int rounds, int shapes)>;
  int measure_deferred(const EachRound& each_round = {});
  // Both steps: `learn` runs deferring (a search on stand-ins, to note the shapes it needs),
  // then every noted shape is measured (measure_deferred). Deferring is the caller's again
  // afterwards, also when `learn` or a measurement throws.
  int profile_together(const std::function<void()>& learn, const EachRound& each_round = {});

  int measured() const { return measured_; }  // entries measured (not found in the cache) so far
  void save() const;                          // writes the cache (no-op without a path)

  // $XDG_CACHE_HOME/peertrain/profile.tsv, or ~/.cache/…; "" when neither is set.
  static std::string default_cache_path();
  // What the cached figures belong to: host, CPU model, cores, compiler, build flags and
  // the binary itself (its size and write time: a rebuilt binary measures again).
  static std::string machine_key();

 private:
  std::string path_;
  int repetitions_;
  int measured_ = 0;
  bool deferring_ = false;
  std::vector<std::pair<model::TransformerConfig, UnitShape>> deferred_;  // noted while deferring, each once
  std::map<std::string, bool> deferred_keys_;
  UnitCost stand_in_;  // what a deferred shape answers meanwhile
  std::map<std::string, UnitCost> units_;
  // The same entries by their numbers, which the simulator asks for many times a search:
  // cheaper than spelling the key.
  std::map<std::array<int, 15>, const UnitCost*> by_numbers_;
  MachineCosts machine_;
  bool machine_known_ = false;
  void load();
  const UnitCost& unit_by_key(const model::TransformerConfig& config, const UnitShape& shape);
};

}  // namespace peertrain::plan
