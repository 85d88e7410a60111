#include "report/fault_events.h"

#include <gtest/gtest.h>

namespace meridian {
namespace {

class FixedWallClock final : public WallClock {
 public:
  double UnixSeconds() const override { return now_s; }
  double now_s = 1000;
};

TEST(FaultEventLogTest, RecordsWhatWhoWhenAndResolvesItsDuration) {
  FixedWallClock wall;
  FaultEventLog log("eu", &wall);
  const int dead = log.Record(pb::WORKER_DEAD, "eu/2", "silent for 10 s");
  wall.now_s = 1012;
  log.Record(pb::PEER_UNREACHABLE, "site 'us'", "cut off", 3.5);
  log.Resolve(dead, 7.25);
  log.Resolve(-1, 99);  // an event that was not kept: ignored
  log.Resolve(5, 99);   // an index it never gave: ignored

  ASSERT_EQ(log.events().size(), 2);
  const pb::FaultEvent& first = log.events().Get(0);
  EXPECT_EQ(first.kind(), pb::WORKER_DEAD);
  EXPECT_EQ(first.site(), "eu");
  EXPECT_EQ(first.subject(), "eu/2");
  EXPECT_EQ(first.detail(), "silent for 10 s");
  EXPECT_DOUBLE_EQ(first.unix_s(), 1000);
  EXPECT_DOUBLE_EQ(first.duration_s(), 7.25);
  EXPECT_DOUBLE_EQ(log.events().Get(1).unix_s(), 1012);
  EXPECT_DOUBLE_EQ(log.events().Get(1).duration_s(), 3.5);
}

TEST(FaultEventLogTest, KeepsAtMostTheBoundAndSaysSoOnce) {
  FixedWallClock wall;
  FaultEventLog log("us", &wall);
  for (int i = 0; i < kMaxFaultEvents; ++i) {
    ASSERT_EQ(log.Record(pb::MESSAGES_RESENT, "site 'eu'", ""), i);
  }
  EXPECT_EQ(log.Record(pb::MESSAGES_RESENT, "site 'eu'", ""), -1);
  EXPECT_EQ(log.events().size(), kMaxFaultEvents);

  // A copy into a summary that holds events already stops at the bound.
  google::protobuf::RepeatedPtrField<pb::FaultEvent> summary;
  summary.Add()->set_subject("earlier");
  log.CopyTo(&summary);
  EXPECT_EQ(summary.size(), kMaxFaultEvents);
  EXPECT_EQ(summary.Get(0).subject(), "earlier");
}

TEST(FaultEventLogTest, RestoreReplacesTheEventsUpToTheBound) {
  FixedWallClock wall;
  FaultEventLog saved("ap", &wall);
  saved.Record(pb::PEER_RESTARTED, "site 'us'", "incarnation 7");
  FaultEventLog restored("ap", &wall);
  restored.Record(pb::WORKER_DEAD, "ap/0", "");
  restored.Restore(saved.events());
  ASSERT_EQ(restored.events().size(), 1);
  EXPECT_EQ(restored.events().Get(0).kind(), pb::PEER_RESTARTED);

  google::protobuf::RepeatedPtrField<pb::FaultEvent> too_many;
  for (int i = 0; i < kMaxFaultEvents + 5; ++i) too_many.Add();
  restored.Restore(too_many);
  EXPECT_EQ(restored.events().size(), kMaxFaultEvents);
}

}  // namespace
}  // namespace meridian
