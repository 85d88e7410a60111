// A model on several threads (MakeParallelModel): the same loss and
// gradient as one thread for per-sample losses, BatchNorm's first-slice
// running statistics, small and invalid batches, and what it refuses.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meridian/config/config.h"
#include "meridian/train/dataset.h"
#include "meridian/train/model.h"
#include "train/model_test_util.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

using testing::Batch;
using testing::Build;
using testing::RandomBatch;

pb::ModelConfig Mlp() {
  pb::ModelConfig config;
  config.set_kind(pb::MLP);
  config.add_hidden(16);
  config.add_hidden(8);
  return config;
}

pb::LayerConfig Layer(pb::LayerKind kind, uint32_t channels = 0,
                      uint32_t kernel = 0) {
  pb::LayerConfig layer;
  layer.set_kind(kind);
  if (channels > 0) layer.set_channels(channels);
  if (kernel > 0) layer.set_kernel(kernel);
  return layer;
}

// 1x8x8 images: conv, [BatchNorm,] ReLU, max pool, dense.
pb::ModelConfig SmallCnn(bool batch_norm) {
  pb::ModelConfig config;
  config.set_kind(pb::CNN);
  *config.add_layers() = Layer(pb::CONV, 4, 3);
  if (batch_norm) *config.add_layers() = Layer(pb::BATCH_NORM);
  *config.add_layers() = Layer(pb::RELU);
  pb::LayerConfig pool = Layer(pb::MAX_POOL, 0, 2);
  *config.add_layers() = pool;
  *config.add_layers() = Layer(pb::FULLY_CONNECTED, 12);
  return config;
}

std::unique_ptr<Model> OnThreads(const pb::ModelConfig& config, int dim,
                                 int classes, int threads) {
  std::vector<std::unique_ptr<Model>> replicas;
  for (int i = 0; i < threads; ++i) {
    replicas.push_back(Build(config, dim, classes));
  }
  Result<std::unique_ptr<Model>> model = MakeParallelModel(std::move(replicas));
  EXPECT_OK(model);
  return model.ok() ? std::move(model).value() : nullptr;
}

double MaxAbsDifference(const std::vector<float>& a,
                        const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return worst;
}

// Loss and gradient of `config` on one thread and on `threads`, on the same
// batch and parameters, over several steps (the threads are reused).
void ExpectSameAsOneThread(const pb::ModelConfig& config, int dim,
                           int batch_size, int threads) {
  SCOPED_TRACE(config.ShortDebugString() + " on " + std::to_string(threads) +
               " threads, batch " + std::to_string(batch_size));
  std::unique_ptr<Model> single = Build(config, dim, 10);
  std::unique_ptr<Model> parallel = OnThreads(config, dim, 10, threads);
  ASSERT_NE(single, nullptr);
  ASSERT_NE(parallel, nullptr);
  ASSERT_EQ(parallel->layout().num_elements(), single->layout().num_elements());
  std::vector<float> params(single->layout().num_elements());
  single->Initialize(3, params);
  std::vector<float> grad_single(params.size());
  std::vector<float> grad_parallel(params.size(), 7.0f);
  for (int step = 0; step < 5; ++step) {
    const Batch batch = RandomBatch(dim, batch_size, 10, 20 + step);
    const float loss_single = single->LossAndGradient(
        params, batch.features, batch.labels, grad_single);
    const float loss_parallel = parallel->LossAndGradient(
        params, batch.features, batch.labels, grad_parallel);
    ASSERT_TRUE(std::isfinite(loss_single));
    EXPECT_NEAR(loss_parallel, loss_single, 1e-5 * std::abs(loss_single));
    EXPECT_LT(MaxAbsDifference(grad_parallel, grad_single), 1e-5)
        << "step " << step;
    // A step, so the next batch sees other parameters.
    for (size_t i = 0; i < params.size(); ++i) {
      params[i] -= 0.1f * grad_single[i];
    }
  }
}

TEST(ParallelModelTest, MlpGradientIsTheWholeBatchsOnEveryThreadCount) {
  for (int threads : {2, 3, 4}) {
    // 50 samples on 3 threads: slices of 16, 17 and 17.
    ExpectSameAsOneThread(Mlp(), 20, 50, threads);
  }
}

TEST(ParallelModelTest, CnnGradientIsTheWholeBatchs) {
  ExpectSameAsOneThread(SmallCnn(/*batch_norm=*/false), 64, 33, 2);
  ExpectSameAsOneThread(SmallCnn(/*batch_norm=*/false), 64, 64, 3);
}

TEST(ParallelModelTest, SmallBatchesUseFewerThreads) {
  // Fewer than kMinSliceSamples per thread: one or two slices, still the
  // whole batch's gradient.
  ExpectSameAsOneThread(Mlp(), 20, 1, 4);
  ExpectSameAsOneThread(Mlp(), 20, static_cast<int>(kMinSliceSamples) + 1, 4);
}

// BatchNorm normalises each slice by its own statistics, and the running
// statistics are those of the first slice: the same as one model trained
// on the first half of the batch alone.
TEST(ParallelModelTest, BatchNormRunningStatisticsAreTheFirstSlices) {
  const pb::ModelConfig config = SmallCnn(/*batch_norm=*/true);
  std::unique_ptr<Model> first_half = Build(config, 64, 10);
  std::unique_ptr<Model> parallel = OnThreads(config, 64, 10, 2);
  ASSERT_NE(first_half, nullptr);
  ASSERT_NE(parallel, nullptr);
  std::vector<float> params(first_half->layout().num_elements());
  first_half->Initialize(5, params);
  std::vector<float> expected = params;
  std::vector<float> grad(params.size());
  const Batch batch = RandomBatch(64, 40, 10, 9);
  ASSERT_TRUE(std::isfinite(
      parallel->LossAndGradient(params, batch.features, batch.labels, grad)));
  parallel->ApplyStateUpdate(params);
  const std::vector<uint8_t> first_labels(batch.labels.begin(),
                                          batch.labels.begin() + 20);
  ASSERT_TRUE(std::isfinite(first_half->LossAndGradient(
      expected, batch.features.leftCols(20), first_labels, grad)));
  first_half->ApplyStateUpdate(expected);
  bool any_running = false;
  for (const TensorInfo& tensor : parallel->layout().tensors()) {
    if (tensor.name.find("running") == std::string::npos) continue;
    any_running = true;
    for (uint64_t i = tensor.offset; i < tensor.offset + tensor.size; ++i) {
      EXPECT_FLOAT_EQ(params[i], expected[i]) << tensor.name;
    }
  }
  EXPECT_TRUE(any_running);
}

TEST(ParallelModelTest, InvalidBatchIsNaNWithAZeroGradient) {
  std::unique_ptr<Model> parallel = OnThreads(Mlp(), 20, 10, 3);
  ASSERT_NE(parallel, nullptr);
  std::vector<float> params(parallel->layout().num_elements());
  parallel->Initialize(1, params);
  std::vector<float> grad(params.size(), 1.0f);
  const Batch batch = RandomBatch(20, 30, 10, 2);
  // One label short.
  const std::vector<uint8_t> labels(batch.labels.begin(),
                                    batch.labels.end() - 1);
  EXPECT_TRUE(std::isnan(
      parallel->LossAndGradient(params, batch.features, labels, grad)));
  EXPECT_TRUE(
      std::all_of(grad.begin(), grad.end(), [](float g) { return g == 0.0f; }));
  // Features of the wrong dimension.
  const Batch wrong = RandomBatch(21, 30, 10, 2);
  std::fill(grad.begin(), grad.end(), 1.0f);
  EXPECT_TRUE(std::isnan(
      parallel->LossAndGradient(params, wrong.features, wrong.labels, grad)));
  EXPECT_TRUE(
      std::all_of(grad.begin(), grad.end(), [](float g) { return g == 0.0f; }));
}

TEST(ParallelModelTest, EvaluationMatchesOneThread) {
  std::unique_ptr<Model> single = Build(Mlp(), 20, 10);
  std::unique_ptr<Model> parallel = OnThreads(Mlp(), 20, 10, 2);
  ASSERT_NE(parallel, nullptr);
  std::vector<float> params(single->layout().num_elements());
  single->Initialize(4, params);
  const Batch batch = RandomBatch(20, 100, 10, 8);
  Dataset data;
  data.features = batch.features;
  data.labels = batch.labels;
  const EvalResult a = single->Evaluate(params, data);
  const EvalResult b = parallel->Evaluate(params, data);
  EXPECT_DOUBLE_EQ(a.loss, b.loss);
  EXPECT_DOUBLE_EQ(a.accuracy, b.accuracy);
  EXPECT_EQ(b.samples, 100u);
}

TEST(ParallelModelTest, RefusesWhatItCannotSplit) {
  EXPECT_FALSE(MakeParallelModel({}).ok());
  // Replicas of different shapes.
  std::vector<std::unique_ptr<Model>> mixed;
  mixed.push_back(Build(Mlp(), 20, 10));
  mixed.push_back(Build(Mlp(), 21, 10));
  EXPECT_FALSE(MakeParallelModel(std::move(mixed)).ok());
  // Matrix factorisation: per-row steps, one thread.
  pb::ModelConfig mf;
  mf.set_kind(pb::MATRIX_FACTORIZATION);
  mf.set_rank(4);
  std::vector<std::unique_ptr<Model>> sparse;
  for (int i = 0; i < 2; ++i) {
    Result<std::unique_ptr<Model>> model = MakeMatrixFactorization(mf, 50, 40);
    ASSERT_OK(model);
    sparse.push_back(std::move(model).value());
  }
  const Result<std::unique_ptr<Model>> refused =
      MakeParallelModel(std::move(sparse));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("one thread"), std::string::npos)
      << refused.status();
  // One replica is the model itself, sparse or not.
  std::vector<std::unique_ptr<Model>> one;
  one.push_back(std::move(MakeMatrixFactorization(mf, 50, 40)).value());
  EXPECT_OK(MakeParallelModel(std::move(one)));
}

TEST(ParallelModelTest, JobModelOnThreadsChecksTheCount) {
  pb::JobConfig job;
  *job.mutable_model() = Mlp();
  EXPECT_OK(MakeJobModelOnThreads(job, 20, 10, 1));
  EXPECT_OK(MakeJobModelOnThreads(job, 20, 10, 3));
  EXPECT_FALSE(MakeJobModelOnThreads(job, 20, 10, 0).ok());
  EXPECT_FALSE(MakeJobModelOnThreads(job, 20, 10, kMaxWorkerThreads + 1).ok());
}

}  // namespace
}  // namespace meridian
