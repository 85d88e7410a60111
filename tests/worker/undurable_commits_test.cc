// UndurableCommits: what a worker keeps for a replay after its site
// restarts — dropped at the durable point, summed unless a pending
// checkpoint separates two commits, bounded.
#include "worker/undurable_commits.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <vector>

namespace meridian {
namespace {

pb::DurablePoint Point(uint64_t durable, std::initializer_list<uint64_t> pending) {
  pb::DurablePoint point;
  point.set_commit_id(durable);
  for (uint64_t id : pending) point.add_pending(id);
  return point;
}

// A change of two floats, kept by the caller until Add takes it.
std::vector<float> change_buffer;
std::vector<float>* Changed(float value) {
  change_buffer = {value, 2 * value};
  return &change_buffer;
}

TEST(UndurableCommitsTest, SumsCommitsNoPendingCheckpointSeparates) {
  UndurableCommits kept(2);
  kept.Add(1, Changed(1), Point(0, {}));
  kept.Add(2, Changed(2), Point(0, {}));
  kept.Add(3, Changed(4), Point(0, {}));
  ASSERT_EQ(kept.kept().size(), 1u);
  EXPECT_EQ(kept.kept()[0].first_id, 1u);
  EXPECT_EQ(kept.kept()[0].last_id, 3u);
  EXPECT_EQ(kept.kept()[0].sum, (std::vector<float>{7, 14}));
  EXPECT_EQ(kept.commits(), 3u);
}

// A checkpoint taken after commit 2 (listed with commit 3's answer) may
// become the point a restart resumes from: 3 stays apart from 1..2; once
// it is durable, 1..2 go.
TEST(UndurableCommitsTest, PendingCheckpointSeparatesAndDurableDrops) {
  UndurableCommits kept(2);
  kept.Add(1, Changed(1), Point(0, {}));
  kept.Add(2, Changed(2), Point(0, {}));
  kept.Add(3, Changed(4), Point(0, {2}));
  ASSERT_EQ(kept.kept().size(), 2u);
  EXPECT_EQ(kept.kept()[0].last_id, 2u);
  EXPECT_EQ(kept.kept()[1].first_id, 3u);
  kept.Add(4, Changed(8), Point(0, {2}));
  ASSERT_EQ(kept.kept().size(), 2u);
  EXPECT_EQ(kept.kept()[1].last_id, 4u);
  EXPECT_EQ(kept.kept()[1].sum, (std::vector<float>{12, 24}));
  kept.OnDurablePoint(Point(2, {}));
  ASSERT_EQ(kept.kept().size(), 1u);
  EXPECT_EQ(kept.kept()[0].first_id, 3u);
  kept.OnDurablePoint(Point(4, {}));
  EXPECT_TRUE(kept.kept().empty());
  EXPECT_EQ(kept.forced_merges(), 0u);
}

TEST(UndurableCommitsTest, BoundMergesTheOldestAndCountsIt) {
  UndurableCommits kept(2);
  for (uint64_t id = 1; id <= 8; ++id) {
    // Every id listed as pending: nothing may be summed.
    kept.Add(id, Changed(1), Point(0, {1, 2, 3, 4, 5, 6, 7}));
  }
  EXPECT_EQ(kept.kept().size(), UndurableCommits::kMaxKept);
  EXPECT_GT(kept.forced_merges(), 0u);
  EXPECT_EQ(kept.commits(), 8u);
  EXPECT_EQ(kept.kept().front().first_id, 1u);
  EXPECT_EQ(kept.kept().back().last_id, 8u);
}

}  // namespace
}  // namespace meridian
