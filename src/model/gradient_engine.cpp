#include "peertrain/model/gradient_engine.h"

#include <Eigen/Core>
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "peertrain/core/error.h"
#include "peertrain/model/batch_slice.h"

namespace peertrain::model {
namespace {

class Unsplit final : public GradientEngine {
 public:
  explicit Unsplit(Transformer& model) : model_(model) {}
  std::string describe() const override { return "the CPU"; }
  float forward_backward(std::span<const float> params, const TokenBatch& batch, std::span<float> grads) override {
    std::fill(grads.begin(), grads.end(), 0.0f);  // the model adds into grads
    return model_.forward_backward(params, batch, grads);
  }
  LossSums evaluate(std::span<const float> params, const TokenBatch& batch, bool) override {
    return model_.evaluate(params, batch);
  }

 private:
  Transformer& model_;
};

// Threads 1 … count that run a job's parts with the caller as part 0; they wait on a
// generation counter between jobs. A job's function must not throw.
class Pool {
 public:
  explicit Pool(int count) {
    for (int i = 1; i <= count; ++i) threads_.emplace_back([this, i] { serve(i); });
  }
  ~Pool() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
      ++generation_;
    }
    wake_.notify_all();
    threads_.clear();  // joins
  }
  void run(int parts, const std::function<void(int)>& job) {
    {
      std::lock_guard lock(mutex_);
      job_ = &job;
      parts_ = parts;
      pending_ = std::max(0, std::min(parts, static_cast<int>(threads_.size()) + 1) - 1);
      ++generation_;
    }
    wake_.notify_all();
    job(0);
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
  }

 private:
  void serve(int index) {
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* job = nullptr;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) return;
        if (index >= parts_) continue;
        job = job_;
      }
      (*job)(index);
      std::lock_guard lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  const std::function<void(int)>* job_ = nullptr;
  int parts_ = 0, pending_ = 0;
  std::vector<std::jthread> threads_;
};

class BatchParallel final : public GradientEngine {
 public:
  BatchParallel(Transformer& model, int threads)
      : model_(model),
        threads_(threads),
        slices_(static_cast<std::size_t>(threads)),
        partial_(static_cast<std::size_t>(threads)) {
    PEERTRAIN_CHECK(threads >= 1, "a batch-parallel engine of ", threads, " threads");
    Eigen::setNbThreads(1);  // the parallelism is ours: a GEMM each per thread
  }
  std::string describe() const override { return str("the CPU, ", threads_, " threads over the batch"); }

  float forward_backward(std::span<const float> params, const TokenBatch& batch, std::span<float> grads) override {
    const int parts = split(batch);
    std::vector<float> losses(static_cast<std::size_t>(parts), 0.0f);
    run(parts, [&](int i) {
      std::span<float> into = grads;
      if (i > 0) {  // every other thread adds into its own buffer: no two threads add to one range
        std::vector<float>& own = partial_[static_cast<std::size_t>(i)];
        own.resize(grads.size());
        into = own;
      }
      std::fill(into.begin(), into.end(), 0.0f);  // the model adds into it
      losses[static_cast<std::size_t>(i)] =
          model_.forward_backward(params, slices_[static_cast<std::size_t>(i)].batch, into);
    });
    // The sum over the parts, each thread a contiguous range of it: in each element the
    // same additions in the same order as one thread's, so the same bits.
    const std::size_t size = grads.size();
    if (parts > 1)
      run(parts, [&](int i) {
        const std::size_t begin = size * static_cast<std::size_t>(i) / static_cast<std::size_t>(parts);
        const std::size_t end = size * static_cast<std::size_t>(i + 1) / static_cast<std::size_t>(parts);
        for (int j = 1; j < parts; ++j) {
          const float* own = partial_[static_cast<std::size_t>(j)].data();
          for (std::size_t k = begin; k < end; ++k) grads[k] += own[k];
        }
      });
    float loss = losses[0];
    for (int i = 1; i < parts; ++i) loss += losses[static_cast<std::size_t>(i)];
    return loss;
  }

  LossSums evaluate(std::span<const float> params, const TokenBatch& batch, bool) override {
    const int parts = split(batch);
    std::vector<LossSums> sums(static_cast<std::size_t>(parts));
    run(parts, [&](int i) {
      sums[static_cast<std::size_t>(i)] = model_.evaluate(params, slices_[static_cast<std::size_t>(i)].batch);
    });
    LossSums total;
    for (const LossSums& s : sums) {
      total.loss_sum += s.loss_sum;
      total.correct += s.correct;
      total.count += s.count;
    }
    return total;
  }

 private:
  // Cuts the batch into as many contiguous runs of sequences as there are threads (fewer
  // when the batch is smaller), sizes differing by at most one; returns how many.
  int split(const TokenBatch& batch) {
    const int parts = std::max(1, std::min(threads_, batch.batch));
    int first = 0;
    for (int i = 0; i < parts; ++i) {
      const int count = batch.batch / parts + (i < batch.batch % parts ? 1 : 0);
      slice_batch(model_.config(), batch, first, count, {}, slices_[static_cast<std::size_t>(i)]);
      first += count;
    }
    return parts;
  }

  // work(i) for i < parts: part 0 on this thread, the others on the pool's threads (kept
  // between calls, so each keeps its thread-local workspace warm); the first error of any
  // part is rethrown here after all have finished.
  template <typename Work>
  void run(int parts, const Work& work) {
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(parts));
    pool_.run(parts, [&](int i) {
      try {
        work(i);
      } catch (...) {
        errors[static_cast<std::size_t>(i)] = std::current_exception();
      }
    });
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
  }

  Transformer& model_;
  int threads_;
  std::vector<BatchSlice> slices_;
  std::vector<std::vector<float>> partial_;
  Pool pool_{threads_ - 1};
};

class OnDevice final : public GradientEngine {
 public:
  explicit OnDevice(std::unique_ptr<DeviceModel> device) : device_(std::move(device)) {}
  std::string describe() const override { return device_->describe(); }
  float forward_backward(std::span<const float> params, const TokenBatch& batch, std::span<float> grads) override {
    std::fill(grads.begin(), grads.end(), 0.0f);  // the device model adds into grads
    return device_->forward_backward(params, batch, grads);
  }
  LossSums evaluate(std::span<const float> params, const TokenBatch& batch, bool params_changed) override {
    return device_->evaluate(params, batch, params_changed);
  }

 private:
  std::unique_ptr<DeviceModel> device_;
};

}  // namespace

std::unique_ptr<GradientEngine> make_unsplit_engine(Transformer& model) { return std::make_unique<Unsplit>(model); }

std::unique_ptr<GradientEngine> make_batch_parallel_engine(Transformer& model, int threads) {
  return std::make_unique<BatchParallel>(model, threads);
}

std::unique_ptr<GradientEngine> make_device_engine(std::unique_ptr<DeviceModel> device) {
  return std::make_unique<OnDevice>(std::move(device));
}

}  // namespace peertrain::model
