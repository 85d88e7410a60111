// Tests of when a site server's checkpoint is due
// (src/site/site_checkpoint.h, on the durable writer of src/durable).

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "site/site_checkpoint.h"
#include "testing/status_matchers.h"
#include "tests/durable/durable_test_util.h"

namespace meridian::durable_test {
namespace {

TEST(EarlyCheckpointSpacingTest, FollowsTheWriteCostWithinBounds) {
  EXPECT_DOUBLE_EQ(EarlyCheckpointSpacing(0.0, 10), 0.1);  // floor
  EXPECT_DOUBLE_EQ(EarlyCheckpointSpacing(0.01, 10), 0.1);
  EXPECT_DOUBLE_EQ(EarlyCheckpointSpacing(0.08, 10), 0.4);  // 5 × cost
  EXPECT_DOUBLE_EQ(EarlyCheckpointSpacing(4.0, 10), 10.0);  // the period
  EXPECT_DOUBLE_EQ(EarlyCheckpointSpacing(4.0, 0), 20.0);   // no period
}

TEST(SiteCheckpointerTest, EarlyCheckpointsFollowTheWriteNotASecond) {
  const std::string dir = Dir("site-due");
  Result<std::unique_ptr<SiteCheckpointer>> opened = SiteCheckpointer::Open(
      {.dir = dir, .fingerprint = Fp(), .period_s = 10}, /*resume=*/false);
  ASSERT_OK(opened);
  SiteCheckpointer& checkpointer = **opened;
  EXPECT_TRUE(checkpointer.Due(100.0, false));  // none yet
  checkpointer.Submit(pb::SiteCheckpoint(), {{"model", {1, 2, 3}}}, 100.0);
  // Written but not yet taken as durable: an early one waits for it.
  ASSERT_OK(checkpointer.Flush());
  EXPECT_FALSE(checkpointer.Due(100.5, true));
  EXPECT_TRUE(checkpointer.TakeDurable().has_value());
  // Wanted checkpoints follow after EarlyCheckpointSpacing (0.1 s for a
  // write under 20 ms; the old rule waited a second), unwanted ones wait
  // for the period.
  const double spacing =
      EarlyCheckpointSpacing(checkpointer.last_write_s(), 10);
  EXPECT_FALSE(checkpointer.Due(100.0 + 0.9 * spacing, true));
  EXPECT_TRUE(checkpointer.Due(100.0 + spacing + 1e-9, true));
  EXPECT_FALSE(checkpointer.Due(100.0 + spacing + 1e-9, false));
  EXPECT_FALSE(checkpointer.Due(109.9, false));
  EXPECT_TRUE(checkpointer.Due(110.0, false));
}

}  // namespace
}  // namespace meridian::durable_test
