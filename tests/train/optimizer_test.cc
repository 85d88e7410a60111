#include "meridian/train/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace meridian {
namespace {

TEST(LearningRateTest, DefaultsAreConstant) {
  const pb::OptimizerConfig config;
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 0), 0.05);
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 123456), 0.05);
}

TEST(LearningRateTest, Constant) {
  pb::OptimizerConfig config;
  config.set_schedule(pb::CONSTANT);
  config.set_learning_rate(0.3);
  for (uint64_t step : {0ull, 1ull, 999ull, 1000ull, 1000000ull}) {
    EXPECT_DOUBLE_EQ(LearningRateAt(config, step), 0.3);
  }
}

TEST(LearningRateTest, StepDecaysEveryStepSize) {
  pb::OptimizerConfig config;
  config.set_schedule(pb::STEP);
  config.set_learning_rate(0.1);
  config.set_gamma(0.5);
  config.set_step_size(10);
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 0), 0.1);
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 9), 0.1);
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 10), 0.05);
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 19), 0.05);
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 25), 0.025);
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 100), 0.1 / 1024);
}

TEST(LearningRateTest, InverseSqrt) {
  pb::OptimizerConfig config;
  config.set_schedule(pb::INVERSE_SQRT);
  config.set_learning_rate(0.2);
  config.set_step_size(100);
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 0), 0.2);
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 50), 0.2 / std::sqrt(1.5));
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 100), 0.2 / std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 300), 0.1);
}

TEST(SgdOptimizerTest, MomentumAndWeightDecayByHand) {
  pb::OptimizerConfig config;
  config.set_learning_rate(0.1);
  config.set_momentum(0.9);
  config.set_weight_decay(0.01);
  SgdOptimizer optimizer(config, 3);
  std::vector<float> p = {1.0f, -2.0f, 0.5f};

  // Step 1: g' = g + 0.01 p = {0.11, 0.18, -0.295}; v = g';
  // p -= 0.1 v = {0.989, -2.018, 0.5295}.
  optimizer.Step(p, std::vector<float>{0.1f, 0.2f, -0.3f});
  EXPECT_NEAR(p[0], 0.989f, 1e-6);
  EXPECT_NEAR(p[1], -2.018f, 1e-6);
  EXPECT_NEAR(p[2], 0.5295f, 1e-6);

  // Step 2, zero gradient: g' = 0.01 p = {0.00989, -0.02018, 0.005295};
  // v = 0.9 {0.11, 0.18, -0.295} + g' = {0.10889, 0.14182, -0.260205};
  // p -= 0.1 v = {0.978111, -2.032182, 0.5555205}.
  optimizer.Step(p, std::vector<float>{0.0f, 0.0f, 0.0f});
  EXPECT_NEAR(p[0], 0.978111f, 1e-6);
  EXPECT_NEAR(p[1], -2.032182f, 1e-6);
  EXPECT_NEAR(p[2], 0.5555205f, 1e-6);
  EXPECT_EQ(optimizer.steps(), 2u);
}

TEST(SgdOptimizerTest, PlainSgdWithoutMomentum) {
  pb::OptimizerConfig config;
  config.set_learning_rate(0.5);
  config.set_momentum(0);
  SgdOptimizer optimizer(config, 2);
  std::vector<float> p = {1.0f, 2.0f};
  optimizer.Step(p, std::vector<float>{1.0f, -1.0f});
  EXPECT_FLOAT_EQ(p[0], 0.5f);
  EXPECT_FLOAT_EQ(p[1], 2.5f);
  optimizer.Step(p, std::vector<float>{1.0f, -1.0f});
  EXPECT_FLOAT_EQ(p[0], 0.0f);
  EXPECT_FLOAT_EQ(p[1], 3.0f);
}

TEST(SgdOptimizerTest, FollowsTheSchedule) {
  pb::OptimizerConfig config;
  config.set_learning_rate(1.0);
  config.set_momentum(0);
  config.set_schedule(pb::STEP);
  config.set_step_size(2);
  config.set_gamma(0.1);
  SgdOptimizer optimizer(config, 1);
  std::vector<float> p = {0.0f};
  const std::vector<float> g = {1.0f};
  EXPECT_DOUBLE_EQ(optimizer.current_learning_rate(), 1.0);
  optimizer.Step(p, g);  // lr 1
  optimizer.Step(p, g);  // lr 1
  EXPECT_DOUBLE_EQ(optimizer.current_learning_rate(), 0.1);
  optimizer.Step(p, g);  // lr 0.1
  EXPECT_FLOAT_EQ(p[0], -2.1f);
  EXPECT_EQ(optimizer.steps(), 3u);
}

TEST(SgdOptimizerTest, RefusesMismatchedSizes) {
  SgdOptimizer optimizer(pb::OptimizerConfig(), 3);
  std::vector<float> p = {1.0f, 2.0f};
  optimizer.Step(p, std::vector<float>{1.0f, 1.0f});
  EXPECT_EQ(p, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(optimizer.steps(), 0u);
}

}  // namespace
}  // namespace meridian
