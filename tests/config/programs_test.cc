// Validation of worker and evaluator programs (WorkerGroup.command,
// EvaluatorConfig.command) and of model.kind EXTERNAL: every rule with the
// field it names and why; model.weights relative to the job file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "meridian/config/config.h"
#include "testing/status_matchers.h"
#include "testing/text.h"

namespace meridian {
namespace {

using ::meridian::testing::Contains;

// A valid EXTERNAL job: two sites, a program per worker group, an
// evaluator for every site, no data { }.
constexpr char kExternal[] = R"(
site { name: "a" workers { count: 2 command: ["python3", "train.py"] } }
site { name: "b" workers { count: 1 command: ["python3", "train.py"] } }
evaluator { command: ["python3", "evaluate.py"] }
model {
  kind: EXTERNAL
  weights: "initial.safetensors"
  metrics { name: "accuracy" higher_is_better: true }
  metrics { name: "loss" higher_is_better: false }
}
target_accuracy: 0.8
)";

pb::JobConfig Parse(const std::string& text) {
  Result<pb::JobConfig> config = ParseJobConfig(text, "job");
  EXPECT_OK(config);
  return config.ok() ? *config : pb::JobConfig();
}

// The issues of `config` as "field: message" lines.
std::vector<std::string> Issues(const pb::JobConfig& config) {
  std::vector<std::string> out;
  for (const ConfigIssue& issue : ValidateJobConfig(config)) {
    out.push_back(issue.field + ": " + issue.message);
  }
  return out;
}

// Expects exactly one issue, at `field`, whose message contains every one
// of `parts`.
void ExpectOneIssue(const pb::JobConfig& config, const std::string& field,
                    const std::vector<std::string>& parts) {
  const std::vector<ConfigIssue> issues = ValidateJobConfig(config);
  ASSERT_EQ(issues.size(), 1u) << ::testing::PrintToString(Issues(config));
  EXPECT_EQ(issues[0].field, field) << issues[0].message;
  for (const std::string& part : parts) {
    EXPECT_TRUE(Contains(issues[0].message, part))
        << "'" << part << "' not in: " << issues[0].message;
  }
}

TEST(ProgramsConfigTest, ExternalJobWithProgramsAndNoDataIsValid) {
  const pb::JobConfig config = Parse(kExternal);
  EXPECT_FALSE(config.has_data());
  EXPECT_TRUE(Issues(config).empty())
      << ::testing::PrintToString(Issues(config));
}

TEST(ProgramsConfigTest, ExternalNeedsWeights) {
  pb::JobConfig config = Parse(kExternal);
  config.mutable_model()->clear_weights();
  ExpectOneIssue(config, "model.weights",
                 {"EXTERNAL", "safetensors", "job file's directory"});
}

TEST(ProgramsConfigTest, WeightsCommandNamesAProgramForAnExternalModel) {
  pb::JobConfig config = Parse(kExternal);
  config.mutable_model()->add_weights_command("python3");
  EXPECT_TRUE(Issues(config).empty())
      << ::testing::PrintToString(Issues(config));
  config.mutable_model()->set_weights_command(0, "");
  ExpectOneIssue(config, "model.weights_command",
                 {"first element", "must be non-empty"});
  config = Parse("site { name: \"a\" workers {} } model { kind: MLP }");
  config.mutable_model()->add_weights_command("python3");
  ExpectOneIssue(config, "model.weights_command", {"is for kind EXTERNAL"});
}

TEST(ProgramsConfigTest, ExternalNeedsNamedUniqueMetrics) {
  pb::JobConfig config = Parse(kExternal);
  config.mutable_model()->clear_metrics();
  config.set_target_accuracy(0);
  ExpectOneIssue(config, "model.metrics", {"at least one metric"});

  config = Parse(kExternal);
  config.mutable_model()->mutable_metrics(1)->set_name("");
  ExpectOneIssue(config, "model.metrics[1].name", {"needs a name"});

  config = Parse(kExternal);
  config.mutable_model()->mutable_metrics(1)->set_name("accuracy");
  ExpectOneIssue(config, "model.metrics[1].name",
                 {"duplicate metric name 'accuracy'"});
}

TEST(ProgramsConfigTest, LossMetricNamesAListedLossWhenThePolicyEvaluatesIt) {
  for (pb::PolicyKind kind : {pb::ADSP, pb::ADACOMM}) {
    pb::JobConfig config = Parse(kExternal);
    config.mutable_policy()->set_kind(kind);
    EXPECT_TRUE(Issues(config).empty())  // "loss", the default, is listed
        << ::testing::PrintToString(Issues(config));

    config.mutable_model()->set_loss_metric("xent");
    ExpectOneIssue(config, "model.loss_metric",
                   {pb::PolicyKind_Name(kind), "'xent'", "'accuracy', 'loss'"});

    config.mutable_model()->set_loss_metric("accuracy");
    ExpectOneIssue(config, "model.loss_metric",
                   {"higher-is-better", "lower is better"});
  }
  // Policies that evaluate no loss do not read it.
  pb::JobConfig config = Parse(kExternal);
  config.mutable_policy()->set_kind(pb::ASYNC);
  config.mutable_model()->set_loss_metric("xent");
  EXPECT_TRUE(Issues(config).empty());
}

TEST(ProgramsConfigTest, ExternalWorkersNeedAProgram) {
  pb::JobConfig config = Parse(kExternal);
  config.mutable_site(0)->add_workers()->set_count(1);  // built-in
  ExpectOneIssue(config, "site[0].workers[1].command",
                 {"EXTERNAL", "built-in worker", "cannot train",
                  "command: [\"python3\", \"train.py\"]"});
  // A site that uses another's server trains the same model.
  config = Parse(kExternal);
  config.mutable_site(1)->set_server_site("a");
  config.mutable_site(1)->mutable_workers(0)->clear_command();
  ExpectOneIssue(config, "site[1].workers[0].command", {"EXTERNAL"});
}

TEST(ProgramsConfigTest, BuiltInModelsMayUseWorkerProgramsButNoEvaluator) {
  pb::JobConfig config = Parse(R"(
    site { name: "a" workers { count: 1 command: ["python3", "mlp.py"] }
                     workers { count: 1 } }
    model { kind: MLP hidden: 16 }
  )");
  EXPECT_TRUE(Issues(config).empty())
      << ::testing::PrintToString(Issues(config));
  config.mutable_evaluator()->add_command("python3");
  ExpectOneIssue(config, "evaluator",
                 {"built-in model (MLP)", "evaluated by its site server",
                  "model.kind EXTERNAL"});
  config.clear_evaluator();
  config.mutable_site(0)->mutable_evaluator()->add_command("python3");
  ExpectOneIssue(config, "site[0].evaluator", {"built-in model (MLP)"});
}

TEST(ProgramsConfigTest, ProgramNameMustBeNonEmpty) {
  pb::JobConfig config = Parse(kExternal);
  config.mutable_site(1)->mutable_workers(0)->set_command(0, "");
  ExpectOneIssue(config, "site[1].workers[0].command",
                 {"first element is the program", "non-empty"});
  config = Parse(kExternal);
  config.mutable_evaluator()->set_command(0, "");
  ExpectOneIssue(config, "evaluator.command", {"non-empty"});
  // Empty arguments are arguments.
  config = Parse(kExternal);
  config.mutable_site(1)->mutable_workers(0)->add_command("");
  EXPECT_TRUE(Issues(config).empty());
}

TEST(ProgramsConfigTest, EvaluatorOnASiteWithoutAServerIsRefused) {
  pb::JobConfig config = Parse(kExternal);
  config.mutable_site(1)->set_server_site("a");
  config.mutable_site(1)->mutable_evaluator()->add_command("python3");
  ExpectOneIssue(config, "site[1].evaluator",
                 {"no server of its own", "server_site 'a'",
                  "belongs to the site that runs one ('a')"});
  // An empty evaluator { } there only says "none" (the job's default does
  // not apply to a site without a server anyway).
  config.mutable_site(1)->mutable_evaluator()->clear_command();
  EXPECT_TRUE(Issues(config).empty())
      << ::testing::PrintToString(Issues(config));
}

TEST(ProgramsConfigTest, ExternalTargetIsOnTheFirstMetric) {
  // target_accuracy: only when the first metric is a higher-is-better
  // "accuracy".
  pb::JobConfig config = Parse(kExternal);
  EXPECT_TRUE(Issues(config).empty());
  config.mutable_model()->mutable_metrics()->SwapElements(0, 1);
  ExpectOneIssue(
      config, "target_accuracy",
      {"model.metrics[0], 'loss' (lower is better)", "target_metric"});
  config = Parse(kExternal);
  config.mutable_model()->mutable_metrics(0)->set_higher_is_better(false);
  ExpectOneIssue(config, "target_accuracy", {"target_metric"});
  // target_metric is on the first metric, whatever it is.
  config = Parse(kExternal);
  config.set_target_accuracy(0);
  config.set_target_metric(0.3);
  EXPECT_TRUE(Issues(config).empty())
      << ::testing::PrintToString(Issues(config));
}

TEST(ProgramsConfigTest, ModelFieldsBelongToTheirKinds) {
  pb::JobConfig config = Parse(kExternal);
  config.mutable_model()->add_hidden(16);
  ExpectOneIssue(config, "model.kind", {"EXTERNAL", "model.weights"});

  config = Parse("site { name: \"a\" workers {} } model { kind: MLP }");
  config.mutable_model()->set_weights("w.safetensors");
  config.mutable_model()->add_metrics()->set_name("accuracy");
  config.mutable_model()->set_loss_metric("loss");
  const std::vector<std::string> issues = Issues(config);
  ASSERT_EQ(issues.size(), 3u) << ::testing::PrintToString(issues);
  EXPECT_EQ(issues[0].rfind("model.weights: is for kind EXTERNAL", 0), 0u);
  EXPECT_EQ(issues[1].rfind("model.metrics: are for kind EXTERNAL", 0), 0u);
  EXPECT_EQ(issues[2], "model.loss_metric: is for kind EXTERNAL");
}

TEST(ProgramsConfigTest, IssuesPointAtTheCommandInTheFile) {
  std::vector<ConfigIssue> issues;
  const Result<pb::JobConfig> config = ParseJobConfig(
      "site {\n"
      "  name: \"a\"\n"
      "  workers { count: 1 command: [\"\", \"x\"] }\n"
      "}\n",
      "job", &issues);
  ASSERT_FALSE(config.ok());
  ASSERT_EQ(issues.size(), 1u) << config.status();
  EXPECT_EQ(issues[0].line, 3);
  EXPECT_EQ(issues[0].field, "site[0].workers[0].command");
}

class WeightsPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("programs_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_ / "jobs");
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  std::filesystem::path dir_;
};

TEST_F(WeightsPathTest, RelativeWeightsAreRelativeToTheJobFile) {
  std::string text = kExternal;
  const std::string path = (dir_ / "jobs" / "job.pbtxt").string();
  std::ofstream(path) << text;
  // Loaded from another working directory, through a relative path.
  const std::filesystem::path saved = std::filesystem::current_path();
  std::filesystem::current_path(dir_);
  Result<pb::JobConfig> config = LoadJobConfig("jobs/./job.pbtxt");
  std::filesystem::current_path(saved);
  ASSERT_OK(config);
  EXPECT_EQ(config->model().weights(),
            (dir_ / "jobs" / "initial.safetensors").string());

  // Absolute paths stay as written; ParseJobConfig has no directory.
  const std::string absolute = "/srv/models/initial.safetensors";
  text.replace(text.find("initial.safetensors"), 19, absolute);
  std::ofstream(path) << text;
  config = LoadJobConfig(path);
  ASSERT_OK(config);
  EXPECT_EQ(config->model().weights(), absolute);
  EXPECT_EQ(Parse(kExternal).model().weights(), "initial.safetensors");
}

}  // namespace
}  // namespace meridian
