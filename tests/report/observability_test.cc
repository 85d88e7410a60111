// Observability through the real binary: a live run's metrics endpoints and
// endpoints.json, `meridian top`, and `meridian report`'s plots, summary and
// answers to bad input.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "meridian/job.pb.h"
#include "meridian/report.pb.h"
#include "meridian/metrics/metrics.h"
#include "meridian/report/report.h"
#include "testing/processes.h"
#include "testing/test_data.h"
#include "testing/status_matchers.h"
#include "testing/text.h"

namespace meridian {
namespace {

using ::meridian::testing::ReadFile;

using ::meridian::testing::Contains;

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::RunCommand;

CommandResult Meridian(const std::string& args) {
  return RunCommand(std::string(MERIDIAN_BINARY) + " " + args);
}



bool HaveGnuplot() { return RunCommand("command -v gnuplot").exit_code == 0; }

// Sum of the samples named `name` in `text` (NaN when absent or garbled).
double MetricSum(const std::string& text, const std::string& name) {
  Result<std::vector<MetricSample>> samples = ParseMetricsText(text);
  if (!samples.ok()) return std::nan("");
  double total = 0;
  bool found = false;
  for (const MetricSample& sample : *samples) {
    if (sample.name == name) {
      total += sample.value;
      found = true;
    }
  }
  return found ? total : std::nan("");
}

// A small two-site run directory as `meridian run` writes it.
std::string WriteRunDir() {
  const std::string dir = testing::MakeTempDir("obs-run");
  pb::RunReport report;
  report.set_job("two-sites");
  report.set_target_accuracy(0.8);
  report.set_reached_target(true);
  report.set_time_to_target_s(4);
  report.set_final_accuracy(0.85);
  report.set_wall_s(12);
  report.set_outcome("time budget of 10 s used");
  report.set_policy("ASYNC");
  report.set_wan_bytes_total(4e6);
  report.set_wan_reduction(120);
  std::ostringstream timeline;
  timeline << "site,t_s,accuracy,loss,model_version,commits\n";
  std::ostringstream traffic;
  traffic << "t_s,link,from_site,to_site,bytes,messages,queued_bytes,"
             "bandwidth_bps,latency_s,partitioned\n";
  for (const char* name : {"a", "b"}) {
    pb::SiteSummary* site = report.add_sites();
    site->set_name(name);
    site->set_training_s(10);
    for (int w = 0; w < 2; ++w) {
      pb::WorkerSummary* worker = site->add_workers();
      worker->set_site(name);
      worker->set_index(w);
      worker->set_commits(100 + 10 * w);
      worker->set_steps(400);
      *report.add_workers() = *worker;
    }
    for (int i = 0; i <= 10; ++i) {
      timeline << name << "," << i << "," << 0.1 + 0.075 * i << ",1.0," << i
               << "," << 10 * i << "\n";
    }
    pb::LinkTraffic* link = report.add_links();
    link->set_link("a-b");
    link->set_from_site(name);
    link->set_to_site(name == std::string("a") ? "b" : "a");
    link->set_bytes(2e6);
    link->set_messages(500);
  }
  // wanem's clock: training starts between its samples 1 and 2.
  for (int t = 0; t <= 12; ++t) {
    const double bytes = t < 2 ? 0 : (t - 1) * 2e5;
    traffic << t << ",a-b,a,b," << bytes << ",10,0,1e8,0.01,0\n";
    traffic << t << ",a-b,b,a," << bytes << ",10,0,1e8,0.01,0\n";
  }
  EXPECT_OK(WriteJsonFile(report, dir + "/report.json"));
  std::ofstream(dir + "/timeline.csv") << timeline.str();
  std::ofstream(dir + "/traffic.csv") << traffic.str();
  return dir;
}

constexpr const char* kPlots[] = {
    "accuracy_vs_time.png", "wan_bytes_vs_time.png",
    "accuracy_vs_wan_bytes.png", "commit_rate.png"};

TEST(ReportTest, RendersEveryPlotAndTheSummary) {
  if (!HaveGnuplot()) {
    GTEST_SKIP() << "gnuplot is not installed (Debian package gnuplot-nox)";
  }
  const std::string run = WriteRunDir();
  const std::string second = WriteRunDir();  // runs overlaid
  const std::string out = testing::MakeTempDir("obs-plots");
  const CommandResult result =
      Meridian("report " + run + " " + second + " --out " + out);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (const char* png : kPlots) {
    const std::string path = out + "/" + png;
    ASSERT_TRUE(fs::exists(path)) << path << "\n" << result.output;
    EXPECT_GT(fs::file_size(path), 2000u) << path;
    EXPECT_EQ(ReadFile(path).substr(0, 8), "\x89PNG\r\n\x1a\n") << path;
    EXPECT_TRUE(Contains(result.output, path)) << result.output;
  }
  // Data and script beside the images, for re-rendering.
  EXPECT_TRUE(fs::exists(out + "/plots.gp"));
  EXPECT_TRUE(fs::exists(out + "/accuracy_vs_time.dat"));
  const std::string summary = ReadFile(out + "/summary.md");
  EXPECT_TRUE(Contains(summary, "| run | job | time to target (s)")) << summary;
  EXPECT_TRUE(Contains(summary, "| " + run + " | two-sites | 4.0 | 0.8500"))
      << summary;
  for (const char* png : kPlots) {
    EXPECT_TRUE(Contains(summary, png)) << summary;
  }
  // Traffic is aligned to training time: the first bytes (wanem time 2 s)
  // land between 0 and 1 s of training.
  const std::string wan = ReadFile(out + "/wan_bytes_vs_time.dat");
  EXPECT_TRUE(Contains(wan, "\n0.5 0.2\n")) << wan;
}

TEST(ReportTest, DefaultOutputIsBesideTheRun) {
  if (!HaveGnuplot()) {
    GTEST_SKIP() << "gnuplot is not installed (Debian package gnuplot-nox)";
  }
  const std::string run = WriteRunDir();
  const CommandResult result = Meridian("report " + run);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(fs::exists(run + "/plots/summary.md"));
  EXPECT_TRUE(fs::exists(run + "/plots/commit_rate.png"));
}

TEST(ReportTest, WithoutGnuplotNamesThePackageAndKeepsTheData) {
  const std::string run = WriteRunDir();
  const std::string out = testing::MakeTempDir("obs-plots");
  const CommandResult result =
      RunCommand("PATH=/nonexistent " + std::string(MERIDIAN_BINARY) +
                 " report " + run + " --out " + out);
  EXPECT_FALSE(result.crashed);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(Contains(result.output, "gnuplot-nox")) << result.output;
  EXPECT_TRUE(fs::exists(out + "/plots.gp"));
  EXPECT_TRUE(fs::exists(out + "/wan_bytes_vs_time.dat"));
  EXPECT_TRUE(fs::exists(out + "/summary.md"));
}

TEST(ReportTest, MissingReportIsBadInputNamingTheFile) {
  const std::string empty = testing::MakeTempDir("obs-run");
  const CommandResult result = Meridian("report " + empty);
  EXPECT_FALSE(result.crashed);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(Contains(result.output, empty + "/report.json")) << result.output;
  const CommandResult missing = Meridian("report /nonexistent/run");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_TRUE(Contains(missing.output, "/nonexistent/run")) << missing.output;
}

TEST(ReportTest, GarbageCsvIsBadInputNamingTheLine) {
  struct Case {
    const char* file;
    const char* text;
    const char* expected;
  };
  const Case cases[] = {
      {"timeline.csv", "site,t_s,accuracy\na,1,0.5\nb,oops,0.5\n",
       "timeline.csv' line 3"},
      {"timeline.csv", "\x01\x02garbage\n", "timeline.csv' line 1"},
      {"timeline.csv", "", "timeline.csv' is empty"},
      {"traffic.csv", "t_s,link,from_site,to_site,bytes\n1,a-b,a\n",
       "traffic.csv' line 2"},
      {"traffic.csv", "t_s,link,from_site,to_site,bytes\n1,a-b,a,b,NaN\n",
       "traffic.csv' line 2"},
  };
  for (const Case& c : cases) {
    const std::string run = WriteRunDir();
    std::ofstream(run + "/" + c.file) << c.text;
    const CommandResult result = Meridian("report " + run);
    EXPECT_FALSE(result.crashed) << c.file;
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_TRUE(Contains(result.output, c.expected))
        << c.expected << " not in: " << result.output;
  }
  // A report.json that is not one.
  const std::string run = WriteRunDir();
  std::ofstream(run + "/report.json") << "{ not json";
  const CommandResult result = Meridian("report " + run);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(Contains(result.output, "report.json")) << result.output;
}

// A free loopback port (bound, then released).
std::string FreeAddress() {
  MetricsRegistry registry;
  Result<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(&registry, "127.0.0.1:0");
  EXPECT_OK(server);
  return server.ok() ? (*server)->address() : "127.0.0.1:1";
}

TEST(TopTest, SitesThatAreDownAreShownAsDown) {
  pb::JobConfig job = testing::SmallJob("/nonexistent", 1);
  job.clear_site();
  for (const char* name : {"east", "west"}) {
    pb::SiteConfig* site = job.add_site();
    site->set_name(name);
    site->add_workers()->set_count(1);
    site->set_metrics_address(FreeAddress());
  }
  job.mutable_wan()->set_metrics_address(FreeAddress());
  const std::string path = testing::MakeTempDir("obs-top") + "/job.pbtxt";
  ASSERT_OK(testing::WriteJobFile(job, path));
  const CommandResult result = Meridian("top --once " + path);
  EXPECT_FALSE(result.crashed);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(Contains(result.output, "SITE")) << result.output;
  for (const char* name : {"east", "west"}) {
    std::istringstream lines(result.output);
    bool down = false;
    for (std::string line; std::getline(lines, line);) {
      down |= line.rfind(name, 0) == 0 && Contains(line, "down");
    }
    EXPECT_TRUE(down) << name << " not shown down:\n" << result.output;
  }
  EXPECT_TRUE(Contains(result.output, "wanem: down")) << result.output;
}

TEST(TopTest, ValidateNamesABadMetricsAddress) {
  pb::JobConfig job = testing::SmallJob("/nonexistent", 1);
  job.mutable_site(0)->set_metrics_address("no-port");
  job.mutable_wan()->set_metrics_address("h:70000");
  const std::string path = testing::MakeTempDir("obs-top") + "/job.pbtxt";
  ASSERT_OK(testing::WriteJobFile(job, path));
  const CommandResult result = Meridian("validate " + path);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(Contains(result.output, "site[0].metrics_address"))
      << result.output;
  EXPECT_TRUE(Contains(result.output, "wan.metrics_address")) << result.output;
}

TEST(TopTest, BadInputIsRefused) {
  EXPECT_EQ(Meridian("top --once").exit_code, 2);
  EXPECT_EQ(Meridian("top --once /nonexistent/job.pbtxt").exit_code, 2);
  const CommandResult no_run = Meridian("top --once --run /nonexistent/run");
  EXPECT_EQ(no_run.exit_code, 2) << no_run.output;
  EXPECT_TRUE(Contains(no_run.output, "endpoints.json")) << no_run.output;
}

class LiveRunTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_dir_ = new std::string(testing::MakeTempDir("obs-data"));
    testing::SyntheticDataOptions options;
    options.train_samples = 2000;
    options.test_samples = 500;
    ASSERT_OK(testing::WriteSyntheticIdx(*data_dir_, options));
  }
  static std::string* data_dir_;
};

std::string* LiveRunTest::data_dir_ = nullptr;

// A two-site job under `meridian run`: endpoints.json lists both site
// servers and wanem; their counters move while the job trains; `meridian
// top --run` shows the sites training.
TEST_F(LiveRunTest, EveryProcessExposesCountersThatMove) {
  pb::JobConfig job = testing::SmallJob(*data_dir_, 2);
  job.set_target_accuracy(0);  // train to the budget (or until stopped)
  job.set_time_budget_s(120);
  job.clear_site();
  for (const char* name : {"a", "b"}) {
    pb::SiteConfig* site = job.add_site();
    site->set_name(name);
    site->add_workers()->set_count(2);
    site->mutable_workers(0)->set_step_time_s(0.005);
  }
  job.mutable_wan()->set_control_address("tcp://127.0.0.1:0");
  job.mutable_sync()->set_kind(pb::GAIA);
  job.mutable_sync()->set_max_clock_skew(4);
  const std::string dir = testing::MakeTempDir("obs-live");
  const std::string path = dir + "/job.pbtxt";
  ASSERT_OK(testing::WriteJobFile(job, path));
  const std::string out = dir + "/out";
  CommandResult run_result;
  std::thread runner(
      [&] { run_result = Meridian("run " + path + " --out " + out); });
  // Whatever happens below, stop the job before joining.
  struct Stopper {
    std::string needle;
    std::thread* runner;
    ~Stopper() {
      for (pid_t pid : testing::FindProcesses(needle)) ::kill(pid, SIGINT);
      runner->join();
    }
  } stopper{"run " + path, &runner};

  pb::RunEndpoints endpoints;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!ReadJsonFile(out + "/endpoints.json", &endpoints).ok()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "no endpoints.json";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(endpoints.process_size(), 3) << endpoints.DebugString();
  std::string site_a;
  std::string wanem;
  for (const pb::ProcessEndpoint& process : endpoints.process()) {
    EXPECT_EQ(process.metrics_url(),
              "http://" + process.metrics_address() + "/metrics");
    if (process.site() == "a") site_a = process.metrics_address();
    if (process.role() == "wanem") wanem = process.metrics_address();
  }
  ASSERT_FALSE(site_a.empty());
  ASSERT_FALSE(wanem.empty());

  // Counters move while the job trains. Wait for site a's first commits
  // and its first clock (the sync's threshold is set at the first clock).
  double first_commits = 0;
  std::string text;
  while (true) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "site a never committed:\n"
        << text;
    Result<std::string> scraped = FetchMetricsText(site_a, 5.0);
    if (scraped.ok()) {
      text = *scraped;
      first_commits = MetricSum(text, "meridian_site_commits_total");
      if (first_commits > 0 && MetricSum(text, "meridian_site_clock") > 0) {
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(Contains(text, "# TYPE meridian_site_commits_total counter"));
  EXPECT_EQ(MetricSum(text, "meridian_site_workers_expected"), 2);
  EXPECT_GT(MetricSum(text, "meridian_sync_theta"), 0) << text;
  double later_commits = first_commits;
  double sent = 0;
  double wan_bytes = 0;
  while (later_commits <= first_commits || !(sent > 0) || !(wan_bytes > 0)) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "counters did not move:\n"
        << text;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Result<std::string> scraped = FetchMetricsText(site_a, 5.0);
    ASSERT_OK(scraped);
    text = *scraped;
    later_commits = MetricSum(text, "meridian_site_commits_total");
    sent = MetricSum(text, "meridian_sync_bytes_sent_total");
    Result<std::string> wan = FetchMetricsText(wanem, 5.0);
    ASSERT_OK(wan);
    wan_bytes = MetricSum(*wan, "meridian_wan_bytes_total");
  }
  EXPECT_TRUE(Contains(text,
                       "meridian_sync_bytes_sent_total{peer=\"b\","
                       "site=\"a\"}"))
      << text;

  const CommandResult top = Meridian("top --once --run " + out);
  EXPECT_EQ(top.exit_code, 0) << top.output;
  EXPECT_TRUE(Contains(top.output, "training")) << top.output;
  EXPECT_TRUE(Contains(top.output, "wanem: ")) << top.output;
  EXPECT_FALSE(Contains(top.output, "down")) << top.output;
}

}  // namespace
}  // namespace meridian
