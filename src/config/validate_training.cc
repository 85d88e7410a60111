// Validation of what and how the job trains: the model, the data and its
// partition across sites, the optimizer, the parameter server, and the
// policy.

#include <string>

#include "config/validate.h"

namespace meridian::config_internal {

namespace {

void ValidatePartition(const pb::PartitionConfig& partition, int num_sites,
                       const IssueReporter& r) {
  r.Specified("kind", partition.kind());
  r.Real("skew", partition.skew(), kUnitInterval);
  r.Real("alpha", partition.alpha(), kPositive);
  r.Check(!partition.has_alpha() || partition.kind() == pb::DIRICHLET, "alpha",
          "alpha is only used by kind: DIRICHLET");
  r.Check(!partition.has_min_samples() || partition.kind() == pb::DIRICHLET,
          "min_samples", "min_samples is only used by kind: DIRICHLET");
  if (partition.kind() == pb::CLASSES_PER_PART) {
    const uint32_t k = partition.classes_per_part();
    if (!kClassesPerPart.Contains(k)) {
      r.Report("classes_per_part",
               "kind CLASSES_PER_PART needs classes_per_part " +
                   kClassesPerPart.Describe() + " (classes per site), got " +
                   std::to_string(k));
    } else if (num_sites > 0) {  // no sites: reported at `site`
      r.Check(uint64_t{k} * num_sites >= kNumClasses, "classes_per_part",
              "classes_per_part " + std::to_string(k) + " over " +
                  std::to_string(num_sites) + " sites holds " +
                  std::to_string(uint64_t{k} * num_sites) +
                  " classes, fewer than the " + std::to_string(kNumClasses) +
                  ": every class needs a site (at least " +
                  std::to_string((kNumClasses + num_sites - 1) / num_sites) +
                  ")");
    }
  } else {
    r.Check(!partition.has_classes_per_part(), "classes_per_part",
            "classes_per_part is only used by kind: CLASSES_PER_PART");
  }
  if (partition.classes_size() == 0) return;  // LABEL_SUBSET: label % P
  r.Check(partition.kind() == pb::LABEL_SUBSET, "classes",
          "class lists are only used by kind: LABEL_SUBSET");
  r.Check(partition.classes_size() == num_sites, "classes",
          "must list one class list per site: expected " +
              std::to_string(num_sites) + ", got " +
              std::to_string(partition.classes_size()));
  for (int i = 0; i < partition.classes_size(); ++i) {
    const pb::ClassList& list = partition.classes(i);
    const IssueReporter c = r.Nested("classes", i);
    c.Check(list.label_size() > 0, "label",
            "each class list must name at least one class label");
    for (int j = 0; j < list.label_size(); ++j) {
      c.Count(Indexed("label", j), list.label(j), kClassLabel);
    }
  }
}

}  // namespace

void ValidateModel(const pb::ModelConfig& model, const IssueReporter& r) {
  r.Specified("kind", model.kind());
  if (model.kind() == pb::EXTERNAL) {
    // weights, metrics and loss_metric: ValidatePrograms.
    r.Check(model.hidden_size() == 0 && model.layers_size() == 0 &&
                !model.has_preset() && !model.has_input_channels() &&
                !model.has_rank() && !model.has_l2(),
            "kind",
            "EXTERNAL takes its tensors from model.weights; hidden, layers, "
            "preset, input_channels, rank and l2 are for the built-in kinds");
    return;
  }
  r.Check(!model.has_weights(), "weights",
          "is for kind EXTERNAL (a built-in model makes its initial "
          "weights from the job's seed)");
  r.Check(model.weights_command_size() == 0, "weights_command",
          "is for kind EXTERNAL (a built-in model makes its initial "
          "weights from the job's seed)");
  r.Check(model.metrics_size() == 0, "metrics",
          "are for kind EXTERNAL (a built-in model's metric is accuracy, "
          "or the test RMSE of MATRIX_FACTORIZATION)");
  r.Check(!model.has_loss_metric(), "loss_metric", "is for kind EXTERNAL");
  if (model.kind() == pb::MATRIX_FACTORIZATION) {
    r.Check(model.hidden_size() == 0 && model.layers_size() == 0 &&
                !model.has_preset() && !model.has_input_channels(),
            "kind",
            "MATRIX_FACTORIZATION takes rank and l2, not hidden, layers, "
            "preset or input_channels");
    r.Count("rank", model.rank(), kFactorRank);
    r.Real("l2", model.l2(), kNonNegative);
    return;
  }
  r.Check(!model.has_rank(), "rank", "is for kind MATRIX_FACTORIZATION");
  r.Check(!model.has_l2(), "l2", "is for kind MATRIX_FACTORIZATION");
  if (model.kind() == pb::CNN) {
    // The layers' own checks need the input's shape: MakeModel makes them
    // (`meridian validate` and every process build the model).
    r.Check(model.hidden_size() == 0, "hidden",
            "is for kind MLP; a CNN's layers are model.layers or "
            "model.preset");
    r.Check(!(model.has_preset() && model.layers_size() > 0), "preset",
            "and model.layers are exclusive: give one");
    r.Check(model.has_preset() || model.layers_size() > 0, "layers",
            "a CNN needs model.layers or a model.preset (e.g. preset: "
            "\"lenet5\")");
    r.Count("input_channels", model.input_channels(), kInputChannels);
    return;
  }
  r.Check(model.layers_size() == 0 && !model.has_preset() &&
              !model.has_input_channels(),
          "layers", "model.layers, preset and input_channels are for kind CNN");
  if (model.kind() == pb::SOFTMAX) {
    r.Check(model.hidden_size() == 0, "hidden",
            "must be empty for kind SOFTMAX (it has no hidden layers); use "
            "kind: MLP for hidden layers");
    return;
  }
  for (int i = 0; i < model.hidden_size(); ++i) {
    r.Count(Indexed("hidden", i), model.hidden(i), kHiddenUnits);
  }
}

void ValidateData(const pb::DataConfig& data, int num_sites,
                  const IssueReporter& r) {
  r.NonEmpty("dir", data.dir());
  r.NonEmpty("train_images", data.train_images());
  r.NonEmpty("train_labels", data.train_labels());
  r.NonEmpty("test_images", data.test_images());
  r.NonEmpty("test_labels", data.test_labels());
  r.Specified("normalization", data.normalization());
  ValidatePartition(data.site_partition(), num_sites,
                    r.Nested("site_partition"));
  if (!data.has_ratings()) return;
  const pb::RatingsConfig& ratings = data.ratings();
  const IssueReporter m = r.Nested("ratings");
  m.Count("users", ratings.users(), kMatrixRows);
  m.Count("items", ratings.items(), kMatrixRows);
  m.Count("rank", ratings.rank(), kFactorRank);
  m.Count("ratings", ratings.ratings(),
          CountRange{2, std::max<uint64_t>(2, uint64_t{ratings.users()} *
                                                  ratings.items() / 2)});
  m.Real("zipf_exponent", ratings.zipf_exponent(), kNonNegative);
  m.Real("user_zipf_exponent", ratings.user_zipf_exponent(), kNonNegative);
  m.Real("noise_stddev", ratings.noise_stddev(), kNonNegative);
  m.Real("test_fraction", ratings.test_fraction(), kOpenUnit);
  // Labels are ratings: a label-based partition would split by rating.
  const pb::PartitionKind kind = data.site_partition().kind();
  r.Check(kind == pb::IID || kind == pb::PARTITION_KIND_UNSPECIFIED,
          "site_partition",
          "a rating matrix is split IID (ratings at random) across sites; "
          "label-based partitions would split it by rating value");
}

void ValidateOptimizer(const pb::OptimizerConfig& optimizer,
                       const IssueReporter& r) {
  r.Real("learning_rate", optimizer.learning_rate(), kPositive);
  r.Real("momentum", optimizer.momentum(), kMomentum);
  r.Real("weight_decay", optimizer.weight_decay(), kNonNegative);
  r.Count("batch_size", optimizer.batch_size(), kBatchSize);
  r.Specified("schedule", optimizer.schedule());
  r.Count("step_size", optimizer.step_size(), kAtLeastOne);
  r.Real("gamma", optimizer.gamma(), kDecayFactor);
}

void ValidateServer(const pb::ServerConfig& server, const IssueReporter& r) {
  r.Specified("apply_rule", server.apply_rule());
  r.Real("momentum", server.momentum(), kMomentum);
  r.Real("learning_rate", server.learning_rate(), kPositive);
  r.Count("num_shards", server.num_shards(), kNumShards);
  r.Real("eval_period_s", server.eval_period_s(), kPositive);
  r.Real("join_timeout_s", server.join_timeout_s(), kPositive);
  // 0: the default (EndpointBounds::FromConfig).
  r.Nested("limits").Real("connection_stall_s",
                          server.limits().connection_stall_s(), kNonNegative);
  r.Nested("limits").Real("untrusted_messages_per_s",
                          server.limits().untrusted_messages_per_s(),
                          kNonNegative);
}

// Every field is checked whatever the kind, so that switching kinds never
// uncovers a bad value; the defaults are all valid.
void ValidatePolicy(const pb::PolicyConfig& policy, const IssueReporter& r) {
  r.Specified("kind", policy.kind());
  r.Count("local_steps", policy.local_steps(), kAtLeastOne);
  r.Count("tau", policy.tau(), kAtLeastOne);
  r.Count("tau0", policy.tau0(), kAtLeastOne);
  r.Real("check_period_s", policy.check_period_s(), kPositive);
  r.Real("min_commit_interval_s", policy.min_commit_interval_s(), kNonNegative);
  if (std::isfinite(policy.min_commit_interval_s()) &&
      std::isfinite(policy.check_period_s()) && policy.check_period_s() > 0) {
    r.Check(policy.min_commit_interval_s() <= policy.check_period_s(),
            "min_commit_interval_s",
            "must be at most check_period_s (" +
                FormatReal(policy.check_period_s()) + "), got " +
                FormatReal(policy.min_commit_interval_s()));
  }
  r.Real("max_commit_overhead_fraction", policy.max_commit_overhead_fraction(),
         kHalfOpenUnit);
  r.Count("initial_commits_per_period", policy.initial_commits_per_period(),
          kAtLeastOne);
  r.Count("min_commits_per_period", policy.min_commits_per_period(),
          kAtLeastOne);
  const uint32_t max_commits = policy.max_commits_per_period();
  if (max_commits != 0) {
    r.Check(max_commits >= policy.min_commits_per_period(),
            "max_commits_per_period",
            "must be 0 (no bound) or at least min_commits_per_period (" +
                std::to_string(policy.min_commits_per_period()) + "), got " +
                std::to_string(max_commits));
  }
  const bool initial_in_bounds =
      policy.initial_commits_per_period() >= policy.min_commits_per_period() &&
      (max_commits == 0 || policy.initial_commits_per_period() <= max_commits);
  const bool bounds_valid =
      max_commits == 0 || max_commits >= policy.min_commits_per_period();
  r.Check(initial_in_bounds || policy.initial_commits_per_period() == 0 ||
              !bounds_valid,
          "initial_commits_per_period",
          "must be within [min_commits_per_period, max_commits_per_period], "
          "got " +
              std::to_string(policy.initial_commits_per_period()));
  r.Real("search_period_s", policy.search_period_s(), kNonNegative);
  r.Real("loss_jump_ratio", policy.loss_jump_ratio(), kPositive);
  r.Count("search_samples_per_period", policy.search_samples_per_period(),
          kSamplesPerPeriod);
  r.Count("loss_eval_batches", policy.loss_eval_batches(), kAtLeastOne);
  r.Real("search_min_improvement", policy.search_min_improvement(),
         kImprovement);
  for (int i = 0; i < policy.momentum_grid_size(); ++i) {
    r.Real(Indexed("momentum_grid", i), policy.momentum_grid(i), kMomentum);
  }
}

}  // namespace meridian::config_internal
