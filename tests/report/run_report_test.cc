// BuildRunReport's verdict on the final flush: flush_complete at the top of
// report.json, with the sites and peers it did not complete with; the cost
// terms: compute utilisation, the density of an exchange, bits per entry.
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
  EXPECT_TRUE(
      BuildRunReport(JobOf({"a"}), {alone}, 1, "done").flush_complete());
  const pb::RunReport report = BuildRunReport(
      JobOf({"a", "b"}), {Synced("a", true), Synced("b", true)}, 1, "done");
  EXPECT_TRUE(report.flush_complete());
  EXPECT_EQ(report.unflushed_size(), 0);
  EXPECT_EQ(DescribeUnflushed(report), "");
}

TEST(RunReportTest, NamesTheSitesAndPeersWhoseFlushDidNotComplete) {
  const pb::RunReport report =
      BuildRunReport(JobOf({"a", "b", "c"}),
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

// A site of `parameters` parameters at `clock` that sent `entries` entries
// in `bytes` bytes, with one worker busy `busy_s` and blocked `blocked_s`.
pb::SiteSummary Sent(const std::string& name, uint32_t clock, double entries,
                     double bytes, double busy_s, double blocked_s) {
  pb::SiteSummary site = Synced(name, true);
  site.set_model_parameters(1000);
  site.mutable_sync()->set_clock(clock);
  site.mutable_sync()->set_entries_sent(entries);
  site.mutable_sync()->set_bytes_sent(bytes);
  pb::WorkerSummary* worker = site.add_workers();
  worker->set_compute_s(busy_s / 2);
  worker->set_device_wait_s(busy_s / 2);
  worker->set_blocked_s(blocked_s);
  return site;
}

TEST(RunReportTest, ComputeUtilizationDensityAndBitsPerEntry) {
  // Gaia, three sites: a round is a clock, two peers each.
  pb::JobConfig job = JobOf({"a", "b", "c"});
  const pb::RunReport gaia = BuildRunReport(
      job,
      {Sent("a", 100, 3000, 6000, 90, 10), Sent("b", 100, 1000, 3000, 60, 40),
       Sent("c", 50, 1000, 2000, 100, 0)},
      1, "done");
  EXPECT_DOUBLE_EQ(gaia.compute_utilization(), 250.0 / 300.0);
  // 3000 / (100 x 2 x 1000), 1000 / 200000, 1000 / 100000.
  EXPECT_DOUBLE_EQ(gaia.sites(0).sync().round_density(), 0.015);
  EXPECT_DOUBLE_EQ(gaia.sites(2).sync().round_density(), 0.01);
  EXPECT_DOUBLE_EQ(gaia.round_density(), (0.015 + 0.005 + 0.01) / 3);
  EXPECT_DOUBLE_EQ(gaia.sites(1).sync().bits_per_entry(), 24.0);
  EXPECT_DOUBLE_EQ(gaia.bits_per_entry(), 11000.0 * 8 / 5000);
  // DiLoCo: a round is averaging_period clocks; a dense exchange is 1.
  job.mutable_sync()->set_kind(pb::DILOCO);
  job.mutable_sync()->set_averaging_period(50);
  const pb::RunReport diloco =
      BuildRunReport(job, {Sent("a", 100, 4000, 4000, 1, 0)}, 1, "done");
  EXPECT_DOUBLE_EQ(diloco.sites(0).sync().round_density(), 1.0);
  // Hubs: the peers differ by site, no density; bits still.
  job.mutable_sync()->set_topology(pb::GROUPS);
  const pb::RunReport hubs =
      BuildRunReport(job, {Sent("a", 100, 4000, 4000, 1, 0)}, 1, "done");
  EXPECT_EQ(hubs.round_density(), 0.0);
  EXPECT_DOUBLE_EQ(hubs.bits_per_entry(), 8.0);
  // Nothing sent, no workers: zeros, not NaN.
  const pb::RunReport idle =
      BuildRunReport(JobOf({"a"}), {Synced("a", true)}, 1, "done");
  EXPECT_EQ(idle.compute_utilization(), 0.0);
  EXPECT_EQ(idle.bits_per_entry(), 0.0);
  // As `meridian compare` and summary.md show them.
  EXPECT_EQ(DescribeCostTerms(gaia), "83% | 1%, 17.6 bits/entry");
  EXPECT_EQ(DescribeCostTerms(hubs), "100% | 8.0 bits/entry");
  EXPECT_EQ(DescribeCostTerms(idle), "— | —");
}

pb::LinkTraffic Link(const std::string& from, const std::string& to,
                     double bytes) {
  pb::LinkTraffic link;
  link.set_link(from + "-" + to);
  link.set_from_site(from);
  link.set_to_site(to);
  link.set_bytes(bytes);
  return link;
}

TEST(RunReportTest, WanBillAtListPricesAgainstBspOverTheWan) {
  pb::JobConfig job = JobOf({"us", "ap", "lab"});
  job.mutable_site(0)->set_region("us-east-1");
  job.mutable_site(1)->set_region("ap-southeast-1");
  // "lab" has no region: its links have no price.
  pb::SiteSummary us = Sent("us", 10, 0, 0, 1, 0);
  pb::SiteSummary ap = Sent("ap", 10, 0, 0, 1, 0);
  us.mutable_workers(0)->set_site("us");
  ap.mutable_workers(0)->set_site("ap");
  ap.mutable_workers(0)->set_steps(1000);
  pb::RunReport report = BuildRunReport(job, {us, ap}, 1, "done");
  *report.add_links() = Link("us", "ap", 2e9);
  *report.add_links() = Link("ap", "us", 1e9);
  *report.add_links() = Link("lab", "us", 5e8);
  report.set_wan_bytes_total(3.5e9);
  AddWanCost(job, &report);
  // Billed to the sender: 2 GB from Virginia at $0.02, 1 GB from Singapore
  // at $0.09.
  EXPECT_DOUBLE_EQ(report.links(0).usd_per_gb(), 0.02);
  EXPECT_DOUBLE_EQ(report.links(0).cost_usd(), 0.04);
  EXPECT_DOUBLE_EQ(report.links(1).cost_usd(), 0.09);
  EXPECT_FALSE(report.links(2).has_usd_per_gb());
  EXPECT_DOUBLE_EQ(report.wan_cost_usd(), 0.13);
  EXPECT_DOUBLE_EQ(report.unpriced_wan_bytes(), 5e8);
  // BSP: ap's 1000 steps each push 4 kB (1000 floats) to us ($0.09/GB) and
  // pull it back ($0.02/GB).
  EXPECT_DOUBLE_EQ(report.dense_equivalent_cost_usd(),
                   1000 * 4000 / 1e9 * (0.09 + 0.02));
  EXPECT_NE(report.wan_price_source().find("AWS"), std::string::npos);
  EXPECT_EQ(DescribeWanCost(report), "$0.130 + 500.00 MB unpriced");
  // Every link priced: the bill against BSP's.
  report.mutable_links()->RemoveLast();
  report.set_wan_bytes_total(3e9);
  report.set_dense_equivalent_bytes(0);
  AddWanCost(job, &report);
  report.set_dense_equivalent_cost_usd(13);
  EXPECT_EQ(DescribeWanCost(report), "$0.130 (BSP $13.00)");
  // The job's price replaces the table's; a report from before prices.
  job.mutable_wan()->add_price()->set_from_region("*");
  job.mutable_wan()->mutable_price(0)->set_usd_per_gb(0.01);
  AddWanCost(job, &report);
  EXPECT_DOUBLE_EQ(report.wan_cost_usd(), 0.03);
  EXPECT_EQ(report.wan_price_source().rfind("the job's wan.price", 0), 0u);
  EXPECT_EQ(DescribeWanCost(pb::RunReport()), "—");
  EXPECT_EQ(FormatUsd(12.345), "$12.35");
  EXPECT_EQ(FormatUsd(0.0013), "$0.0013");
}

}  // namespace
}  // namespace meridian
