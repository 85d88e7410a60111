// RestartPolicy on virtual time: the restart limit of `meridian run` counts
// the failures of a child that keeps failing; a process that ran healthy
// for kHealthyPeriodS before it failed starts the count and the backoff
// again.
#include <gtest/gtest.h>

#include <cstdint>

#include "launch/supervisor.h"

namespace meridian {
namespace {

// One failure and the restart that follows it, as the supervisor runs
// them: the process failed at `t`, is started again after its backoff and
// is up at once. Returns whether the restart was allowed.
bool FailAndRestart(RestartPolicy& policy, double& t) {
  policy.Failed(t);
  if (!policy.CanRestart()) return false;
  t += policy.NextBackoffS();
  policy.Restarted();
  policy.Up(t);
  return true;
}

TEST(RestartPolicyTest, LimitIsReachedAfterMaxRestartsQuickFailures) {
  RestartPolicy policy(/*max_restarts=*/3, /*first_backoff_s=*/1);
  double t = 0;
  policy.Up(t);
  for (uint32_t restart = 1; restart <= 3; ++restart) {
    t += 5;  // up 5 s each time: far from healthy
    ASSERT_TRUE(FailAndRestart(policy, t)) << "restart " << restart;
    EXPECT_EQ(policy.restarts(), restart);
  }
  t += 5;
  EXPECT_FALSE(policy.Failed(t));  // no reset
  EXPECT_FALSE(policy.CanRestart());
  EXPECT_EQ(policy.restarts(), 3u);
  EXPECT_DOUBLE_EQ(policy.last_up_s(), 5);
}

TEST(RestartPolicyTest, NoRestartsAtAllWithALimitOfZero) {
  RestartPolicy policy(/*max_restarts=*/0, /*first_backoff_s=*/1);
  policy.Up(0);
  EXPECT_FALSE(policy.Failed(1000));
  EXPECT_FALSE(policy.CanRestart());
  EXPECT_FALSE(RestartPolicy().CanRestart());
}

TEST(RestartPolicyTest, HealthyRunResetsTheCountAndTheBackoff) {
  RestartPolicy policy(/*max_restarts=*/2, /*first_backoff_s=*/1);
  double t = 0;
  policy.Up(t);
  t += 1;
  ASSERT_TRUE(FailAndRestart(policy, t));
  t += 1;
  ASSERT_TRUE(FailAndRestart(policy, t));
  ASSERT_EQ(policy.restarts(), 2u);
  EXPECT_DOUBLE_EQ(policy.NextBackoffS(), 4);

  // Up a full healthy period, then fails: restart 1 again, first backoff.
  t += kHealthyPeriodS;
  EXPECT_TRUE(policy.Failed(t));
  EXPECT_DOUBLE_EQ(policy.last_up_s(), kHealthyPeriodS);
  EXPECT_EQ(policy.restarts(), 0u);
  EXPECT_TRUE(policy.CanRestart());
  EXPECT_EQ(policy.next_restart(), 1u);
  EXPECT_DOUBLE_EQ(policy.NextBackoffS(), 1);
  t += policy.NextBackoffS();
  policy.Restarted();
  policy.Up(t);

  // The new count: two more quick failures reach the limit again.
  t += 1;
  ASSERT_TRUE(FailAndRestart(policy, t));
  EXPECT_EQ(policy.restarts(), 2u);
  t += 1;
  policy.Failed(t);
  EXPECT_FALSE(policy.CanRestart());
}

TEST(RestartPolicyTest, JustUnderTheHealthyPeriodDoesNotReset) {
  RestartPolicy policy(/*max_restarts=*/1, /*first_backoff_s=*/1,
                       /*healthy_period_s=*/60);
  double t = 0;
  policy.Up(t);
  t += 10;
  ASSERT_TRUE(FailAndRestart(policy, t));
  t += 59.9;
  EXPECT_FALSE(policy.Failed(t));
  EXPECT_FALSE(policy.CanRestart());
}

TEST(RestartPolicyTest, TimeNotUpDoesNotCountAsHealthy) {
  RestartPolicy policy(/*max_restarts=*/1, /*first_backoff_s=*/1);
  double t = 0;
  policy.Up(t);
  t += 1;
  policy.Failed(t);
  ASSERT_TRUE(policy.CanRestart());
  policy.Restarted();
  // The new process never comes up (no ready line) for a long time, then
  // its start fails: that is no healthy run.
  t += 10 * kHealthyPeriodS;
  EXPECT_FALSE(policy.Failed(t));
  EXPECT_DOUBLE_EQ(policy.last_up_s(), 0);
  EXPECT_FALSE(policy.CanRestart());
}

TEST(RestartPolicyTest, BackoffDoublesPerRestartUpToTheCeiling) {
  RestartPolicy policy(/*max_restarts=*/100, /*first_backoff_s=*/1);
  double t = 0;
  policy.Up(t);
  const double expected[] = {1, 2, 4, 8, 16, 30, 30, 30};
  for (double backoff : expected) {
    t += 1;
    policy.Failed(t);
    EXPECT_DOUBLE_EQ(policy.NextBackoffS(), backoff)
        << "restart " << policy.next_restart();
    EXPECT_LE(policy.NextBackoffS(), kMaxBackoffS);
    t += policy.NextBackoffS();
    policy.Restarted();
    policy.Up(t);
  }
  EXPECT_EQ(policy.restarts(), 8u);
}

TEST(RestartPolicyTest, AStartRefusedForItsPortDoesNotCount) {
  RestartPolicy policy(/*max_restarts=*/1, /*first_backoff_s=*/1);
  policy.Up(0);
  policy.Failed(1);
  policy.Restarted();
  policy.Uncount();  // address in use: tried again without counting
  EXPECT_EQ(policy.restarts(), 0u);
  EXPECT_TRUE(policy.CanRestart());
  policy.Restarted();
  EXPECT_EQ(policy.restarts(), 1u);
  policy.Uncount();
  policy.Uncount();  // never below 0
  EXPECT_EQ(policy.restarts(), 0u);
}

}  // namespace
}  // namespace meridian
