// BuildRunReport's verdict on the final flush: flush_complete at the top of
// report.json, with the sites and peers it did not complete with.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "meridian/job.pb.h"
#include "meridian/report.pb.h"
#include "meridian/report/report.h"

namespace meridian {
namespace {

pb::JobConfig JobOf(const std::vector<std::string>& names) {
  pb::JobConfig job;
  for (const std::string& name : names) job.add_site()->set_name(name);
  return job;
}

pb::SiteSummary Synced(const std::string& name, bool flushed,
                       const std::vector<std::string>& unflushed = {}) {
  pb::SiteSummary site;
  site.set_name(name);
  site.mutable_sync()->set_flushed(flushed);
  for (const std::string& peer : unflushed) {
    site.mutable_sync()->add_unflushed_peers(peer);
  }
  return site;
}

TEST(RunReportTest, FlushCompleteWhenEverySiteFlushedOrNoneSyncs) {
  pb::SiteSummary alone;
  alone.set_name("a");
  EXPECT_TRUE(BuildRunReport(JobOf({"a"}), {alone}, 1, "done").flush_complete());
  const pb::RunReport report = BuildRunReport(
      JobOf({"a", "b"}), {Synced("a", true), Synced("b", true)}, 1, "done");
  EXPECT_TRUE(report.flush_complete());
  EXPECT_EQ(report.unflushed_size(), 0);
  EXPECT_EQ(DescribeUnflushed(report), "");
}

TEST(RunReportTest, NamesTheSitesAndPeersWhoseFlushDidNotComplete) {
  const pb::RunReport report = BuildRunReport(
      JobOf({"a", "b", "c"}),
      {Synced("a", false, {"b"}), Synced("b", false, {"a", "c"}),
       Synced("c", true)},
      1, "done");
  EXPECT_FALSE(report.flush_complete());
  ASSERT_EQ(report.unflushed_size(), 2);
  EXPECT_EQ(report.unflushed(0).site(), "a");
  EXPECT_EQ(DescribeUnflushed(report), "a with b; b with a, c");
}

TEST(RunReportTest, ASyncingSiteWithoutASummaryCountsAsUnflushed) {
  const pb::RunReport report = BuildRunReport(
      JobOf({"a", "b"}), {Synced("a", true)}, 1, "failed: b killed");
  EXPECT_FALSE(report.flush_complete());
  ASSERT_EQ(report.unflushed_size(), 1);
  EXPECT_EQ(report.unflushed(0).site(), "b");
  EXPECT_EQ(DescribeUnflushed(report), "b with its peers");
}

}  // namespace
}  // namespace meridian
