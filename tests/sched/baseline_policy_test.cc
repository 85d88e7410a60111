// The issue-6 policies on virtual time: who waits for whom and for how long
// (BSP, SSP, FIXED_ADACOMM, ADACOMM), and ADSP's equal commit rate without
// waiting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "meridian/core/clock.h"
#include "meridian/sched/policy.h"
#include "sched/virtual_site.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

using testing_sched::SimWorker;
using testing_sched::VirtualSite;
using testing_sched::Wait;
using testing_sched::WorkerLog;
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

void ExpectWaits(const WorkerLog& log, const std::vector<Wait>& expected,
                 const char* who) {
  ASSERT_GE(log.waits.size(), expected.size()) << who;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(log.waits[i].start_s, expected[i].start_s, 1e-6)
        << who << " wait " << i;
    EXPECT_NEAR(log.waits[i].end_s, expected[i].end_s, 1e-6)
        << who << " wait " << i;
  }
}

TEST(BaselinePolicyTest, MakePolicyBuildsEveryKind) {
  const std::pair<pb::PolicyKind, const char*> kinds[] = {
      {pb::BSP, "bsp"},         {pb::ASYNC, "async"},
      {pb::SSP, "ssp"},         {pb::FIXED_ADACOMM, "fixed_adacomm"},
      {pb::ADACOMM, "adacomm"}, {pb::ADSP, "adsp"},
  };
  for (const auto& [kind, name] : kinds) {
    std::unique_ptr<IntraSitePolicy> policy = Build(Config(kind));
    ASSERT_NE(policy, nullptr) << name;
    EXPECT_EQ(policy->name(), name);
    policy->Start(2, Duration(0));
    EXPECT_EQ(policy->clock(), 0u) << name;
  }
  pb::PolicyConfig bad = Config(pb::ADSP);
  bad.set_check_period_s(0);
  EXPECT_FALSE(MakePolicy(bad).ok());
}

TEST(BaselinePolicyTest, PlansCarryEachKindsTrigger) {
  pb::PolicyConfig config = Config(pb::FIXED_ADACOMM);
  config.set_tau(40);
  std::unique_ptr<IntraSitePolicy> policy = Build(config);
  policy->Start(2, Duration(0));
  EXPECT_EQ(policy->PlanFor(0).local_steps(), 40u);
  EXPECT_EQ(policy->PlanFor(0).interval_s(), 0);

  config = Config(pb::ADACOMM);
  config.set_tau0(25);
  policy = Build(config);
  policy->Start(2, Duration(0));
  EXPECT_EQ(policy->PlanFor(1).local_steps(), 25u);

  config = Config(pb::SSP);
  config.set_local_steps(3);
  policy = Build(config);
  policy->Start(2, Duration(0));
  EXPECT_EQ(policy->PlanFor(1).local_steps(), 3u);

  // ADSP: time-driven, Gamma / dC = 10 s / 10 before any overhead is known.
  policy = Build(Config(pb::ADSP));
  policy->Start(2, Duration(0));
  EXPECT_EQ(policy->PlanFor(1).local_steps(), 0u);
  EXPECT_DOUBLE_EQ(policy->PlanFor(1).interval_s(), 1.0);
  // It owns the server momentum while it searches it (the grid's first
  // value until chosen), and leaves it alone otherwise.
  EXPECT_EQ(policy->ServerMomentum(), std::optional<double>(0.0));
  config = Config(pb::ADSP);
  config.set_search(false);
  policy = Build(config);
  policy->Start(2, Duration(0));
  EXPECT_EQ(policy->ServerMomentum(), std::nullopt);
  config = Config(pb::ADSP);
  config.set_search_momentum(false);
  policy = Build(config);
  policy->Start(2, Duration(0));
  EXPECT_EQ(policy->ServerMomentum(), std::nullopt);
  // The baselines never touch it.
  for (pb::PolicyKind kind : {pb::BSP, pb::SSP, pb::ADACOMM}) {
    EXPECT_EQ(Build(Config(kind))->ServerMomentum(), std::nullopt);
  }
}

// ---------------------------------------------------------------------------
// BSP: everyone waits for the slowest, every clock.

TEST(BaselinePolicyTest, BspEveryoneWaitsForTheSlowestEachClock) {
  std::unique_ptr<IntraSitePolicy> policy = Build(Config(pb::BSP));
  VirtualSite site(policy.get(), {{1.0}, {2.0}, {3.0}});
  site.RunUntil(30.5);
  const auto& logs = site.logs();
  for (const WorkerLog& log : logs) {
    EXPECT_EQ(log.commit_arrivals_s.size(), 10u);
    EXPECT_EQ(log.rejected, 0u);
  }
  // Round k (0-based) closes at 3(k+1) when the 3 s worker commits: the
  // 1 s worker waits 2 s, the 2 s worker 1 s, the slowest never.
  ExpectWaits(logs[0], {{1, 3}, {4, 6}, {7, 9}}, "1 s worker");
  ExpectWaits(logs[1], {{2, 3}, {5, 6}, {8, 9}}, "2 s worker");
  EXPECT_NEAR(logs[0].blocked_s, 20, 1e-6);
  EXPECT_NEAR(logs[1].blocked_s, 10, 1e-6);
  EXPECT_TRUE(logs[2].waits.empty());
  EXPECT_EQ(policy->clock(), 10u);
}

// ---------------------------------------------------------------------------
// SSP: only a worker more than s clocks ahead waits, and only until the
// slowest catches up.

TEST(BaselinePolicyTest, SspHoldsOnlyWorkersMoreThanSAhead) {
  pb::PolicyConfig config = Config(pb::SSP);
  config.set_staleness(2);
  std::unique_ptr<IntraSitePolicy> policy = Build(config);
  VirtualSite site(policy.get(), {{1.0}, {3.0}});
  site.RunUntil(30.5);
  const auto& logs = site.logs();
  // The fast worker runs free for its first 3 commits (t = 1, 2, 3); its
  // 4th (t = 4) puts it 3 ahead of the slow one's 1: held until the slow
  // one's 2nd commit at t = 6, and so on every 3 s.
  ExpectWaits(logs[0], {{4, 6}, {7, 9}, {10, 12}, {13, 15}}, "fast worker");
  EXPECT_TRUE(logs[1].waits.empty()) << "the slowest never waits";
  EXPECT_EQ(logs[0].rejected + logs[1].rejected, 0u);
  // The gap never exceeds s + 1 (the held commit itself).
  for (double t = 0.5; t < 30; t += 0.5) {
    const int gap = logs[0].CommitsIn(0, t) - logs[1].CommitsIn(0, t);
    EXPECT_LE(gap, 3) << "t = " << t;
  }
  EXPECT_EQ(policy->clock(), 10u);  // the slowest worker's commits
}

TEST(BaselinePolicyTest, SspWithStalenessZeroIsLockstep) {
  pb::PolicyConfig config = Config(pb::SSP);
  config.set_staleness(0);
  std::unique_ptr<IntraSitePolicy> policy = Build(config);
  VirtualSite site(policy.get(), {{1.0}, {3.0}});
  site.RunUntil(12.5);
  ExpectWaits(site.logs()[0], {{1, 3}, {4, 6}, {7, 9}, {10, 12}}, "fast");
  EXPECT_TRUE(site.logs()[1].waits.empty());
}

TEST(BaselinePolicyTest, SspWithLargeStalenessNeverWaits) {
  pb::PolicyConfig config = Config(pb::SSP);
  config.set_staleness(1000);
  std::unique_ptr<IntraSitePolicy> policy = Build(config);
  VirtualSite site(policy.get(), {{1.0}, {3.0}});
  site.RunUntil(30.5);
  EXPECT_TRUE(site.logs()[0].waits.empty());
  EXPECT_EQ(site.logs()[0].commit_arrivals_s.size(), 30u);
  EXPECT_EQ(site.logs()[1].commit_arrivals_s.size(), 10u);
}

TEST(BaselinePolicyTest, SspPullsAndLeavesFollowTheSameRule) {
  pb::PolicyConfig config = Config(pb::SSP);
  config.set_staleness(1);
  std::unique_ptr<IntraSitePolicy> ssp = Build(config);
  ssp->Start(3, Duration(0));
  // Worker 0 commits twice: 2 ahead of 1 and 2 (clock 0) -> held.
  PolicyDecision d = ssp->OnCommit(Commit(0, 1));
  EXPECT_EQ(d.update, PolicyDecision::Update::kApply);
  EXPECT_EQ(d.release, (Workers{0}));
  d = ssp->OnCommit(Commit(0, 2));
  EXPECT_EQ(d.update, PolicyDecision::Update::kApply);  // applied anyway
  EXPECT_TRUE(d.release.empty());
  // Its pull is held too.
  EXPECT_TRUE(ssp->OnPull(0, FromSeconds(2.5)).release.empty());
  // Worker 1 catches up; worker 2 is still at 0, so 0 stays held.
  d = ssp->OnCommit(Commit(1, 3));
  EXPECT_EQ(d.release, (Workers{1}));
  EXPECT_EQ(ssp->clock(), 0u);
  // Worker 2 leaves: the slowest is now worker 1 at clock 1, so 0 goes.
  d = ssp->OnLeave(2, FromSeconds(4));
  EXPECT_EQ(d.release, (Workers{0}));
  EXPECT_EQ(ssp->clock(), 1u);
  // Unknown and departed workers are refused.
  EXPECT_EQ(ssp->OnCommit(Commit(2, 5)).update,
            PolicyDecision::Update::kReject);
  EXPECT_EQ(ssp->OnCommit(Commit(7, 5)).update,
            PolicyDecision::Update::kReject);
}

// ---------------------------------------------------------------------------
// FIXED_ADACOMM: tau local steps, then everyone waits for the slowest.

TEST(BaselinePolicyTest, FixedAdacommAveragesEveryTauSteps) {
  pb::PolicyConfig config = Config(pb::FIXED_ADACOMM);
  config.set_tau(4);
  std::unique_ptr<IntraSitePolicy> policy = Build(config);
  VirtualSite site(policy.get(), {{0.5}, {1.0}});
  site.RunUntil(20.5);
  const auto& logs = site.logs();
  // A round is 4 steps of the 1 s worker: the 0.5 s worker waits 2 s.
  ExpectWaits(logs[0], {{2, 4}, {6, 8}, {10, 12}}, "fast worker");
  EXPECT_TRUE(logs[1].waits.empty());
  for (const WorkerLog& log : logs) {
    EXPECT_EQ(log.commit_arrivals_s.size(), 5u);
    for (uint32_t steps : log.commit_steps) EXPECT_EQ(steps, 4u);
  }
  EXPECT_EQ(policy->clock(), 5u);
}

// ---------------------------------------------------------------------------
// ADACOMM: as FIXED_ADACOMM, with tau shrinking as sqrt(L / L0).

TEST(BaselinePolicyTest, AdacommShrinksTauWithTheLossAtRoundBoundaries) {
  pb::PolicyConfig config = Config(pb::ADACOMM);
  config.set_tau0(8);
  config.set_check_period_s(10);
  std::unique_ptr<IntraSitePolicy> policy = Build(config);
  VirtualSite site(policy.get(), {{0.1}, {0.2}});
  // L(t) = 2 / (1 + t / 10): L/L0 = 1/4 at t = 30 -> tau 4; at t = 70,
  // ceil(8 / sqrt(8)) = 3.
  site.set_loss([](double t) { return 2.0 / (1 + t / 10); });
  site.RunUntil(75);
  const auto& logs = site.logs();
  ASSERT_EQ(logs[0].commit_steps.size(), logs[1].commit_steps.size());
  ASSERT_GT(logs[0].commit_steps.size(), 10u);
  // Every round's workers ran the same tau, and tau never grows.
  for (size_t k = 0; k < logs[0].commit_steps.size(); ++k) {
    EXPECT_EQ(logs[0].commit_steps[k], logs[1].commit_steps[k]) << k;
    if (k > 0) {
      EXPECT_LE(logs[0].commit_steps[k], logs[0].commit_steps[k - 1]) << k;
    }
  }
  EXPECT_EQ(logs[0].commit_steps.front(), 8u);
  EXPECT_EQ(logs[0].commit_steps.back(), 3u);
  // Rounds before the first re-evaluation (t = 10) ran tau0; L/L0 = 1/2 at
  // t = 10 gives ceil(5.66) = 6.
  const std::set<uint32_t> seen(logs[0].commit_steps.begin(),
                                logs[0].commit_steps.end());
  EXPECT_TRUE(seen.contains(6u));
  EXPECT_TRUE(seen.contains(4u));
  // The 0.1 s worker waits tau * 0.1 s every round; the slowest never.
  EXPECT_TRUE(logs[1].waits.empty());
  ASSERT_EQ(logs[0].waits.size(), logs[0].commit_steps.size());
  for (size_t k = 0; k < logs[0].waits.size(); ++k) {
    const double wait = logs[0].waits[k].end_s - logs[0].waits[k].start_s;
    EXPECT_NEAR(wait, 0.1 * logs[0].commit_steps[k], 1e-6) << k;
  }
  EXPECT_GE(site.evaluations(), 7u);  // one per 10 s
  EXPECT_LE(site.evaluations(), 9u);
}

// ---------------------------------------------------------------------------
// ADSP: nobody waits, and every worker makes the same number of commits per
// check period whatever its speed.

TEST(AdspPolicyTest, IntervalSubtractsTheMeasuredOverhead) {
  pb::PolicyConfig config = Config(pb::ADSP);
  config.set_search(false);
  // The paper's rule alone (the link floor has its own test).
  config.set_max_commit_overhead_fraction(0);
  config.set_check_period_s(10);
  config.set_initial_commits_per_period(10);
  config.set_min_commit_interval_s(0.1);
  std::unique_ptr<IntraSitePolicy> adsp = Build(config);
  adsp->Start(2, Duration(0));
  EXPECT_DOUBLE_EQ(adsp->PlanFor(0).interval_s(), 1.0);

  // First commit (the cycle holds the join): not measured, released at once.
  PolicyDecision d = adsp->OnCommit(Commit(0, 1.7));
  EXPECT_EQ(d.update, PolicyDecision::Update::kApply);
  EXPECT_EQ(d.release, (Workers{0}));
  EXPECT_DOUBLE_EQ(adsp->PlanFor(0).interval_s(), 1.0);
  // Reply at 1.7 carried 1.0; the commit arrives at 3.2: 0.5 s overhead.
  adsp->OnCommit(Commit(0, 3.2));
  EXPECT_NEAR(adsp->PlanFor(0).interval_s(), 0.5, 1e-9);
  // Reply at 3.2 carried 0.5; arrival at 4.2: still 0.5.
  adsp->OnCommit(Commit(0, 4.2));
  EXPECT_NEAR(adsp->PlanFor(0).interval_s(), 0.5, 1e-9);
  // One slow cycle (0.9 s overhead) moves it by a quarter only.
  adsp->OnCommit(Commit(0, 4.2 + 0.5 + 0.9));
  EXPECT_NEAR(adsp->PlanFor(0).interval_s(), 1.0 - 0.6, 1e-9);
  // A sample is capped at the whole target cycle (Gamma / dC = 1 s).
  adsp->OnCommit(Commit(0, 5.6 + 0.4 + 3.0));
  EXPECT_NEAR(adsp->PlanFor(0).interval_s(), 1.0 - 0.7, 1e-9);
  // Worker 1 is untouched; its reported overhead counts on its first commit.
  EXPECT_DOUBLE_EQ(adsp->PlanFor(1).interval_s(), 1.0);
  CommitEvent first = Commit(1, 2);
  first.commit_overhead_s = 0.2;
  adsp->OnCommit(first);
  EXPECT_NEAR(adsp->PlanFor(1).interval_s(), 0.8, 1e-9);
  // A stall longer than the whole cycle is capped: T_min at worst.
  adsp->OnCommit(Commit(1, 2 + 0.8 + 50));
  EXPECT_GE(adsp->PlanFor(1).interval_s(), 0.1);
  EXPECT_EQ(adsp->OnCommit(Commit(5, 60)).update,
            PolicyDecision::Update::kReject);
  EXPECT_EQ(adsp->clock(), 3u);  // 7 commits / 2 workers
}

TEST(AdspPolicyTest, ThreeSpeedsCommitEquallyEveryPeriodAndNeverWait) {
  pb::PolicyConfig config = Config(pb::ADSP);
  config.set_search(false);
  // The paper's rule alone: the slowest worker's 0.15 s round trip is 15%
  // of its cycle, which the default link floor (10%) would stretch.
  config.set_max_commit_overhead_fraction(0);
  config.set_check_period_s(10);
  config.set_initial_commits_per_period(10);
  config.set_min_commit_interval_s(0.1);
  std::unique_ptr<IntraSitePolicy> adsp = Build(config);
  // Three speeds (13 ms, 31 ms and 97 ms steps) and three different round
  // trips: uncompensated, the slowest would make about 8 commits per period
  // and the fastest 10.
  VirtualSite site(
      adsp.get(),
      {{0.013, 0.002, 0.002}, {0.031, 0.020, 0.030}, {0.097, 0.080, 0.070}});
  site.RunUntil(200);
  const auto& logs = site.logs();
  for (size_t w = 0; w < logs.size(); ++w) {
    EXPECT_TRUE(logs[w].waits.empty()) << "worker " << w;
    EXPECT_EQ(logs[w].blocked_s, 0) << "worker " << w;
    EXPECT_EQ(logs[w].rejected, 0u);
  }
  // From the second period on (the overhead estimate needs a few commits):
  // every worker makes dC +- 1 commits per period, within 1 of each other.
  for (int k = 1; k < 20; ++k) {
    int lo = 1 << 30, hi = 0;
    for (const WorkerLog& log : logs) {
      const int n = log.CommitsIn(10.0 * k, 10.0 * (k + 1));
      lo = std::min(lo, n);
      hi = std::max(hi, n);
      EXPECT_NEAR(n, 10, 1) << "period " << k;
    }
    EXPECT_LE(hi - lo, 1) << "period " << k;
  }
  // So the totals stay together too (the bounded staleness ADSP relies on).
  for (int k = 2; k <= 20; ++k) {
    int lo = 1 << 30, hi = 0;
    for (const WorkerLog& log : logs) {
      const int n = log.CommitsIn(0, 10.0 * k);
      lo = std::min(lo, n);
      hi = std::max(hi, n);
    }
    EXPECT_LE(hi - lo, 2) << "after period " << k;
  }
  // Fast workers do more local work per commit (tau_i ~ v_i * interval).
  const double fast_tau = static_cast<double>(logs[0].steps) /
                          static_cast<double>(logs[0].commit_steps.size());
  const double slow_tau = static_cast<double>(logs[2].steps) /
                          static_cast<double>(logs[2].commit_steps.size());
  EXPECT_GT(fast_tau, 5 * slow_tau);
}

// A worker behind a slow link (1 s round trip) commits less often rather
// than spend most of its time in transit; the others keep their rate.
TEST(AdspPolicyTest, ASlowLinkCommitsLessOftenAndTheOthersKeepTheirRate) {
  for (const double fraction : {0.0, 0.1}) {
    SCOPED_TRACE(fraction);
    pb::PolicyConfig config = Config(pb::ADSP);
    config.set_search(false);
    config.set_check_period_s(10);
    config.set_initial_commits_per_period(10);
    config.set_min_commit_interval_s(0.1);
    config.set_max_commit_overhead_fraction(fraction);
    std::unique_ptr<IntraSitePolicy> adsp = Build(config);
    VirtualSite site(adsp.get(),
                     {{0.01, 0.005, 0.005}, {0.01, 0.005, 0.005},
                      {0.01, 0.5, 0.5}});
    site.RunUntil(200);
    const auto& logs = site.logs();
    // From the second period on, once the round trips are measured.
    for (int w = 0; w < 2; ++w) {
      EXPECT_NEAR(logs[w].CommitsIn(10, 200), 190, 19) << "worker " << w;
    }
    const int slow = logs[2].CommitsIn(10, 200);
    const double in_transit = slow * 1.0 / 190;
    if (fraction == 0) {
      // The paper's rule: T_min after each 1 s round trip.
      EXPECT_GT(slow, 150);
      EXPECT_GT(in_transit, 0.8);
    } else {
      // Every 9 s + 1 s in transit: about one commit per period.
      EXPECT_NEAR(slow, 19, 2);
      EXPECT_LE(in_transit, 0.11);
    }
    for (const WorkerLog& log : logs) EXPECT_EQ(log.blocked_s, 0);
  }
}

TEST(AdspPolicyTest, SearchRunsWhileTrainingGoesOnAndNobodyWaits) {
  pb::PolicyConfig config = Config(pb::ADSP);
  // The paper's rule alone: the search climbs to cycles of ~50 ms, which
  // the slowest worker's 50 ms round trip could not keep under the link
  // floor (it would commit less often, by design).
  config.set_max_commit_overhead_fraction(0);
  config.set_check_period_s(5);
  config.set_initial_commits_per_period(4);
  config.set_min_commit_interval_s(0.05);
  std::unique_ptr<IntraSitePolicy> adsp = Build(config);
  VirtualSite site(
      adsp.get(),
      {{0.013, 0.002, 0.002}, {0.031, 0.010, 0.010}, {0.097, 0.030, 0.020}});
  // The loss falls faster the more commits the site makes.
  double loss = 2.3, last_t = 0;
  uint64_t seen_commits = 0;
  std::set<double> momenta;
  site.set_observer([&](double) {
    const std::optional<double> mu = adsp->ServerMomentum();
    if (mu) momenta.insert(*mu);
  });
  site.set_loss([&](double t) {
    uint64_t commits = 0;
    for (const WorkerLog& log : site.logs()) {
      commits += log.commit_arrivals_s.size();
    }
    const double dt = t - last_t;
    if (dt > 0) {
      const double rate = static_cast<double>(commits - seen_commits) / dt;
      const double inv = 1 / (loss - 0.2) + 0.002 * std::min(rate, 8.0) * dt;
      loss = 0.2 + 1 / inv;
    }
    last_t = t;
    seen_commits = commits;
    return loss;
  });
  site.RunUntil(120);
  for (const WorkerLog& log : site.logs()) {
    EXPECT_TRUE(log.waits.empty());
    EXPECT_EQ(log.rejected, 0u);
  }
  EXPECT_GT(site.evaluations(), 10u);
  EXPECT_GT(adsp->search_time_s(), 0);
  EXPECT_LE(adsp->search_time_s(), 120);
  // The momentum grid was tried ({0, 0.3, 0.6} by default).
  EXPECT_TRUE(momenta.contains(0.0));
  EXPECT_TRUE(momenta.contains(0.3) || momenta.contains(0.6));
  for (double mu : momenta) EXPECT_TRUE(mu == 0 || mu == 0.3 || mu == 0.6);
  // Commit counts stay together even while dC changes.
  int lo = 1 << 30, hi = 0;
  for (const WorkerLog& log : site.logs()) {
    const int n = static_cast<int>(log.commit_arrivals_s.size());
    lo = std::min(lo, n);
    hi = std::max(hi, n);
  }
  EXPECT_GT(lo, 50);
  EXPECT_LE(hi - lo, 3);
}

}  // namespace
}  // namespace meridian
