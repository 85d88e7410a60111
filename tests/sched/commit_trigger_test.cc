#include <gtest/gtest.h>

#include <vector>

#include "meridian/core/clock.h"
#include "meridian/sched/policy.h"

namespace meridian {
namespace {

pb::CommitPlan Plan(uint32_t local_steps, double interval_s) {
  pb::CommitPlan plan;
  plan.set_local_steps(local_steps);
  plan.set_interval_s(interval_s);
  return plan;
}

// Runs `steps` steps of `step_s` virtual seconds each and returns the
// (1-based) steps at which the trigger fired, resetting it after each
// commit as the worker does when the reply arrives.
std::vector<int> CommitSteps(CommitTrigger& trigger, ManualClock& clock,
                             const pb::CommitPlan& plan, int steps,
                             double step_s) {
  std::vector<int> fired;
  for (int step = 1; step <= steps; ++step) {
    clock.AdvanceSeconds(step_s);
    if (trigger.OnStep(clock.Now())) {
      fired.push_back(step);
      trigger.Reset(plan, clock.Now());
    }
  }
  return fired;
}

TEST(CommitTriggerTest, StepDrivenCommitsOnNthStep) {
  ManualClock clock;
  CommitTrigger trigger;
  const pb::CommitPlan plan = Plan(3, 0);
  trigger.Reset(plan, clock.Now());
  EXPECT_EQ(trigger.steps_since_commit(), 0u);

  clock.AdvanceSeconds(100);  // time alone never triggers a step plan
  EXPECT_FALSE(trigger.OnStep(clock.Now()));
  EXPECT_EQ(trigger.steps_since_commit(), 1u);
  EXPECT_FALSE(trigger.OnStep(clock.Now()));
  EXPECT_EQ(trigger.steps_since_commit(), 2u);
  EXPECT_TRUE(trigger.OnStep(clock.Now()));
  EXPECT_EQ(trigger.steps_since_commit(), 3u);

  trigger.Reset(plan, clock.Now());
  EXPECT_EQ(CommitSteps(trigger, clock, plan, 10, 50.0),
            (std::vector<int>{3, 6, 9}));
}

TEST(CommitTriggerTest, OneStepPlanCommitsEveryStep) {
  ManualClock clock;
  CommitTrigger trigger;
  const pb::CommitPlan plan = Plan(1, 0);
  trigger.Reset(plan, clock.Now());
  EXPECT_EQ(CommitSteps(trigger, clock, plan, 4, 0.0),
            (std::vector<int>{1, 2, 3, 4}));
}

TEST(CommitTriggerTest, TimeDrivenOnVirtualTime) {
  ManualClock clock;
  CommitTrigger trigger;
  const pb::CommitPlan plan = Plan(0, 2.0);
  clock.AdvanceSeconds(10);  // the plan arrives at t = 10 s
  trigger.Reset(plan, clock.Now());

  clock.AdvanceSeconds(1.5);
  EXPECT_FALSE(trigger.OnStep(clock.Now()));
  clock.AdvanceSeconds(0.25);
  EXPECT_FALSE(trigger.OnStep(clock.Now()));  // 1.75 s since the reset
  clock.AdvanceSeconds(0.25);
  EXPECT_TRUE(trigger.OnStep(clock.Now()));  // exactly 2 s: commit
  EXPECT_EQ(trigger.steps_since_commit(), 3u);

  // Steps of 0.5 s: every 4th step reaches the 2 s interval.
  trigger.Reset(plan, clock.Now());
  EXPECT_EQ(CommitSteps(trigger, clock, plan, 12, 0.5),
            (std::vector<int>{4, 8, 12}));
  // Steps of 0.75 s: 3 steps (2.25 s) per commit.
  trigger.Reset(plan, clock.Now());
  EXPECT_EQ(CommitSteps(trigger, clock, plan, 9, 0.75),
            (std::vector<int>{3, 6, 9}));
}

TEST(CommitTriggerTest, BothSetFirstToTriggerWins) {
  ManualClock clock;
  CommitTrigger trigger;
  const pb::CommitPlan plan = Plan(4, 1.0);

  // Fast steps (0.125 s): the step count wins.
  trigger.Reset(plan, clock.Now());
  EXPECT_EQ(CommitSteps(trigger, clock, plan, 8, 0.125),
            (std::vector<int>{4, 8}));

  // Slow steps (0.5 s): the interval wins after 2 steps.
  trigger.Reset(plan, clock.Now());
  EXPECT_EQ(CommitSteps(trigger, clock, plan, 6, 0.5),
            (std::vector<int>{2, 4, 6}));

  // Mixed: time passes without steps, then one step triggers by time.
  trigger.Reset(plan, clock.Now());
  EXPECT_FALSE(trigger.OnStep(clock.Now()));
  clock.AdvanceSeconds(1.0);
  EXPECT_TRUE(trigger.OnStep(clock.Now()));
  EXPECT_EQ(trigger.steps_since_commit(), 2u);
}

TEST(CommitTriggerTest, PlanWithNeitherTriggerCommitsEveryStep) {
  ManualClock clock;
  CommitTrigger trigger;
  const pb::CommitPlan plan = Plan(0, 0);
  trigger.Reset(plan, clock.Now());
  EXPECT_TRUE(trigger.OnStep(clock.Now()));
  EXPECT_TRUE(trigger.OnStep(clock.Now()));  // even without a Reset
  trigger.Reset(plan, clock.Now());
  EXPECT_EQ(CommitSteps(trigger, clock, plan, 3, 1.0),
            (std::vector<int>{1, 2, 3}));
  // A negative interval counts as unset.
  const pb::CommitPlan negative = Plan(0, -1.0);
  trigger.Reset(negative, clock.Now());
  EXPECT_TRUE(trigger.OnStep(clock.Now()));
}

TEST(CommitTriggerTest, DefaultPlanCommitsEveryStep) {
  // pb::CommitPlan defaults: local_steps 1, interval 0.
  ManualClock clock;
  CommitTrigger trigger;
  EXPECT_TRUE(trigger.OnStep(clock.Now()));
  trigger.Reset(pb::CommitPlan(), clock.Now());
  EXPECT_TRUE(trigger.OnStep(clock.Now()));
}

TEST(CommitTriggerTest, ResetRestartsCounting) {
  ManualClock clock;
  CommitTrigger trigger;
  const pb::CommitPlan plan = Plan(3, 10.0);
  trigger.Reset(plan, clock.Now());
  clock.AdvanceSeconds(9);
  EXPECT_FALSE(trigger.OnStep(clock.Now()));
  EXPECT_FALSE(trigger.OnStep(clock.Now()));
  EXPECT_EQ(trigger.steps_since_commit(), 2u);

  // Reset before either trigger: steps and time count from here.
  trigger.Reset(plan, clock.Now());
  EXPECT_EQ(trigger.steps_since_commit(), 0u);
  clock.AdvanceSeconds(9);  // 18 s since the first reset, 9 since this one
  EXPECT_FALSE(trigger.OnStep(clock.Now()));
  EXPECT_FALSE(trigger.OnStep(clock.Now()));
  EXPECT_TRUE(trigger.OnStep(clock.Now()));

  // A new plan replaces the old one.
  trigger.Reset(Plan(1, 0), clock.Now());
  EXPECT_TRUE(trigger.OnStep(clock.Now()));
}

}  // namespace
}  // namespace meridian
