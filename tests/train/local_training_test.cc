// TrainLocally, the single-process reference of a job (`meridian local`).

#include "meridian/train/local_training.h"

#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <vector>

#include "meridian/job.pb.h"
#include "meridian/train/model.h"
#include "testing/test_data.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

pb::JobConfig SmallMatrixFactorizationJob() {
  pb::JobConfig job;
  job.set_seed(3);
  pb::ModelConfig* model = job.mutable_model();
  model->set_kind(pb::MATRIX_FACTORIZATION);
  model->set_rank(4);
  pb::RatingsConfig* ratings = job.mutable_data()->mutable_ratings();
  ratings->set_users(400);
  ratings->set_items(100);
  ratings->set_rank(3);
  ratings->set_ratings(10000);
  ratings->set_noise_stddev(0.3);
  job.mutable_optimizer()->set_learning_rate(0.03);
  job.mutable_optimizer()->set_momentum(0);
  job.mutable_optimizer()->set_batch_size(50);
  return job;
}

TEST(TrainLocallyTest, TrainsTheJobsModelForTheAskedSamples) {
  const pb::JobConfig job = SmallMatrixFactorizationJob();
  Result<LocalTrainingResult> none = TrainLocally(job, 1);
  ASSERT_OK(none);
  EXPECT_EQ(none->steps, 1u);  // whole batches
  EXPECT_EQ(none->samples, 50u);
  Result<LocalTrainingResult> trained = TrainLocally(job, 400000);
  ASSERT_OK(trained);
  EXPECT_EQ(trained->steps, 8000u);
  EXPECT_EQ(trained->test.samples, 1000u);  // the 10% held out
  EXPECT_LT(trained->test.metric, none->test.metric - 0.2)
      << "from " << none->test.metric;
  // Deterministic in the job's seed.
  Result<LocalTrainingResult> again = TrainLocally(job, 400000);
  ASSERT_OK(again);
  EXPECT_EQ(again->test.metric, trained->test.metric);
}

// On two threads the MLP's step is the batch's (the slices' gradients
// weighted by their samples), so the same samples end at the same model up
// to float summation order; matrix factorisation refuses threads.
TEST(TrainLocallyTest, ThreadsTrainTheSameModel) {
  const std::string dir = testing::MakeTempDir("local-threads");
  testing::SyntheticDataOptions options;
  options.train_samples = 600;
  options.test_samples = 200;
  ASSERT_OK(testing::WriteSyntheticIdx(dir, options));
  const pb::JobConfig job = testing::SmallJob(dir, 1);
  Result<LocalTrainingResult> one = TrainLocally(job, 3200, 1);
  Result<LocalTrainingResult> two = TrainLocally(job, 3200, 2);
  ASSERT_OK(one);
  ASSERT_OK(two);
  EXPECT_EQ(one->steps, two->steps);
  EXPECT_NEAR(one->test.loss, two->test.loss, 1e-3 * one->test.loss + 1e-4);
  EXPECT_NEAR(one->test.accuracy, two->test.accuracy, 0.011);
  Result<LocalTrainingResult> mf =
      TrainLocally(SmallMatrixFactorizationJob(), 100, 2);
  ASSERT_FALSE(mf.ok());
  EXPECT_NE(mf.status().message().find("thread"), std::string::npos)
      << mf.status();
}

TEST(TrainLocallyTest, ReportsDivergenceAndBadDataAsErrors) {
  pb::JobConfig job = SmallMatrixFactorizationJob();
  job.mutable_optimizer()->set_learning_rate(50);
  Result<LocalTrainingResult> diverged = TrainLocally(job, 400000);
  ASSERT_FALSE(diverged.ok());
  EXPECT_NE(diverged.status().message().find("diverged"), std::string::npos)
      << diverged.status();
  job = SmallMatrixFactorizationJob();
  job.mutable_data()->mutable_ratings()->set_ratings(1);
  EXPECT_FALSE(TrainLocally(job, 100).ok());
}

// The observer sees every step in order, with the model and its
// parameters, and a false return ends training after that step.
TEST(TrainLocallyTest, TheStepObserverSeesEveryStepAndCanStop) {
  const pb::JobConfig job = SmallMatrixFactorizationJob();
  std::vector<uint64_t> steps;
  std::vector<float> last;
  Result<LocalTrainingResult> trained = TrainLocally(
      job, 400000, 1,
      [&](uint64_t step, const Model& model, std::span<const float> params) {
        EXPECT_EQ(params.size(), model.layout().num_elements());
        steps.push_back(step);
        last.assign(params.begin(), params.end());
        return step < 7;
      });
  ASSERT_OK(trained);
  EXPECT_EQ(trained->steps, 7u);
  EXPECT_EQ(steps, (std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7}));
  // The last call saw the model the result evaluates: trained past init.
  Result<LocalTrainingResult> seven = TrainLocally(job, 7 * 50);
  ASSERT_OK(seven);
  EXPECT_EQ(trained->test.metric, seven->test.metric);
  EXPECT_FALSE(last.empty());
}

}  // namespace
}  // namespace meridian
