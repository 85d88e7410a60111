// Worker and evaluator programs (src/launch/programs.h): where a program is
// found (as execvp would, from the job file's directory), the MERIDIAN_*
// environment each process gets, and a child started with that directory
// and environment (a real /bin/sh).
#include "launch/programs.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "meridian/config/config.h"
#include "meridian/core/process.h"
#include "meridian/launch/launcher.h"
#include "meridian/net/security.h"
#include "testing/status_matchers.h"
#include "testing/test_data.h"
#include "testing/text.h"

namespace meridian {
namespace {

using ::meridian::testing::Contains;
using ::meridian::testing::ReadFile;
using ::meridian::testing::StatusIs;

// The path found, or the error's message.
std::string Found(const Result<std::string>& found) {
  return found.ok() ? *found : found.status().message();
}

// A file with `mode` at `path` (directories made).
void Touch(const std::string& path, mode_t mode) {
  std::filesystem::create_directories(
      std::filesystem::path(path).parent_path());
  std::ofstream(path) << "#!/bin/sh\nexit 0\n";
  ::chmod(path.c_str(), mode);
}

class FindProgramTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("find-program"); }
  std::string dir_;
};

TEST_F(FindProgramTest, NamesAreLookedUpInPathInOrder) {
  Touch(dir_ + "/one/tool", 0644);  // not executable: skipped
  Touch(dir_ + "/two/tool", 0755);
  Touch(dir_ + "/three/tool", 0755);
  const std::string path =
      dir_ + "/one:" + dir_ + "/missing:" + dir_ + "/two:" + dir_ + "/three";
  Result<std::string> found = FindProgram("tool", "/", path.c_str());
  ASSERT_OK(found);
  EXPECT_EQ(*found, dir_ + "/two/tool");
}

TEST_F(FindProgramTest, RelativePathEntriesAreRelativeToTheWorkingDirectory) {
  Touch(dir_ + "/bin/tool", 0755);
  Touch(dir_ + "/here", 0755);
  EXPECT_EQ(Found(FindProgram("tool", dir_, "bin")), dir_ + "/bin/tool");
  // An empty entry is the working directory, as for execvp.
  EXPECT_EQ(Found(FindProgram("here", dir_, "/nonexistent:")), dir_ + "/here");
}

TEST_F(FindProgramTest, PathsWithASlashAreRelativeToTheWorkingDirectory) {
  Touch(dir_ + "/scripts/train.sh", 0755);
  EXPECT_EQ(Found(FindProgram("scripts/train.sh", dir_, "")),
            dir_ + "/scripts/train.sh");
  EXPECT_EQ(Found(FindProgram("./scripts/../scripts/train.sh", dir_, "")),
            dir_ + "/scripts/train.sh");
  EXPECT_EQ(Found(FindProgram(dir_ + "/scripts/train.sh", "/elsewhere", "")),
            dir_ + "/scripts/train.sh");
  // PATH is not searched for them.
  Result<std::string> missing = FindProgram("./sh", dir_, "/bin:/usr/bin");
  EXPECT_THAT(missing, StatusIs(StatusCode::kNotFound));
  EXPECT_TRUE(Contains(missing.status().message(),
                       dir_ + "/sh does not exist (relative paths are "
                              "relative to the job file's directory)"))
      << missing.status();
}

TEST_F(FindProgramTest, ErrorsSayWhereItLookedAndWhatWasWrong) {
  Result<std::string> missing = FindProgram(
      "no-such-trainer", dir_, (dir_ + "/a:" + dir_ + "/b").c_str());
  EXPECT_THAT(missing, StatusIs(StatusCode::kNotFound));
  EXPECT_EQ(missing.status().message(),
            "no 'no-such-trainer' in any directory of PATH '" + dir_ +
                "/a:" + dir_ + "/b'");

  Touch(dir_ + "/a/train.py", 0644);
  Result<std::string> unusable =
      FindProgram("train.py", dir_, (dir_ + "/a").c_str());
  EXPECT_THAT(unusable, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_TRUE(Contains(unusable.status().message(),
                       dir_ + "/a/train.py is not executable"))
      << unusable.status();

  std::filesystem::create_directories(dir_ + "/sub");
  Result<std::string> directory = FindProgram("./sub", dir_, nullptr);
  EXPECT_THAT(directory, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_TRUE(Contains(directory.status().message(), "is a directory"));

  // PATH unset: execvp's default.
  EXPECT_EQ(Found(FindProgram("sh", dir_, nullptr)), "/bin/sh");
  Result<std::string> unset = FindProgram("no-such-trainer", dir_, nullptr);
  EXPECT_TRUE(
      Contains(unset.status().message(), "PATH unset, so '/bin:/usr/bin'"))
      << unset.status();
}

// ---- the environment --------------------------------------------------------

std::map<std::string, std::string> Variables(const SpawnOptions& spawn) {
  std::map<std::string, std::string> out;
  for (const std::string& entry : spawn.set_environment) {
    const size_t equals = entry.find('=');
    out[entry.substr(0, equals)] = entry.substr(equals + 1);
  }
  return out;
}

pb::JobConfig TwoSiteJob() {
  Result<pb::JobConfig> job = ParseJobConfig(R"(
    seed: 77
    site { name: "a"
           workers { count: 2 command: ["sh", "train.sh", "--lr", "0.1"] }
           workers { count: 1 step_time_s: 0.25
                     command: ["sh", "train.sh", "two words"] } }
    site { name: "b" server_site: "a"
           workers { count: 1 command: ["sh", "train.sh"] } }
    evaluator { command: ["sh", "evaluate.sh"] }
    model { kind: EXTERNAL weights: "/models/initial.safetensors"
            metrics { name: "accuracy" } }
  )",
                                             "job");
  EXPECT_OK(job);
  return *job;
}

TEST(ProgramEnvironmentTest, WorkersLearnTheirPlaceInTheJob) {
  const pb::JobConfig job = TwoSiteJob();
  const ProgramContext context{"/run/out/job.pbtxt", "/jobs", "/run/out"};
  Result<ProgramProcess> worker =
      WorkerProgram(job, context, 0, 2, "tcp://127.0.0.1:7100");
  ASSERT_OK(worker);
  const std::string sh = Found(FindProgram("sh", "/", std::getenv("PATH")));
  EXPECT_EQ(worker->argv,
            (std::vector<std::string>{sh, "train.sh", "two words"}));
  EXPECT_EQ(worker->command, "sh train.sh 'two words'");
  EXPECT_EQ(worker->spawn.working_dir, "/jobs");
  EXPECT_EQ(Variables(worker->spawn),
            (std::map<std::string, std::string>{
                {"MERIDIAN_ROLE", "worker"},
                {"MERIDIAN_JOB", "/run/out/job.pbtxt"},
                {"MERIDIAN_SITE", "a"},
                {"MERIDIAN_SITE_INDEX", "0"},
                {"MERIDIAN_SITE_COUNT", "2"},
                {"MERIDIAN_WORKER_INDEX", "2"},
                {"MERIDIAN_WORKER_COUNT", "3"},
                {"MERIDIAN_CONNECT", "tcp://127.0.0.1:7100"},
                {"MERIDIAN_WEIGHTS", "/models/initial.safetensors"},
                {"MERIDIAN_STEP_TIME_S", "0.25"},
                {"MERIDIAN_SEED", "77"},
                {"MERIDIAN_OUT", "/run/out"}}));
  // What does not apply is removed from what the child inherits: no stale
  // keys, never the site's control token.
  for (const char* name : {"MERIDIAN_SECRET_KEY", "MERIDIAN_SERVER_PUBLIC_KEY",
                           "MERIDIAN_CONTROL_TOKEN"}) {
    EXPECT_NE(std::find(worker->spawn.unset_environment.begin(),
                        worker->spawn.unset_environment.end(), name),
              worker->spawn.unset_environment.end())
        << name;
  }

  // A worker of a site without a server: its own site's place, the
  // endpoint it is given (its serving site's, through wanem).
  Result<ProgramProcess> remote =
      WorkerProgram(job, context, 1, 0, "tcp://127.0.0.1:7401");
  ASSERT_OK(remote);
  const auto variables = Variables(remote->spawn);
  EXPECT_EQ(variables.at("MERIDIAN_SITE"), "b");
  EXPECT_EQ(variables.at("MERIDIAN_SITE_INDEX"), "1");
  EXPECT_EQ(variables.at("MERIDIAN_WORKER_COUNT"), "1");
  EXPECT_EQ(variables.at("MERIDIAN_CONNECT"), "tcp://127.0.0.1:7401");
  EXPECT_EQ(variables.at("MERIDIAN_STEP_TIME_S"), "0");
}

TEST(ProgramEnvironmentTest, EvaluatorsHaveNoWorkerVariables) {
  const pb::JobConfig job = TwoSiteJob();
  EXPECT_EQ(EvaluatorCommand(job, 0),
            (std::vector<std::string>{"sh", "evaluate.sh"}));
  EXPECT_TRUE(EvaluatorCommand(job, 1).empty());  // no server of its own
  pb::JobConfig own = job;
  own.mutable_site(0)->mutable_evaluator()->add_command("./mine");
  EXPECT_EQ(EvaluatorCommand(own, 0), (std::vector<std::string>{"./mine"}));
  own.mutable_site(0)->mutable_evaluator()->clear_command();
  EXPECT_TRUE(EvaluatorCommand(own, 0).empty());  // "none" for this site

  const ProgramContext context{"/jobs/job.pbtxt", "/jobs", "/out"};
  Result<ProgramProcess> evaluator =
      EvaluatorProgram(job, context, 0, "tcp://127.0.0.1:7100");
  ASSERT_OK(evaluator);
  const auto variables = Variables(evaluator->spawn);
  EXPECT_EQ(variables.at("MERIDIAN_ROLE"), "evaluator");
  EXPECT_EQ(variables.at("MERIDIAN_SITE"), "a");
  EXPECT_EQ(variables.at("MERIDIAN_CONNECT"), "tcp://127.0.0.1:7100");
  for (const char* name : {"MERIDIAN_WORKER_INDEX", "MERIDIAN_WORKER_COUNT",
                           "MERIDIAN_STEP_TIME_S"}) {
    EXPECT_EQ(variables.count(name), 0u) << name;
  }
}

TEST(ProgramEnvironmentTest, ExternalWeightsAndCurveKeys) {
  pb::JobConfig job = TwoSiteJob();
  job.mutable_security()->set_key_dir("keys");  // relative to the launcher
  Result<CurveKeyPair> site = GenerateCurveKeyPair();
  Result<CurveKeyPair> workers = GenerateCurveKeyPair();
  ASSERT_OK(site);
  ASSERT_OK(workers);
  job.mutable_site(0)->set_curve_public_key(site->public_key);
  job.mutable_site(0)->set_worker_curve_public_key(workers->public_key);
  const ProgramContext context{"/jobs/job.pbtxt", "/jobs", "/out"};
  const std::string keys =
      (std::filesystem::current_path() / "keys/workers/a.key").string();
  for (int s : {0, 1}) {  // b's workers use a's server: a's worker key
    ::unsetenv(kSecretKeyEnv);
    Result<ProgramProcess> worker = WorkerProgram(job, context, s, 0, "x");
    ASSERT_OK(worker);
    const auto variables = Variables(worker->spawn);
    EXPECT_EQ(variables.at("MERIDIAN_WEIGHTS"), "/models/initial.safetensors");
    EXPECT_EQ(variables.at("MERIDIAN_SECRET_KEY"), keys);
    EXPECT_EQ(variables.at("MERIDIAN_SERVER_PUBLIC_KEY"), site->public_key);
  }
  Result<ProgramProcess> evaluator = EvaluatorProgram(job, context, 0, "x");
  ASSERT_OK(evaluator);
  EXPECT_EQ(Variables(evaluator->spawn).at("MERIDIAN_SECRET_KEY"), keys);
}

TEST(ProgramEnvironmentTest, FindJobProgramsNamesTheFieldAndTheDirectory) {
  const std::string dir = testing::MakeTempDir("job-programs");
  pb::JobConfig job = TwoSiteJob();
  Touch(dir + "/evaluate.sh", 0644);  // sh runs it: need not be executable
  EXPECT_OK(FindJobPrograms(job, dir + "/job.pbtxt"));
  job.mutable_site(1)->mutable_workers(0)->set_command(0, "no-such-trainer");
  const Status missing = FindJobPrograms(job, dir + "/job.pbtxt");
  EXPECT_THAT(missing, StatusIs(StatusCode::kNotFound));
  EXPECT_TRUE(Contains(missing.message(),
                       "site[1].workers[0].command: cannot start the worker "
                       "program of site 'b' 'no-such-trainer train.sh': no "
                       "'no-such-trainer' in any directory of PATH"))
      << missing;
  EXPECT_TRUE(Contains(missing.message(),
                       "; programs run in the job file's directory " + dir))
      << missing;
  // Only the site asked for (`meridian site --with-workers`).
  EXPECT_OK(FindJobPrograms(job, dir + "/job.pbtxt", 0));
  job.mutable_evaluator()->set_command(0, "./evaluate.sh");
  EXPECT_THAT(FindJobPrograms(job, dir + "/job.pbtxt", 0),
              StatusIs(StatusCode::kFailedPrecondition));
}

// ---- a real child ----------------------------------------------------------

TEST(ProgramProcessTest, ChildRunsInItsDirectoryWithItsEnvironment) {
  const std::string dir = testing::MakeTempDir("program-process");
  ::setenv("MERIDIAN_CONTROL_TOKEN", "the-site-secret", 1);
  ::setenv("MERIDIAN_TEST_KEPT", "inherited", 1);
  SpawnOptions spawn;
  spawn.working_dir = dir;
  spawn.set_environment = {"MERIDIAN_SITE=a", "MERIDIAN_TEST_KEPT=replaced"};
  spawn.unset_environment = {"MERIDIAN_CONTROL_TOKEN"};
  Result<ChildProcess> child = ChildProcess::Spawn(
      "env", {"/bin/sh", "-c", "pwd; env | grep '^MERIDIAN_' | sort"},
      dir + "/log", spawn);
  ::unsetenv("MERIDIAN_CONTROL_TOKEN");
  ::unsetenv("MERIDIAN_TEST_KEPT");
  ASSERT_OK(child);
  while (!child->Poll()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(child->succeeded()) << child->DescribeExit();
  EXPECT_EQ(ReadFile(dir + "/log"),
            dir + "\nMERIDIAN_SITE=a\nMERIDIAN_TEST_KEPT=replaced\n");

  // A directory that does not exist: said in the log, status 127.
  spawn.working_dir = dir + "/gone";
  child = ChildProcess::Spawn("gone", {"/bin/true"}, dir + "/log2", spawn);
  ASSERT_OK(child);
  while (!child->Poll()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(child->DescribeExit(), "exited with status 127");
  EXPECT_EQ(ReadFile(dir + "/log2"),
            "meridian: cannot change into '" + dir +
                "/gone' to start /bin/true: No such file or directory\n");
}

}  // namespace
}  // namespace meridian
