// --pp P on the device: the GPT's units (embedding, blocks, head) cut into P runs of
// consecutive units, the stages, each a thread driving its GPU (stage s on device
// options.device + s mod the visible devices: all on one with one GPU, and on the emulator) through the
// micro-batches of a step in the order of a pipeline schedule (parallel/schedule.h:
// gpipe, 1f1b, eager-1f1b), as the CPU pipeline engine (parallel/pipeline.h) runs them on
// threads.
//
// A boundary tensor (a micro-batch's activations forward, their gradient backward) never
// leaves device memory: the sender's last kernel writes it into a message buffer and
// records an event; the receiver's stream waits for the event and copies the buffer into
// its own activations (device to device, peer to peer between GPUs), then records that it
// has, and the sender's stream waits for that before it writes the buffer again. One
// process holds every stage, so no NCCL and no host hop are needed; the host only passes
// pointers and events.
//
// Each stage holds only its units' parameters and gradients (one run of the flat layout,
// and a tied head's wte apart on the last stage) and the saved activations of the micro-batches in flight, which the
// schedule bounds: 1f1b p − s on stage s, gpipe m. The optimizer stays on the host
// (set_update_rule returns false): with a tied head two stages add into wte.
//
// Serial twins: the whole-model DeviceTransformer and the CPU model
// (tests/device/device_transformer_test.cpp, on the emulator and on a GPU).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "device_block_ops.h"
#include "peertrain/device/device_transformer.h"
#include "peertrain/model/batch_slice.h"
#include "peertrain/parallel/partitioner.h"
#include "peertrain/parallel/schedule.h"

namespace peertrain::device {
namespace {

using namespace detail;

// A boundary tensor in flight, in the sender's device memory.
// A boundary tensor in flight, in the sender's device memory. Each of a stage's two pools
// (forward, backward) sends to one stage only, so each event belongs to one device: CUDA
// records an event only on a stream of the device it was made on.
struct Message {
  DeviceArray<float> data;
  kernels::Event ready = kernels::create_event();  // made by the sender: its kernels wrote data
  // Made by the receiver at its first copy: that copy has run. Written by the receiver
  // before it clears in_use, read by the sender after it sees in_use clear.
  std::optional<kernels::Event> consumed;
  std::atomic<bool> in_use{false};  // posted and not yet copied by the receiver
  ~Message() {
    kernels::destroy_event(ready);
    if (consumed) kernels::destroy_event(*consumed);
  }
};

// Where the stages leave each other's messages, by (receiving stage, tag). The host side
// of the hand-over only: the data moves on the devices' streams.
class Mailbox {
 public:
  void post(int stage, int tag, Message* message) {
    {
      std::lock_guard lock(mutex_);
      boxes_[{stage, tag}] = message;
    }
    arrived_.notify_all();
  }
  // Waits for the message; throws when another stage failed (abort) or after timeout_s.
  Message* take(int stage, int tag, double timeout_s, const std::string& what) {
    std::unique_lock lock(mutex_);
    const bool came = arrived_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] {
      return aborted_ || boxes_.count({stage, tag}) > 0;
    });
    if (aborted_)
      throw Error(ErrorKind::kPeerLost,
                  str("device pipeline: stage ", stage, " stopped waiting for ", what, ": another stage failed"));
    if (!came)
      throw Error(ErrorKind::kTimeout,
                  str("device pipeline: stage ", stage, " waited ", timeout_s, " s for ", what, " and none came"));
    const auto it = boxes_.find({stage, tag});
    Message* message = it->second;
    boxes_.erase(it);
    return message;
  }
  void abort() {
    {
      std::lock_guard lock(mutex_);
      aborted_ = true;
    }
    arrived_.notify_all();
  }
  void reset() {
    std::lock_guard lock(mutex_);
    aborted_ = false;
    boxes_.clear();
  }

 private:
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<std::pair<int, int>, Message*> boxes_;
  bool aborted_ = false;
};

int forward_tag(int microbatch) { return 2 * microbatch; }
int backward_tag(int microbatch) { return 2 * microbatch + 1; }

// One stage: units [first_unit, end_unit) of the layout on one device.
class Stage {
 public:
  Stage(const model::TransformerConfig& config, const model::TransformerLayout& layout,
        const model::DeviceOptions& options, int index, int first_unit, int end_unit, int device)
      : config_(config),
        layout_(layout),
        index_(index),
        first_unit_(first_unit),
        end_unit_(end_unit),
        device_(device),
        first_block_(std::max(first_unit, 1) - 1),
        end_block_(std::min(end_unit, config.layers + 1) - 1) {
    kernels::set_device(device_);
    stream_ = kernels::create_stream();
    blas_ = std::make_unique<kernels::Blas>(stream_, precision(options.gemm));
    // Its units are one run of the flat layout, [lo, hi): its buffers hold that run only,
    // and the offsets of its tensors are taken from lo.
    const model::ParameterRange& last = layout.units[static_cast<std::size_t>(end_unit) - 1];
    units_ = {layout.units[static_cast<std::size_t>(first_unit)].offset, 0};
    units_.size = last.offset + last.size - units_.offset;
    params_.resize(units_.size, "stage parameters");
    grads_.resize(units_.size, "stage gradients");
    host_params_ = PinnedArray<float>(units_.size, "stage parameters (pinned)");
    host_grads_ = PinnedArray<float>(units_.size, "stage gradients (pinned)");
    for (int l = first_block_; l < end_block_; ++l)
      blocks_.push_back(shifted(layout.blocks[static_cast<std::size_t>(l)]));
    if (config.tied_head && has_head() && !has_embedding()) {  // the logits read wte, which stage 0 holds
      wte_ = {layout.wte, static_cast<std::size_t>(config.vocab) * config.d_model};
      wte_params_.resize(wte_.size, "tied wte (last stage)");
      wte_grads_.resize(wte_.size, "tied wte gradient (last stage)");
      host_wte_params_ = PinnedArray<float>(wte_.size, "tied wte (pinned)");
      host_wte_grads_ = PinnedArray<float>(wte_.size, "tied wte gradient (pinned)");
    }
    if (has_head()) {
      const bool apart = wte_.size > 0;
      const std::size_t out = config.tied_head ? layout.wte : layout.head_w;
      head_ = {layout.lnf_w - units_.offset, layout.lnf_b - units_.offset,
               apart ? wte_params_.data() : params_.data() + (out - units_.offset),
               apart ? wte_grads_.data() : grads_.data() + (out - units_.offset)};
    }
  }

  ~Stage() {
    kernels::set_device(device_);
    for (auto& pool : messages_) pool.clear();
    slots_.clear();
    blas_.reset();
    kernels::destroy_stream(stream_);
  }

  bool has_embedding() const { return first_unit_ == 0; }
  bool has_head() const { return end_unit_ == config_.layers + 2; }
  int blocks() const { return end_block_ - first_block_; }
  std::string units() const { return str(first_unit_, "–", end_unit_ - 1); }
  void set_timeout(double seconds) { timeout_s_ = seconds; }

  // Before a step (or an evaluation): its units' params in (and wte's, apart), its
  // gradient zeroed, room for `microbatches` micro-batches of n tokens' losses.
  void begin(std::span<const float> params, std::span<const int> positions, int microbatches, int n) {
    kernels::set_device(device_);
    // What a failed step may have left: micro-batches in flight, buffers never taken (its
    // streams have been synchronised since, so nothing still reads them).
    std::fill(slot_of_.begin(), slot_of_.end(), -1);
    free_slots_.resize(slots_.size());
    std::iota(free_slots_.begin(), free_slots_.end(), 0);
    for (auto& pool : messages_)
      for (const std::unique_ptr<Message>& m : pool) m->in_use.store(false, std::memory_order_relaxed);
    const auto upload = [&](model::ParameterRange r, float* host, float* device, float* gradient) {
      std::copy_n(params.data() + r.offset, r.size, host);
      kernels::copy_to_device(device, host, sizeof(float) * r.size, stream_);
      kernels::zero(gradient, sizeof(float) * r.size, stream_);
    };
    upload(units_, host_params_.data(), params_.data(), grads_.data());
    if (wte_.size > 0) upload(wte_, host_wte_params_.data(), wte_params_.data(), wte_grads_.data());
    positions_.resize(positions.size(), "positions");
    kernels::copy_to_device(positions_.data(), positions.data(), sizeof(int) * positions.size(), stream_);
    if (has_head()) {
      const std::size_t count = static_cast<std::size_t>(microbatches) * n;
      host_losses_.resize(count, "losses (pinned)");
      host_correct_.resize(count, "correct (pinned)");
    }
  }

  // Micro-batch i's forward: the embedding or the previous stage's activations in, the
  // blocks, then the head (last stage; grad_scale 0: evaluation) or the next stage out.
  void forward(int i, const model::TokenBatch& mb, float grad_scale, Mailbox& mail) {
    Slot& slot = acquire(i);
    const int d = config_.d_model, n = mb.batch * mb.tokens;
    const std::size_t dn = static_cast<std::size_t>(d) * n;
    const model::BlockShape shape = model::block_shape(config_, mb);
    for (DeviceArray<float>& saved : slot.saved) saved.resize(shape.saved().total, "block activations");
    Message* out = has_head() ? nullptr : &outgoing(0, dn);
    if (has_head()) slot.x_head.resize(dn, "head input");
    const auto output_of = [&](int k) {  // where block k (of the stage's) writes
      return k + 1 < blocks() ? slot.saved[static_cast<std::size_t>(k) + 1].data()
             : has_head()     ? slot.x_head.data()
                              : out->data.data();
    };
    float* x = output_of(-1);  // the stage's input
    if (has_embedding()) {
      slot.ids.resize(static_cast<std::size_t>(n), "bytes");
      kernels::copy_to_device(slot.ids.data(), mb.bytes.data(), sizeof(std::int32_t) * n, stream_);
      kernels::token_embedding_forward(stream_, d, mb.batch, mb.tokens, slot.ids.data(), positions_.data(),
                                       params_.data() + layout_.wte, params_.data() + layout_.wpe, x);  // from 0
    } else {
      receive(mail, forward_tag(i), x, dn, str("micro-batch ", i, "'s activations"));
    }
    DeviceBlockOps ops = block_ops(mb);
    for (int k = 0; k < blocks(); ++k) {
      float* saved = slot.saved[static_cast<std::size_t>(k)].data();
      model::block_forward(ops, shape, blocks_[static_cast<std::size_t>(k)], params_.data(), saved, saved,
                           output_of(k));
    }
    if (!has_head()) return send(mail, index_ + 1, forward_tag(i), *out);
    slot.targets.resize(static_cast<std::size_t>(n), "targets");
    kernels::copy_to_device(slot.targets.data(), mb.targets.data(), sizeof(std::int32_t) * n, stream_);
    head_forward(ops, config_, head_, params_.data(), slot.x_head.data(), n, slot.targets.data(), grad_scale,
                 slot.head);
    const std::size_t at = static_cast<std::size_t>(i) * n;
    kernels::copy_to_host(host_losses_.data() + at, slot.head.losses.data(), sizeof(float) * n, stream_);
    kernels::copy_to_host(host_correct_.data() + at, slot.head.correct.data(), sizeof(int) * n, stream_);
  }

  // Micro-batch i's backward: the head's (last stage) or the next stage's gradient in,
  // the blocks in reverse, then the embedding's gradient or the previous stage out.
  void backward(int i, const model::TokenBatch& mb, Mailbox& mail) {
    Slot& slot = slots_[static_cast<std::size_t>(slot_of_.at(static_cast<std::size_t>(i)))];
    const int d = config_.d_model, n = mb.batch * mb.tokens;
    const std::size_t dn = static_cast<std::size_t>(d) * n;
    const model::BlockShape shape = model::block_shape(config_, mb);
    // The gradient flows through one buffer, in place: the message to the previous stage.
    Message* out = has_embedding() ? nullptr : &outgoing(1, dn);
    d_x_.resize(dn, "input gradient");
    float* dx = out != nullptr ? out->data.data() : d_x_.data();
    DeviceBlockOps ops = block_ops(mb);
    if (has_head()) {
      d_y_.resize(dn, "head: ln_f output gradient");
      head_backward(ops, config_, head_, params_.data(), slot.x_head.data(), n, slot.head, d_y_.data(), dx,
                    grads_.data());
    } else {
      receive(mail, backward_tag(i), dx, dn, str("micro-batch ", i, "'s gradient"));
    }
    for (int k = blocks(); k-- > 0;)
      model::block_backward(ops, shape, blocks_[static_cast<std::size_t>(k)], params_.data(),
                            slot.saved[static_cast<std::size_t>(k)].data(), dx, dx, grads_.data());
    if (has_embedding())
      kernels::token_embedding_backward(stream_, d, mb.batch, mb.tokens, slot.ids.data(), positions_.data(), dx,
                                        grads_.data() + layout_.wte, grads_.data() + layout_.wpe);
    else
      send(mail, index_ - 1, backward_tag(i), *out);
    release(i);
  }

  void release(int i) {
    int& s = slot_of_.at(static_cast<std::size_t>(i));
    free_slots_.push_back(s);
    s = -1;
  }

  // After the step: its gradient to the host (then add_gradient), the losses readable.
  void finish(bool gradient) {
    kernels::set_device(device_);
    if (gradient) {
      kernels::copy_to_host(host_grads_.data(), grads_.data(), sizeof(float) * units_.size, stream_);
      if (wte_.size > 0)
        kernels::copy_to_host(host_wte_grads_.data(), wte_grads_.data(), sizeof(float) * wte_.size, stream_);
    }
    kernels::synchronize(stream_);
  }
  // grads += this stage's gradient (both ends of a tied wte add theirs).
  void add_gradient(std::span<float> grads) const {
    const auto add = [&](model::ParameterRange r, const float* from) {
      for (std::size_t j = 0; j < r.size; ++j) grads[r.offset + j] += from[j];
    };
    add(units_, host_grads_.data());
    if (wte_.size > 0) add(wte_, host_wte_grads_.data());
  }
  model::LossSums losses(int microbatches, int n) const {
    model::LossSums sums;
    const std::size_t count = static_cast<std::size_t>(microbatches) * n;
    for (std::size_t j = 0; j < count; ++j) {
      sums.loss_sum += host_losses_.data()[j];
      sums.correct += host_correct_.data()[j];
    }
    sums.count = static_cast<long long>(count);
    return sums;
  }
  int peak_slots() const { return static_cast<int>(slots_.size()); }

 private:
  // A block's offsets counted from the stage's first parameter.
  model::BlockOffsets shifted(model::BlockOffsets o) const {
    for (std::size_t* f : {&o.ln1_w, &o.ln1_b, &o.qkv_w, &o.qkv_b, &o.proj_w, &o.proj_b, &o.ln2_w, &o.ln2_b, &o.fc_w,
                           &o.fc_b, &o.fc2_w, &o.fc2_b})
      *f -= units_.offset;
    return o;
  }

  // One micro-batch in flight: each block's saved activations, the head's buffers (last
  // stage), its bytes (first stage: the embedding's backward reads them) and targets.
  struct Slot {
    std::vector<DeviceArray<float>> saved;
    DeviceArray<float> x_head;
    HeadBuffers head;
    DeviceArray<std::int32_t> ids, targets;
  };

  Slot& acquire(int i) {
    if (slot_of_.size() <= static_cast<std::size_t>(i)) slot_of_.resize(static_cast<std::size_t>(i) + 1, -1);
    PEERTRAIN_CHECK(slot_of_[static_cast<std::size_t>(i)] < 0, "device pipeline: micro-batch ", i,
                    " forward twice on stage ", index_);
    if (free_slots_.empty()) {
      slots_.emplace_back();
      slots_.back().saved.resize(static_cast<std::size_t>(blocks()));
      free_slots_.push_back(static_cast<int>(slots_.size()) - 1);
    }
    slot_of_[static_cast<std::size_t>(i)] = free_slots_.back();
    free_slots_.pop_back();
    return slots_[static_cast<std::size_t>(slot_of_[static_cast<std::size_t>(i)])];
  }

  // A message buffer the receiver has finished with (or a new one), its stream ordered
  // after that receiver's copy.
  // direction: 0 forward (to the next stage), 1 backward (to the previous).
  Message& outgoing(int direction, std::size_t floats) {
    std::vector<std::unique_ptr<Message>>& pool = messages_[static_cast<std::size_t>(direction)];
    Message* message = nullptr;
    for (const std::unique_ptr<Message>& m : pool)
      if (!m->in_use.load(std::memory_order_acquire)) {
        message = m.get();
        break;
      }
    if (message == nullptr) message = pool.emplace_back(std::make_unique<Message>()).get();
    if (message->consumed) kernels::wait(stream_, *message->consumed);
    message->in_use.store(true, std::memory_order_relaxed);
    message->data.resize(floats, "boundary tensor");
    return *message;
  }
  void send(Mailbox& mail, int to, int tag, Message& message) {
    kernels::record(message.ready, stream_);
    mail.post(to, tag, &message);
  }
  void receive(Mailbox& mail, int tag, float* into, std::size_t floats, const std::string& what) {
    Message* message = mail.take(index_, tag, timeout_s_, what);
    kernels::wait(stream_, message->ready);
    kernels::copy_on_device(into, message->data.data(), sizeof(float) * floats, stream_);
    if (!message->consumed) message->consumed = kernels::create_event();  // on this stage's device
    kernels::record(*message->consumed, stream_);
    message->in_use.store(false, std::memory_order_release);
  }

  DeviceBlockOps block_ops(const model::TokenBatch& mb) {
    return {stream_,           *blas_,  scratch_, delta_, nullptr, attention_dims(config_, mb, blas_->precision()),
            positions_.data(), mb.batch};
  }

  const model::TransformerConfig& config_;
  const model::TransformerLayout& layout_;
  int index_, first_unit_, end_unit_, device_;
  int first_block_, end_block_;  // the blocks among its units
  double timeout_s_ = 60;
  model::ParameterRange units_;              // its units' run of the flat layout: its buffers' extent
  model::ParameterRange wte_;                // a tied head's wte on the last stage, held apart; else empty
  std::vector<model::BlockOffsets> blocks_;  // its blocks', from units_.offset
  HeadTensors head_;                         // the last stage's
  kernels::Stream stream_;
  std::unique_ptr<kernels::Blas> blas_;
  DeviceArray<float> params_, grads_, wte_params_, wte_grads_;
  PinnedArray<float> host_params_, host_grads_, host_wte_params_, host_wte_grads_;
  PinnedArray<float> host_losses_;
  PinnedArray<int> host_correct_;
  DeviceArray<int> positions_;
  std::vector<Slot> slots_;
  std::vector<int> free_slots_, slot_of_;
  std::array<std::vector<std::unique_ptr<Message>>, 2> messages_;  // outgoing: forward, backward
  std::array<DeviceArray<float>, 5> scratch_;       // the block composition's
  DeviceArray<float> delta_, d_x_, d_y_;
};

// Each unit's FLOPs per token, forward and backward: what the default split balances.
std::vector<double> unit_flops(const model::TransformerConfig& c) {
  const double d = c.d_model, f = static_cast<double>(c.mlp_ratio) * c.d_model;
  std::vector<double> costs;
  costs.push_back(3 * d);  // the embedding: a gather
  for (int l = 0; l < c.layers; ++l) costs.push_back(3 * (2 * (4 * d * d + 2 * f * d) + 2 * c.seq * d));
  costs.push_back(3 * 2 * static_cast<double>(c.vocab) * d);  // the head's logits
  return costs;
}

// A stage's own host thread, kept across steps: a step starts no thread, and what the
// kernels keep per host thread (the BF16 attention's operand workspace) lives as long as
// the pipeline instead of being freed, which waits for the device, at the end of each
// step. The job catches its own errors.
class StageThread {
 public:
  StageThread() : thread_([this] { loop(); }) {}
  ~StageThread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  void start(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      job_ = std::move(job);
      busy_ = true;
    }
    changed_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !busy_; });
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || (busy_ && job_); });
        if (stop_) return;
        job = std::exchange(job_, nullptr);
      }
      job();
      {
        std::lock_guard lock(mutex_);
        busy_ = false;
      }
      changed_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> job_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;  // last: it starts once the rest is made
};

class DevicePipeline final : public model::DeviceModel {
 public:
  DevicePipeline(const model::TransformerConfig& config, const model::DeviceOptions& options,
                 std::vector<int> first_units)
      : config_(config),
        options_(options),
        layout_(model::transformer_layout(config)),
        schedule_(parallel::parse_schedule(options.schedule)),
        first_units_(std::move(first_units)) {
    const int devices = std::max(1, kernels::device_count());
    const int units = static_cast<int>(layout_.units.size());
    for (int s = 0; s < options.pp; ++s) {
      const int end = s + 1 < options.pp ? first_units_[static_cast<std::size_t>(s) + 1] : units;
      stages_.push_back(std::make_unique<Stage>(config_, layout_, options, s, first_units_[static_cast<std::size_t>(s)],
                                                end, kernels::emulated() ? 0 : (options.device + s) % devices));
      stages_.back()->set_timeout(options.timeout_s);
    }
    for (int s = 0; s < options.pp; ++s) threads_.push_back(std::make_unique<StageThread>());
  }

  std::string describe() const override {
    std::string split;
    for (const auto& s : stages_) split += str(split.empty() ? "" : " | ", s->units());
    return str(options_.pp, " pipeline stages (units ", split, "), ", parallel::to_string(schedule_), " over ",
               options_.microbatches, " micro-batches, stage 0 on ", kernels::device_name(options_.device), ", ",
               gemm_name(options_.gemm), " GEMM");
  }

  std::size_t peak_device_bytes() const override { return kernels::peak_allocated_bytes(); }

  float forward_backward(std::span<const float> params, const model::TokenBatch& batch,
                         std::span<float> grads) override {
    check(params.size(), grads.size());
    const int m = options_.microbatches;
    if (batch.batch % m != 0)
      throw Error(ErrorKind::kInvalidArgument, str("--device cuda --pp ", options_.pp, ": --microbatches ", m,
                                                   " must divide the batch of ", batch.batch, " sequences"));
    model::check_batch(config_, batch);  // a bad byte is an error, not an out-of-bounds read
    const int per = batch.batch / m;
    micro_.resize(static_cast<std::size_t>(m));
    for (int i = 0; i < m; ++i)
      model::slice_batch(config_, batch, i * per, per, {}, micro_[static_cast<std::size_t>(i)]);
    const int n = per * batch.tokens;
    const float grad_scale = static_cast<float>(1.0 / batch.loss_divisor);
    mail_.reset();
    std::exception_ptr failure;
    std::mutex failure_mutex;
    for (int s = 0; s < options_.pp; ++s)
      threads_[static_cast<std::size_t>(s)]->start([&, s] {
        Stage& stage = *stages_[static_cast<std::size_t>(s)];
        try {
          stage.begin(params, batch.positions, m, n);
          for (const parallel::PipelineOp& op : parallel::stage_schedule(schedule_, options_.pp, s, m)) {
            const model::TokenBatch& mb = micro_[static_cast<std::size_t>(op.microbatch)].batch;
            if (op.kind == parallel::PassKind::kForward)
              stage.forward(op.microbatch, mb, grad_scale, mail_);
            else
              stage.backward(op.microbatch, mb, mail_);
          }
          stage.finish(/*gradient=*/true);
        } catch (...) {
          std::lock_guard lock(failure_mutex);
          if (!failure) failure = std::current_exception();
          mail_.abort();  // wake the stages waiting on this one
        }
      });
    for (const auto& thread : threads_) thread->wait();
    if (failure) {
      settle();
      std::rethrow_exception(failure);
    }
    for (const auto& stage : stages_) stage->add_gradient(grads);
    return static_cast<float>(stages_.back()->losses(m, n).loss_sum / batch.loss_divisor);
  }

  // Forward only, the whole batch as one micro-batch, the stages one after another on the
  // calling thread (the mailbox's post comes before its take).
  model::LossSums evaluate(std::span<const float> params, const model::TokenBatch& batch, bool) override {
    check(params.size(), params.size());
    model::check_batch(config_, batch);
    const int n = batch.batch * batch.tokens;
    mail_.reset();
    try {
      for (const auto& stage : stages_) {
        stage->begin(params, batch.positions, 1, n);
        stage->forward(0, batch, 0.0f, mail_);
        stage->release(0);
      }
      for (const auto& stage : stages_) stage->finish(false);
    } catch (...) {
      settle();
      throw;
    }
    return stages_.back()->losses(1, n);
  }

 private:
  // After a failed step: every stage's queued work runs out, so that nothing still reads
  // or writes a buffer the next step reuses. Its own errors are dropped: the step's
  // failure already says what went wrong.
  void settle() {
    for (const auto& stage : stages_) try {
        stage->finish(false);
      } catch (const std::exception&) {
      }
  }

  void check(std::size_t params, std::size_t grads) const {
    PEERTRAIN_CHECK(params == layout_.total && grads == params, "device pipeline: params has ", params, " and grads ",
                    grads, " floats, the model ", layout_.total);
  }

  model::TransformerConfig config_;
  model::DeviceOptions options_;
  model::TransformerLayout layout_;
  parallel::Schedule schedule_;
  std::vector<int> first_units_;
  std::vector<std::unique_ptr<Stage>> stages_;
  Mailbox mail_;
  std::vector<model::BatchSlice> micro_;
  std::vector<std::unique_ptr<StageThread>> threads_;  // after stages_: they stop first
};

}  // namespace

std::unique_ptr<model::DeviceModel> make_device_pipeline(const model::TransformerConfig& config,
                                                         const model::DeviceOptions& options) {
  if (options.sp > 1)
    throw Error(ErrorKind::kInvalidArgument, str("--device cuda runs --pp ", options.pp,
                                                 " with --sp 1: sequence ranks inside the stages of the "
                                                 "GPU pipeline are not built yet"));
  const parallel::Schedule schedule = parallel::parse_schedule(options.schedule);
  if (schedule != parallel::Schedule::kGpipe && schedule != parallel::Schedule::kOneFOneB &&
      schedule != parallel::Schedule::kEager1F1B)
    throw Error(ErrorKind::kInvalidArgument,
                str("--device cuda --pp ", options.pp, " runs --schedule gpipe, 1f1b or eager-1f1b, not '",
                    options.schedule, "' (the others need split backwards or chunks the device stages do not run)"));
  if (options.microbatches < 1)
    throw Error(ErrorKind::kInvalidArgument, str("--microbatches must be positive, got ", options.microbatches));
  const int units = config.layers + 2;
  if (options.pp > units)
    throw Error(ErrorKind::kInvalidArgument,
                str("--pp ", options.pp, " needs at least as many units (", units, ": the embedding, ", config.layers,
                    " blocks, the head): every stage holds one or more"));
  std::vector<int> first_units = options.stage_first_units;
  if (first_units.empty())
    first_units = parallel::partition(unit_flops(config), options.pp);
  else
    parallel::validate_first_units(first_units, units, options.pp);
  return std::make_unique<DevicePipeline>(config, options, std::move(first_units));
}

}  // namespace peertrain::device
