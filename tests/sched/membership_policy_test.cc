// Workers that die and join during training, under every policy, on
// virtual time: who waits for whom once a worker is gone, when a joiner is
// let in, and how the site clock follows the live worker set.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "meridian/core/clock.h"
#include "meridian/sched/policy.h"
#include "sched/virtual_site.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

using testing_sched::SimWorker;
using testing_sched::VirtualSite;
using testing_sched::WorkerLog;
using Update = PolicyDecision::Update;
using Workers = std::vector<uint32_t>;

std::unique_ptr<IntraSitePolicy> Build(const pb::PolicyConfig& config) {
  Result<std::unique_ptr<IntraSitePolicy>> policy = MakePolicy(config);
  EXPECT_OK(policy);
  return policy.ok() ? std::move(policy).value() : nullptr;
}

pb::PolicyConfig Config(pb::PolicyKind kind) {
  pb::PolicyConfig config;
  config.set_kind(kind);
  return config;
}

CommitEvent Commit(uint32_t worker, double now_s) {
  CommitEvent event;
  event.worker = worker;
  event.local_steps = 1;
  event.now = FromSeconds(now_s);
  return event;
}

uint64_t TotalRejected(const VirtualSite& site) {
  uint64_t rejected = 0;
  for (const WorkerLog& log : site.logs()) rejected += log.rejected;
  return rejected;
}

// Runs `site` to `until_s`, checking at every `step_s` that the policy's
// clock never goes backwards.
void RunMonotonic(VirtualSite* site, const IntraSitePolicy& policy,
                  double until_s, double step_s = 0.1) {
  uint64_t last = policy.clock();
  for (double t = site->now_s() + step_s; t <= until_s + 1e-9; t += step_s) {
    site->RunUntil(t);
    ASSERT_GE(policy.clock(), last) << "clock went backwards at t = " << t;
    last = policy.clock();
  }
}

// ---------------------------------------------------------------------------
// Barrier policies: the barrier waits only for live workers; a joiner comes
// in at the next round boundary.

class BarrierMembershipTest : public ::testing::TestWithParam<pb::PolicyKind> {
 protected:
  pb::PolicyConfig BarrierConfig() const {
    pb::PolicyConfig config = Config(GetParam());
    // One local step per round for every kind, so rounds take the slowest
    // live worker's step time.
    config.set_local_steps(1);
    config.set_tau(1);
    config.set_tau0(1);
    config.set_check_period_s(1000);
    return config;
  }
};

TEST_P(BarrierMembershipTest, BarrierFollowsTheLiveWorkers) {
  std::unique_ptr<IntraSitePolicy> policy = Build(BarrierConfig());
  VirtualSite site(policy.get(), {{1.0}, {2.0}, {3.0}});
  // Rounds close at 3 (the 3 s worker); the next is open at 4.5.
  RunMonotonic(&site, *policy, 4.5);
  EXPECT_EQ(policy->clock(), 1u);
  // The slowest dies mid-round: the round closes when the 2 s worker
  // commits (t = 5), and later rounds take 2 s.
  site.Kill(2);
  RunMonotonic(&site, *policy, 8.2);
  EXPECT_EQ(policy->clock(), 3u);  // closed at 5 and 7
  // It comes back while the round of [7, 9) is open: let in at 9 with the
  // others, so every worker of the next round starts from the same model.
  site.Join(2);
  RunMonotonic(&site, *policy, 8.9);
  EXPECT_TRUE(site.logs()[2].join_released_s.empty());
  RunMonotonic(&site, *policy, 15.5);
  ASSERT_EQ(site.logs()[2].join_released_s.size(), 1u);
  EXPECT_NEAR(site.logs()[2].join_released_s[0], 9.0, 1e-6);
  // Rounds of 3 s again from 9: closed at 12 and 15.
  EXPECT_EQ(policy->clock(), 6u);
  const std::vector<double>& joiner = site.logs()[2].commit_arrivals_s;
  ASSERT_GE(joiner.size(), 3u);
  EXPECT_NEAR(joiner[1], 12.0, 1e-6);  // its first commit after the join
  EXPECT_NEAR(joiner[2], 15.0, 1e-6);
  // The fast worker's wait in the round the slowest died in ended at 5.
  bool waited_until_5 = false;
  for (const auto& wait : site.logs()[0].waits) {
    waited_until_5 = waited_until_5 || std::abs(wait.end_s - 5.0) < 1e-6;
  }
  EXPECT_TRUE(waited_until_5);
  EXPECT_EQ(TotalRejected(site), 0u);
}

TEST_P(BarrierMembershipTest, JoinerIsLetInAtOnceWhenNobodyElseIsLive) {
  std::unique_ptr<IntraSitePolicy> policy = Build(BarrierConfig());
  policy->Start(2, Duration(0));
  // Worker 1 never joined; worker 0 commits alone.
  policy->OnLeave(1, Duration(0));
  PolicyDecision d = policy->OnCommit(Commit(0, 1));
  EXPECT_TRUE(d.flush_aggregate);
  EXPECT_EQ(d.release, (Workers{0}));
  // Worker 0 dies with nothing pending; worker 1 joins late: nobody else
  // is computing, so it is let in now.
  policy->OnLeave(0, FromSeconds(2));
  d = policy->OnJoin(1, FromSeconds(3));
  EXPECT_EQ(d.release, (Workers{1}));
  EXPECT_FALSE(d.flush_aggregate);
  // A second OnJoin of a live worker changes nothing.
  EXPECT_TRUE(policy->OnJoin(1, FromSeconds(3)).release.empty());
  EXPECT_TRUE(policy->OnJoin(7, FromSeconds(3)).release.empty());
  // Alone, it closes rounds by itself.
  d = policy->OnCommit(Commit(1, 4));
  EXPECT_EQ(d.update, Update::kAggregate);
  EXPECT_TRUE(d.flush_aggregate);
  EXPECT_EQ(d.release, (Workers{1}));
  EXPECT_EQ(policy->clock(), 2u);
}

TEST_P(BarrierMembershipTest,
       DeadWorkersCommitIsKeptAndARestartJoinsNextRound) {
  std::unique_ptr<IntraSitePolicy> policy = Build(BarrierConfig());
  policy->Start(3, Duration(0));
  EXPECT_EQ(policy->OnCommit(Commit(0, 1)).update, Update::kAggregate);
  EXPECT_EQ(policy->OnCommit(Commit(1, 1)).update, Update::kAggregate);
  // Worker 1 dies with its commit in the round; its restart joins at once.
  PolicyDecision d = policy->OnLeave(1, FromSeconds(2));
  EXPECT_FALSE(d.flush_aggregate);
  d = policy->OnJoin(1, FromSeconds(2));
  EXPECT_TRUE(d.release.empty()) << "worker 2 still computes this round";
  // Worker 2 closes the round: the dead incarnation's commit is in the
  // flushed aggregate, 0 and 2 are answered and the joiner let in.
  d = policy->OnCommit(Commit(2, 3));
  EXPECT_TRUE(d.flush_aggregate);
  EXPECT_EQ(d.release, (Workers{0, 2, 1}));
  EXPECT_EQ(policy->clock(), 1u);
  // From now on the barrier needs all three.
  EXPECT_TRUE(policy->OnCommit(Commit(0, 4)).release.empty());
  EXPECT_TRUE(policy->OnCommit(Commit(2, 4)).release.empty());
  d = policy->OnCommit(Commit(1, 5));
  EXPECT_EQ(d.release, (Workers{0, 1, 2}));
  EXPECT_EQ(policy->clock(), 2u);
}

TEST_P(BarrierMembershipTest, JoinerLeavingBeforeItsRoundIsForgotten) {
  std::unique_ptr<IntraSitePolicy> policy = Build(BarrierConfig());
  policy->Start(2, Duration(0));
  policy->OnLeave(1, Duration(0));
  EXPECT_TRUE(policy->OnJoin(1, FromSeconds(0.5)).release.empty());
  // It dies again before the round closes: not released, not waited for.
  policy->OnLeave(1, FromSeconds(0.7));
  const PolicyDecision d = policy->OnCommit(Commit(0, 1));
  EXPECT_EQ(d.release, (Workers{0}));
  EXPECT_EQ(policy->clock(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Barriers, BarrierMembershipTest,
                         ::testing::Values(pb::BSP, pb::FIXED_ADACOMM,
                                           pb::ADACOMM),
                         [](const auto& info) {
                           return pb::PolicyKind_Name(info.param);
                         });

TEST(AdacommMembershipTest, JoinerRunsTheNewRoundsTau) {
  pb::PolicyConfig config = Config(pb::ADACOMM);
  config.set_tau0(8);
  config.set_check_period_s(10);
  std::unique_ptr<IntraSitePolicy> policy = Build(config);
  VirtualSite site(policy.get(), {{0.1}, {0.2}, {0.2}});
  site.set_loss([](double t) { return 2.0 / (1 + t / 10); });
  site.RunUntil(12.05);
  site.Kill(2);
  site.RunUntil(25.05);
  site.Join(2);
  site.RunUntil(45);
  const auto& logs = site.logs();
  ASSERT_EQ(logs[2].join_released_s.size(), 1u);
  // Every commit of the joiner's incarnation ran the same tau as the other
  // workers' commits of the same round (matched by arrival order after the
  // join: each round has one commit per live worker).
  const double joined = logs[2].join_released_s[0];
  std::vector<uint32_t> mine, theirs;
  for (size_t k = 0; k < logs[2].commit_arrivals_s.size(); ++k) {
    if (logs[2].commit_arrivals_s[k] > joined) {
      mine.push_back(logs[2].commit_steps[k]);
    }
  }
  for (size_t k = 0; k < logs[1].commit_arrivals_s.size(); ++k) {
    if (logs[1].commit_arrivals_s[k] > joined) {
      theirs.push_back(logs[1].commit_steps[k]);
    }
  }
  ASSERT_GT(mine.size(), 3u);
  const size_t n = std::min(mine.size(), theirs.size());
  for (size_t k = 0; k < n; ++k) EXPECT_EQ(mine[k], theirs[k]) << k;
  EXPECT_EQ(TotalRejected(site), 0u);
}

// ---------------------------------------------------------------------------
// SSP: a dead worker no longer holds the fast ones back; a joiner starts at
// the slowest live worker's clock.

TEST(SspMembershipTest, DeadWorkerReleasesTheFastAndJoinerStartsAtTheSlowest) {
  pb::PolicyConfig config = Config(pb::SSP);
  config.set_staleness(2);
  std::unique_ptr<IntraSitePolicy> policy = Build(config);
  VirtualSite site(policy.get(), {{1.0}, {3.0}});
  // The fast worker's 4th commit (t = 4) is 3 ahead of the slow one's 1.
  RunMonotonic(&site, *policy, 4.5);
  EXPECT_EQ(policy->clock(), 1u);
  site.Kill(1);
  // Released at the kill, it runs free: commits at 5.5, 6.5 ... 9.5.
  RunMonotonic(&site, *policy, 10.2);
  const WorkerLog& fast = site.logs()[0];
  ASSERT_FALSE(fast.waits.empty());
  EXPECT_NEAR(fast.waits[0].end_s, 4.5, 1e-6);
  EXPECT_EQ(fast.CommitsIn(4.6, 10.2), 5);
  EXPECT_EQ(policy->clock(), 9u);  // the only live worker's 9 commits
  // The slow worker joins at the fast one's clock (9), answered at once.
  site.Join(1);
  RunMonotonic(&site, *policy, 10.3);
  ASSERT_EQ(site.logs()[1].join_released_s.size(), 1u);
  EXPECT_NEAR(site.logs()[1].join_released_s[0], 10.2, 1e-6);
  EXPECT_EQ(policy->clock(), 9u);
  // Three fast commits later (10.5, 11.5, 12.5: clock 12 = 9 + 3) the fast
  // one waits for the joiner's first commit at 13.2.
  RunMonotonic(&site, *policy, 14);
  bool held_until_joiner = false;
  for (const auto& wait : fast.waits) {
    held_until_joiner =
        held_until_joiner || (std::abs(wait.start_s - 12.5) < 1e-6 &&
                              std::abs(wait.end_s - 13.2) < 1e-6);
  }
  EXPECT_TRUE(held_until_joiner);
  EXPECT_EQ(policy->clock(), 10u);
  EXPECT_EQ(TotalRejected(site), 0u);
}

// ---------------------------------------------------------------------------
// ASYNC and ADSP: nobody waits; the clock ticks once per live worker's worth
// of commits and never goes back.

class FreeMembershipTest : public ::testing::TestWithParam<pb::PolicyKind> {
 protected:
  pb::PolicyConfig FreeConfig() const {
    pb::PolicyConfig config = Config(GetParam());
    config.set_local_steps(1);
    // ADSP: one commit per worker per second (Gamma / dC = 10 / 10, no
    // measured overhead in virtual time), no search.
    config.set_search(false);
    config.set_check_period_s(10);
    config.set_initial_commits_per_period(10);
    config.set_min_commit_interval_s(0.1);
    return config;
  }
};

TEST_P(FreeMembershipTest, ClockFollowsTheLiveWorkers) {
  std::unique_ptr<IntraSitePolicy> policy = Build(FreeConfig());
  VirtualSite site(policy.get(), {{1.0}, {1.0}});
  // Both commit every second: one tick per second.
  RunMonotonic(&site, *policy, 3.5);
  EXPECT_EQ(policy->clock(), 3u);
  site.Kill(1);
  // Alone, the survivor's every commit is a tick (4, 5, 6).
  RunMonotonic(&site, *policy, 6.5);
  EXPECT_EQ(policy->clock(), 6u);
  EXPECT_TRUE(site.logs()[0].waits.empty());
  // The joiner is answered at once and the clock goes back to one tick per
  // two commits.
  site.Join(1);
  RunMonotonic(&site, *policy, 10.6);
  ASSERT_EQ(site.logs()[1].join_released_s.size(), 1u);
  EXPECT_NEAR(site.logs()[1].join_released_s[0], 6.5, 1e-6);
  // Commits after 6.5: survivor at 7, 8, 9, 10; joiner at 7.5, 8.5, 9.5,
  // 10.5: 8 commits, 4 ticks.
  EXPECT_EQ(policy->clock(), 10u);
  EXPECT_TRUE(site.logs()[0].waits.empty());
  EXPECT_TRUE(site.logs()[1].waits.empty());
  EXPECT_EQ(TotalRejected(site), 0u);
  // OnJoin of a live or unknown worker releases nobody.
  EXPECT_TRUE(policy->OnJoin(0, FromSeconds(11)).release.empty());
  EXPECT_TRUE(policy->OnJoin(9, FromSeconds(11)).release.empty());
}

TEST_P(FreeMembershipTest, WorkersThatNeverJoinedDoNotSlowTheClock) {
  std::unique_ptr<IntraSitePolicy> policy = Build(FreeConfig());
  policy->Start(4, Duration(0));
  // Only worker 0 joined in time (the join timeout passed).
  for (uint32_t w = 1; w < 4; ++w) policy->OnLeave(w, Duration(0));
  for (int c = 1; c <= 3; ++c) {
    const PolicyDecision d = policy->OnCommit(Commit(0, c));
    EXPECT_EQ(d.update, Update::kApply);
    EXPECT_EQ(d.release, (Workers{0}));
    EXPECT_EQ(policy->clock(), static_cast<uint64_t>(c));
  }
  EXPECT_EQ(policy->OnJoin(2, FromSeconds(4)).release, (Workers{2}));
  policy->OnCommit(Commit(0, 5));
  EXPECT_EQ(policy->clock(), 3u);
  policy->OnCommit(Commit(2, 5));
  EXPECT_EQ(policy->clock(), 4u);
}

INSTANTIATE_TEST_SUITE_P(Free, FreeMembershipTest,
                         ::testing::Values(pb::ASYNC, pb::ADSP),
                         [](const auto& info) {
                           return pb::PolicyKind_Name(info.param);
                         });

}  // namespace
}  // namespace meridian
