// The age of remote changes as a site records it (src/sync/update_age.h).

#include "sync/update_age.h"

#include <gtest/gtest.h>

namespace meridian {
namespace {

TEST(DurationHistogramTest, EmptyReadsZero) {
  DurationHistogram histogram;
  EXPECT_EQ(histogram.count(), 0u);
  EXPECT_EQ(histogram.Quantile(0.5), 0);
  EXPECT_EQ(histogram.mean(), 0);
  EXPECT_EQ(histogram.max(), 0);
}

TEST(DurationHistogramTest, QuantilesWithinABucket) {
  DurationHistogram histogram;
  // 90 short ages (10 ms) and 10 long ones (1 s).
  for (int i = 0; i < 90; ++i) histogram.Add(0.010);
  for (int i = 0; i < 10; ++i) histogram.Add(1.0);
  EXPECT_EQ(histogram.count(), 100u);
  EXPECT_NEAR(histogram.Quantile(0.5), 0.010, 0.010 * 0.13);
  EXPECT_NEAR(histogram.Quantile(0.9), 0.010, 0.010 * 0.13);
  EXPECT_NEAR(histogram.Quantile(0.95), 1.0, 0.13);
  EXPECT_DOUBLE_EQ(histogram.max(), 1.0);
  EXPECT_NEAR(histogram.mean(), (90 * 0.010 + 10 * 1.0) / 100, 1e-12);
  // Never beyond what was seen, even where the bucket reaches further.
  EXPECT_LE(histogram.Quantile(1.0), 1.0);
}

TEST(DurationHistogramTest, OutOfRangeAndNonsenseAreCounted) {
  DurationHistogram histogram;
  histogram.Add(-3);         // a sender clock ahead of ours
  histogram.Add(0.0 / 0.0);  // NaN from a corrupt stamp
  histogram.Add(1e-9);       // below the first bucket
  histogram.Add(1e6);        // beyond the last
  EXPECT_EQ(histogram.count(), 4u);
  EXPECT_EQ(histogram.Quantile(0.25), 0);  // the first three read as 0 s
  EXPECT_DOUBLE_EQ(histogram.max(), 1e6);
  EXPECT_DOUBLE_EQ(histogram.Quantile(1.0), 1e6);
}

TEST(RemoteUpdateAgeTest, AgesRunFromTheWindowStartAndClocksFromTheTag) {
  RemoteUpdateAge age;
  // Changes collected from t=100 s, sent at 100.2 s with clock 40,
  // applied at 100.25 s while this site is at clock 43.
  age.Record(100.0, 100.2, 40, 100.25, 43);
  // A second one, 0.5 s old, one clock behind.
  age.Record(100.25, 100.7, 44, 100.75, 45);
  pb::RemoteUpdateAge out;
  age.Fill("eu", &out);
  EXPECT_EQ(out.peer(), "eu");
  EXPECT_EQ(out.updates(), 2u);
  EXPECT_DOUBLE_EQ(out.max_s(), 0.5);
  EXPECT_NEAR(out.mean_s(), (0.25 + 0.5) / 2, 1e-9);
  EXPECT_NEAR(out.median_transit_s(), 0.05, 0.05 * 0.13);
  EXPECT_DOUBLE_EQ(out.mean_clocks_behind(), 2.0);
  EXPECT_DOUBLE_EQ(out.max_clocks_behind(), 3.0);
}

TEST(RemoteUpdateAgeTest, AnUpdateFromAheadIsZeroClocksBehind) {
  RemoteUpdateAge age;
  age.Record(10.0, 10.1, 50, 10.2, 47);  // the peer runs ahead (DS bound)
  pb::RemoteUpdateAge out;
  age.Fill("ap", &out);
  EXPECT_DOUBLE_EQ(out.max_clocks_behind(), 0.0);
}

}  // namespace
}  // namespace meridian
