// The command line's answers to bad input: clear errors, no crash.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "meridian/job.pb.h"
#include "meridian/report/report.h"
#include "meridian/report.pb.h"
#include "meridian/wan_control.pb.h"
#include "meridian/wan/presets.h"
#include "testing/processes.h"
#include "testing/test_data.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

using testing::CommandResult;

CommandResult Meridian(const std::string& args) {
  return testing::RunCommand(std::string(MERIDIAN_BINARY) + " " + args);
}

std::string WriteText(const std::string& text) {
  const std::string path = testing::MakeTempDir("cli") + "/job.pbtxt";
  std::ofstream(path) << text;
  return path;
}

// A valid two-worker job on generated data; empty on failure.
std::string WriteSmallJob() {
  const std::string data = testing::MakeTempDir("cli-data");
  testing::SyntheticDataOptions options;
  options.train_samples = 100;
  options.test_samples = 20;
  if (!testing::WriteSyntheticIdx(data, options).ok()) return "";
  const std::string path = testing::MakeTempDir("cli-job") + "/job.pbtxt";
  if (!testing::WriteJobFile(testing::SmallJob(data, 2), path).ok()) return "";
  return path;
}

// Every job file shipped in deploy/configs validates (new ones included
// without listing them here).
TEST(ShippedConfigTest, EveryDeployConfigValidates) {
  const std::filesystem::path dir =
      std::filesystem::path(MERIDIAN_SOURCE_DIR) / "deploy" / "configs";
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".pbtxt") continue;
    const CommandResult result = Meridian("validate " + entry.path().string());
    EXPECT_EQ(result.exit_code, 0) << entry.path() << "\n" << result.output;
    EXPECT_NE(result.output.find("OK"), std::string::npos) << result.output;
    ++checked;
  }
  EXPECT_GE(checked, 8) << "deploy/configs lost its job files";
}

// Writes a report.json into a fresh run directory.
std::string WriteRun(bool reached, double time_to_target_s, double accuracy,
                     double wan_bytes) {
  const std::string dir = testing::MakeTempDir("run");
  pb::RunReport report;
  report.set_job("j");
  report.set_target_accuracy(0.87);
  report.set_reached_target(reached);
  report.set_time_to_target_s(time_to_target_s);
  report.set_final_accuracy(accuracy);
  report.set_wan_bytes_total(wan_bytes);
  EXPECT_OK(WriteJsonFile(report, dir + "/report.json"));
  return dir;
}

TEST(CliTest, CompareTabulatesRunsAgainstTheFirst) {
  const std::string base = WriteRun(true, 40, 0.88, 2e9);
  const std::string gaia = WriteRun(true, 44, 0.879, 4e6);
  const std::string slow = WriteRun(false, -1, 0.80, 1e6);
  const CommandResult result =
      Meridian("compare " + base + " " + gaia + " " + slow);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("| " + gaia + " | j | 44.0 | 0.8790 | 4.00 MB"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("1.10× | 0.00×"), std::string::npos)
      << result.output;  // 44 / 40 and 4 MB / 2 GB
  EXPECT_NE(result.output.find("not reached"), std::string::npos)
      << result.output;
}

TEST(CliTest, CompareNamesAMissingReport) {
  const std::string empty = testing::MakeTempDir("run");
  const CommandResult result = Meridian("compare " + empty);
  EXPECT_FALSE(result.crashed);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find(empty), std::string::npos) << result.output;
}

TEST(CliTest, ValidateReportsEveryProblemWithLineAndColumn) {
  const std::string path = WriteText(
      "name: \"bad\"\n"
      "site {\n"
      "  name: \"a\"\n"
      "  workers { count: 0 }\n"
      "}\n"
      "optimizer { learning_rate: -1 }\n"
      "target_accuracy: 1.5\n");
  const CommandResult result = Meridian("validate " + path);
  EXPECT_FALSE(result.crashed);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find(path + ":4:"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find(path + ":6:"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find(path + ":7:"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("count"), std::string::npos);
  EXPECT_NE(result.output.find("learning_rate"), std::string::npos);
}

TEST(CliTest, ValidateReportsSyntaxErrors) {
  const std::string path =
      WriteText("site {\n  name: \"a\"\n  wrkers { }\n}\n");
  const CommandResult result = Meridian("validate " + path);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find(path + ":3:"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("wrkers"), std::string::npos) << result.output;
}

TEST(CliTest, MissingConfigFileIsNamed) {
  const CommandResult result = Meridian("validate /nonexistent/job.pbtxt");
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.output.find("/nonexistent/job.pbtxt"), std::string::npos)
      << result.output;
}

TEST(CliTest, RunRefusesAnInvalidConfigBeforeStartingAnything) {
  const std::string path = WriteText("site { name: \"a\" }\n");
  const std::string out = testing::MakeTempDir("cli-out");
  const CommandResult result = Meridian("run " + path + " --out " + out);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("worker"), std::string::npos) << result.output;
}

TEST(CliTest, MissingDataFileIsNamedWithItsPackage) {
  pb::JobConfig job = testing::SmallJob("/usr/share/datasets/fashion-mnist", 1);
  job.mutable_data()->set_train_images("no-such-file-idx3-ubyte.gz");
  const std::string path = testing::MakeTempDir("cli-job") + "/job.pbtxt";
  ASSERT_OK(testing::WriteJobFile(job, path));
  const std::string out = testing::MakeTempDir("cli-out");
  const CommandResult result = Meridian("run " + path + " --out " + out);
  EXPECT_FALSE(result.crashed);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find(
                "/usr/share/datasets/fashion-mnist/no-such-file-idx3-ubyte.gz"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("dataset-fashion-mnist"), std::string::npos)
      << result.output;
}

TEST(CliTest, MissingDataDirectoryIsNamed) {
  pb::JobConfig job = testing::SmallJob("/nonexistent/data", 1);
  const std::string path = testing::MakeTempDir("cli-job") + "/job.pbtxt";
  ASSERT_OK(testing::WriteJobFile(job, path));
  const CommandResult result =
      Meridian("site --config " + path + " --site site-a");
  EXPECT_FALSE(result.crashed);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("/nonexistent/data/"), std::string::npos)
      << result.output;
}

TEST(CliTest, UnknownSiteAndWorkerAreNamed) {
  const std::string path = WriteSmallJob();
  ASSERT_FALSE(path.empty());
  CommandResult result =
      Meridian("worker --config " + path + " --site nowhere --index 0");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("nowhere"), std::string::npos);
  EXPECT_NE(result.output.find("site-a"), std::string::npos)
      << "the error lists the known sites: " << result.output;
  result = Meridian("worker --config " + path + " --site site-a --index 7");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("no worker 7"), std::string::npos)
      << result.output;
}

TEST(CliTest, BadAddressOverridesAndLinksAreNamed) {
  const std::string path = WriteSmallJob();
  ASSERT_FALSE(path.empty());

  CommandResult result =
      testing::RunCommand("MERIDIAN_SITE_SITE_A_ADDRESS=10.0.0.1:7100 " +
                          std::string(MERIDIAN_BINARY) + " validate " + path);
  EXPECT_FALSE(result.crashed);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("MERIDIAN_SITE_SITE_A_ADDRESS"),
            std::string::npos)
      << result.output;

  result = Meridian("wanem --config " + path + " --link site-a-nowhere");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("site-a-nowhere"), std::string::npos)
      << result.output;
  result = Meridian(
      "wanem --listen 127.0.0.1:0 --forward 127.0.0.1:1 "
      "--link a-b");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--link"), std::string::npos) << result.output;
}

TEST(CliTest, RunTakesAJobFileOrAResumeDirectory) {
  const std::string path = WriteSmallJob();
  ASSERT_FALSE(path.empty());
  CommandResult result = Meridian("run");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--resume"), std::string::npos) << result.output;
  const std::string dir = testing::MakeTempDir("cli-run");
  result = Meridian("run " + path + " --resume " + dir);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("give no FILE"), std::string::npos)
      << result.output;
  // A directory no run wrote: named, nothing started.
  result = Meridian("run --resume " + dir);
  EXPECT_FALSE(result.crashed);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find(dir + "/run.json"), std::string::npos)
      << result.output;
  EXPECT_EQ(Meridian("run " + path + " --max-restarts -3").exit_code, 2);
  EXPECT_EQ(Meridian("run " + path + " --max-restarts lots").exit_code, 2);
}

TEST(CliTest, ResumeRefusesARunManifestWithoutAJobFile) {
  const std::string dir = testing::MakeTempDir("cli-run");
  std::ofstream(dir + "/run.json") << "{\"job\": \"j\"}";
  const CommandResult result = Meridian("run --resume " + dir);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("names no job file"), std::string::npos)
      << result.output;
}

TEST(CliTest, BadCommandLinesAreUsageErrors) {
  EXPECT_EQ(Meridian("").exit_code, 2);
  EXPECT_EQ(Meridian("frobnicate").exit_code, 2);
  EXPECT_EQ(Meridian("worker --config x --site a --index notanumber").exit_code,
            2);
  const CommandResult help = Meridian("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("run"), std::string::npos);
}

// `meridian presets --json` is what scripts read instead of copying
// wan/presets.cc: every region pair and access network, with its numbers.
TEST(CliTest, PresetsPrintsEveryPresetAsTextAndJson) {
  const CommandResult text = Meridian("presets");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  for (const wan::AccessLinkPreset& access : wan::AccessLinkPresets()) {
    EXPECT_NE(text.output.find(std::string(access.name)), std::string::npos)
        << access.name;
  }
  const CommandResult json = Meridian("presets --json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  // Scripts read these keys (bench/scenarios/heterogeneity): the proto's
  // own field names, not JSON's lowerCamelCase.
  for (const char* key : {"\"region_pairs\"", "\"region_a\"", "\"rtt_ms\"",
                          "\"access_networks\"", "\"down_mbps\"",
                          "\"one_way_ms\"", "\"jitter_ms\""}) {
    EXPECT_NE(json.output.find(key), std::string::npos) << key;
  }
  pb::LinkPresets parsed;
  ASSERT_OK(google::protobuf::util::JsonStringToMessage(json.output, &parsed))
      << json.output;
  ASSERT_EQ(parsed.access_networks_size(), wan::AccessLinkPresets().size());
  for (int i = 0; i < parsed.access_networks_size(); ++i) {
    const pb::AccessNetworkPreset& got = parsed.access_networks(i);
    const wan::AccessLinkPreset& want = wan::AccessLinkPresets()[i];
    EXPECT_EQ(got.name(), want.name);
    EXPECT_EQ(got.down_mbps(), want.down_mbps);
    EXPECT_EQ(got.up_mbps(), want.up_mbps);
    EXPECT_EQ(got.one_way_ms(), want.one_way_ms);
    // Printed even when 0.
    EXPECT_TRUE(got.has_jitter_ms()) << got.name();
    EXPECT_EQ(got.jitter_ms(), want.jitter_ms);
  }
  ASSERT_EQ(parsed.region_pairs_size(), wan::RegionPresets().size());
  const pb::RegionPairPreset& first = parsed.region_pairs(0);
  EXPECT_EQ(first.region_a(), wan::RegionPresets()[0].region_a);
  EXPECT_EQ(first.region_b(), wan::RegionPresets()[0].region_b);
  EXPECT_EQ(first.rtt_ms(), wan::RegionPresets()[0].rtt_ms);
  EXPECT_EQ(first.gbps(), wan::RegionPresets()[0].gbps);
}

}  // namespace
}  // namespace meridian
