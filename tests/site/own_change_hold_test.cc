// OwnChangeHold: each clock's held own changes queue; they reach the model
// when the peers' clock does, or early when the queue is full; a
// checkpoint's copy has them all, and a restart queues it again.
#include "site/own_change_hold.h"

#include <gtest/gtest.h>

#include <vector>

#include "testing/status_matchers.h"

namespace meridian {
namespace {

class OwnChangeHoldTest : public ::testing::Test {
 protected:
  OwnChangeHoldTest() : store_(Layout(), 2, ApplyRule{}) {
    store_.HoldOwnChanges();
  }

  static ModelLayout Layout() {
    ModelLayout layout;
    EXPECT_OK(layout.Add("w", {4}));
    return layout;
  }

  // A commit of `value` everywhere (held by the store).
  void Commit(float value) {
    const std::vector<float> u(4, value);
    const UpdateSegment all{0, u};
    store_.Apply(std::span<const UpdateSegment>(&all, 1));
  }

  float Model() {
    std::vector<float> w(4);
    store_.Snapshot(w);
    return w[0];
  }

  ParameterStore store_;
};

TEST_F(OwnChangeHoldTest, AClockIsAppliedWhenThePeersAnnounceIt) {
  OwnChangeHold hold(&store_, 4);
  Commit(1.0f);
  hold.OnClock(1);
  Commit(2.0f);
  hold.OnClock(2);
  Commit(4.0f);  // clock 3, still being trained
  EXPECT_EQ(hold.queued_clocks(), 2u);
  hold.Release(0);
  EXPECT_EQ(Model(), 0.0f);
  hold.Release(1);
  EXPECT_EQ(Model(), 1.0f);
  hold.Release(5);
  EXPECT_EQ(Model(), 3.0f);
  EXPECT_EQ(hold.queued_clocks(), 0u);
  hold.ReleaseAll();  // and what the clock being trained holds
  EXPECT_EQ(Model(), 7.0f);
  EXPECT_EQ(hold.forced(), 0u);
}

TEST_F(OwnChangeHoldTest, AFullQueueAppliesItsOldestClock) {
  OwnChangeHold hold(&store_, 2);
  for (int clock = 1; clock <= 3; ++clock) {
    Commit(1.0f);
    hold.OnClock(clock);
  }
  EXPECT_EQ(hold.queued_clocks(), 2u);
  EXPECT_EQ(hold.forced(), 1u);
  EXPECT_EQ(Model(), 1.0f);
}

TEST_F(OwnChangeHoldTest, ACheckpointKeepsEveryHeldChange) {
  OwnChangeHold hold(&store_, 4);
  Commit(1.0f);
  hold.OnClock(1);
  Commit(2.0f);
  std::vector<float> saved(4, 0.0f);
  hold.AddTo(saved);
  EXPECT_EQ(saved, std::vector<float>(4, 3.0f));
  EXPECT_EQ(Model(), 0.0f);  // a copy: nothing applied

  // A restarted site: a fresh store and hold, the checkpoint's copy queued
  // at its clock.
  ParameterStore restarted(Layout(), 2, ApplyRule{});
  restarted.HoldOwnChanges();
  OwnChangeHold again(&restarted, 4);
  ASSERT_OK(again.Restore(saved, 7));
  again.Release(6);
  std::vector<float> w(4);
  restarted.Snapshot(w);
  EXPECT_EQ(w[0], 0.0f);
  again.Release(7);
  restarted.Snapshot(w);
  EXPECT_EQ(w, std::vector<float>(4, 3.0f));
  EXPECT_FALSE(again.Restore(std::vector<float>(3), 1).ok());
}

}  // namespace
}  // namespace meridian
