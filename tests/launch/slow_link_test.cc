// A slow link is not a dead peer: `meridian run` over two sites through
// wanem, their link slowed (or partitioned) at run time with `meridian
// wanem ctl`. Slowed so far that the final flush takes longer than the
// peers' liveness timeout, every peer stays reachable, the flush completes
// and the replicas end identical; partitioned, the run says its flush is
// incomplete (report.json, its summary, exit status 3) and `meridian run
// --resume` completes it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "launch/run_test_util.h"
#include "meridian/job.pb.h"
#include "meridian/metrics/metrics.h"
#include "meridian/report/report.h"
#include "meridian/report.pb.h"
#include "testing/processes.h"
#include "testing/status_matchers.h"
#include "testing/test_data.h"

namespace meridian {
namespace {

using testing::BackgroundRun;
using testing::CommandResult;
using testing::EventsOf;
using testing::RunCommand;
using testing::WaitFor;

// The liveness timeout of the jobs here (fault.peer_timeout_s).
constexpr double kPeerTimeoutS = 3.0;

class SlowLinkTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_dir_ = new std::string(testing::MakeTempDir("slowlink-data"));
    testing::SyntheticDataOptions options;
    options.train_samples = 4000;
    options.test_samples = 1000;
    options.noise = 400;
    ASSERT_OK(testing::WriteSyntheticIdx(*data_dir_, options));
  }

  void SetUp() override {
    out_ = testing::MakeTempDir("slowlink-out");
    path_ = testing::MakeTempDir("slowlink-job") + "/job.pbtxt";
  }

  // Sites a and b of one worker each through wanem (100 Mbit/s, 5 ms),
  // Gaia sync, `budget_s` of training, peers unreachable after
  // kPeerTimeoutS of silence.
  void WriteJob(double budget_s) {
    pb::JobConfig job = testing::SmallJob(*data_dir_, 1);
    job.set_time_budget_s(budget_s);
    job.set_stop_at_target(false);
    job.clear_site();
    for (const char* name : {"a", "b"}) {
      pb::SiteConfig* site = job.add_site();
      site->set_name(name);
      site->add_workers()->set_count(1);
    }
    pb::LinkDirectionConfig* link = job.mutable_wan()->mutable_default_link();
    link->set_bandwidth("100mbit");
    link->set_latency("5ms");
    job.mutable_wan()->set_control_address("tcp://127.0.0.1:0");
    pb::SyncConfig* sync = job.mutable_sync();
    sync->set_kind(pb::GAIA);
    sync->set_threshold(0.05);
    sync->set_max_clock_skew(4);
    sync->mutable_compression()->set_value_coding(pb::VALUE_INT8);
    sync->mutable_compression()->set_block_size(256);
    job.mutable_fault()->set_peer_timeout_s(kPeerTimeoutS);
    ASSERT_OK(testing::WriteJobFile(job, path_));
  }

  // wanem's control endpoint once both site servers' workers train (OUT/
  // endpoints.json and their metrics); empty after a generous deadline.
  std::string AwaitTraining() {
    std::string control;
    const bool training = WaitFor(
        [&] {
          pb::RunEndpoints endpoints;
          if (!ReadJsonFile(out_ + "/endpoints.json", &endpoints).ok()) {
            return false;
          }
          int sites = 0;
          for (const pb::ProcessEndpoint& process : endpoints.process()) {
            if (process.role() == "wanem") control = process.control_address();
            if (process.role() != "site") continue;
            Result<std::string> text =
                FetchMetricsText(process.metrics_address(), 5.0);
            if (!text.ok()) continue;
            Result<std::vector<MetricSample>> samples = ParseMetricsText(*text);
            if (!samples.ok()) continue;
            for (const MetricSample& sample : *samples) {
              if (sample.name == "meridian_site_worker_steps_total" &&
                  sample.value > 0) {
                ++sites;
                break;
              }
            }
          }
          return sites == 2 && !control.empty();
        },
        std::chrono::seconds(120));
    return training ? control : std::string();
  }

  // `meridian wanem ctl --control CONTROL ARGS`, which must succeed.
  static void Ctl(const std::string& control, const std::string& args) {
    const CommandResult result =
        RunCommand(std::string(MERIDIAN_BINARY) + " wanem ctl --control " +
                   control + " " + args);
    ASSERT_EQ(result.exit_code, 0) << args << ": " << result.output;
  }

  double ModelDifference() const {
    return testing::MaxDifference(out_ + "/model-a.f32",
                                  out_ + "/model-b.f32");
  }

  static std::string* data_dir_;
  std::string out_;
  std::string path_;
};

std::string* SlowLinkTest::data_dir_ = nullptr;

// The link slowed to 48 kbit/s while the sites train: the final flush
// takes longer than the liveness timeout, yet both peers stay reachable
// throughout (their messages, cut to a quarter second of the link, keep
// arriving), the flush completes and the replicas agree up to rounding.
TEST_F(SlowLinkTest, FlushOverASlowLinkCompletesAndNoPeerIsDeclaredDead) {
  WriteJob(/*budget_s=*/12);
  BackgroundRun run(path_ + " --out " + out_);
  const std::string control = AwaitTraining();
  ASSERT_FALSE(control.empty()) << "the sites did not start training";
  Ctl(control, "set a-b --bandwidth 48kbit");
  const CommandResult& result = run.Wait();
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output.find("FINAL FLUSH INCOMPLETE"), std::string::npos);

  pb::RunReport report;
  ASSERT_OK(ReadJsonFile(out_ + "/report.json", &report));
  EXPECT_TRUE(report.flush_complete());
  EXPECT_EQ(report.unflushed_size(), 0);
  ASSERT_EQ(report.sites_size(), 2);
  double longest_flush_s = 0;
  for (const pb::SiteSummary& site : report.sites()) {
    EXPECT_TRUE(site.sync().flushed()) << site.name();
    EXPECT_EQ(site.sync().unflushed_peers_size(), 0) << site.name();
    EXPECT_GT(site.sync().flush_bytes(), 0) << site.name();
    EXPECT_GT(site.sync().flush_bound_s(), 0) << site.name();
    longest_flush_s = std::max(longest_flush_s, site.sync().flush_s());
  }
  // What the test is about: the flush outlasted the liveness timeout.
  EXPECT_GT(longest_flush_s, kPeerTimeoutS);
  for (const char* site : {"a", "b"}) {
    const std::string subject = std::string("site '") + site + "'";
    EXPECT_TRUE(EventsOf(report, pb::PEER_UNREACHABLE, subject).empty())
        << subject << " was declared unreachable";
  }
  EXPECT_LT(ModelDifference(), 1e-4);
}

// The link partitioned while the sites train and to the end: the flush
// cannot complete. report.json says so at the top (flush_complete false,
// both sites with their peer), so does the summary, and the exit status is
// 3. `meridian run --resume OUT`, the link whole again, completes the flush
// (exit 0) and the replicas agree.
TEST_F(SlowLinkTest, FlushThatCannotCompleteIsReportedAndResumeCompletesIt) {
  WriteJob(/*budget_s=*/8);
  BackgroundRun run(path_ + " --out " + out_);
  const std::string control = AwaitTraining();
  ASSERT_FALSE(control.empty()) << "the sites did not start training";
  Ctl(control, "partition a-b");
  const CommandResult& result = run.Wait();
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("FINAL FLUSH INCOMPLETE (a with b; b with a)"),
            std::string::npos)
      << result.output;

  pb::RunReport report;
  ASSERT_OK(ReadJsonFile(out_ + "/report.json", &report));
  EXPECT_FALSE(report.flush_complete());
  ASSERT_EQ(report.unflushed_size(), 2);
  for (const pb::UnflushedSite& site : report.unflushed()) {
    ASSERT_EQ(site.peers_size(), 1) << site.site();
    EXPECT_EQ(site.peers(0), site.site() == "a" ? "b" : "a");
  }
  EXPECT_GT(ModelDifference(), 0);

  const CommandResult resumed = RunCommand(std::string(MERIDIAN_BINARY) +
                                           " run --resume " + out_);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  pb::RunReport after;
  ASSERT_OK(ReadJsonFile(out_ + "/report.json", &after));
  EXPECT_TRUE(after.flush_complete());
  for (const pb::SiteSummary& site : after.sites()) {
    EXPECT_TRUE(site.sync().flushed()) << site.name();
  }
  EXPECT_LT(ModelDifference(), 1e-4);
  // The workers the resume starts join sites whose training is over: they
  // are told so and leave with success, failing nothing.
  for (const pb::FaultEvent& event : after.events()) {
    EXPECT_NE(event.kind(), pb::PROCESS_FAILED)
        << event.subject() << ": " << event.detail();
  }
}

}  // namespace
}  // namespace meridian
