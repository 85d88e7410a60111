#include "meridian/sync/sync.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "meridian/config/config.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

struct Taken {
  std::vector<uint64_t> indices;
  std::vector<float> values;
};

Taken Take(std::vector<float>& acc, const std::vector<float>& w, double theta,
           pb::ThresholdMode mode, uint64_t base = 0) {
  Taken taken;
  const size_t n =
      TakeSignificant(acc, w, theta, mode, base, &taken.indices, &taken.values);
  EXPECT_EQ(n, taken.indices.size());
  return taken;
}

TEST(SignificanceTest, RelativeModeComparesWithTheCurrentValue) {
  std::vector<float> w = {1.0f, 1.0f, -2.0f, 10.0f, 0.5f};
  std::vector<float> acc = {0.02f, 0.005f, -0.05f, 0.05f, -0.01f};
  // theta 1%: |acc/w| = 2%, 0.5%, 2.5%, 0.5%, 2%.
  const Taken taken = Take(acc, w, 0.01, pb::RELATIVE, 100);
  EXPECT_EQ(taken.indices, (std::vector<uint64_t>{100, 102, 104}));
  EXPECT_EQ(taken.values, (std::vector<float>{0.02f, -0.05f, -0.01f}));
  // Sent entries leave acc; the others stay for later.
  EXPECT_EQ(acc, (std::vector<float>{0, 0.005f, 0, 0.05f, 0}));
}

TEST(SignificanceTest, ZeroWeightIsAlwaysSignificant) {
  std::vector<float> w = {0.0f, 0.0f, 1.0f};
  std::vector<float> acc = {1e-9f, 0.0f, 1e-9f};
  const Taken taken = Take(acc, w, 0.5, pb::RELATIVE);
  // A zero change is never sent, even at w == 0.
  EXPECT_EQ(taken.indices, (std::vector<uint64_t>{0}));
}

TEST(SignificanceTest, AbsoluteModeIgnoresTheWeight) {
  std::vector<float> w = {1000.0f, 0.0f, 1e-6f};
  std::vector<float> acc = {0.2f, 0.05f, -0.3f};
  const Taken taken = Take(acc, w, 0.1, pb::ABSOLUTE);
  EXPECT_EQ(taken.indices, (std::vector<uint64_t>{0, 2}));
  EXPECT_EQ(acc, (std::vector<float>{0, 0.05f, 0}));
}

TEST(SignificanceTest, ZeroThresholdFlushesEveryChange) {
  std::vector<float> w = {1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<float> acc = {1e-7f, 0.0f, -1e-7f, 1e-3f};
  const Taken taken = Take(acc, w, 0.0, pb::RELATIVE);
  EXPECT_EQ(taken.indices, (std::vector<uint64_t>{0, 2, 3}));
  EXPECT_EQ(acc, (std::vector<float>(4, 0.0f)));
}

// The filter's definition, one entry at a time.
Taken Reference(std::vector<float>& acc, const std::vector<float>& w,
                float theta, pb::ThresholdMode mode) {
  Taken taken;
  for (size_t i = 0; i < acc.size(); ++i) {
    const float a = acc[i];
    if (a == 0.0f) continue;
    const bool significant =
        mode == pb::ABSOLUTE
            ? std::fabs(a) > theta
            : w[i] == 0.0f || std::fabs(a) > theta * std::fabs(w[i]);
    if (!significant) continue;
    taken.indices.push_back(i);
    taken.values.push_back(a);
    acc[i] = 0.0f;
  }
  return taken;
}

TEST(SignificanceTest, BlocksOfEveryMixAgreeWithTheDefinition) {
  // Lengths around the 16-entry blocks, blocks with none, some and all of
  // their entries significant, zeros, zero weights, NaN and Inf.
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 1e-30f};
  for (size_t n : {0, 1, 15, 16, 17, 31, 32, 33, 100, 1000}) {
    for (pb::ThresholdMode mode : {pb::RELATIVE, pb::ABSOLUTE}) {
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<float> w(n);
        std::vector<float> acc(n);
        // Per block: how likely an entry is significant (0, 1 or mixed).
        float block_share = 0;
        for (size_t i = 0; i < n; ++i) {
          if (i % 16 == 0) block_share = static_cast<float>(rng() % 3) / 2;
          w[i] = unit(rng);
          const bool big = unit(rng) * 0.5f + 0.5f < block_share;
          acc[i] = (big ? 0.5f : 0.01f) * (mode == pb::ABSOLUTE ? 1 : w[i]);
          if (rng() % 10 == 0) acc[i] = specials[rng() % 5];
          if (rng() % 10 == 0) w[i] = specials[rng() % 5];
        }
        std::vector<float> want_acc = acc;
        const Taken want = Reference(want_acc, w, 0.1f, mode);
        const Taken got = Take(acc, w, 0.1, mode);
        SCOPED_TRACE(::testing::Message()
                     << "n " << n << " mode " << mode << " trial " << trial);
        ASSERT_EQ(got.indices, want.indices);
        ASSERT_EQ(got.values.size(), want.values.size());
        for (size_t k = 0; k < got.values.size(); ++k) {
          // Bit for bit (NaN included).
          ASSERT_EQ(std::memcmp(&got.values[k], &want.values[k], 4), 0) << k;
        }
        ASSERT_EQ(std::memcmp(acc.data(), want_acc.data(), 4 * n), 0);
      }
    }
  }
}

TEST(SignificanceTest, AccumulatesUntilSignificant) {
  std::vector<float> w = {1.0f};
  std::vector<float> acc = {0.0f};
  int sent_at = -1;
  for (int round = 0; round < 10 && sent_at < 0; ++round) {
    acc[0] += 0.004f;  // 0.4% per round against a 1% threshold
    if (!Take(acc, w, 0.01, pb::RELATIVE).indices.empty()) sent_at = round;
  }
  EXPECT_EQ(sent_at, 2);  // 1.2% after the third round
  EXPECT_EQ(acc[0], 0.0f);
}

pb::SyncConfig SyncWith(pb::ThresholdSchedule schedule, double theta,
                        uint32_t flush_every = 0) {
  pb::SyncConfig sync;
  sync.set_threshold(theta);
  sync.set_threshold_schedule(schedule);
  sync.set_flush_every(flush_every);
  return sync;
}

TEST(ThresholdScheduleTest, Constant) {
  ThresholdSchedule schedule(SyncWith(pb::THRESHOLD_CONSTANT, 0.02),
                             pb::OptimizerConfig(), 1);
  EXPECT_DOUBLE_EQ(schedule.At(1), 0.02);
  EXPECT_DOUBLE_EQ(schedule.At(1000), 0.02);
}

TEST(ThresholdScheduleTest, InverseSqrtOfTheClock) {
  ThresholdSchedule schedule(SyncWith(pb::THRESHOLD_INVERSE_SQRT, 0.1),
                             pb::OptimizerConfig(), 1);
  EXPECT_DOUBLE_EQ(schedule.At(1), 0.1);
  EXPECT_DOUBLE_EQ(schedule.At(4), 0.05);
  EXPECT_DOUBLE_EQ(schedule.At(100), 0.01);
}

TEST(ThresholdScheduleTest, CoupledToTheLearningRate) {
  pb::OptimizerConfig optimizer;
  optimizer.set_learning_rate(0.1);
  optimizer.set_schedule(pb::STEP);
  optimizer.set_step_size(100);
  optimizer.set_gamma(0.5);
  // Four local steps per clock: clock 25 is step 100, the first decay.
  ThresholdSchedule schedule(SyncWith(pb::THRESHOLD_LR_COUPLED, 0.04),
                             optimizer, 4);
  EXPECT_DOUBLE_EQ(schedule.At(1), 0.04);
  EXPECT_DOUBLE_EQ(schedule.At(24), 0.04);
  EXPECT_DOUBLE_EQ(schedule.At(25), 0.02);
  EXPECT_DOUBLE_EQ(schedule.At(50), 0.01);
}

TEST(ThresholdScheduleTest, FlushEveryNClocks) {
  ThresholdSchedule schedule(SyncWith(pb::THRESHOLD_CONSTANT, 0.05, 10),
                             pb::OptimizerConfig(), 1);
  EXPECT_DOUBLE_EQ(schedule.At(9), 0.05);
  EXPECT_DOUBLE_EQ(schedule.At(10), 0.0);
  EXPECT_DOUBLE_EQ(schedule.At(11), 0.05);
  EXPECT_DOUBLE_EQ(schedule.At(20), 0.0);
}

TEST(AdaptiveThresholdTest, RisesAboveBudgetFallsBelowWithinBounds) {
  AdaptiveThreshold adaptive(/*budget=*/1000.0, /*step=*/0.005,
                             /*max_adjustment=*/0.012);
  adaptive.Observe(1050, 1.0);  // within 10%: unchanged
  EXPECT_DOUBLE_EQ(adaptive.adjustment(), 0.0);
  adaptive.Observe(2000, 1.0);
  EXPECT_DOUBLE_EQ(adaptive.adjustment(), 0.005);
  adaptive.Observe(600, 0.5);  // 1200 B/s
  EXPECT_DOUBLE_EQ(adaptive.adjustment(), 0.010);
  adaptive.Observe(5000, 1.0);  // clamped at the maximum
  EXPECT_DOUBLE_EQ(adaptive.adjustment(), 0.012);
  adaptive.Observe(100, 1.0);
  EXPECT_DOUBLE_EQ(adaptive.adjustment(), 0.007);
  for (int i = 0; i < 5; ++i) adaptive.Observe(0, 1.0);
  EXPECT_DOUBLE_EQ(adaptive.adjustment(), 0.0);  // never below zero
}

// A link slowed at run time: the sender stays within the job file's budget,
// but the link cannot take what it has to send (its flow control holds
// changes back): the threshold rises. When the link keeps up again, it
// falls.
TEST(AdaptiveThresholdTest, RisesWhileTheLinkIsSaturated) {
  AdaptiveThreshold adaptive(/*budget=*/1e6, /*step=*/0.005,
                             /*max_adjustment=*/0.5);
  adaptive.ObserveDelivery(500'000, 1.0, /*saturated=*/false);
  EXPECT_DOUBLE_EQ(adaptive.adjustment(), 0.0);
  for (int i = 0; i < 4; ++i) adaptive.ObserveDelivery(50'000, 1.0, true);
  EXPECT_DOUBLE_EQ(adaptive.adjustment(), 0.020);
  adaptive.ObserveDelivery(100'000, 1.0, /*saturated=*/false);
  EXPECT_DOUBLE_EQ(adaptive.adjustment(), 0.015);
  // Above the budget counts as saturated too.
  adaptive.ObserveDelivery(2'000'000, 1.0, /*saturated=*/false);
  EXPECT_DOUBLE_EQ(adaptive.adjustment(), 0.020);
}

TEST(AdaptiveThresholdTest, WithoutABudgetOnlySaturationCounts) {
  AdaptiveThreshold adaptive(/*budget=*/0, /*step=*/0.01,
                             /*max_adjustment=*/0.05);
  adaptive.ObserveDelivery(10'000'000, 1.0, false);
  EXPECT_DOUBLE_EQ(adaptive.adjustment(), 0.0);
  adaptive.ObserveDelivery(1'000'000, 1.0, true);
  EXPECT_DOUBLE_EQ(adaptive.adjustment(), 0.01);
  adaptive.ObserveDelivery(1'000'000, 1.0, false);
  EXPECT_DOUBLE_EQ(adaptive.adjustment(), 0.0);
}

TEST(MirrorClocksTest, ClocksGoUp) {
  MirrorClocks clocks({"b", "c"});
  EXPECT_EQ(clocks.Min(), 0);
  EXPECT_OK(clocks.Advance("b", 1));
  EXPECT_OK(clocks.Advance("b", 2));
  EXPECT_EQ(clocks.Min(), 0);
  EXPECT_OK(clocks.Advance("c", 1));
  EXPECT_EQ(clocks.Min(), 1);
  EXPECT_EQ(clocks.ClockOf("b"), 2);
}

TEST(MirrorClocksTest, RepeatedBackwardsAndUnknownAreErrors) {
  MirrorClocks clocks({"b"});
  ASSERT_OK(clocks.Advance("b", 2));
  const Status repeated = clocks.Advance("b", 2);
  EXPECT_FALSE(repeated.ok());
  EXPECT_NE(repeated.message().find("repeats"), std::string::npos);
  const Status backwards = clocks.Advance("b", 1);
  EXPECT_FALSE(backwards.ok());
  EXPECT_NE(backwards.message().find("backwards"), std::string::npos);
  EXPECT_FALSE(clocks.Advance("z", 1).ok());
  EXPECT_EQ(clocks.ClockOf("b"), 2);  // errors change nothing
}

TEST(MirrorClocksTest, JumpsForwardAndResets) {
  MirrorClocks clocks({"b"});
  ASSERT_OK(clocks.Advance("b", 1));
  // A site that was cut off catches up in one step.
  ASSERT_OK(clocks.Advance("b", 40));
  EXPECT_EQ(clocks.ClockOf("b"), 40);
  // A peer restarted without its state starts again.
  ASSERT_OK(clocks.Reset("b", 0));
  EXPECT_EQ(clocks.ClockOf("b"), 0);
  EXPECT_FALSE(clocks.Reset("z", 0).ok());
}

TEST(MirrorClocksTest, StalenessBound) {
  MirrorClocks clocks({"b", "c"});
  ASSERT_OK(clocks.Advance("b", 1));
  // DS = 0: a barrier every clock.
  EXPECT_TRUE(clocks.WithinBound(0, 0));
  EXPECT_FALSE(clocks.WithinBound(1, 0));
  // DS = 2: up to two clocks ahead of the slowest (c, at 0).
  EXPECT_TRUE(clocks.WithinBound(2, 2));
  EXPECT_FALSE(clocks.WithinBound(3, 2));
  ASSERT_OK(clocks.Advance("c", 1));
  EXPECT_TRUE(clocks.WithinBound(3, 2));
  EXPECT_TRUE(MirrorClocks({}).WithinBound(100, 0));
}

TEST(BlockedKeysTest, BlocksOnlyTheAnnouncedKeysUntilReleased) {
  BlockedKeys blocked;
  const std::vector<uint64_t> keys = {10, 11, 500};
  blocked.Block("b", 3, keys);
  EXPECT_TRUE(blocked.Intersects(0, 11));
  EXPECT_TRUE(blocked.Intersects(500, 501));
  EXPECT_FALSE(blocked.Intersects(12, 500));
  EXPECT_FALSE(blocked.Intersects(0, 10));
  // Another peer announces an overlapping key.
  const std::vector<uint64_t> more = {11};
  blocked.Block("c", 3, more);
  blocked.Release("b", 3);
  EXPECT_FALSE(blocked.Intersects(0, 11));
  EXPECT_TRUE(blocked.Intersects(11, 12));
  blocked.Release("c", 3);
  EXPECT_TRUE(blocked.empty());
  blocked.Release("c", 3);  // releasing twice is harmless
}

pb::JobConfig SixSites(pb::TopologyKind topology) {
  pb::JobConfig config;
  for (const char* name : {"a", "b", "c", "d", "e", "f"}) {
    pb::SiteConfig* site = config.add_site();
    site->set_name(name);
    site->add_workers()->set_count(1);
  }
  config.mutable_sync()->set_topology(topology);
  if (topology == pb::STAR) config.mutable_sync()->set_hub("c");
  if (topology == pb::GROUPS) {
    pb::SiteGroup* g1 = config.mutable_sync()->add_group();
    g1->set_hub("a");
    g1->add_site("b");
    g1->add_site("c");
    pb::SiteGroup* g2 = config.mutable_sync()->add_group();
    g2->set_hub("d");
    g2->add_site("e");
    g2->add_site("f");
  }
  EXPECT_TRUE(ValidateJobConfig(config).empty())
      << FormatConfigIssues("six", ValidateJobConfig(config));
  return config;
}

TEST(TopologyTest, FullMeshTalksToEveryone) {
  const pb::JobConfig config = SixSites(pb::FULL_MESH);
  const SyncRole role = RoleOf(config, 2);
  EXPECT_EQ(role.kind, SyncRole::Kind::kMesh);
  EXPECT_EQ(role.Peers(), (std::vector<int>{0, 1, 3, 4, 5}));
  EXPECT_EQ(MessagesPerClock(config), 2u * 6 * 5);
}

TEST(TopologyTest, StarSendsThroughTheHub) {
  const pb::JobConfig config = SixSites(pb::STAR);
  EXPECT_EQ(RoleOf(config, 2).kind, SyncRole::Kind::kHub);
  EXPECT_EQ(RoleOf(config, 2).Peers(), (std::vector<int>{0, 1, 3, 4, 5}));
  EXPECT_EQ(RoleOf(config, 0).kind, SyncRole::Kind::kMember);
  EXPECT_EQ(RoleOf(config, 0).Peers(), (std::vector<int>{2}));
  // 5 members x 2 up + 5 x 2 down.
  EXPECT_EQ(MessagesPerClock(config), 20u);
}

TEST(TopologyTest, GroupsHaveHubsInAMesh) {
  const pb::JobConfig config = SixSites(pb::GROUPS);
  const SyncRole hub = RoleOf(config, 3);
  EXPECT_EQ(hub.kind, SyncRole::Kind::kHub);
  EXPECT_EQ(hub.members, (std::vector<int>{4, 5}));
  EXPECT_EQ(hub.hubs, (std::vector<int>{0}));
  const SyncRole member = RoleOf(config, 1);
  EXPECT_EQ(member.kind, SyncRole::Kind::kMember);
  EXPECT_EQ(member.hub, 0);
  // 4(S - H) + 2H(H - 1) = 16 + 4, against 60 for the mesh.
  EXPECT_EQ(MessagesPerClock(config), 20u);
}

TEST(TopologyTest, SitesWithoutAServerTakeNoPart) {
  pb::JobConfig config = SixSites(pb::FULL_MESH);
  config.mutable_site(5)->set_server_site("a");
  EXPECT_EQ(RoleOf(config, 0).Peers(), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(MessagesPerClock(config), 2u * 5 * 4);
}

}  // namespace
}  // namespace meridian
