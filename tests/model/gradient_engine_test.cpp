// The batch-parallel engine (--threads N) against the unsplit model, its serial twin: the
// same loss, gradient and evaluation sums on fresh random parameters and batches, for
// gpt and vit, batches that split evenly, unevenly and into fewer parts than threads, over
// several calls (the pool's threads are reused), and an error in a part reaching the caller.
#include "peertrain/model/gradient_engine.h"

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <vector>

#include "peertrain/core/error.h"
#include "transformer_test_util.h"

namespace peertrain::model {
namespace {

using test::all_positions;
using test::make_batch;
using test::normalized_error;

void expect_batch_parallel_equals_unsplit(const TransformerConfig& config) {
  Transformer model(config);
  const std::vector<float> params = test::random_params(model, 5);
  const int eigen_threads = Eigen::nbThreads();
  const auto unsplit = make_unsplit_engine(model);
  for (int threads : {2, 3}) {
    const auto parallel = make_batch_parallel_engine(model, threads);
    for (int batch : {1, 4, 5}) {  // fewer sequences than threads; even; uneven
      SCOPED_TRACE(::testing::Message() << "threads " << threads << " batch " << batch);
      const test::Batch b = make_batch(config, batch, all_positions(model.config().tokens()), 40 + batch);
      std::vector<float> want(params.size(), 1.0f), got(params.size(), 2.0f);  // both overwritten
      const float want_loss = unsplit->forward_backward(params, b.view, want);
      for (int call = 0; call < 2; ++call) {  // the second call reuses the pool's threads
        const float got_loss = parallel->forward_backward(params, b.view, got);
        EXPECT_NEAR(got_loss, want_loss, 1e-6 * want_loss);
        EXPECT_LT(normalized_error(got, want), 1e-6);
      }
      const LossSums want_sums = unsplit->evaluate(params, b.view, true);
      const LossSums got_sums = parallel->evaluate(params, b.view, true);
      EXPECT_NEAR(got_sums.loss_sum, want_sums.loss_sum, 1e-6 * want_sums.loss_sum);
      EXPECT_EQ(got_sums.correct, want_sums.correct);
      EXPECT_EQ(got_sums.count, want_sums.count);
    }
  }
  Eigen::setNbThreads(eigen_threads);
}

TEST(BatchParallelEngine, GptEqualsTheUnsplitModel) { expect_batch_parallel_equals_unsplit(test::tiny_gpt(false)); }
TEST(BatchParallelEngine, VitEqualsTheUnsplitModel) { expect_batch_parallel_equals_unsplit(test::tiny_vit()); }

TEST(BatchParallelEngine, ABadBatchInAnyPartIsTheCallersError) {
  const TransformerConfig config = test::tiny_gpt(false);
  Transformer model(config);
  const std::vector<float> params = test::random_params(model, 5);
  test::Batch b = make_batch(config, 4, all_positions(config.tokens()), 9);
  b.bytes.back() = config.vocab + 3;  // in the last sequence: the second thread's part
  b.view.bytes = b.bytes;
  const auto parallel = make_batch_parallel_engine(model, 2);
  std::vector<float> grads(params.size());
  EXPECT_THROW(parallel->forward_backward(params, b.view, grads), Error);
  // and the engine goes on afterwards
  const test::Batch good = make_batch(config, 4, all_positions(config.tokens()), 10);
  EXPECT_TRUE(std::isfinite(parallel->forward_backward(params, good.view, grads)));
}

}  // namespace
}  // namespace peertrain::model
