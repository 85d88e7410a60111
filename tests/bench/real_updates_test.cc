// RecordRealUpdates (bench/compression/real_updates.h): the updates
// compression_bench --job encodes are the job's real changes, split by
// tensor, and the significance filter's part of them.

#include "compression/real_updates.h"

#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <vector>

#include "meridian/train/local_training.h"
#include "meridian/train/model.h"
#include "testing/test_data.h"
#include "testing/status_matchers.h"

namespace meridian::bench {
namespace {

pb::JobConfig SmallMlpJob() {
  const std::string dir = testing::MakeTempDir("real-updates");
  testing::SyntheticDataOptions data;
  data.train_samples = 600;
  data.test_samples = 100;
  EXPECT_OK(testing::WriteSyntheticIdx(dir, data));
  return testing::SmallJob(dir, 1);
}

// The dense change an update describes.
std::vector<float> Dense(const ModelLayout& layout, const RealUpdate& update) {
  std::vector<float> out(layout.num_elements(), 0.0f);
  EXPECT_EQ(update.size(), layout.tensors().size());
  for (size_t t = 0; t < update.size(); ++t) {
    const TensorInfo& tensor = layout.tensors()[t];
    EXPECT_EQ(update[t].size, tensor.size) << tensor.name;
    EXPECT_EQ(update[t].indices.size(), update[t].values.size());
    for (size_t j = 0; j < update[t].indices.size(); ++j) {
      if (j > 0) {
        EXPECT_LT(update[t].indices[j - 1], update[t].indices[j]);
      }
      EXPECT_LT(update[t].indices[j], tensor.size);
      out[tensor.offset + update[t].indices[j]] = update[t].values[j];
    }
  }
  return out;
}

TEST(RealUpdatesTest, CommitsAreTheModelsChangeOverTheirSteps) {
  const pb::JobConfig job = SmallMlpJob();
  RealUpdateOptions options;
  options.warmup_steps = 10;
  options.updates = 4;
  options.steps_per_update = 3;
  Result<RealUpdates> recorded = RecordRealUpdates(job, options);
  ASSERT_OK(recorded);
  ASSERT_EQ(recorded->commits.size(), 4u);
  ASSERT_EQ(recorded->significant.size(), 4u);
  EXPECT_EQ(recorded->steps_per_update, 3u);

  // The parameters after steps 10 and 22 of the same (deterministic) loop.
  std::vector<float> at_10, at_22;
  ASSERT_TRUE(TrainLocally(job, 22 * job.optimizer().batch_size(), 1,
                           [&](uint64_t step, const Model&,
                               std::span<const float> params) {
                             if (step == 10)
                               at_10.assign(params.begin(), params.end());
                             if (step == 22)
                               at_22.assign(params.begin(), params.end());
                             return step < 22;
                           })
                  .ok());
  ASSERT_EQ(at_22.size(), recorded->layout.num_elements());
  std::vector<float> sum(at_22.size(), 0.0f);
  for (const RealUpdate& commit : recorded->commits) {
    const std::vector<float> dense = Dense(recorded->layout, commit);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += dense[i];
  }
  double worst = 0;
  for (size_t i = 0; i < sum.size(); ++i) {
    worst = std::max<double>(worst, std::fabs(sum[i] - (at_22[i] - at_10[i])));
  }
  EXPECT_LT(worst, 1e-5);
  // A dense model changes nearly everywhere; the filter at 0.05 takes part.
  const uint64_t n = recorded->layout.num_elements();
  EXPECT_GT(RealUpdates::Density(recorded->commits, n), 0.5);
  const double significant = RealUpdates::Density(recorded->significant, n);
  EXPECT_GT(significant, 0.0);
  EXPECT_LT(significant, RealUpdates::Density(recorded->commits, n));
}

TEST(RealUpdatesTest, TheFilterTakesEverythingAtZeroAndNothingAtInfinity) {
  const pb::JobConfig job = SmallMlpJob();
  RealUpdateOptions options;
  options.warmup_steps = 5;
  options.updates = 3;
  options.steps_per_update = 2;
  options.theta = 0;  // a flush every update: exactly the commits
  Result<RealUpdates> flush = RecordRealUpdates(job, options);
  ASSERT_OK(flush);
  for (size_t u = 0; u < flush->commits.size(); ++u) {
    EXPECT_EQ(Dense(flush->layout, flush->significant[u]),
              Dense(flush->layout, flush->commits[u]));
  }
  options.theta = 1e30;
  Result<RealUpdates> none = RecordRealUpdates(job, options);
  ASSERT_OK(none);
  EXPECT_EQ(
      RealUpdates::Density(none->significant, none->layout.num_elements()),
      0.0);
  options.updates = 0;
  EXPECT_FALSE(RecordRealUpdates(job, options).ok());
}

// Matrix factorisation changes only the rows of its batches' users and
// items: its commits are sparse.
TEST(RealUpdatesTest, MatrixFactorisationCommitsTouchOnlyTheirRows) {
  pb::JobConfig job;
  job.set_seed(3);
  job.mutable_model()->set_kind(pb::MATRIX_FACTORIZATION);
  job.mutable_model()->set_rank(4);
  pb::RatingsConfig* ratings = job.mutable_data()->mutable_ratings();
  ratings->set_users(2000);
  ratings->set_items(500);
  ratings->set_rank(3);
  ratings->set_ratings(20000);
  job.mutable_optimizer()->set_learning_rate(0.03);
  job.mutable_optimizer()->set_momentum(0);
  job.mutable_optimizer()->set_batch_size(20);
  RealUpdateOptions options;
  options.warmup_steps = 3;
  options.updates = 2;
  options.steps_per_update = 2;
  Result<RealUpdates> recorded = RecordRealUpdates(job, options);
  ASSERT_OK(recorded);
  // 2 steps x 20 ratings touch at most 40 users and 40 items: (4 + 1)
  // values each, of 2,500 x 5.
  const double density =
      RealUpdates::Density(recorded->commits, recorded->layout.num_elements());
  EXPECT_GT(density, 0.0);
  EXPECT_LE(density, 80.0 * 5 / (2500.0 * 5));
}

}  // namespace
}  // namespace meridian::bench
