// Validation of what the user brings: worker and evaluator programs
// (WorkerGroup.command, EvaluatorConfig.command) and the model they own
// (model.kind EXTERNAL: its weights file, its metrics and the job's target
// on them). Whether a program can be found, and whether the weights file
// parses, depends on the machine that runs it: `meridian run` and
// `meridian validate` check those, not the config.

#include <cmath>
#include <set>
#include <string>

#include "config/validate.h"
#include "meridian/config/config.h"

namespace meridian::config_internal {

namespace {

// A command's program (its first element) must be named; the arguments
// after it may be anything, empty strings included.
void ValidateCommand(
    const google::protobuf::RepeatedPtrField<std::string>& command,
    const IssueReporter& r) {
  if (command.empty()) return;
  r.Check(!command.Get(0).empty(), "command",
          "its first element is the program to run (a name looked up in "
          "PATH, or a path relative to the job file's directory) and must "
          "be non-empty");
}

// Whether the intra-site policy asks for loss evaluations (ADSP's search,
// ADACOMM's tau): with an external model the evaluator measures them.
bool PolicyEvaluatesLoss(const pb::PolicyConfig& policy) {
  return policy.kind() == pb::ADSP || policy.kind() == pb::ADACOMM;
}

// model { } of kind EXTERNAL: the weights file, the metrics, loss_metric.
void ValidateExternalModel(const pb::JobConfig& config,
                           const IssueReporter& root) {
  const pb::ModelConfig& model = config.model();
  const IssueReporter r = root.Nested("model");
  r.Check(!model.weights().empty(), "weights",
          "model.kind EXTERNAL needs its initial weights: a safetensors "
          "file every site reads (relative to the job file's directory), "
          "e.g. weights: \"initial.safetensors\" (meridian."
          "save_initial_weights writes one from a state_dict)");
  r.Check(
      model.weights_command_size() == 0 || !model.weights_command(0).empty(),
      "weights_command",
      "its first element is the program that writes model.weights (a "
      "name looked up in PATH, or a path relative to the job file's "
      "directory) and must be non-empty");
  r.Check(model.metrics_size() > 0, "metrics",
          "model.kind EXTERNAL needs at least one metric its evaluators "
          "report, e.g. metrics { name: \"accuracy\" higher_is_better: true "
          "} (the first is the job's metric: target, plots, progress)");
  std::set<std::string> names;
  for (int i = 0; i < model.metrics_size(); ++i) {
    const std::string& name = model.metrics(i).name();
    const IssueReporter m = r.Nested("metrics", i);
    if (name.empty()) {
      m.Report("name",
               "every metric needs a name (what the evaluator "
               "reports it as)");
    } else if (!names.insert(name).second) {
      m.Report("name", "duplicate metric name '" + name +
                           "'; metric names must be unique");
    }
  }
  if (!PolicyEvaluatesLoss(config.policy()) || names.empty()) return;
  const std::string policy = pb::PolicyKind_Name(config.policy().kind());
  std::string listed;
  for (const pb::MetricConfig& metric : model.metrics()) {
    listed += (listed.empty() ? "'" : ", '") + metric.name() + "'";
  }
  if (!names.count(model.loss_metric())) {
    r.Report("loss_metric",
             "policy " + policy +
                 " evaluates the loss, which an EXTERNAL model's evaluator "
                 "reports as model.loss_metric ('" +
                 model.loss_metric() + "'); name one of model.metrics (" +
                 listed + "), or add a metric of that name");
    return;
  }
  for (const pb::MetricConfig& metric : model.metrics()) {
    if (metric.name() != model.loss_metric()) continue;
    r.Check(!metric.higher_is_better(), "loss_metric",
            "names metric '" + metric.name() +
                "', which is higher-is-better; policy " + policy +
                " reads it as a loss (lower is better): name a loss, or set "
                "its higher_is_better: false");
    return;  // the first of that name (a duplicate is reported at its name)
  }
}

// The job's target on an EXTERNAL model is on its first metric.
void ValidateExternalTarget(const pb::JobConfig& config,
                            const IssueReporter& root) {
  if (config.model().metrics_size() == 0) return;  // reported at metrics
  const pb::MetricConfig& first = config.model().metrics(0);
  const bool accuracy = first.name() == "accuracy" && first.higher_is_better();
  root.Check(accuracy || !(config.target_accuracy() > 0), "target_accuracy",
             "the job's metric is model.metrics[0], '" + first.name() + "' (" +
                 (first.higher_is_better() ? "higher" : "lower") +
                 " is better), not accuracy: give its target as "
                 "target_metric");
}

// An EXTERNAL model is trained by programs only.
void ValidateWorkerPrograms(const pb::JobConfig& config,
                            const IssueReporter& root) {
  for (int s = 0; s < config.site_size(); ++s) {
    const pb::SiteConfig& site = config.site(s);
    for (int g = 0; g < site.workers_size(); ++g) {
      root.Nested("site", s)
          .Nested("workers", g)
          .Check(site.workers(g).command_size() > 0, "command",
                 "model.kind EXTERNAL is trained by worker programs: the "
                 "built-in worker (`meridian worker`) cannot train a model "
                 "it does not implement; give the group's program, e.g. "
                 "command: [\"python3\", \"train.py\"]");
    }
  }
}

// A built-in model is evaluated by its site server, which takes no
// evaluator process.
void ValidateBuiltInEvaluators(const pb::JobConfig& config,
                               const IssueReporter& root) {
  const std::string why =
      "a built-in model (" + pb::ModelKind_Name(config.model().kind()) +
      ") is evaluated by its site server itself, which takes no evaluator "
      "process; evaluator programs are for model.kind EXTERNAL";
  root.Check(config.evaluator().command().empty(), "evaluator", why);
  for (int s = 0; s < config.site_size(); ++s) {
    const pb::SiteConfig& site = config.site(s);
    root.Nested("site", s).Check(
        !HasServer(site) || site.evaluator().command().empty(), "evaluator",
        why);
  }
}

}  // namespace

void ValidatePrograms(const pb::JobConfig& config, const IssueReporter& root) {
  for (int s = 0; s < config.site_size(); ++s) {
    const pb::SiteConfig& site = config.site(s);
    const IssueReporter r = root.Nested("site", s);
    for (int g = 0; g < site.workers_size(); ++g) {
      ValidateCommand(site.workers(g).command(), r.Nested("workers", g));
    }
    if (!site.has_evaluator()) continue;
    ValidateCommand(site.evaluator().command(), r.Nested("evaluator"));
    r.Check(HasServer(site) || site.evaluator().command().empty(), "evaluator",
            "site '" + site.name() +
                "' has no server of its own (server_site '" +
                site.server_site() +
                "'): an evaluator evaluates its site server's model, so it "
                "belongs to the site that runs one ('" +
                site.server_site() + "')");
  }
  ValidateCommand(config.evaluator().command(), root.Nested("evaluator"));
  if (config.model().kind() != pb::EXTERNAL) {
    ValidateBuiltInEvaluators(config, root);
    return;
  }
  ValidateExternalModel(config, root);
  ValidateExternalTarget(config, root);
  ValidateWorkerPrograms(config, root);
}

}  // namespace meridian::config_internal
