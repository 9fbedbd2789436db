// The passes of one pipeline worker: forward, backward (or B), W, and the messages between
// chunks; see pipeline_worker.h.
#include "pipeline_worker.h"

#include <time.h>

#include <Eigen/Core>
#include <algorithm>
#include <numeric>

#include "peertrain/model/transformer_layout.h"

namespace peertrain::parallel {
namespace pipeline_detail {

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::vector<int> rank_positions(int tokens, int sp, int rank, SequenceSplit split) {
  if (sp == 1) {
    std::vector<int> all(tokens);
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
  return sequence_positions(tokens, sp, rank, split);
}

void build_microbatches(const model::Transformer& model, const GlobalBatch& global, int microbatches,
                        RankBatches& rank) {
  const auto& c = model.config();
  const bool gpt = c.kind == model::TransformerKind::kGpt;
  std::vector<int> every(static_cast<std::size_t>(c.tokens()));
  std::iota(every.begin(), every.end(), 0);
  const model::TokenBatch whole{.batch = global.batch,
                                .tokens = c.tokens(),
                                .positions = every,
                                .bytes = global.bytes,
                                .pixels = global.pixels,
                                .targets = gpt ? global.targets : global.labels,
                                .loss_divisor = gpt ? static_cast<double>(global.batch) * c.seq : global.batch};
  const bool all_tokens = rank.positions.size() == every.size();
  const int per = global.batch / microbatches;
  rank.slices.resize(static_cast<std::size_t>(microbatches));
  for (int i = 0; i < microbatches; ++i)
    model::slice_batch(c, whole, i * per, per,
                       all_tokens ? std::span<const int>() : std::span<const int>(rank.positions),
                       rank.slices[static_cast<std::size_t>(i)]);
}

std::vector<model::ParameterRange> touched_ranges(const model::Transformer& model,
                                                  const std::vector<std::pair<int, int>>& unit_runs,
                                                  const VocabShard* shard) {
  const auto& c = model.config();
  const auto& at = model.layout();
  const auto d = static_cast<std::size_t>(c.d_model);
  std::vector<model::ParameterRange> ranges;
  for (auto [first_unit, end_unit] : unit_runs)
    for (int u = first_unit; u < end_unit; ++u) {
      if (shard && u == 0)
        ranges.push_back({at.wpe, d * c.seq});
      else if (shard && u + 1 == model.num_units())
        ranges.push_back({at.lnf_w, 2 * d});
      else
        ranges.push_back(model.unit_parameters(u));
      if (!shard && c.tied_head && u + 1 == model.num_units()) ranges.push_back(model.unit_parameters(0));
    }
  if (shard) {
    ranges.push_back({at.wte + shard->first * d, shard->count * d});
    if (!c.tied_head)
      for (std::size_t j = 0; j < d; ++j)
        ranges.push_back({at.head_w + j * c.vocab + shard->first, static_cast<std::size_t>(shard->count)});
  }
  std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  std::vector<model::ParameterRange> merged;
  for (const auto& r : ranges) {
    if (r.size == 0) continue;
    if (!merged.empty() && merged.back().offset + merged.back().size >= r.offset)
      merged.back().size = std::max(merged.back().size, r.offset + r.size - merged.back().offset);
    else
      merged.push_back(r);
  }
  return merged;
}

}  // namespace pipeline_detail

bool PipelineEngine::Worker::prepare(StepShared& step, model::Transformer& engine_model) {
  const EngineConfig& config = step.config;
  const int P = config.pp, M = config.microbatches, V = step.shape.virtual_stages();
  const int v = step.shape.chunks();
  const bool pipedream = step.shape.schedule == Schedule::kPipeDream;
  try {
    model = &engine_model;
    if (static_cast<int>(chunks.size()) != v) chunks.assign(static_cast<std::size_t>(v), {});
    std::vector<std::pair<int, int>> runs;
    for (int c = 0; c < v; ++c) {
      Chunk& chunk = chunks[static_cast<std::size_t>(c)];
      const int k = step.shape.virtual_stage(stage, c);
      const int first = step.first_units[static_cast<std::size_t>(k)];
      const int end = k + 1 < V ? step.first_units[static_cast<std::size_t>(k) + 1] : step.units;
      const bool same_split = chunk.first_unit == first && chunk.end_unit == end;
      PEERTRAIN_CHECK(same_split || !step.carrying, where(), ": the split changed with micro-batches in flight");
      if (!same_split) chunk.slots.clear();
      chunk.virtual_stage = k;
      chunk.first_unit = first;
      chunk.end_unit = end;
      // PipeDream's micro-batches in flight since the last step keep their slots.
      if (step.carrying)
        chunk.carried_slot_of = chunk.slot_of;
      else
        chunk.carried_slot_of.assign(static_cast<std::size_t>(M), -1);
      chunk.free_slots.clear();
      for (int slot = 0; slot < static_cast<int>(chunk.slots.size()); ++slot)
        if (std::find(chunk.carried_slot_of.begin(), chunk.carried_slot_of.end(), slot) == chunk.carried_slot_of.end())
          chunk.free_slots.push_back(slot);
      chunk.slot_of.assign(static_cast<std::size_t>(M), -1);
      runs.emplace_back(first, end);
    }
    if (step.carrying) {  // the last step's micro-batches stay for the carried backwards
      std::swap(data, data_last);
      data.positions = data_last.positions;
    }
    build_microbatches(*model, step.batch, M, data);
    ops = step.schedule[static_cast<std::size_t>(stage)];
    shard.reset();
    if (config.vocab_parallel != VocabParallel::kNone) shard = vocab_shard(model->config().vocab, P, stage);
    ranges = touched_ranges(*model, runs, shard ? &*shard : nullptr);
    replicated_ranges.clear();
    if (tp_rank > 0) {  // the embedding and the head, whole on every tensor rank
      std::vector<std::pair<int, int>> whole;
      for (auto [first, end] : runs) {
        if (first == 0) whole.emplace_back(0, 1);
        if (end == step.units) whole.emplace_back(step.units - 1, step.units);
      }
      replicated_ranges = touched_ranges(*model, whole);
    }
    grads.resize(model->num_parameters());
    for (const auto& r : ranges) std::fill_n(grads.begin() + r.offset, r.size, 0.0f);
    const std::size_t floats =
        static_cast<std::size_t>(model->config().d_model) * data[0].batch * data.positions.size();
    received.resize(floats);
    scratch[0].resize(floats);
    scratch[1].resize(floats);
    local.clear();
    if (shard) {
      for (auto* buffers : {&token_vectors, &outputs, &output_grads, &token_grads}) {
        buffers->resize(static_cast<std::size_t>(M));
        for (auto& b : *buffers) b.resize(floats);
      }
      output_states.resize(static_cast<std::size_t>(M));
    }
    output_live.assign(static_cast<std::size_t>(M), 0);
    outputs_held = peak_outputs_held = 0;
    pass_cpu_s.assign(kPassKinds * static_cast<std::size_t>(v) * M, 0.0);
    stashed.clear();
    if (pipedream) {
      // Weight stashing: this step's weights kept for its micro-batches still in flight at
      // its end; the last step's for those carried into this one.
      if (step.carrying) {
        std::swap(weights, weights_last);
        weights_last_version = weights_version;
      }
      weights.resize(model->num_parameters());
      for (const auto& r : ranges) std::copy_n(step.params.begin() + r.offset, r.size, weights.begin() + r.offset);
      weights_version = step.version;
      carried_gradient.resize(floats);
    }
    loss = 0;
    busy_s = busy_cpu_s = wait_s = reduce_s = 0;
    peak_bytes = 0;
    in_flight = 0;
    for (const Chunk& c : chunks)
      in_flight += static_cast<int>(
          std::count_if(c.carried_slot_of.begin(), c.carried_slot_of.end(), [](int slot) { return slot >= 0; }));
    peak_in_flight = in_flight;
    const auto p = static_cast<std::size_t>(stage);
    stage_group = mesh.workers() > 1 ? &step.stage_groups[p]->member(mesh_index) : nullptr;
    sequence_group = mesh.sp > 1 ? &step.sequence_groups[p][static_cast<std::size_t>(tp_rank)]->member(rank) : nullptr;
    tensor_group = mesh.tp > 1 ? &step.tensor_groups[p][static_cast<std::size_t>(rank)]->member(tp_rank) : nullptr;
    fabric = step.fabric ? &step.fabric->member(index) : nullptr;
    pipe =
        step.pipeline_groups.empty() ? nullptr : &step.pipeline_groups[static_cast<std::size_t>(rank)]->member(stage);
    if (sequence_group) ring.emplace(*sequence_group, config.ring, config.timeout_s);
    context = {};
    context.attention = ring ? &*ring : nullptr;
    context.sequence_group = sequence_group;
    context.tensor_group = tensor_group;
    context.timeout_s = config.timeout_s;
    context.vocabulary_outside = shard.has_value();
    return true;
  } catch (...) {
    step.failure.record(std::current_exception(), where());
    return false;
  }
}

// The fabric as the resharding exchange sees it: posted pieces go out in parcels of the
// outbox, taken ones count as waiting; both through the emulated links when there are.
struct PipelineEngine::Worker::FabricLink final : ExchangeLink {
  Worker& w;
  StepShared& step;
  int tag;
  FabricLink(Worker& w, StepShared& step, int tag) : w(w), step(step), tag(tag) {}
  void post(int to, std::span<const float> data) override {
    Parcel& parcel = w.free_parcel(data.size());
    std::copy(data.begin(), data.end(), parcel.data.begin());
    if (step.links) step.links->posted(w.index, to, tag, data.size() * sizeof(float));
    parcel.request = w.fabric->isend(to, tag, parcel.data);
  }
  void take(int from, std::span<float> into) override {
    w.waiting([&] {
      w.fabric->recv(from, tag, into, step.config.timeout_s);
      if (step.links) step.links->taken(from, w.index, tag);
    });
  }
};

void PipelineEngine::Worker::receive(StepShared& step, int k, int tag, AlignedVector<float>& into) {
  const int from = step.shape.stage_of(k);
  if (from == stage) {
    auto it = local.find(tag);
    PEERTRAIN_CHECK(it != local.end(), where(), ": message ", tag, " from its own chunk has not been sent");
    into.swap(it->second);
    local.erase(it);
    return;
  }
  FabricLink link(*this, step, tag);
  exchange_receive(step.boundaries.at(from, stage), mesh_index, into, link);
}

void PipelineEngine::Worker::send(StepShared& step, int k, int tag, Parcel& parcel) {
  const int to = step.shape.stage_of(k);
  if (to == stage) {
    local[tag] = parcel.data;  // a copy: the parcel goes back to the outbox
    return;
  }
  // The slices go out in parcels of their own. This one (not posted, so free) may be one
  // of them: its data is moved out first.
  const AlignedVector<float> tile = std::move(parcel.data);
  FabricLink link(*this, step, tag);
  exchange_send(step.boundaries.at(stage, to), mesh_index, tile, link);
}

std::size_t PipelineEngine::Worker::held_bytes() const {
  std::size_t bytes = 0;
  for (const Chunk& chunk : chunks)
    for (const auto* of : {&chunk.slot_of, &chunk.carried_slot_of})
      for (int held : *of)
        if (held >= 0)
          for (const auto& saved : chunk.slots[static_cast<std::size_t>(held)]) bytes += saved.activation_bytes();
  for (std::size_t i = 0; i < output_live.size(); ++i)
    if (output_live[i]) bytes += output_states[i].bytes();
  return bytes;
}

void PipelineEngine::Worker::forward(StepShared& step, const PipelineOp& op) {
  const int V = step.shape.virtual_stages(), M = step.config.microbatches, i = op.microbatch;
  Chunk& chunk = chunks[static_cast<std::size_t>(op.chunk)];
  const int k = chunk.virtual_stage;
  if (k > 0) receive(step, k - 1, forward_tag(k, i, M), received);
  float* tokens = nullptr;  // vocabulary parallelism: the looked-up token vectors, summed here
  if (k == 0 && shard) {
    tokens = token_vectors[static_cast<std::size_t>(i)].data();
    for (int from = 1; from < step.config.pp; ++from) {
      waiting([&] { pipe->recv(from, token_tag(i, M, V), received, step.config.timeout_s); });
      busy(op, M, [&] {
        Eigen::Map<Eigen::ArrayXf>(tokens, static_cast<Eigen::Index>(received.size())) +=
            Eigen::Map<const Eigen::ArrayXf>(received.data(), static_cast<Eigen::Index>(received.size()));
      });
    }
  }
  if (chunk.free_slots.empty()) {
    chunk.slots.emplace_back(chunk.units());
    chunk.free_slots.push_back(static_cast<int>(chunk.slots.size()) - 1);
  }
  const int slot = chunk.free_slots.back();
  chunk.free_slots.pop_back();
  chunk.slot_of[static_cast<std::size_t>(i)] = slot;
  if (chunk.slot_version.size() < chunk.slots.size()) chunk.slot_version.resize(chunk.slots.size());
  chunk.slot_version[static_cast<std::size_t>(slot)] = step.version;
  Parcel* parcel = k + 1 < V ? &free_parcel(received.size()) : nullptr;
  busy(op, M, [&] {
    // Units chain through two scratch buffers; the first reads what arrived, the last
    // writes straight into the outgoing parcel.
    for (int j = 0; j < chunk.units(); ++j) {
      const int unit = chunk.first_unit + j;
      const bool head = unit + 1 == step.units;
      const float* in = unit == 0 ? tokens : j == 0 ? received.data() : scratch[(j - 1) % 2].data();
      float* out = head                     ? (shard ? outputs[static_cast<std::size_t>(i)].data() : nullptr)
                   : j + 1 == chunk.units() ? parcel->data.data()
                                            : scratch[j % 2].data();
      const float unit_loss =
          model->forward(unit, step.params, data[i], in, out, chunk.slots[static_cast<std::size_t>(slot)][j], context);
      if (head) loss += unit_loss;
    }
  });
  if (parcel) send(step, k + 1, forward_tag(k + 1, i, M), *parcel);
  if (shard && k + 1 == V) send_to_all(step, output_tag(i, M, V), outputs[static_cast<std::size_t>(i)]);
  // What the stage now holds for the backward passes still to come.
  ++in_flight;
  peak_bytes = std::max(peak_bytes, held_bytes());
  peak_in_flight = std::max(peak_in_flight, in_flight);
}

void PipelineEngine::Worker::backward(StepShared& step, const PipelineOp& op) {
  const int V = step.shape.virtual_stages(), M = step.config.microbatches, i = op.microbatch;
  if (op.carried && !step.carrying) return;  // PipeDream's first step: nothing in flight yet
  Chunk& chunk = chunks[static_cast<std::size_t>(op.chunk)];
  const int k = chunk.virtual_stage;
  // A carried backward (PipeDream) runs on the last step's micro-batch and weights; the
  // gradient of the first of them came at the end of the last step.
  const model::TokenBatch& batch = op.carried ? data_last[i] : data[i];
  const std::span<const float> params = op.carried ? std::span<const float>(weights_last) : step.params;
  const bool from_last_step = op.carried && i == M - (step.config.pp - stage - 1);
  if (!from_last_step && k + 1 < V) receive(step, k + 1, backward_tag(k, i, M), received);
  // After the receive, which may swap buffers.
  const float* incoming = from_last_step ? carried_gradient.data() : received.data();
  const int slot = (op.carried ? chunk.carried_slot_of : chunk.slot_of)[static_cast<std::size_t>(i)];
  PEERTRAIN_CHECK(slot >= 0, "backward of micro-batch ", i, " before its forward on stage ", stage);
  if (step.shape.schedule == Schedule::kPipeDream)
    stashed.push_back({stage, i, op.carried, chunk.slot_version[static_cast<std::size_t>(slot)],
                       op.carried ? weights_last_version : step.version});
  Parcel* parcel = k > 0 ? &free_parcel(received.size()) : nullptr;
  busy(op, M, [&] {
    for (int j = chunk.units() - 1; j >= 0; --j) {
      const int unit = chunk.first_unit + j;
      const float* dout = unit + 1 == step.units ? (shard ? output_grads[static_cast<std::size_t>(i)].data() : nullptr)
                          : j + 1 == chunk.units() ? incoming
                                                   : scratch[(j + 1) % 2].data();
      if (unit == 0 && shard) {  // the token vectors' gradient, for every stage's rows
        auto& to = token_grads[static_cast<std::size_t>(i)];
        std::copy_n(dout, to.size(), to.data());
      }
      float* din = unit == 0 ? nullptr : j == 0 ? parcel->data.data() : scratch[j % 2].data();
      auto& saved = chunk.slots[static_cast<std::size_t>(slot)][j];
      if (step.split_backward)
        model->backward_input(unit, params, batch, dout, din, saved, context);
      else
        model->backward(unit, params, batch, dout, din, saved, grads, context);
    }
  });
  if (parcel) send(step, k - 1, backward_tag(k - 1, i, M), *parcel);
  if (k == 0 && shard) send_to_all(step, token_grad_tag(i, M, V), token_grads[static_cast<std::size_t>(i)]);
  if (step.split_backward)
    peak_bytes = std::max(peak_bytes, held_bytes());  // B added what W needs
  else
    release(chunk, i, op.carried);
}

void PipelineEngine::Worker::weight(StepShared& step, const PipelineOp& op) {
  Chunk& chunk = chunks[static_cast<std::size_t>(op.chunk)];
  const int i = op.microbatch;
  const int slot = chunk.slot_of[static_cast<std::size_t>(i)];
  PEERTRAIN_CHECK(slot >= 0, "W pass of micro-batch ", i, " before its forward on stage ", stage);
  busy(op, step.config.microbatches, [&] {
    for (int j = chunk.units() - 1; j >= 0; --j)
      model->backward_weight(chunk.first_unit + j, step.params, data[i], chunk.slots[static_cast<std::size_t>(slot)][j],
                             grads, context);
  });
  release(chunk, i);
}

void PipelineEngine::Worker::send_to_all(StepShared& step, int tag, const AlignedVector<float>& data) {
  for (int to = 0; to < step.config.pp; ++to) {
    if (to == stage) continue;
    Parcel& parcel = free_parcel(data.size());
    std::copy(data.begin(), data.end(), parcel.data.begin());
    parcel.request = pipe->isend(to, tag, parcel.data);
  }
}

void PipelineEngine::Worker::look_up_tokens(StepShared& step) {
  const int M = step.config.microbatches, V = step.shape.virtual_stages(), d = model->config().d_model;
  const float* wte = step.params.data() + model->layout().wte;
  for (int i = 0; i < M; ++i) {
    // Stage 0 keeps its share to sum the others' into; the others send theirs there.
    Parcel* parcel = stage == 0 ? nullptr : &free_parcel(received.size());
    float* out = parcel ? parcel->data.data() : token_vectors[static_cast<std::size_t>(i)].data();
    busy(ops.front(), M, [&] { vocab_embedding_forward(*shard, d, data[i].bytes, wte, out); });
    if (parcel) parcel->request = pipe->isend(0, token_tag(i, M, V), parcel->data);
  }
}

void PipelineEngine::Worker::output_s(StepShared& step, const PipelineOp& op) {
  const int M = step.config.microbatches, V = step.shape.virtual_stages(), i = op.microbatch;
  const int head = step.shape.stage_of(V - 1);
  const auto& c = model->config();
  const model::TokenBatch& batch = data[i];
  const float* y = outputs[static_cast<std::size_t>(i)].data();
  if (stage != head) {
    waiting([&] { pipe->recv(head, output_tag(i, M, V), received, step.config.timeout_s); });
    y = received.data();
  }
  // Vocab-1 has dy after S; only the head stage's feeds a backward, the others' (the same)
  // is dropped.
  float* dy = step.config.vocab_parallel != VocabParallel::kVocab1 ? nullptr
              : stage == head                                      ? output_grads[static_cast<std::size_t>(i)].data()
                                                                   : scratch[0].data();
  const std::size_t w = c.tied_head ? model->layout().wte : model->layout().head_w;
  auto& state = output_states[static_cast<std::size_t>(i)];
  busy(op, M, [&] {
    const double loss_sum =
        vocab_output_forward(*pipe, step.config.vocab_parallel, *shard, c.vocab, c.d_model, c.tied_head,
                             step.params.data() + w, y, batch.batch * batch.tokens, batch.targets,
                             static_cast<float>(1.0 / batch.loss_divisor), state, dy, nullptr, step.config.timeout_s);
    if (stage == head) loss += static_cast<float>(loss_sum / batch.loss_divisor);
  });
  output_live[static_cast<std::size_t>(i)] = 1;
  peak_outputs_held = std::max(peak_outputs_held, ++outputs_held);
  peak_bytes = std::max(peak_bytes, held_bytes());
}

void PipelineEngine::Worker::output_t(StepShared& step, const PipelineOp& op) {
  const int M = step.config.microbatches, V = step.shape.virtual_stages(), i = op.microbatch;
  const auto& c = model->config();
  PEERTRAIN_CHECK(output_live[static_cast<std::size_t>(i)], where(), ": T pass of micro-batch ", i, " before its S");
  // Vocab-2's dy comes here; only the head stage's feeds a backward.
  float* dy = step.config.vocab_parallel != VocabParallel::kVocab2 ? nullptr
              : stage == step.shape.stage_of(V - 1)                ? output_grads[static_cast<std::size_t>(i)].data()
                                                                   : scratch[0].data();
  const std::size_t w = c.tied_head ? model->layout().wte : model->layout().head_w;
  busy(op, M, [&] {
    vocab_output_backward(*pipe, step.config.vocab_parallel, *shard, c.vocab, c.d_model, c.tied_head,
                          step.params.data() + w, data[i].targets, static_cast<float>(1.0 / data[i].loss_divisor),
                          output_states[static_cast<std::size_t>(i)], dy, grads.data() + w, step.config.timeout_s);
  });
  output_live[static_cast<std::size_t>(i)] = 0;
  --outputs_held;
}

void PipelineEngine::Worker::add_token_gradients(StepShared& step) {
  const int M = step.config.microbatches, V = step.shape.virtual_stages(), d = model->config().d_model;
  float* dwte = grads.data() + model->layout().wte;
  for (int i = 0; i < M; ++i) {
    const float* dout = token_grads[static_cast<std::size_t>(i)].data();
    if (stage != 0) {
      waiting([&] { pipe->recv(0, token_grad_tag(i, M, V), received, step.config.timeout_s); });
      dout = received.data();
    }
    busy(ops.back(), M, [&] { vocab_embedding_backward(*shard, d, data[i].bytes, dout, dwte); });
  }
}

void PipelineEngine::Worker::release(Chunk& chunk, int i, bool carried) {
  auto& slot_of = carried ? chunk.carried_slot_of : chunk.slot_of;
  chunk.free_slots.push_back(slot_of[static_cast<std::size_t>(i)]);
  slot_of[static_cast<std::size_t>(i)] = -1;
  --in_flight;
}

void PipelineEngine::Worker::run(StepShared& step) {
  const double timeout_s = step.config.timeout_s;
  try {
    if (shard) look_up_tokens(step);
    for (const PipelineOp& op : ops) {
      if (op.kind == PassKind::kForward)
        forward(step, op);
      else if (op.kind == PassKind::kBackward)
        backward(step, op);
      else if (op.kind == PassKind::kWeight)
        weight(step, op);
      else if (op.kind == PassKind::kOutputS)
        output_s(step, op);
      else
        output_t(step, op);
    }
    if (shard) add_token_gradients(step);
    // PipeDream: the stage after has just sent the gradient of this stage's first micro-batch
    // left in flight; it is the input of the next step's first carried backward.
    const int in_flight_here = step.config.pp - stage - 1;
    if (step.shape.schedule == Schedule::kPipeDream && in_flight_here > 0) {
      const int M = step.config.microbatches;
      receive(step, stage + 1, backward_tag(stage, M - in_flight_here, M), carried_gradient);
    }
    waiting([&] {
      for (auto& parcel : outbox) {
        parcel.request.wait(timeout_s);
        parcel.request = Work();
      }
    });
    end = Clock::now();
    for (const auto& r : replicated_ranges) std::fill_n(grads.begin() + r.offset, r.size, 0.0f);
    if (stage_group) {
      for (const auto& r : ranges)
        stage_group->all_reduce(std::span<float>(grads).subspan(r.offset, r.size), timeout_s);
      reduce_s = seconds_between(end, Clock::now());
    }
  } catch (...) {
    step.failure.record(std::current_exception(), where());
    // The groups are aborted now, so these return at once, and no send is left pointing
    // into a buffer or at a group that is about to go.
    for (auto& parcel : outbox) parcel.request = Work();
    end = Clock::now();
  }
  ring.reset();
  stage_group = sequence_group = tensor_group = fabric = pipe = nullptr;
  context = {};
}

}  // namespace peertrain::parallel
