#include "meridian/sched/policy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "meridian/core/clock.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

using Update = PolicyDecision::Update;
using Workers = std::vector<uint32_t>;

std::unique_ptr<IntraSitePolicy> Make(pb::PolicyKind kind,
                                      uint32_t local_steps = 1) {
  pb::PolicyConfig config;
  config.set_kind(kind);
  config.set_local_steps(local_steps);
  Result<std::unique_ptr<IntraSitePolicy>> policy = MakePolicy(config);
  EXPECT_OK(policy);
  return policy.ok() ? std::move(policy).value() : nullptr;
}

class PolicyTest : public ::testing::Test {
 protected:
  CommitEvent Commit(uint32_t worker, uint64_t version = 0) {
    CommitEvent event;
    event.worker = worker;
    event.base_version = version;
    event.current_version = version;
    event.local_steps = 1;
    event.now = clock_.Now();
    return event;
  }

  ManualClock clock_;
};

// ---------------------------------------------------------------------------
// MakePolicy

TEST(MakePolicyTest, BuildsEachKind) {
  pb::PolicyConfig config;
  config.set_kind(pb::BSP);
  Result<std::unique_ptr<IntraSitePolicy>> bsp = MakePolicy(config);
  ASSERT_OK(bsp);
  ASSERT_NE(*bsp, nullptr);
  EXPECT_EQ((*bsp)->name(), "bsp");

  config.set_kind(pb::ASYNC);
  Result<std::unique_ptr<IntraSitePolicy>> async = MakePolicy(config);
  ASSERT_OK(async);
  ASSERT_NE(*async, nullptr);
  EXPECT_EQ((*async)->name(), "async");

  // The documented default kind is ASYNC.
  Result<std::unique_ptr<IntraSitePolicy>> by_default =
      MakePolicy(pb::PolicyConfig());
  ASSERT_OK(by_default);
  EXPECT_EQ((*by_default)->name(), "async");
}

TEST(MakePolicyTest, RejectsUnspecifiedKind) {
  pb::PolicyConfig config;
  config.set_kind(pb::POLICY_KIND_UNSPECIFIED);
  const Result<std::unique_ptr<IntraSitePolicy>> policy = MakePolicy(config);
  ASSERT_FALSE(policy.ok());
  EXPECT_EQ(policy.status().code(), StatusCode::kInvalidArgument);
}

TEST(MakePolicyTest, PlanCarriesLocalSteps) {
  for (const pb::PolicyKind kind : {pb::BSP, pb::ASYNC}) {
    std::unique_ptr<IntraSitePolicy> policy = Make(kind, 5);
    ASSERT_NE(policy, nullptr);
    policy->Start(2, Duration(0));
    const pb::CommitPlan plan = policy->PlanFor(1);
    EXPECT_EQ(plan.local_steps(), 5u) << pb::PolicyKind_Name(kind);
    EXPECT_EQ(plan.interval_s(), 0.0) << pb::PolicyKind_Name(kind);

    // 0 local steps would never commit: at least one.
    policy = Make(kind, 0);
    ASSERT_NE(policy, nullptr);
    policy->Start(2, Duration(0));
    EXPECT_EQ(policy->PlanFor(0).local_steps(), 1u)
        << pb::PolicyKind_Name(kind);
  }
}

// ---------------------------------------------------------------------------
// BSP

TEST_F(PolicyTest, BspAggregatesUntilEveryWorkerCommitted) {
  std::unique_ptr<IntraSitePolicy> bsp = Make(pb::BSP);
  ASSERT_NE(bsp, nullptr);
  bsp->Start(3, clock_.Now());
  EXPECT_EQ(bsp->clock(), 0u);

  clock_.AdvanceSeconds(1);
  PolicyDecision d = bsp->OnCommit(Commit(0));
  EXPECT_EQ(d.update, Update::kAggregate);
  EXPECT_FALSE(d.flush_aggregate);
  EXPECT_TRUE(d.release.empty());

  clock_.AdvanceSeconds(1);
  d = bsp->OnCommit(Commit(1));
  EXPECT_EQ(d.update, Update::kAggregate);
  EXPECT_FALSE(d.flush_aggregate);
  EXPECT_TRUE(d.release.empty());
  EXPECT_EQ(bsp->clock(), 0u);

  clock_.AdvanceSeconds(1);
  d = bsp->OnCommit(Commit(2));
  EXPECT_EQ(d.update, Update::kAggregate);
  EXPECT_TRUE(d.flush_aggregate);
  EXPECT_EQ(d.release, (Workers{0, 1, 2}));
  EXPECT_EQ(bsp->clock(), 1u);

  // The next clock works the same, in any order.
  d = bsp->OnCommit(Commit(2, 1));
  EXPECT_EQ(d.update, Update::kAggregate);
  EXPECT_TRUE(d.release.empty());
  d = bsp->OnCommit(Commit(0, 1));
  EXPECT_TRUE(d.release.empty());
  EXPECT_FALSE(d.flush_aggregate);
  d = bsp->OnCommit(Commit(1, 1));
  EXPECT_TRUE(d.flush_aggregate);
  EXPECT_EQ(d.release, (Workers{0, 1, 2}));
  EXPECT_EQ(bsp->clock(), 2u);
}

TEST_F(PolicyTest, BspRejectsSecondCommitInAClock) {
  std::unique_ptr<IntraSitePolicy> bsp = Make(pb::BSP);
  ASSERT_NE(bsp, nullptr);
  bsp->Start(3, clock_.Now());
  EXPECT_EQ(bsp->OnCommit(Commit(1)).update, Update::kAggregate);

  const PolicyDecision again = bsp->OnCommit(Commit(1));
  EXPECT_EQ(again.update, Update::kReject);
  EXPECT_FALSE(again.reject_reason.empty());
  EXPECT_FALSE(again.flush_aggregate);
  EXPECT_TRUE(again.release.empty());

  // The rejected commit did not count: the barrier still needs 0 and 2.
  EXPECT_TRUE(bsp->OnCommit(Commit(0)).release.empty());
  const PolicyDecision last = bsp->OnCommit(Commit(2));
  EXPECT_TRUE(last.flush_aggregate);
  EXPECT_EQ(last.release, (Workers{0, 1, 2}));
  EXPECT_EQ(bsp->clock(), 1u);

  // In the new clock worker 1 may commit again.
  EXPECT_EQ(bsp->OnCommit(Commit(1, 1)).update, Update::kAggregate);
}

TEST_F(PolicyTest, BspRejectsUnknownWorker) {
  std::unique_ptr<IntraSitePolicy> bsp = Make(pb::BSP);
  ASSERT_NE(bsp, nullptr);
  bsp->Start(2, clock_.Now());
  const PolicyDecision d = bsp->OnCommit(Commit(2));
  EXPECT_EQ(d.update, Update::kReject);
  EXPECT_TRUE(d.release.empty());
  EXPECT_FALSE(d.flush_aggregate);
}

TEST_F(PolicyTest, BspLeaveOfMissingWorkerClosesTheClock) {
  std::unique_ptr<IntraSitePolicy> bsp = Make(pb::BSP);
  ASSERT_NE(bsp, nullptr);
  bsp->Start(3, clock_.Now());
  EXPECT_TRUE(bsp->OnCommit(Commit(0)).release.empty());
  EXPECT_TRUE(bsp->OnCommit(Commit(2)).release.empty());

  clock_.AdvanceSeconds(5);
  const PolicyDecision d = bsp->OnLeave(1, clock_.Now());
  EXPECT_TRUE(d.flush_aggregate);
  EXPECT_EQ(d.release, (Workers{0, 2}));
  EXPECT_EQ(bsp->clock(), 1u);

  // From now on the barrier is the two remaining workers; the departed one
  // cannot commit any more.
  EXPECT_EQ(bsp->OnCommit(Commit(1, 1)).update, Update::kReject);
  EXPECT_TRUE(bsp->OnCommit(Commit(2, 1)).release.empty());
  const PolicyDecision next = bsp->OnCommit(Commit(0, 1));
  EXPECT_TRUE(next.flush_aggregate);
  EXPECT_EQ(next.release, (Workers{0, 2}));
  EXPECT_EQ(bsp->clock(), 2u);
}

TEST_F(PolicyTest, BspLeaveWithNothingPendingDoesNotAdvance) {
  std::unique_ptr<IntraSitePolicy> bsp = Make(pb::BSP);
  ASSERT_NE(bsp, nullptr);
  bsp->Start(3, clock_.Now());
  const PolicyDecision d = bsp->OnLeave(0, clock_.Now());
  EXPECT_FALSE(d.flush_aggregate);
  EXPECT_TRUE(d.release.empty());
  EXPECT_EQ(bsp->clock(), 0u);
  // A leave of a worker that already committed: its update stays in the
  // aggregate, but it is not released.
  EXPECT_TRUE(bsp->OnCommit(Commit(1)).release.empty());
  EXPECT_FALSE(bsp->OnLeave(1, clock_.Now()).flush_aggregate);
  const PolicyDecision last = bsp->OnCommit(Commit(2));
  EXPECT_TRUE(last.flush_aggregate);
  EXPECT_EQ(last.release, (Workers{2}));
  EXPECT_EQ(bsp->clock(), 1u);
}

TEST_F(PolicyTest, BspReleasesPullAtOnce) {
  std::unique_ptr<IntraSitePolicy> bsp = Make(pb::BSP);
  ASSERT_NE(bsp, nullptr);
  bsp->Start(3, clock_.Now());
  EXPECT_TRUE(bsp->OnCommit(Commit(0)).release.empty());
  const PolicyDecision d = bsp->OnPull(1, clock_.Now());
  EXPECT_EQ(d.release, (Workers{1}));
  EXPECT_FALSE(d.flush_aggregate);
  EXPECT_EQ(bsp->clock(), 0u);
}

// ---------------------------------------------------------------------------
// ASYNC

TEST_F(PolicyTest, AsyncAppliesAndReleasesEveryCommitAtOnce) {
  std::unique_ptr<IntraSitePolicy> async = Make(pb::ASYNC);
  ASSERT_NE(async, nullptr);
  async->Start(3, clock_.Now());
  const uint32_t order[] = {0, 0, 2, 1, 0, 2, 2, 2};
  const uint64_t clocks[] = {0, 0, 1, 1, 1, 2, 2, 2};
  for (size_t i = 0; i < std::size(order); ++i) {
    clock_.AdvanceSeconds(0.25);
    // Stale commits are applied too: ASYNC never rejects.
    const PolicyDecision d = async->OnCommit(Commit(order[i], 0));
    EXPECT_EQ(d.update, Update::kApply) << i;
    EXPECT_FALSE(d.flush_aggregate) << i;
    EXPECT_EQ(d.release, (Workers{order[i]})) << i;
    EXPECT_EQ(async->clock(), clocks[i]) << "after commit " << i + 1;
  }
  EXPECT_EQ(async->OnPull(1, clock_.Now()).release, (Workers{1}));
  EXPECT_TRUE(async->OnLeave(1, clock_.Now()).release.empty());
  EXPECT_EQ(async->clock(), 2u);  // 8 commits / 3 workers
}

TEST_F(PolicyTest, AsyncClockWithZeroWorkersDoesNotDivideByZero) {
  std::unique_ptr<IntraSitePolicy> async = Make(pb::ASYNC);
  ASSERT_NE(async, nullptr);
  async->Start(0, clock_.Now());
  async->OnCommit(Commit(0));
  async->OnCommit(Commit(0));
  EXPECT_EQ(async->clock(), 2u);
}

}  // namespace
}  // namespace meridian
