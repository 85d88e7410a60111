// The command line's answers to bad worker and evaluator programs and
// external models: a program that cannot be found is refused before
// anything starts (exit code 2), naming the field, the program, where it
// was looked for and the working directory; `meridian validate` reads the
// initial weights, or accepts them missing when model.weights_command will
// write them, which `meridian run` runs once before any site starts;
// `meridian worker` takes its place from the environment.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "meridian/job.pb.h"
#include "testing/processes.h"
#include "testing/status_matchers.h"
#include "testing/test_data.h"
#include "testing/text.h"

namespace meridian {
namespace {

using ::meridian::testing::CommandResult;
using ::meridian::testing::Contains;

CommandResult Meridian(const std::string& args) {
  return testing::RunCommand(std::string(MERIDIAN_BINARY) + " " + args);
}

// A small valid job in a fresh directory whose only worker group runs
// `command`; its path.
std::string WriteProgramJob(const std::vector<std::string>& command) {
  const std::string data = testing::MakeTempDir("programs-cli-data");
  testing::SyntheticDataOptions options;
  options.train_samples = 100;
  options.test_samples = 20;
  EXPECT_OK(testing::WriteSyntheticIdx(data, options));
  pb::JobConfig job = testing::SmallJob(data, 1);
  for (const std::string& arg : command) {
    job.mutable_site(0)->mutable_workers(0)->add_command(arg);
  }
  const std::string path = testing::MakeTempDir("programs-cli") + "/job.pbtxt";
  EXPECT_OK(testing::WriteJobFile(job, path));
  return path;
}

std::string DirOf(const std::string& path) {
  return std::filesystem::path(path).parent_path().string();
}

TEST(ProgramsCliTest, RunRefusesAMissingProgramBeforeAnythingStarts) {
  const std::string path = WriteProgramJob({"no-such-trainer", "--lr", "1"});
  const std::string out = DirOf(path) + "/out";
  const CommandResult result = testing::RunCommand(
      "PATH=/nonexistent/bin:/bin " + std::string(MERIDIAN_BINARY) + " run " +
      path + " --out " + out);
  EXPECT_FALSE(result.crashed);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(Contains(
      result.output,
      "meridian run: site[0].workers[0].command: cannot start the worker "
      "program of site 'site-a' 'no-such-trainer --lr 1': no "
      "'no-such-trainer' in any directory of PATH '/nonexistent/bin:/bin'; "
      "programs run in the job file's directory " +
          DirOf(path)))
      << result.output;
  EXPECT_FALSE(std::filesystem::exists(out)) << "the run started";
}

TEST(ProgramsCliTest, RelativeProgramsAreLookedUpNextToTheJobFile) {
  const std::string path = WriteProgramJob({"./train.sh"});
  const std::string dir = DirOf(path);
  CommandResult result = Meridian("run " + path + " --out " + dir + "/out");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(Contains(result.output,
                       dir + "/train.sh does not exist (relative paths are "
                             "relative to the job file's directory)"))
      << result.output;
  // There, but not executable.
  std::ofstream(dir + "/train.sh") << "#!/bin/sh\n";
  ::chmod((dir + "/train.sh").c_str(), 0644);
  result = Meridian("run " + path + " --out " + dir + "/out");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(Contains(result.output, dir + "/train.sh is not executable"))
      << result.output;
}

TEST(ProgramsCliTest, SiteWithWorkersRefusesAMissingProgram) {
  const std::string path = WriteProgramJob({"no-such-trainer"});
  const CommandResult result =
      Meridian("site --config " + path +
               " --site site-a --with-workers --out " + DirOf(path));
  EXPECT_FALSE(result.crashed);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(Contains(result.output,
                       "meridian site: site[0].workers[0].command: cannot "
                       "start the worker program of site 'site-a'"))
      << result.output;
}

// A safetensors file of one F16 tensor [2] and an integer one (which the
// sites do not serve).
void WriteWeights(const std::string& path) {
  const std::string header =
      R"({"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
      R"("n":{"dtype":"I64","shape":[1],"data_offsets":[4,12]}})";
  std::string bytes(8, '\0');
  const uint64_t size = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(size >> (8 * i));
  bytes += header + std::string(12, '\0');
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(ProgramsCliTest, ValidateReadsTheInitialWeights) {
  const std::string dir = testing::MakeTempDir("programs-cli-external");
  const std::string path = dir + "/job.pbtxt";
  std::ofstream(path) << R"(
site { name: "a" workers { count: 1 command: ["python3", "train.py"] } }
model {
  kind: EXTERNAL
  weights: "initial.safetensors"
  metrics { name: "accuracy" }
}
)";
  CommandResult result = Meridian("validate " + path);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(Contains(result.output, path + ": model.weights: "))
      << result.output;
  EXPECT_TRUE(Contains(result.output, dir + "/initial.safetensors"))
      << result.output;

  std::ofstream(dir + "/initial.safetensors") << "not a tensor file";
  result = Meridian("validate " + path);
  EXPECT_FALSE(result.crashed);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(Contains(result.output, dir + "/initial.safetensors"))
      << result.output;

  // Integer tensors only: nothing the sites could serve.
  std::string bytes(8, '\0');
  const std::string header =
      R"({"n":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})";
  for (int i = 0; i < 8; ++i) {
    bytes[i] = static_cast<char>(uint64_t{header.size()} >> (8 * i));
  }
  std::ofstream(dir + "/initial.safetensors", std::ios::binary)
      << bytes + header + std::string(8, '\0');
  result = Meridian("validate " + path);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(Contains(result.output, "holds no floating-point tensor"))
      << result.output;

  WriteWeights(dir + "/initial.safetensors");
  result = Meridian("validate " + path);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(Contains(result.output, "OK")) << result.output;
  EXPECT_TRUE(Contains(
      result.output, "model.weights " + dir + "/initial.safetensors: w[2]:F16"))
      << result.output;
}

// An external job in a fresh directory whose model.weights_command is
// `sh -c SCRIPT` and whose worker fails at once; its path.
std::string WriteWeightsCommandJob(const std::string& script) {
  const std::string dir = testing::MakeTempDir("programs-cli-weights");
  std::ofstream(dir + "/job.pbtxt") << R"(
site { name: "a" workers { count: 1 command: ["sh", "-c", "exit 1"] } }
model {
  kind: EXTERNAL
  weights: "initial.safetensors"
  weights_command: ["sh", "-c", ")" + script +
                                           R"("]
  metrics { name: "accuracy" }
}
time_budget_s: 5
)";
  return dir + "/job.pbtxt";
}

TEST(ProgramsCliTest, MissingWeightsAreWrittenByTheWeightsCommand) {
  // validate accepts the missing file and says what will write it.
  std::string path = WriteWeightsCommandJob("exit 3");
  CommandResult result = Meridian("validate " + path);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(Contains(result.output,
                       "missing; `meridian run` writes it "
                       "first with `sh -c 'exit 3'`"))
      << result.output;
  // A command that fails fails the run before any site starts.
  result =
      Meridian("run " + path + " --fail-fast --out " + DirOf(path) + "/out");
  EXPECT_FALSE(result.crashed);
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_TRUE(Contains(result.output,
                       "model.weights_command `sh -c 'exit 3'` "
                       "exited with status 3 and did not "
                       "write " +
                           DirOf(path) + "/initial.safetensors"))
      << result.output;
  EXPECT_FALSE(std::filesystem::exists(DirOf(path) + "/out/site-a.json"));
  // What a failed command left behind goes: a torn file never passes for
  // the weights on the next run.
  path = WriteWeightsCommandJob(
      "printf torn > \\\"$MERIDIAN_WEIGHTS\\\"; exit 1");
  result = Meridian("run " + path + " --fail-fast --out " + DirOf(path) +
                    "/out");
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_TRUE(Contains(result.output, "exited with status 1"))
      << result.output;
  EXPECT_FALSE(std::filesystem::exists(DirOf(path) + "/initial.safetensors"));

  // One that writes the file runs once, in the job's directory, as the
  // role "weights"; the sites then start from what it wrote.
  const std::string dir =
      DirOf(WriteWeightsCommandJob("")) + "/";  // for the prepared file
  WriteWeights(dir + "prepared.safetensors");
  path = WriteWeightsCommandJob(
      "env | grep ^MERIDIAN_ | sort >> weights-env; cp " + dir +
      "prepared.safetensors \\\"$MERIDIAN_WEIGHTS\\\"");
  result =
      Meridian("run " + path + " --fail-fast --out " + DirOf(path) + "/out");
  EXPECT_FALSE(result.crashed) << result.output;
  EXPECT_TRUE(std::filesystem::exists(DirOf(path) + "/initial.safetensors"))
      << result.output;
  const std::string env = testing::ReadFile(DirOf(path) + "/weights-env");
  EXPECT_TRUE(Contains(env, "MERIDIAN_ROLE=weights\n")) << env;
  EXPECT_TRUE(Contains(
      env, "MERIDIAN_WEIGHTS=" + DirOf(path) + "/initial.safetensors\n"))
      << env;
  EXPECT_FALSE(Contains(env, "MERIDIAN_SITE=")) << env;
  EXPECT_TRUE(Contains(result.output, "is missing: writing it with"))
      << result.output;
  // The site server read the weights: it got as far as its workers.
  EXPECT_TRUE(Contains(result.output, "worker")) << result.output;
  // A second run finds the file and does not run the command again.
  result =
      Meridian("run " + path + " --fail-fast --out " + DirOf(path) + "/out2");
  EXPECT_EQ(testing::ReadFile(DirOf(path) + "/weights-env"), env);
}

TEST(ProgramsCliTest, WorkerTakesItsPlaceFromTheEnvironment) {
  CommandResult result = Meridian("worker");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(Contains(result.output,
                       "give --config, --site and --index (or MERIDIAN_JOB, "
                       "MERIDIAN_SITE and MERIDIAN_WORKER_INDEX)"))
      << result.output;
  result = testing::RunCommand(
      "MERIDIAN_JOB=/nonexistent/job.pbtxt MERIDIAN_SITE=a "
      "MERIDIAN_WORKER_INDEX=x " +
      std::string(MERIDIAN_BINARY) + " worker");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(Contains(result.output,
                       "MERIDIAN_WORKER_INDEX must be a whole "
                       "number >= 0, got 'x'"))
      << result.output;
  // The variables name the job file; a flag wins over its variable.
  result = testing::RunCommand(
      "MERIDIAN_JOB=/nonexistent/job.pbtxt MERIDIAN_SITE=a "
      "MERIDIAN_WORKER_INDEX=0 " +
      std::string(MERIDIAN_BINARY) +
      " worker --config /nonexistent/flag.pbtxt");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(Contains(result.output, "/nonexistent/flag.pbtxt"))
      << result.output;
}

}  // namespace
}  // namespace meridian
