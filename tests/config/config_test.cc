#include "meridian/config/config.h"
#include "testing/status_matchers.h"
#include "testing/text.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace meridian {
namespace {

using ::meridian::testing::Contains;

namespace gpb = google::protobuf;

// (line, column, field) of each issue, in order.
using Where = std::tuple<int, int, std::string>;

std::vector<Where> Locations(const std::vector<ConfigIssue>& issues) {
  std::vector<Where> out;
  for (const ConfigIssue& issue : issues) {
    out.emplace_back(issue.line, issue.column, issue.field);
  }
  return out;
}

std::vector<std::string> Fields(const std::vector<ConfigIssue>& issues) {
  std::vector<std::string> out;
  for (const ConfigIssue& issue : issues) out.push_back(issue.field);
  return out;
}


constexpr char kMinimal[] = R"(
site {
  name: "a"
  workers { count: 2 }
}
)";

// Every field of JobConfig set to a valid, non-default value.
constexpr char kFull[] = R"(# A full job.
name: "full-job"
site {
  name: "eu-west"
  address: "tcp://10.0.0.1:7200"
  workers { count: 2 step_time_s: 0.01 }
  workers { count: 3 step_time_s: 0.05 }
}
site {
  name: "us_east.1"
  address: "ipc:///tmp/us_east.sock"
  workers { }
}
model { kind: MLP hidden: [256, 128] }
data {
  dir: "/data/fmnist"
  train_images: "ti.gz"
  train_labels: "tl.gz"
  test_images: "vi.gz"
  test_labels: "vl.gz"
  normalization: SCALE
  site_partition {
    kind: LABEL_SUBSET
    classes { label: [0, 1, 2, 3, 4] }
    classes { label: 5 label: 6 label: 7 label: 8 label: 9 }
    skew: 0.5
  }
  train_limit: 6000
  test_limit: 1000
}
optimizer {
  learning_rate: 0.1
  momentum: 0.5
  weight_decay: 0.0001
  batch_size: 32
  schedule: STEP
  step_size: 200
  gamma: 0.9
}
server {
  apply_rule: SUM
  momentum: 0.3
  learning_rate: 0.5
  num_shards: 8
  eval_period_s: 1.5
  join_timeout_s: 30
}
policy { kind: BSP local_steps: 4 }
target_accuracy: 0.85
time_budget_s: 120
seed: 42
)";

pb::JobConfig ParseOrDie(const std::string& text) {
  Result<pb::JobConfig> config = ParseJobConfig(text, "test.job");
  EXPECT_OK(config);
  return config.ok() ? *config : pb::JobConfig();
}

// A valid config with one of every repeated message, built in code.
pb::JobConfig ValidConfig() {
  pb::JobConfig config = ParseOrDie(kMinimal);
  config.mutable_data()->mutable_site_partition()->set_kind(pb::LABEL_SUBSET);
  config.mutable_data()->mutable_site_partition()->add_classes()->add_label(3);
  return config;
}

// ---------------------------------------------------------------------------
// Parsing valid configs.

TEST(ParseJobConfigTest, MinimalConfigParses) {
  std::vector<ConfigIssue> issues = {{1, 1, "stale", "left over"}};
  Result<pb::JobConfig> config = ParseJobConfig(kMinimal, "min.job", &issues);
  ASSERT_OK(config);
  EXPECT_TRUE(issues.empty());
  ASSERT_EQ(config->site_size(), 1);
  EXPECT_EQ(config->site(0).name(), "a");
  EXPECT_EQ(SiteWorkerCount(config->site(0)), 2u);
  EXPECT_EQ(TotalWorkerCount(*config), 2u);
}

TEST(ParseJobConfigTest, DefaultsAreTheDocumentedOnes) {
  const pb::JobConfig config = ParseOrDie(R"(site { name: "a" workers {} })");
  EXPECT_EQ(config.name(), "job");
  EXPECT_EQ(config.site(0).address(), "tcp://127.0.0.1:7100");
  EXPECT_EQ(config.site(0).workers(0).count(), 1u);
  EXPECT_EQ(config.site(0).workers(0).step_time_s(), 0.0);
  EXPECT_EQ(config.model().kind(), pb::MLP);
  EXPECT_EQ(config.model().hidden_size(), 0);
  EXPECT_EQ(config.data().dir(), "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(config.data().train_images(), "train-images-idx3-ubyte.gz");
  EXPECT_EQ(config.data().train_labels(), "train-labels-idx1-ubyte.gz");
  EXPECT_EQ(config.data().test_images(), "t10k-images-idx3-ubyte.gz");
  EXPECT_EQ(config.data().test_labels(), "t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(config.data().normalization(), pb::STANDARDIZE);
  EXPECT_EQ(config.data().site_partition().kind(), pb::IID);
  EXPECT_EQ(config.data().site_partition().classes_size(), 0);
  EXPECT_EQ(config.data().site_partition().skew(), 0.8);
  EXPECT_EQ(config.data().train_limit(), 0u);
  EXPECT_EQ(config.data().test_limit(), 0u);
  EXPECT_EQ(config.optimizer().learning_rate(), 0.05);
  EXPECT_EQ(config.optimizer().momentum(), 0.9);
  EXPECT_EQ(config.optimizer().weight_decay(), 0.0);
  EXPECT_EQ(config.optimizer().batch_size(), 64u);
  EXPECT_EQ(config.optimizer().schedule(), pb::CONSTANT);
  EXPECT_EQ(config.optimizer().step_size(), 1000u);
  EXPECT_EQ(config.optimizer().gamma(), 0.5);
  EXPECT_EQ(config.server().apply_rule(), pb::MEAN);
  EXPECT_EQ(config.server().momentum(), 0.0);
  EXPECT_EQ(config.server().learning_rate(), 1.0);
  EXPECT_EQ(config.server().num_shards(), 4u);
  EXPECT_EQ(config.server().eval_period_s(), 2.0);
  EXPECT_EQ(config.server().join_timeout_s(), 60.0);
  EXPECT_EQ(config.policy().kind(), pb::ASYNC);
  EXPECT_EQ(config.policy().local_steps(), 1u);
  EXPECT_EQ(config.target_accuracy(), 0.0);
  EXPECT_EQ(config.time_budget_s(), 600.0);
  EXPECT_EQ(config.seed(), 1u);
}

TEST(ParseJobConfigTest, FullConfigParses) {
  const pb::JobConfig config = ParseOrDie(kFull);
  EXPECT_EQ(config.name(), "full-job");
  ASSERT_EQ(config.site_size(), 2);
  EXPECT_EQ(config.site(0).address(), "tcp://10.0.0.1:7200");
  EXPECT_EQ(config.site(1).name(), "us_east.1");
  EXPECT_EQ(SiteWorkerCount(config.site(0)), 5u);
  EXPECT_EQ(SiteWorkerCount(config.site(1)), 1u);
  EXPECT_EQ(TotalWorkerCount(config), 6u);
  ASSERT_EQ(config.model().hidden_size(), 2);
  EXPECT_EQ(config.model().hidden(1), 128u);
  EXPECT_EQ(config.data().normalization(), pb::SCALE);
  ASSERT_EQ(config.data().site_partition().classes_size(), 2);
  EXPECT_EQ(config.data().site_partition().classes(1).label_size(), 5);
  EXPECT_EQ(config.data().site_partition().classes(1).label(4), 9u);
  EXPECT_EQ(config.data().site_partition().skew(), 0.5);
  EXPECT_EQ(config.data().train_limit(), 6000u);
  EXPECT_EQ(config.optimizer().schedule(), pb::STEP);
  EXPECT_EQ(config.optimizer().weight_decay(), 0.0001);
  EXPECT_EQ(config.server().apply_rule(), pb::SUM);
  EXPECT_EQ(config.server().num_shards(), 8u);
  EXPECT_EQ(config.server().join_timeout_s(), 30.0);
  EXPECT_EQ(config.policy().kind(), pb::BSP);
  EXPECT_EQ(config.policy().local_steps(), 4u);
  EXPECT_EQ(config.target_accuracy(), 0.85);
  EXPECT_EQ(config.time_budget_s(), 120.0);
  EXPECT_EQ(config.seed(), 42u);
  EXPECT_TRUE(ValidateJobConfig(config).empty());
}

// ---------------------------------------------------------------------------
// Syntax errors.

TEST(ParseJobConfigTest, SyntaxErrorHasOneBasedLineAndColumn) {
  const std::string text =
      "site {\n"
      "  name: \"a\"\n"
      "  workers { count 2 }\n"  // missing ':' -> at the "2", column 19
      "}\n";
  std::vector<ConfigIssue> issues;
  Result<pb::JobConfig> config = ParseJobConfig(text, "bad.job", &issues);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(Locations(issues), (std::vector<Where>{{3, 19, ""}}));
  EXPECT_TRUE(Contains(issues[0].message, "Expected \":\""))
      << issues[0].message;
  EXPECT_EQ(config.status().message(), "bad.job:3:19: " + issues[0].message);
}

TEST(ParseJobConfigTest, UnterminatedMessageReportsEndOfInput) {
  std::vector<ConfigIssue> issues;
  EXPECT_FALSE(ParseJobConfig("site {\n  name: \"a\"\n", "x", &issues).ok());
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].line, 3);
  EXPECT_EQ(issues[0].column, 1);
}

TEST(ParseJobConfigTest, UnknownFieldPointsAtTheName) {
  std::vector<ConfigIssue> issues;
  const std::string text = "site {\n  name: \"a\"\n  wrkers { count: 2 }\n}\n";
  EXPECT_FALSE(ParseJobConfig(text, "x", &issues).ok());
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(Locations(issues), (std::vector<Where>{{3, 3, ""}}));
  EXPECT_TRUE(Contains(issues[0].message, "no field named \"wrkers\""))
      << issues[0].message;
}

TEST(ParseJobConfigTest, WrongEnumValuePointsAtTheValue) {
  std::vector<ConfigIssue> issues;
  const std::string text = "site { name: \"a\" }\npolicy { kind: HOGWILD }\n";
  EXPECT_FALSE(ParseJobConfig(text, "x", &issues).ok());
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(Locations(issues), (std::vector<Where>{{2, 16, ""}}));
  EXPECT_TRUE(Contains(issues[0].message, "\"HOGWILD\"")) << issues[0].message;
}

TEST(ParseJobConfigTest, WrongValueTypeIsReported) {
  std::vector<ConfigIssue> issues;
  const std::string text = "site {\n  workers { count: \"two\" }\n}\n";
  EXPECT_FALSE(ParseJobConfig(text, "x", &issues).ok());
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(Locations(issues), (std::vector<Where>{{2, 20, ""}}));
  EXPECT_TRUE(Contains(issues[0].message, "Expected integer"))
      << issues[0].message;
}

TEST(ParseJobConfigTest, NegativeCountIsASyntaxError) {
  std::vector<ConfigIssue> issues;
  EXPECT_FALSE(
      ParseJobConfig("site { workers { count: -1 } }", "x", &issues).ok());
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].line, 1);
  EXPECT_EQ(issues[0].column, 25);
}

TEST(ParseJobConfigTest, RepeatedSingularFieldIsReported) {
  std::vector<ConfigIssue> issues;
  EXPECT_FALSE(ParseJobConfig("seed: 1\nseed: 2\n", "x", &issues).ok());
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].line, 2);
  EXPECT_TRUE(Contains(issues[0].message, "\"seed\"")) << issues[0].message;
}

TEST(ParseJobConfigTest, SyntaxErrorSkipsSemanticChecks) {
  // No site and a syntax error: only the syntax error is reported, since
  // semantic checks on a partial parse would be noise.
  std::vector<ConfigIssue> issues;
  EXPECT_FALSE(ParseJobConfig("name: \"j\" }", "x", &issues).ok());
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].field, "");
}

// ---------------------------------------------------------------------------
// Semantic errors with locations.

TEST(ParseJobConfigTest, ReportsEverySemanticProblemAtItsField) {
  const std::string text =
      "site {\n"                              // 1
      "  name: \"a\"\n"                       // 2
      "  workers {\n"                         // 3
      "    count: 0\n"                        // 4
      "    step_time_s: -1\n"                 // 5
      "  }\n"                                 // 6
      "  address: \"http://x:1\"\n"           // 7
      "}\n"                                   // 8
      "site {\n"                              // 9
      "  name: \"a\"\n"                       // 10
      "  workers { count: 2 }\n"              // 11
      "}\n"                                   // 12
      "model { kind: SOFTMAX hidden: 10 }\n"  // 13
      "optimizer {\n"                         // 14
      "  learning_rate: 0\n"                  // 15
      "  momentum: 1\n"                       // 16
      "  batch_size: 0\n"                     // 17
      "}\n"                                   // 18
      "server { num_shards: 300 }\n"          // 19
      "policy { local_steps: 0 }\n"           // 20
      "time_budget_s: inf\n";                 // 21
  std::vector<ConfigIssue> issues;
  Result<pb::JobConfig> config = ParseJobConfig(text, "multi.job", &issues);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Locations(issues), (std::vector<Where>{
                                   {7, 3, "site[0].address"},
                                   {4, 5, "site[0].workers[0].count"},
                                   {5, 5, "site[0].workers[0].step_time_s"},
                                   {10, 3, "site[1].name"},
                                   {13, 23, "model.hidden"},
                                   {15, 3, "optimizer.learning_rate"},
                                   {16, 3, "optimizer.momentum"},
                                   {17, 3, "optimizer.batch_size"},
                                   {19, 10, "server.num_shards"},
                                   {20, 10, "policy.local_steps"},
                                   {21, 1, "time_budget_s"},
                               }));
  ASSERT_EQ(issues.size(), 11u);
  EXPECT_TRUE(Contains(issues[0].message, "tcp://, ipc:// or inproc://"));
  EXPECT_EQ(issues[1].message, "must be in [1, 1024], got 0");
  EXPECT_EQ(issues[2].message, "must be >= 0, got -1");
  EXPECT_TRUE(Contains(issues[3].message, "duplicate site name 'a'"));
  EXPECT_TRUE(Contains(issues[4].message, "SOFTMAX"));
  EXPECT_EQ(issues[5].message, "must be > 0, got 0");
  EXPECT_EQ(issues[6].message, "must be in [0, 1), got 1");
  EXPECT_EQ(issues[7].message, "must be in [1, 65536], got 0");
  EXPECT_EQ(issues[8].message, "must be in [1, 256], got 300");
  EXPECT_EQ(issues[9].message, "must be >= 1, got 0");
  EXPECT_EQ(issues[10].message, "must be finite and > 0, got inf");
  // The status message is exactly the formatted issue list.
  EXPECT_EQ(config.status().message(), FormatConfigIssues("multi.job", issues));
  EXPECT_TRUE(Contains(config.status().message(),
                       "multi.job:4:5: site[0].workers[0].count: must be in "
                       "[1, 1024], got 0\n"));
}

TEST(ParseJobConfigTest, AbsentFieldFallsBackToEnclosingMessage) {
  std::vector<ConfigIssue> issues;
  EXPECT_FALSE(ParseJobConfig("\n  site { name: \"a\" }\n", "x", &issues).ok());
  EXPECT_EQ(Locations(issues), (std::vector<Where>{{2, 3, "site[0].workers"}}));

  // No site at all: nothing to point at.
  EXPECT_FALSE(ParseJobConfig("seed: 3\n", "x", &issues).ok());
  EXPECT_EQ(Locations(issues), (std::vector<Where>{{0, 0, "site"}}));
  EXPECT_EQ(FormatConfigIssues("x", issues), "x: site: " + issues[0].message);
}

TEST(ParseJobConfigTest, ListSyntaxEntriesUseTheListLocation) {
  const std::string text =
      "site { name: \"a\" workers {} }\n"
      "model {\n"
      "  hidden: 64\n"
      "  hidden: [32, 0, 70000]\n"
      "}\n";
  std::vector<ConfigIssue> issues;
  EXPECT_FALSE(ParseJobConfig(text, "x", &issues).ok());
  EXPECT_EQ(Locations(issues), (std::vector<Where>{{4, 3, "model.hidden[2]"},
                                                   {4, 3, "model.hidden[3]"}}));
}

TEST(ParseJobConfigTest, ClassListProblemsAreLocated) {
  const std::string text =
      "site { name: \"a\" workers {} }\n"  // 1
      "site { name: \"b\" workers {} }\n"  // 2
      "data { site_partition {\n"          // 3
      "  kind: LABEL_SUBSET\n"             // 4
      "  classes { label: [0, 1] }\n"      // 5
      "  classes { }\n"                    // 6
      "  classes {\n"                      // 7
      "    label: 2\n"                     // 8
      "    label: 10\n"                    // 9
      "  }\n"                              // 10
      "  skew: 1.5\n"                      // 11
      "} }\n";                             // 12
  std::vector<ConfigIssue> issues;
  EXPECT_FALSE(ParseJobConfig(text, "x", &issues).ok());
  EXPECT_EQ(Locations(issues),
            (std::vector<Where>{
                {11, 3, "data.site_partition.skew"},
                {5, 3, "data.site_partition.classes"},
                {6, 3, "data.site_partition.classes[1].label"},
                {9, 5, "data.site_partition.classes[2].label[1]"},
            }));
  ASSERT_EQ(issues.size(), 4u);
  EXPECT_EQ(issues[0].message, "must be in [0, 1], got 1.5");
  EXPECT_TRUE(Contains(issues[1].message, "expected 2, got 3"))
      << issues[1].message;
  EXPECT_EQ(issues[3].message, "must be in [0, 9], got 10");
}

TEST(ParseJobConfigTest, DuplicateSiteNamesAreReportedOncePerRepeat) {
  const std::string text =
      "site { name: \"x\" workers {} }\n"
      "site { name: \"y\" workers {} }\n"
      "site { name: \"x\" workers {} }\n"
      "site { name: \"x\" workers {} }\n";
  std::vector<ConfigIssue> issues;
  EXPECT_FALSE(ParseJobConfig(text, "x", &issues).ok());
  EXPECT_EQ(Locations(issues), (std::vector<Where>{{3, 8, "site[2].name"},
                                                   {4, 8, "site[3].name"}}));
  EXPECT_EQ(issues[0].message,
            "duplicate site name 'x' (also used by site[0]); site names must "
            "be unique");
}

// ---------------------------------------------------------------------------
// ValidateJobConfig rules.

TEST(ValidateJobConfigTest, ValidConfigHasNoIssue) {
  EXPECT_TRUE(ValidateJobConfig(ValidConfig()).empty());
  EXPECT_TRUE(ValidateJobConfig(ParseOrDie(kMinimal)).empty());
}

TEST(ValidateJobConfigTest, ValidationIssuesHaveNoLocation) {
  pb::JobConfig config = ValidConfig();
  config.mutable_site(0)->mutable_workers(0)->set_count(0);
  const std::vector<ConfigIssue> issues = ValidateJobConfig(config);
  EXPECT_EQ(Locations(issues),
            (std::vector<Where>{{0, 0, "site[0].workers[0].count"}}));
}

TEST(ValidateJobConfigTest, SiteNames) {
  struct Case {
    std::string name;
    bool valid;
  };
  const Case cases[] = {
      {"site-1", true}, {"A.b_c", true}, {"", false},  {"a b", false},
      {"a/b", false},   {"..", false},   {".", false}, {"é", false},
      {"..a", true},    {"x:y", false},
  };
  for (const Case& c : cases) {
    pb::JobConfig config = ValidConfig();
    config.mutable_site(0)->set_name(c.name);
    const std::vector<ConfigIssue> issues = ValidateJobConfig(config);
    EXPECT_EQ(Fields(issues), c.valid
                                  ? std::vector<std::string>{}
                                  : std::vector<std::string>{"site[0].name"})
        << "name '" << c.name << "'";
  }
}

TEST(ValidateJobConfigTest, Addresses) {
  struct Case {
    std::string address;
    bool valid;
  };
  const Case cases[] = {
      {"tcp://127.0.0.1:7100", true},
      {"ipc:///tmp/a", true},
      {"inproc://a", true},
      {"", false},
      {"tcp://", false},
      {"http://h:1", false},
      {"127.0.0.1:7100", false},
      {"TCP://h:1", false},
  };
  for (const Case& c : cases) {
    pb::JobConfig config = ValidConfig();
    config.mutable_site(0)->set_address(c.address);
    EXPECT_EQ(Fields(ValidateJobConfig(config)),
              c.valid ? std::vector<std::string>{}
                      : std::vector<std::string>{"site[0].address"})
        << "address '" << c.address << "'";
  }
}

// Boundaries of every numeric range: `mutate` sets one value; `field` is the
// expected issue's path, empty when the value is allowed.
TEST(ValidateJobConfigTest, NumericBoundaries) {
  struct Case {
    std::function<void(pb::JobConfig*)> mutate;
    std::string field;
  };
  auto group = [](pb::JobConfig* c) {
    return c->mutable_site(0)->mutable_workers(0);
  };
  auto opt = [](pb::JobConfig* c) { return c->mutable_optimizer(); };
  auto server = [](pb::JobConfig* c) { return c->mutable_server(); };
  auto policy = [](pb::JobConfig* c) { return c->mutable_policy(); };
  auto part = [](pb::JobConfig* c) {
    return c->mutable_data()->mutable_site_partition();
  };
  auto dirichlet = [&](pb::JobConfig* c) {
    part(c)->set_kind(pb::DIRICHLET);
    part(c)->clear_classes();
    return part(c);
  };
  const Case cases[] = {
      {[&](auto* c) { group(c)->set_count(1024); }, ""},
      {[&](auto* c) { group(c)->set_count(1025); }, "site[0].workers[0].count"},
      {[&](auto* c) { group(c)->set_step_time_s(0); }, ""},
      {[&](auto* c) { group(c)->set_step_time_s(-1e-9); },
       "site[0].workers[0].step_time_s"},
      {[](auto* c) { c->mutable_model()->add_hidden(65536); }, ""},
      {[](auto* c) { c->mutable_model()->add_hidden(1); }, ""},
      {[](auto* c) { c->mutable_model()->add_hidden(65537); },
       "model.hidden[0]"},
      {[&](auto* c) { part(c)->set_skew(0); }, ""},
      {[&](auto* c) { part(c)->set_skew(1); }, ""},
      {[&](auto* c) { part(c)->set_skew(-0.1); }, "data.site_partition.skew"},
      {[&](auto* c) { dirichlet(c)->set_alpha(1e-9); }, ""},
      {[&](auto* c) { dirichlet(c)->set_alpha(1e6); }, ""},
      {[&](auto* c) { dirichlet(c)->set_alpha(0); },
       "data.site_partition.alpha"},
      {[&](auto* c) { dirichlet(c)->set_alpha(-0.5); },
       "data.site_partition.alpha"},
      {[&](auto* c) { dirichlet(c)->set_min_samples(0); }, ""},
      {[&](auto* c) { dirichlet(c)->set_min_samples(1000000); }, ""},
      {[&](auto* c) { part(c)->mutable_classes(0)->set_label(0, 9); }, ""},
      {[&](auto* c) { part(c)->mutable_classes(0)->set_label(0, 10); },
       "data.site_partition.classes[0].label[0]"},
      {[&](auto* c) { opt(c)->set_learning_rate(1e-12); }, ""},
      {[&](auto* c) { opt(c)->set_learning_rate(-0.1); },
       "optimizer.learning_rate"},
      {[&](auto* c) { opt(c)->set_momentum(0); }, ""},
      {[&](auto* c) { opt(c)->set_momentum(0.999); }, ""},
      {[&](auto* c) { opt(c)->set_momentum(-0.1); }, "optimizer.momentum"},
      {[&](auto* c) { opt(c)->set_weight_decay(0); }, ""},
      {[&](auto* c) { opt(c)->set_weight_decay(-1); },
       "optimizer.weight_decay"},
      {[&](auto* c) { opt(c)->set_batch_size(1); }, ""},
      {[&](auto* c) { opt(c)->set_batch_size(65536); }, ""},
      {[&](auto* c) { opt(c)->set_batch_size(65537); }, "optimizer.batch_size"},
      {[&](auto* c) { opt(c)->set_step_size(1); }, ""},
      {[&](auto* c) { opt(c)->set_step_size(0); }, "optimizer.step_size"},
      {[&](auto* c) { opt(c)->set_gamma(1); }, ""},
      {[&](auto* c) { opt(c)->set_gamma(0); }, "optimizer.gamma"},
      {[&](auto* c) { opt(c)->set_gamma(1.01); }, "optimizer.gamma"},
      {[&](auto* c) { server(c)->set_momentum(0); }, ""},
      {[&](auto* c) { server(c)->set_momentum(1); }, "server.momentum"},
      {[&](auto* c) { server(c)->set_learning_rate(0); },
       "server.learning_rate"},
      {[&](auto* c) { server(c)->set_num_shards(1); }, ""},
      {[&](auto* c) { server(c)->set_num_shards(256); }, ""},
      {[&](auto* c) { server(c)->set_num_shards(0); }, "server.num_shards"},
      {[&](auto* c) { server(c)->set_num_shards(257); }, "server.num_shards"},
      {[&](auto* c) { server(c)->set_eval_period_s(0); },
       "server.eval_period_s"},
      {[&](auto* c) { server(c)->set_join_timeout_s(-5); },
       "server.join_timeout_s"},
      {[](auto* c) { c->mutable_policy()->set_local_steps(1); }, ""},
      {[](auto* c) { c->mutable_policy()->set_local_steps(0); },
       "policy.local_steps"},
      {[&](auto* c) { policy(c)->set_staleness(0); }, ""},
      {[&](auto* c) { policy(c)->set_tau(1); }, ""},
      {[&](auto* c) { policy(c)->set_tau(0); }, "policy.tau"},
      {[&](auto* c) { policy(c)->set_tau0(0); }, "policy.tau0"},
      {[&](auto* c) { policy(c)->set_check_period_s(0.1); }, ""},
      {[&](auto* c) { policy(c)->set_check_period_s(0); },
       "policy.check_period_s"},
      {[&](auto* c) {
         policy(c)->set_check_period_s(
             std::numeric_limits<double>::quiet_NaN());
       },
       "policy.check_period_s"},
      {[&](auto* c) { policy(c)->set_min_commit_interval_s(0); }, ""},
      {[&](auto* c) { policy(c)->set_min_commit_interval_s(10); }, ""},
      {[&](auto* c) { policy(c)->set_min_commit_interval_s(-0.1); },
       "policy.min_commit_interval_s"},
      {[&](auto* c) { policy(c)->set_min_commit_interval_s(10.5); },
       "policy.min_commit_interval_s"},
      {[&](auto* c) { policy(c)->set_max_commit_overhead_fraction(0); }, ""},
      {[&](auto* c) { policy(c)->set_max_commit_overhead_fraction(0.5); }, ""},
      {[&](auto* c) { policy(c)->set_max_commit_overhead_fraction(1); },
       "policy.max_commit_overhead_fraction"},
      {[&](auto* c) { policy(c)->set_max_commit_overhead_fraction(-0.1); },
       "policy.max_commit_overhead_fraction"},
      {[&](auto* c) { policy(c)->set_initial_commits_per_period(1); }, ""},
      {[&](auto* c) { policy(c)->set_initial_commits_per_period(0); },
       "policy.initial_commits_per_period"},
      {[&](auto* c) { policy(c)->set_min_commits_per_period(11); },
       "policy.initial_commits_per_period"},
      {[&](auto* c) { policy(c)->set_max_commits_per_period(10); }, ""},
      {[&](auto* c) { policy(c)->set_max_commits_per_period(9); },
       "policy.initial_commits_per_period"},
      {[&](auto* c) {
         policy(c)->set_min_commits_per_period(5);
         policy(c)->set_max_commits_per_period(4);
         policy(c)->set_initial_commits_per_period(5);
       },
       "policy.max_commits_per_period"},
      {[&](auto* c) { policy(c)->set_search_period_s(0); }, ""},
      {[&](auto* c) { policy(c)->set_search_period_s(-1); },
       "policy.search_period_s"},
      {[&](auto* c) { policy(c)->set_loss_jump_ratio(0); },
       "policy.loss_jump_ratio"},
      {[&](auto* c) { policy(c)->set_search_samples_per_period(3); }, ""},
      {[&](auto* c) { policy(c)->set_search_samples_per_period(2); },
       "policy.search_samples_per_period"},
      {[&](auto* c) { policy(c)->set_loss_eval_batches(0); },
       "policy.loss_eval_batches"},
      {[&](auto* c) { policy(c)->set_search_min_improvement(0); }, ""},
      {[&](auto* c) { policy(c)->set_search_min_improvement(1); },
       "policy.search_min_improvement"},
      {[&](auto* c) { policy(c)->add_momentum_grid(0.9); }, ""},
      {[&](auto* c) { policy(c)->add_momentum_grid(1); },
       "policy.momentum_grid[0]"},
      {[&](auto* c) {
         policy(c)->add_momentum_grid(0.3);
         policy(c)->add_momentum_grid(std::numeric_limits<double>::quiet_NaN());
       },
       "policy.momentum_grid[1]"},
      {[](auto* c) { c->set_target_accuracy(0); }, ""},
      {[](auto* c) { c->set_target_accuracy(1); }, ""},
      {[](auto* c) { c->set_target_accuracy(1.0001); }, "target_accuracy"},
      {[](auto* c) { c->set_target_accuracy(-0.5); }, "target_accuracy"},
      {[](auto* c) { c->set_time_budget_s(0.001); }, ""},
      {[](auto* c) { c->set_time_budget_s(0); }, "time_budget_s"},
  };
  int index = 0;
  for (const Case& c : cases) {
    pb::JobConfig config = ValidConfig();
    c.mutate(&config);
    EXPECT_EQ(Fields(ValidateJobConfig(config)),
              c.field.empty() ? std::vector<std::string>{}
                              : std::vector<std::string>{c.field})
        << "case #" << index;
    ++index;
  }
}

// alpha and min_samples belong to DIRICHLET, classes_per_part to
// CLASSES_PER_PART, which needs it in [1, 10] and with sites * k >= 10.
TEST(ValidateJobConfigTest, PartitionKindsOwnTheirFields) {
  pb::JobConfig four_sites = ValidConfig();
  four_sites.mutable_data()->mutable_site_partition()->clear_classes();
  for (const char* name : {"b", "c", "d"}) {
    pb::SiteConfig* site = four_sites.add_site();
    site->set_name(name);
    site->add_workers()->set_count(1);
  }
  ASSERT_TRUE(ValidateJobConfig(four_sites).empty());
  struct Case {
    pb::PartitionKind kind;
    std::function<void(pb::PartitionConfig*)> mutate;
    std::string field;    // "" when valid
    std::string message;  // part of the issue's message
  };
  const Case cases[] = {
      {pb::DIRICHLET, [](auto*) {}, "", ""},
      {pb::DIRICHLET, [](auto* p) { p->set_alpha(0.1); }, "", ""},
      {pb::DIRICHLET, [](auto* p) { p->set_min_samples(0); }, "", ""},
      {pb::DIRICHLET,
       [](auto* p) { p->set_alpha(std::numeric_limits<double>::quiet_NaN()); },
       "alpha", "must be finite and > 0, got nan"},
      {pb::IID, [](auto* p) { p->set_alpha(0.5); }, "alpha",
       "only used by kind: DIRICHLET"},
      {pb::LABEL_SKEW, [](auto* p) { p->set_min_samples(5); }, "min_samples",
       "only used by kind: DIRICHLET"},
      {pb::DIRICHLET, [](auto* p) { p->set_classes_per_part(3); },
       "classes_per_part", "only used by kind: CLASSES_PER_PART"},
      {pb::CLASSES_PER_PART, [](auto* p) { p->set_classes_per_part(3); }, "",
       ""},
      {pb::CLASSES_PER_PART, [](auto* p) { p->set_classes_per_part(10); }, "",
       ""},
      {pb::CLASSES_PER_PART, [](auto*) {}, "classes_per_part",
       "kind CLASSES_PER_PART needs classes_per_part in [1, 10] (classes per "
       "site), got 0"},
      {pb::CLASSES_PER_PART, [](auto* p) { p->set_classes_per_part(11); },
       "classes_per_part", "in [1, 10]"},
      {pb::CLASSES_PER_PART, [](auto* p) { p->set_classes_per_part(2); },
       "classes_per_part",
       "classes_per_part 2 over 4 sites holds 8 classes, fewer than the 10: "
       "every class needs a site (at least 3)"},
      {pb::CLASSES_PER_PART,
       [](auto* p) {
         p->set_classes_per_part(3);
         p->set_alpha(1);
       },
       "alpha", "only used by kind: DIRICHLET"},
  };
  int index = 0;
  for (const Case& c : cases) {
    pb::JobConfig config = four_sites;
    pb::PartitionConfig* partition =
        config.mutable_data()->mutable_site_partition();
    partition->set_kind(c.kind);
    c.mutate(partition);
    const std::vector<ConfigIssue> issues = ValidateJobConfig(config);
    if (c.field.empty()) {
      EXPECT_TRUE(issues.empty())
          << "case #" << index << ": " << FormatConfigIssues("j", issues);
    } else {
      ASSERT_EQ(Fields(issues),
                std::vector<std::string>{"data.site_partition." + c.field})
          << "case #" << index;
      EXPECT_TRUE(Contains(issues[0].message, c.message))
          << "case #" << index << ": " << issues[0].message;
    }
    ++index;
  }
}

TEST(ValidateJobConfigTest, UnspecifiedEnumsListTheAllowedValues) {
  pb::JobConfig config = ValidConfig();
  config.mutable_model()->set_kind(pb::MODEL_KIND_UNSPECIFIED);
  config.mutable_data()->set_normalization(pb::NORMALIZATION_UNSPECIFIED);
  config.mutable_data()->mutable_site_partition()->set_kind(
      pb::PARTITION_KIND_UNSPECIFIED);
  config.mutable_optimizer()->set_schedule(pb::LR_SCHEDULE_KIND_UNSPECIFIED);
  config.mutable_server()->set_apply_rule(pb::APPLY_RULE_UNSPECIFIED);
  config.mutable_policy()->set_kind(pb::POLICY_KIND_UNSPECIFIED);
  const std::vector<ConfigIssue> issues = ValidateJobConfig(config);
  // The classes are only used by LABEL_SUBSET, which is no longer the kind.
  EXPECT_EQ(Fields(issues), (std::vector<std::string>{
                                "model.kind",
                                "data.normalization",
                                "data.site_partition.kind",
                                "data.site_partition.classes",
                                "optimizer.schedule",
                                "server.apply_rule",
                                "policy.kind",
                            }));
  ASSERT_EQ(issues.size(), 7u);
  EXPECT_EQ(issues[0].message,
            "must be one of SOFTMAX, MLP, CNN, MATRIX_FACTORIZATION, EXTERNAL, got "
            "MODEL_KIND_UNSPECIFIED");
  EXPECT_EQ(issues[1].message,
            "must be one of SCALE, STANDARDIZE, got "
            "NORMALIZATION_UNSPECIFIED");
  EXPECT_EQ(issues[6].message,
            "must be one of BSP, ASYNC, SSP, FIXED_ADACOMM, ADACOMM, ADSP, "
            "got POLICY_KIND_UNSPECIFIED");
}

TEST(ValidateJobConfigTest, PolicyDefaultsAreValidForEveryKind) {
  for (const pb::PolicyKind kind : {pb::BSP, pb::ASYNC, pb::SSP,
                                    pb::FIXED_ADACOMM, pb::ADACOMM, pb::ADSP}) {
    pb::JobConfig config = ValidConfig();
    config.mutable_policy()->set_kind(kind);
    EXPECT_TRUE(ValidateJobConfig(config).empty()) << pb::PolicyKind_Name(kind);
  }
  const pb::PolicyConfig defaults;
  EXPECT_EQ(defaults.staleness(), 40u);
  EXPECT_EQ(defaults.tau(), 40u);
  EXPECT_EQ(defaults.tau0(), 40u);
  EXPECT_EQ(defaults.check_period_s(), 10);
  EXPECT_EQ(defaults.min_commit_interval_s(), 0.1);
  EXPECT_EQ(defaults.max_commit_overhead_fraction(), 0.1);
  EXPECT_EQ(defaults.initial_commits_per_period(), 10u);
  EXPECT_EQ(defaults.max_commits_per_period(), 0u);
  EXPECT_TRUE(defaults.search());
  EXPECT_EQ(defaults.search_samples_per_period(), 5u);
  EXPECT_EQ(defaults.loss_jump_ratio(), 0.3);
}

TEST(ParseJobConfigTest, AdspPolicyWithItsOptions) {
  std::vector<ConfigIssue> issues;
  const std::string text =
      "site { name: \"a\" workers { count: 2 } }\n"
      "policy {\n"
      "  kind: ADSP\n"
      "  check_period_s: 60\n"
      "  min_commit_interval_s: 10\n"
      "  initial_commits_per_period: 2\n"
      "  momentum_grid: [0, 0.3, 0.6, 1.5]\n"
      "}\n";
  EXPECT_FALSE(ParseJobConfig(text, "x", &issues).ok());
  ASSERT_EQ(issues.size(), 1u) << FormatConfigIssues("x", issues);
  EXPECT_EQ(issues[0].field, "policy.momentum_grid[3]");
  EXPECT_EQ(issues[0].message, "must be in [0, 1), got 1.5");

  issues.clear();
  std::string fixed = text;
  fixed.replace(fixed.find(", 1.5"), 5, "");
  const Result<pb::JobConfig> config = ParseJobConfig(fixed, "x", &issues);
  ASSERT_OK(config) << FormatConfigIssues("x", issues);
  EXPECT_EQ(config->policy().kind(), pb::ADSP);
  EXPECT_EQ(config->policy().check_period_s(), 60);
  EXPECT_EQ(config->policy().momentum_grid_size(), 3);
}

TEST(ValidateJobConfigTest, SoftmaxRejectsHiddenLayers) {
  pb::JobConfig config = ValidConfig();
  config.mutable_model()->set_kind(pb::SOFTMAX);
  EXPECT_TRUE(ValidateJobConfig(config).empty());
  config.mutable_model()->add_hidden(16);
  EXPECT_EQ(Fields(ValidateJobConfig(config)),
            std::vector<std::string>{"model.hidden"});
}

TEST(ValidateJobConfigTest, CnnNeedsLayersOrAPresetAndNoHiddenLayers) {
  pb::JobConfig config = ValidConfig();
  pb::ModelConfig* model = config.mutable_model();
  model->set_kind(pb::CNN);
  model->set_preset("lenet5");
  EXPECT_TRUE(ValidateJobConfig(config).empty());
  model->add_layers()->set_kind(pb::RELU);
  EXPECT_EQ(Fields(ValidateJobConfig(config)),
            std::vector<std::string>{"model.preset"});
  model->clear_preset();
  EXPECT_TRUE(ValidateJobConfig(config).empty());
  model->clear_layers();
  EXPECT_EQ(Fields(ValidateJobConfig(config)),
            std::vector<std::string>{"model.layers"});
  model->set_preset("lenet5-gn");
  model->add_hidden(16);
  model->set_input_channels(0);
  EXPECT_EQ(Fields(ValidateJobConfig(config)),
            (std::vector<std::string>{"model.hidden", "model.input_channels"}));
  // A CNN's fields on an MLP are a mistake, not silently ignored.
  model->clear_hidden();
  model->clear_input_channels();
  model->set_kind(pb::MLP);
  EXPECT_EQ(Fields(ValidateJobConfig(config)),
            std::vector<std::string>{"model.layers"});
}

TEST(ValidateJobConfigTest, EmptyDataNames) {
  pb::JobConfig config = ValidConfig();
  pb::DataConfig* data = config.mutable_data();
  data->set_dir("");
  data->set_train_images("");
  data->set_train_labels("");
  data->set_test_images("");
  data->set_test_labels("");
  const std::vector<ConfigIssue> issues = ValidateJobConfig(config);
  EXPECT_EQ(Fields(issues),
            (std::vector<std::string>{"data.dir", "data.train_images",
                                      "data.train_labels", "data.test_images",
                                      "data.test_labels"}));
  ASSERT_FALSE(issues.empty());
  EXPECT_EQ(issues[0].message, "must be non-empty");
}

TEST(ValidateJobConfigTest, SiteNeedsWorkers) {
  pb::JobConfig config = ValidConfig();
  config.mutable_site(0)->clear_workers();
  EXPECT_EQ(Fields(ValidateJobConfig(config)),
            std::vector<std::string>{"site[0].workers"});
  config.clear_site();
  config.mutable_data()->mutable_site_partition()->clear_classes();
  EXPECT_EQ(Fields(ValidateJobConfig(config)),
            std::vector<std::string>{"site"});
}

TEST(ValidateJobConfigTest, LabelSubsetWithoutListsIsValid) {
  pb::JobConfig config = ValidConfig();
  config.mutable_data()->mutable_site_partition()->clear_classes();
  EXPECT_TRUE(ValidateJobConfig(config).empty());
}

// Visits every singular double field reachable from `message` (through the
// first element of repeated messages) with its dotted path. Repeated doubles
// (policy.momentum_grid) are checked in NumericBoundaries.
// Visits the double fields under `message` (descending into its messages)
// whose path `wanted` accepts (a message is entered when its path is).
void ForEachDoubleField(
    gpb::Message* message, const std::string& prefix,
    const std::function<void(gpb::Message*, const gpb::FieldDescriptor*,
                             const std::string&)>& visit,
    const std::function<bool(const std::string&)>& wanted =
        [](const std::string&) { return true; }) {
  const gpb::Descriptor* type = message->GetDescriptor();
  const gpb::Reflection* reflection = message->GetReflection();
  for (int i = 0; i < type->field_count(); ++i) {
    const gpb::FieldDescriptor* field = type->field(i);
    const std::string path =
        (prefix.empty() ? "" : prefix + ".") + field->name();
    if (!wanted(path)) continue;
    if (field->cpp_type() == gpb::FieldDescriptor::CPPTYPE_DOUBLE) {
      if (!field->is_repeated()) visit(message, field, path);
    } else if (field->cpp_type() == gpb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (!field->is_repeated()) {
        ForEachDoubleField(reflection->MutableMessage(message, field), path,
                           visit, wanted);
      } else if (reflection->FieldSize(*message, field) > 0) {
        ForEachDoubleField(
            reflection->MutableRepeatedMessage(message, field, 0), path + "[0]",
            visit, wanted);
      }
    }
  }
}

// The fields of matrix-factorisation jobs alone (refused as unused in
// others).
bool IsMatrixFactorizationField(const std::string& path) {
  return path == "model.l2" || path == "target_metric" ||
         path.starts_with("data.ratings");
}

TEST(ValidateJobConfigTest, WorkerThreads) {
  pb::JobConfig config = ValidConfig();
  pb::WorkerGroup* group = config.mutable_site(0)->mutable_workers(0);
  group->set_threads(4);
  EXPECT_TRUE(ValidateJobConfig(config).empty());
  group->set_threads(0);
  std::vector<ConfigIssue> issues = ValidateJobConfig(config);
  ASSERT_EQ(Fields(issues),
            std::vector<std::string>{"site[0].workers[0].threads"});
  EXPECT_EQ(issues[0].message, "must be in [1, 64], got 0");
  group->set_threads(kMaxWorkerThreads + 1);
  EXPECT_EQ(Fields(ValidateJobConfig(config)),
            std::vector<std::string>{"site[0].workers[0].threads"});
  // Matrix factorisation steps a few rows: one thread.
  group->set_threads(2);
  config.mutable_data()->mutable_site_partition()->set_kind(pb::IID);
  config.mutable_data()->mutable_site_partition()->clear_classes();
  config.mutable_model()->set_kind(pb::MATRIX_FACTORIZATION);
  config.mutable_data()->mutable_ratings();
  issues = ValidateJobConfig(config);
  ASSERT_EQ(Fields(issues),
            std::vector<std::string>{"site[0].workers[0].threads"});
  EXPECT_TRUE(Contains(issues[0].message, "one thread")) << issues[0].message;
  group->set_threads(1);
  EXPECT_TRUE(ValidateJobConfig(config).empty());
}

TEST(ValidateJobConfigTest, WorkerAccessLinks) {
  pb::JobConfig config = ValidConfig();
  pb::WorkerLinkConfig* link =
      config.mutable_site(0)->mutable_workers(0)->mutable_link();
  link->set_preset("5g");
  link->mutable_up()->set_latency("40ms");
  EXPECT_TRUE(ValidateJobConfig(config).empty());
  EXPECT_TRUE(HasWorkerLinks(config));
  link->set_preset("dial-up");
  link->mutable_both()->set_bandwidth("fast");
  std::vector<ConfigIssue> issues = ValidateJobConfig(config);
  ASSERT_EQ(Fields(issues), (std::vector<std::string>{
                                "site[0].workers[0].link.preset",
                                "site[0].workers[0].link.both.bandwidth"}));
  EXPECT_TRUE(Contains(issues[0].message, "4g")) << issues[0].message;
  link->clear_preset();
  link->clear_both();
  // Emulated by `meridian run`, not by a standalone wanem.
  config.mutable_wan()->set_wanem_host("10.0.0.9");
  issues = ValidateJobConfig(config);
  ASSERT_EQ(Fields(issues),
            std::vector<std::string>{"site[0].workers[0].link"});
  EXPECT_TRUE(Contains(issues[0].message, "wanem_host")) << issues[0].message;
  config.mutable_wan()->clear_wanem_host();
  // Workers of a site without a server reach theirs over the WAN.
  config.mutable_data()->mutable_site_partition()->set_kind(pb::IID);
  config.mutable_data()->mutable_site_partition()->clear_classes();
  pb::SiteConfig* remote = config.add_site();
  remote->set_name("remote");
  remote->set_server_site(config.site(0).name());
  remote->add_workers()->mutable_link()->set_preset("4g");
  issues = ValidateJobConfig(config);
  ASSERT_EQ(Fields(issues),
            std::vector<std::string>{"site[1].workers[0].link"});
  EXPECT_TRUE(Contains(issues[0].message, "server_site")) << issues[0].message;
  config.mutable_site(1)->mutable_workers(0)->clear_link();
  config.mutable_site(0)->mutable_workers(0)->clear_link();
  EXPECT_FALSE(HasWorkerLinks(config));
}

TEST(ValidateJobConfigTest, FaultSettings) {
  pb::JobConfig config = ValidConfig();
  EXPECT_TRUE(ValidateJobConfig(config).empty());  // the defaults
  pb::FaultConfig* fault = config.mutable_fault();
  fault->set_heartbeat_interval_s(2);
  fault->set_peer_timeout_s(3);  // below two heartbeats
  fault->set_retention_limit("lots");
  fault->set_checkpoint_period_s(-1);
  std::vector<ConfigIssue> issues = ValidateJobConfig(config);
  EXPECT_EQ(Fields(issues),
            (std::vector<std::string>{"fault.checkpoint_period_s",
                                      "fault.peer_timeout_s",
                                      "fault.retention_limit"}));
  for (const ConfigIssue& issue : issues) {
    if (issue.field == "fault.peer_timeout_s") {
      EXPECT_TRUE(Contains(issue.message, "twice heartbeat_interval_s"))
          << issue.message;
    }
  }
  fault->set_peer_timeout_s(4);
  fault->set_retention_limit("16mb");
  fault->set_checkpoint_period_s(0);  // no checkpoints: allowed
  EXPECT_TRUE(ValidateJobConfig(config).empty());
}

// NaN and infinities in `config`'s double fields that `wanted` accepts: each
// is one issue at its path saying it must be finite, and the restored value
// validates again. Returns the fields visited.
int ExpectEveryDoubleRejectsNanAndInfinity(
    pb::JobConfig& config,
    const std::function<bool(const std::string&)>& wanted) {
  int visited = 0;
  ForEachDoubleField(
      &config, "",
      [&](gpb::Message* message, const gpb::FieldDescriptor* field,
          const std::string& path) {
        ++visited;
        const gpb::Reflection* reflection = message->GetReflection();
        const double saved = reflection->GetDouble(*message, field);
        for (double bad : {std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity()}) {
          reflection->SetDouble(message, field, bad);
          const std::vector<ConfigIssue> issues = ValidateJobConfig(config);
          ASSERT_EQ(Fields(issues), std::vector<std::string>{path})
              << "value " << bad;
          EXPECT_TRUE(Contains(issues[0].message, "must be finite"))
              << issues[0].message;
        }
        reflection->SetDouble(message, field, saved);
        EXPECT_TRUE(ValidateJobConfig(config).empty()) << path;
      },
      wanted);
  return visited;
}

TEST(ValidateJobConfigTest, MatrixFactorizationDoublesRejectNanAndInfinity) {
  pb::JobConfig config = ValidConfig();
  config.mutable_data()->mutable_site_partition()->set_kind(pb::IID);
  config.mutable_data()->mutable_site_partition()->clear_classes();
  config.mutable_model()->set_kind(pb::MATRIX_FACTORIZATION);
  config.mutable_data()->mutable_ratings();
  ASSERT_TRUE(ValidateJobConfig(config).empty());
  // model.l2, target_metric and the rating matrix's four.
  EXPECT_EQ(ExpectEveryDoubleRejectsNanAndInfinity(
                config,
                [](const std::string& path) {
                  return IsMatrixFactorizationField(path) || path == "model" ||
                         path == "data";
                }),
            6);
}

TEST(ValidateJobConfigTest, EveryDoubleFieldRejectsNanAndInfinity) {
  pb::JobConfig config = ValidConfig();
  // A DIRICHLET partition, whose alpha may be set (with another kind, a set
  // alpha is also reported as unused).
  config.mutable_data()->mutable_site_partition()->set_kind(pb::DIRICHLET);
  config.mutable_data()->mutable_site_partition()->clear_classes();
  const int visited = ExpectEveryDoubleRejectsNanAndInfinity(
      config, [](const std::string& path) {
        return !IsMatrixFactorizationField(path);
      });
  // step_time_s, skew, alpha, 4 optimizer/server pairs..., target, budget,
  // wan.sample_period_s, sync: threshold, adaptive_step, adaptive_max,
  // selective_barrier_fraction, send_period_s, compression.top_k_fraction;
  // policy:
  // check_period_s, min_commit_interval_s, search_period_s,
  // loss_jump_ratio, search_min_improvement, max_commit_overhead_fraction;
  // fault: heartbeat_interval_s,
  // worker_timeout_s, server_timeout_s, worker_give_up_s, peer_timeout_s,
  // checkpoint_period_s, restart_backoff_s; sync.skewscout: target_loss,
  // dead_band, smoothing, tighten_factor, loosen_factor, min_theta,
  // max_theta, significance_z, min_density, max_density; sync.diloco:
  // outer_lr, outer_momentum, error_feedback_decay; server.limits:
  // connection_stall_s, untrusted_messages_per_s.
  EXPECT_EQ(visited, 48);
}

TEST(ValidateJobConfigTest, WanPricesNeedAPriceASourceAndOneEntryAPair) {
  pb::JobConfig config = ValidConfig();
  pb::TransferPriceConfig* any = config.mutable_wan()->add_price();
  any->set_from_region("*");
  any->set_usd_per_gb(0.05);
  pb::TransferPriceConfig* pair = config.mutable_wan()->add_price();
  pair->set_from_region("us-east-1");
  pair->set_to_region("eu-central-1");
  pair->set_usd_per_gb(0);
  EXPECT_TRUE(ValidateJobConfig(config).empty());
  // The same pair again ("*" and an empty to_region are the same), a
  // negative price, no price, no source.
  pb::TransferPriceConfig* again = config.mutable_wan()->add_price();
  again->set_from_region("*");
  again->set_to_region("*");
  again->set_usd_per_gb(1);
  pb::TransferPriceConfig* negative = config.mutable_wan()->add_price();
  negative->set_from_region("ap-southeast-1");
  negative->set_usd_per_gb(-0.01);
  config.mutable_wan()->add_price()->set_from_region("eu-west-1");
  config.mutable_wan()->add_price()->set_usd_per_gb(0.02);
  const std::vector<ConfigIssue> issues = ValidateJobConfig(config);
  EXPECT_EQ(Fields(issues),
            (std::vector<std::string>{
                "wan.price[2].to_region", "wan.price[3].usd_per_gb",
                "wan.price[4].usd_per_gb", "wan.price[5].from_region"}))
      << FormatConfigIssues("j", issues);
  EXPECT_TRUE(Contains(issues[0].message, "already priced by wan.price[0]"))
      << issues[0].message;
}

// A change of the sync block and what validation says of it.
struct SyncCase {
  std::function<void(pb::SyncConfig*)> mutate;
  std::string field;    // "" when valid
  std::string message;  // part of the issue's message
};

// Each case on ValidConfig() with `kind` and `setup` applied first: valid,
// or exactly one issue at `prefix` + its field, mentioning its message.
void ExpectSyncCases(pb::SyncKind kind,
                     const std::function<void(pb::SyncConfig*)>& setup,
                     const std::string& prefix,
                     std::span<const SyncCase> cases) {
  int index = 0;
  for (const SyncCase& c : cases) {
    pb::JobConfig config = ValidConfig();
    config.mutable_sync()->set_kind(kind);
    setup(config.mutable_sync());
    c.mutate(config.mutable_sync());
    const std::vector<ConfigIssue> issues = ValidateJobConfig(config);
    if (c.field.empty()) {
      EXPECT_TRUE(issues.empty())
          << "case #" << index << ": " << FormatConfigIssues("j", issues);
    } else {
      ASSERT_EQ(Fields(issues), std::vector<std::string>{prefix + c.field})
          << "case #" << index << ": " << FormatConfigIssues("j", issues);
      EXPECT_TRUE(Contains(issues[0].message, c.message))
          << "case #" << index << ": " << issues[0].message;
    }
    ++index;
  }
}

TEST(ValidateJobConfigTest, SkewScoutOptionsAndWhatItControls) {
  const SyncCase cases[] = {
      {[](auto* s) { s->mutable_skewscout()->set_enabled(true); }, "", ""},
      {[](auto* s) {
         s->set_kind(pb::DENSE);
         s->mutable_skewscout()->set_enabled(true);
       },
       "enabled", "needs sync.kind GAIA"},
      // FedAvg: the averaging period is the knob, starting in its bounds.
      {[](auto* s) {
         s->set_kind(pb::MODEL_AVERAGING);
         s->mutable_skewscout()->set_enabled(true);
       },
       "", ""},
      {[](auto* s) {
         s->set_kind(pb::MODEL_AVERAGING);
         s->set_averaging_period(500);
         s->mutable_skewscout()->set_enabled(true);
       },
       "enabled",
       "starts at sync.averaging_period (500), which must lie in [1, 400]"},
      {[](auto* s) { s->mutable_skewscout()->set_min_averaging_period(0); },
       "min_averaging_period", ""},
      {[](auto* s) {
         s->mutable_skewscout()->set_min_averaging_period(20);
         s->mutable_skewscout()->set_max_averaging_period(10);
       },
       "max_averaging_period", "at least min_averaging_period (20)"},
      {[](auto* s) {
         s->set_threshold(0.9);
         s->mutable_skewscout()->set_enabled(true);
       },
       "enabled", "starts at sync.threshold (0.9)"},
      // Off: the threshold is not its business.
      {[](auto* s) { s->set_threshold(0.9); }, "", ""},
      {[](auto* s) { s->mutable_skewscout()->set_travel_period(0); },
       "travel_period", ""},
      {[](auto* s) { s->mutable_skewscout()->set_holdout_samples(0); },
       "holdout_samples", ""},
      {[](auto* s) { s->mutable_skewscout()->set_target_loss(1); },
       "target_loss", ""},
      {[](auto* s) { s->mutable_skewscout()->set_dead_band(1); }, "dead_band",
       ""},
      {[](auto* s) { s->mutable_skewscout()->set_smoothing(0); }, "smoothing",
       ""},
      {[](auto* s) { s->mutable_skewscout()->set_tighten_factor(1); },
       "tighten_factor", ""},
      {[](auto* s) { s->mutable_skewscout()->set_loosen_factor(0.5); },
       "loosen_factor", ""},
      {[](auto* s) { s->mutable_skewscout()->set_patience(0); }, "patience",
       ""},
      {[](auto* s) { s->mutable_skewscout()->set_min_theta(0); }, "min_theta",
       ""},
      {[](auto* s) { s->mutable_skewscout()->set_max_theta(0.0005); },
       "max_theta", "at least min_theta"},
      {[](auto* s) { s->mutable_skewscout()->set_significance_z(-1); },
       "significance_z", ""},
      {[](auto* s) {
         s->mutable_skewscout()->set_travel_value_coding(
             pb::VALUE_CODING_UNSPECIFIED);
       },
       "travel_value_coding", ""},
      {[](auto* s) {
         s->mutable_skewscout()->set_travel_period(100);
         s->mutable_skewscout()->set_max_travel_period(50);
       },
       "max_travel_period", "at least travel_period (100)"},
      {[](auto* s) {
         s->mutable_skewscout()->set_travel_period(100);
         s->mutable_skewscout()->set_max_travel_period(100);
       },
       "", ""},
      {[](auto* s) { s->mutable_skewscout()->set_min_density(0); },
       "min_density", ""},
      {[](auto* s) {
         s->mutable_skewscout()->set_min_density(0.1);
         s->mutable_skewscout()->set_max_density(0.05);
       },
       "max_density", "at least min_density"},
      // Threshold 0 through top-k: the density is the knob, and must
      // start within its bounds.
      {[](auto* s) {
         s->set_threshold(0);
         s->mutable_compression()->set_selection(pb::TOP_K);
         s->mutable_compression()->set_top_k_fraction(0.01);
         s->mutable_skewscout()->set_enabled(true);
       },
       "", ""},
      {[](auto* s) {
         s->set_threshold(0);
         s->mutable_compression()->set_selection(pb::TOP_K);
         s->mutable_compression()->set_top_k_fraction(0.5);
         s->mutable_skewscout()->set_enabled(true);
       },
       "enabled", "top_k_fraction (0.5), which must lie in [0.001, 0.25]"},
  };
  ExpectSyncCases(
      pb::GAIA, [](pb::SyncConfig* s) { s->set_threshold(0.05); },
      "sync.skewscout.", cases);
}

TEST(ValidateJobConfigTest, DiLoCoOptions) {
  const SyncCase cases[] = {
      {[](auto*) {}, "", ""},
      {[](auto* s) {
         s->mutable_diloco()->set_fragments(4);
         s->mutable_diloco()->set_overlap(true);
         s->mutable_compression()->set_value_coding(pb::VALUE_INT4);
       },
       "", ""},
      {[](auto* s) { s->mutable_diloco()->set_fragments(3); },
       "sync.diloco.fragments", "must divide sync.averaging_period (20)"},
      {[](auto* s) { s->mutable_diloco()->set_fragments(0); },
       "sync.diloco.fragments", ""},
      {[](auto* s) { s->mutable_diloco()->set_outer_lr(0); },
       "sync.diloco.outer_lr", ""},
      {[](auto* s) { s->mutable_diloco()->set_outer_momentum(1); },
       "sync.diloco.outer_momentum", ""},
      // SparseLoCo: error feedback, top-k, int2 (not with INDEX_DENSE).
      {[](auto* s) {
         s->mutable_diloco()->set_outer_momentum(0);
         s->mutable_diloco()->set_error_feedback(true);
         s->mutable_diloco()->set_error_feedback_decay(0.95);
         s->mutable_compression()->set_selection(pb::TOP_K);
         s->mutable_compression()->set_top_k_fraction(0.02);
         s->mutable_compression()->set_value_coding(pb::VALUE_INT2);
       },
       "", ""},
      {[](auto* s) {
         s->mutable_diloco()->set_error_feedback(true);
         s->mutable_diloco()->set_error_feedback_decay(1.5);
       },
       "sync.diloco.error_feedback_decay", ""},
      {[](auto* s) {
         s->mutable_compression()->set_value_coding(pb::VALUE_INT2);
         s->mutable_compression()->set_index_coding(pb::INDEX_DENSE);
       },
       "sync.compression.index_coding", "no zero level"},
      {[](auto* s) {
         s->set_topology(pb::STAR);
         s->set_hub("a");
       },
       "sync.topology", "needs FULL_MESH"},
      // SkewScout moves the period of one fragment's rounds only.
      {[](auto* s) { s->mutable_skewscout()->set_enabled(true); }, "", ""},
      {[](auto* s) {
         s->mutable_diloco()->set_fragments(4);
         s->mutable_skewscout()->set_enabled(true);
       },
       "sync.skewscout.enabled", "use one fragment"},
  };
  ExpectSyncCases(
      pb::DILOCO, [](pb::SyncConfig* s) { s->set_averaging_period(20); }, "",
      cases);
}

// Error feedback is DiLoCo's: FedAvg sends models, not outer gradients.
TEST(ValidateJobConfigTest, ErrorFeedbackIsDiLoCosOnly) {
  const SyncCase cases[] = {
      {[](auto*) {}, "", ""},
      {[](auto* s) { s->mutable_diloco()->set_error_feedback(true); },
       "sync.diloco.error_feedback", "DILOCO only"},
  };
  ExpectSyncCases(
      pb::MODEL_AVERAGING,
      [](pb::SyncConfig* s) { s->set_averaging_period(20); }, "", cases);
}

// Sends between clocks: a period in seconds, for the kinds that send at
// clocks.
TEST(ValidateJobConfigTest, SendPeriod) {
  const SyncCase cases[] = {
      {[](auto*) {}, "", ""},
      {[](auto* s) { s->set_send_period_s(0.02); }, "", ""},
      {[](auto* s) { s->set_send_period_s(-1); }, "sync.send_period_s", ""},
      {[](auto* s) { s->set_send_period_s(std::nan("")); },
       "sync.send_period_s", ""},
  };
  ExpectSyncCases(
      pb::DENSE, [](pb::SyncConfig*) {}, "", cases);
}

// Own changes held for the peers': for the kinds that apply a peer's
// changes as they come; DiLoCo's rounds apply every site's together.
TEST(ValidateJobConfigTest, OwnChangesWithThePeersIsGaiaAndDenseOnly) {
  const SyncCase dense_cases[] = {
      {[](auto*) {}, "", ""},
      {[](auto* s) { s->set_own_changes(pb::OWN_CHANGES_WITH_PEERS); }, "",
       ""},
      {[](auto* s) { s->set_own_changes(pb::OWN_CHANGES_UNSPECIFIED); },
       "sync.own_changes", ""},
      {[](auto* s) { s->set_own_changes(pb::OWN_CHANGES_AS_SENT); }, "", ""},
      // A hub's accumulators carry what it relays: not only its own.
      {[](auto* s) {
         s->set_own_changes(pb::OWN_CHANGES_AS_SENT);
         s->set_topology(pb::STAR);
         s->set_hub("a");
       },
       "sync.own_changes", "needs topology FULL_MESH"},
      {[](auto* s) {
         s->set_own_changes(pb::OWN_CHANGES_WITH_PEERS);
         s->set_topology(pb::STAR);
         s->set_hub("a");
       },
       "", ""},
  };
  ExpectSyncCases(
      pb::DENSE, [](pb::SyncConfig*) {}, "", dense_cases);
  ExpectSyncCases(
      pb::GAIA, [](pb::SyncConfig*) {}, "", dense_cases);
  const SyncCase diloco_cases[] = {
      {[](auto* s) { s->set_own_changes(pb::OWN_CHANGES_WITH_PEERS); },
       "sync.own_changes", "GAIA and DENSE only"},
      {[](auto* s) { s->set_own_changes(pb::OWN_CHANGES_AS_SENT); },
       "sync.own_changes", "OWN_CHANGES_AS_SENT applies to GAIA and DENSE"},
  };
  ExpectSyncCases(
      pb::DILOCO, [](pb::SyncConfig* s) { s->set_averaging_period(20); }, "",
      diloco_cases);
}

// FedAvg is DiLoCo's outer step with lr 1 and no momentum: the same rounds,
// the same full mesh.
TEST(ValidateJobConfigTest, ModelAveragingNeedsAFullMesh) {
  const SyncCase cases[] = {
      {[](auto*) {}, "", ""},
      {[](auto* s) {
         s->set_topology(pb::STAR);
         s->set_hub("a");
       },
       "sync.topology", "MODEL_AVERAGING averages every site's"},
      {[](auto* s) { s->set_averaging_period(0); }, "sync.averaging_period",
       ""},
      {[](auto* s) { s->set_send_period_s(0.02); }, "sync.send_period_s",
       "applies to GAIA and DENSE only"},
  };
  ExpectSyncCases(
      pb::MODEL_AVERAGING,
      [](pb::SyncConfig* s) { s->set_averaging_period(10); }, "", cases);
}

// ---------------------------------------------------------------------------
// FormatConfigIssues.

TEST(FormatConfigIssuesTest, Format) {
  EXPECT_EQ(FormatConfigIssues("j.txt", {}), "");
  EXPECT_EQ(FormatConfigIssues("j.txt", {{4, 5, "site[0].workers[0].count",
                                          "must be in [1, 1024], got 0"}}),
            "j.txt:4:5: site[0].workers[0].count: must be in [1, 1024], got 0");
  EXPECT_EQ(FormatConfigIssues("j.txt", {{0, 0, "site", "need one"},
                                         {3, 0, "seed", "bad"},
                                         {2, 7, "", "syntax"}}),
            "j.txt: site: need one\n"
            "j.txt:3: seed: bad\n"
            "j.txt:2:7: syntax");
}

// ---------------------------------------------------------------------------
// LoadJobConfig.

class LoadJobConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("config_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::filesystem::path path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }

  std::filesystem::path dir_;
};

TEST_F(LoadJobConfigTest, LoadsAFile) {
  const std::string path = Write("ok.job", kFull);
  Result<pb::JobConfig> config = LoadJobConfig(path);
  ASSERT_OK(config);
  EXPECT_EQ(config->name(), "full-job");
}

TEST_F(LoadJobConfigTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = (dir_ / "nope.job").string();
  Result<pb::JobConfig> config = LoadJobConfig(path);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(config.status().message(), path)) << config.status();
}

TEST_F(LoadJobConfigTest, DirectoryIsInvalidArgumentNamingThePath) {
  Result<pb::JobConfig> config = LoadJobConfig(dir_.string());
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(config.status().message(), dir_.string()))
      << config.status();
}

TEST_F(LoadJobConfigTest, IssuesAreReportedAgainstThePath) {
  const std::string path = Write("bad.job", "site {\n  name: \"\"\n}\n");
  std::vector<ConfigIssue> issues;
  Result<pb::JobConfig> config = LoadJobConfig(path, &issues);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Locations(issues), (std::vector<Where>{{2, 3, "site[0].name"},
                                                   {1, 1, "site[0].workers"}}));
  EXPECT_EQ(config.status().message(), FormatConfigIssues(path, issues));
  EXPECT_EQ(config.status().message().rfind(path + ":2:3: site[0].name: ", 0),
            0u)
      << config.status();
}

// ---------------------------------------------------------------------------
// Site helpers.

TEST(FindSiteTest, FindsByNameAndListsKnownNames) {
  const pb::JobConfig config = ParseOrDie(kFull);
  Result<int> index = FindSite(config, "us_east.1");
  ASSERT_OK(index);
  EXPECT_EQ(*index, 1);
  EXPECT_EQ(*FindSite(config, "eu-west"), 0);

  Result<int> missing = FindSite(config, "ap-south");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            "no site named 'ap-south' in the job (sites: eu-west, "
            "us_east.1)");
}

TEST(SiteWorkersTest, CountsAndGroupsAcrossMultipleGroups) {
  pb::SiteConfig site;
  pb::WorkerGroup* fast = site.add_workers();
  fast->set_count(2);
  fast->set_step_time_s(0.01);
  pb::WorkerGroup* slow = site.add_workers();
  slow->set_count(3);
  slow->set_step_time_s(0.5);
  pb::WorkerGroup* single = site.add_workers();  // default count: 1
  single->set_step_time_s(2);
  EXPECT_EQ(SiteWorkerCount(site), 6u);

  const double expected[] = {0.01, 0.01, 0.5, 0.5, 0.5, 2};
  for (uint32_t i = 0; i < 6; ++i) {
    EXPECT_EQ(WorkerGroupOf(site, i).step_time_s(), expected[i])
        << "worker " << i;
  }
  EXPECT_EQ(&WorkerGroupOf(site, 1), &site.workers(0));
  EXPECT_EQ(&WorkerGroupOf(site, 2), &site.workers(1));
  EXPECT_EQ(&WorkerGroupOf(site, 5), &site.workers(2));

  pb::JobConfig config;
  *config.add_site() = site;
  config.add_site()->add_workers()->set_count(4);
  EXPECT_EQ(TotalWorkerCount(config), 10u);
  EXPECT_EQ(SiteWorkerCount(pb::SiteConfig()), 0u);
}

}  // namespace
}  // namespace meridian

namespace meridian {
namespace {

constexpr char kThreeSites[] = R"(
site { name: "a" workers { count: 2 } }
site { name: "b" server_site: "a" workers { count: 1 } workers { count: 2 } }
site { name: "c" workers { count: 1 } }
)";

TEST(ServerSiteTest, ServedWorkersFollowServerSite) {
  Result<pb::JobConfig> config = ParseJobConfig(kThreeSites, "three.job");
  ASSERT_OK(config);
  EXPECT_TRUE(HasServer(config->site(0)));
  EXPECT_FALSE(HasServer(config->site(1)));
  EXPECT_EQ(ServingSite(*config, 0), 0);
  EXPECT_EQ(ServingSite(*config, 1), 0);
  EXPECT_EQ(ServingSite(*config, 2), 2);
  const std::vector<WorkerRef> a = ServedWorkers(*config, 0);
  const std::vector<WorkerRef> expected = {
      {0, 0}, {0, 1}, {1, 0}, {1, 1}, {1, 2}};
  EXPECT_EQ(a, expected);
  EXPECT_TRUE(ServedWorkers(*config, 1).empty());
  EXPECT_EQ(ServedWorkers(*config, 2), (std::vector<WorkerRef>{{2, 0}}));
}

TEST(ServerSiteTest, BadServerSitesAreReportedAtTheField) {
  std::vector<ConfigIssue> issues;
  Result<pb::JobConfig> config = ParseJobConfig(
      "site { name: \"a\" workers { count: 1 } }\n"
      "site { name: \"b\" server_site: \"nowhere\" workers { count: 1 } }\n"
      "site { name: \"c\" server_site: \"c\" workers { count: 1 } }\n"
      "site { name: \"d\" server_site: \"b\" workers { count: 1 } }\n",
      "bad.job", &issues);
  EXPECT_FALSE(config.ok());
  ASSERT_EQ(issues.size(), 3u) << FormatConfigIssues("bad.job", issues);
  EXPECT_EQ(issues[0].field, "site[1].server_site");
  EXPECT_EQ(issues[0].line, 2);
  EXPECT_NE(issues[0].message.find("nowhere"), std::string::npos);
  EXPECT_EQ(issues[1].field, "site[2].server_site");
  EXPECT_NE(issues[1].message.find("itself"), std::string::npos);
  EXPECT_EQ(issues[2].field, "site[3].server_site");
  EXPECT_NE(issues[2].message.find("no server of its own"), std::string::npos);
}

}  // namespace
}  // namespace meridian
