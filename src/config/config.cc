#include "meridian/config/config.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <system_error>
#include <utility>

#include "config/issue_reporter.h"
#include "config/validate.h"

namespace meridian {
namespace {

namespace gpb = google::protobuf;
using ParseInfoTree = gpb::TextFormat::ParseInfoTree;
using ParseLocation = gpb::TextFormat::ParseLocation;

using config_internal::IssueReporter;
using config_internal::kNonNegative;
using config_internal::kPositive;
using config_internal::kUnitInterval;

// ---------------------------------------------------------------------------
// Locations.

// Line `line` (0-based) of `text`, without its newline; empty past the end.
std::string_view LineOf(std::string_view text, int line) {
  size_t start = 0;
  for (int i = 0; i < line; ++i) {
    start = text.find('\n', start);
    if (start == std::string_view::npos) return {};
    ++start;
  }
  const size_t end = text.find('\n', start);
  return text.substr(start, end == std::string_view::npos ? end : end - start);
}

// The text between `marker` and the next '"' in `message`.
std::optional<std::string_view> QuotedAfter(std::string_view message,
                                            std::string_view marker) {
  const size_t at = message.find(marker);
  if (at == std::string_view::npos) return std::nullopt;
  const size_t start = at + marker.size();
  const size_t end = message.find('"', start);
  if (end == std::string_view::npos || end == start) return std::nullopt;
  return message.substr(start, end - start);
}

// Collects the parser's errors as issues (protobuf's positions are 0-based;
// a negative line means "no position").
class IssueCollector final : public gpb::io::ErrorCollector {
 public:
  IssueCollector(std::string_view text, std::vector<ConfigIssue>* issues)
      : text_(text), issues_(issues) {}

  void AddError(int line, gpb::io::ColumnNumber column,
                const std::string& message) override {
    ConfigIssue issue;
    if (line >= 0) {
      issue.line = line + 1;
      issue.column = column >= 0 ? PointAtName(line, column, message) + 1 : 0;
    }
    issue.message = message;
    issues_->push_back(std::move(issue));
  }

 private:
  // Protobuf reports an unknown field name or enum value at the token after
  // it. Moves the column back to the name when the name directly precedes
  // that token on the same line (and the line has no tabs, which protobuf
  // expands); otherwise keeps protobuf's column.
  int PointAtName(int line, int column, std::string_view message) const {
    std::optional<std::string_view> name =
        QuotedAfter(message, "has no field named \"");
    if (!name.has_value()) {
      name = QuotedAfter(message, "Unknown enumeration value of \"");
    }
    if (!name.has_value()) return column;
    const std::string_view text = LineOf(text_, line);
    if (text.find('\t') != std::string_view::npos ||
        static_cast<size_t>(column) > text.size()) {
      return column;
    }
    size_t end = static_cast<size_t>(column);
    while (end > 0 && text[end - 1] == ' ') --end;
    if (end < name->size() ||
        text.substr(end - name->size(), name->size()) != *name) {
      return column;
    }
    return static_cast<int>(end - name->size());
  }

  std::string_view text_;
  std::vector<ConfigIssue>* issues_;
};

// One step of a dotted field path: "workers[0]" or "count".
struct PathStep {
  std::string_view name;
  int index = -1;  // -1: no index given
};

std::optional<PathStep> ParsePathStep(std::string_view text) {
  PathStep step;
  const size_t bracket = text.find('[');
  step.name = text.substr(0, bracket);
  if (bracket == std::string_view::npos) return step;
  if (text.back() != ']') return std::nullopt;
  const char* first = text.data() + bracket + 1;
  const char* last = text.data() + text.size() - 1;
  const auto [end, error] = std::from_chars(first, last, step.index);
  if (error != std::errc() || end != last || step.index < 0) {
    return std::nullopt;
  }
  return step;
}

// Where the index-th value of `field` starts. A repeated field written as a
// list ("hidden: [1, 0]") has one location for the whole list, so a missing
// entry falls back to the nearest earlier one.
std::optional<ParseLocation> FindLocation(const ParseInfoTree& tree,
                                          const gpb::FieldDescriptor* field,
                                          int index) {
  if (!field->is_repeated()) {
    const ParseLocation location = tree.GetLocation(field, -1);
    if (location.line >= 0) return location;
    return std::nullopt;
  }
  for (int i = std::max(index, 0); i >= 0; --i) {
    const ParseLocation location = tree.GetLocation(field, i);
    if (location.line >= 0) return location;
  }
  return std::nullopt;
}

// Sets issue->line/column (1-based) to where the field at issue->field was
// written; to the closest enclosing message that was written when the field
// itself is absent; to 0 when none was.
void LocateIssue(const ParseInfoTree& root, ConfigIssue* issue) {
  const gpb::Descriptor* type = pb::JobConfig::descriptor();
  const ParseInfoTree* tree = &root;
  std::string_view rest = issue->field;
  while (tree != nullptr && type != nullptr && !rest.empty()) {
    const size_t dot = rest.find('.');
    const std::optional<PathStep> step = ParsePathStep(rest.substr(0, dot));
    rest = dot == std::string_view::npos ? "" : rest.substr(dot + 1);
    if (!step.has_value()) return;
    const gpb::FieldDescriptor* field =
        type->FindFieldByName(std::string(step->name));
    if (field == nullptr) return;
    const std::optional<ParseLocation> location =
        FindLocation(*tree, field, step->index);
    if (!location.has_value()) return;
    issue->line = location->line + 1;
    issue->column = location->column + 1;
    if (field->cpp_type() != gpb::FieldDescriptor::CPPTYPE_MESSAGE) return;
    tree = tree->GetTreeForNested(
        field, field->is_repeated() ? std::max(step->index, 0) : -1);
    type = field->message_type();
  }
}

// model.weights, when relative, is relative to the directory of the job
// file at `path` (itself relative to the working directory).
void ResolveJobRelativePaths(const std::string& path, pb::JobConfig* config) {
  const std::string& weights = config->model().weights();
  if (weights.empty() || std::filesystem::path(weights).is_absolute()) return;
  std::error_code error;
  const std::filesystem::path job = std::filesystem::absolute(path, error);
  if (error) return;  // no working directory: left as written
  config->mutable_model()->set_weights(
      (job.parent_path() / weights).lexically_normal().string());
}

}  // namespace

std::string FormatConfigIssues(std::string_view source,
                               const std::vector<ConfigIssue>& issues) {
  std::string out;
  for (const ConfigIssue& issue : issues) {
    if (!out.empty()) out += '\n';
    out += source;
    if (issue.line > 0) {
      out += ':';
      out += std::to_string(issue.line);
      if (issue.column > 0) {
        out += ':';
        out += std::to_string(issue.column);
      }
    }
    out += ": ";
    if (!issue.field.empty()) {
      out += issue.field;
      out += ": ";
    }
    out += issue.message;
  }
  return out;
}

std::vector<ConfigIssue> ValidateJobConfig(const pb::JobConfig& config) {
  std::vector<ConfigIssue> issues;
  const IssueReporter root(&issues);
  config_internal::ValidateSites(config, root);
  config_internal::ValidateModel(config.model(), root.Nested("model"));
  config_internal::ValidateData(config.data(), config.site_size(),
                                root.Nested("data"));
  config_internal::ValidateOptimizer(config.optimizer(),
                                     root.Nested("optimizer"));
  config_internal::ValidateServer(config.server(), root.Nested("server"));
  config_internal::ValidatePolicy(config.policy(), root.Nested("policy"));
  config_internal::ValidateWan(config, root.Nested("wan"), root);
  config_internal::ValidateSync(config, root.Nested("sync"));
  config_internal::ValidateSecurity(config, root);
  config_internal::ValidateFault(config.fault(), root.Nested("fault"));
  config_internal::ValidatePrograms(config, root);
  root.Real("target_accuracy", config.target_accuracy(), kUnitInterval);
  root.Real("target_metric", config.target_metric(), kNonNegative);
  const bool mf = config.model().kind() == pb::MATRIX_FACTORIZATION;
  // An EXTERNAL model's target is on its first metric (ValidatePrograms).
  const bool external = config.model().kind() == pb::EXTERNAL;
  root.Check(mf == config.data().has_ratings(), "data",
             mf ? "model.kind MATRIX_FACTORIZATION trains on a generated "
                  "rating matrix: give data { ratings { ... } }"
                : "data.ratings is the data of model.kind "
                  "MATRIX_FACTORIZATION, not of " +
                      pb::ModelKind_Name(config.model().kind()));
  root.Check(!mf || config.target_accuracy() == 0, "target_accuracy",
             "a MATRIX_FACTORIZATION job's target is its test RMSE: use "
             "target_metric");
  root.Check(mf || external ||
                 !(std::isfinite(config.target_metric()) &&
                   config.target_metric() > 0),
             "target_metric",
             "is for models whose metric is not accuracy "
             "(MATRIX_FACTORIZATION); a classifier's target is "
             "target_accuracy");
  root.Real("time_budget_s", config.time_budget_s(), kPositive);
  return issues;
}

Result<pb::JobConfig> ParseJobConfig(std::string_view text,
                                     std::string_view source,
                                     std::vector<ConfigIssue>* issues) {
  std::vector<ConfigIssue> found;
  pb::JobConfig config;
  if (text.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    found.push_back({0, 0, "", "the job file is too large"});
  } else {
    IssueCollector collector(text, &found);
    ParseInfoTree tree;
    gpb::TextFormat::Parser parser;
    parser.RecordErrorsTo(&collector);
    parser.WriteLocationsTo(&tree);
    gpb::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
    if (parser.Parse(&input, &config)) {
      // Semantic checks only on a complete parse: a partial one would add
      // issues that are mere consequences of the syntax error.
      found = ValidateJobConfig(config);
      for (ConfigIssue& issue : found) LocateIssue(tree, &issue);
    } else if (found.empty()) {
      found.push_back({0, 0, "", "the job file does not parse"});
    }
  }
  if (issues != nullptr) *issues = found;
  if (!found.empty()) {
    return InvalidArgumentError(FormatConfigIssues(source, found));
  }
  return config;
}

Result<pb::JobConfig> LoadJobConfig(const std::string& path,
                                    std::vector<ConfigIssue>* issues) {
  if (issues != nullptr) issues->clear();
  std::error_code error;
  const std::filesystem::file_status status =
      std::filesystem::status(path, error);
  if (status.type() == std::filesystem::file_type::not_found) {
    return NotFoundError("job file '" + path + "' does not exist");
  }
  if (error) {
    return InvalidArgumentError("cannot access job file '" + path +
                                "': " + error.message());
  }
  if (std::filesystem::is_directory(status)) {
    return InvalidArgumentError("job file '" + path +
                                "' is a directory, not a file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int saved_errno = errno;
    return InvalidArgumentError(
        "cannot open job file '" + path + "'" +
        (saved_errno != 0 ? ": " + std::generic_category().message(saved_errno)
                          : std::string()));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return InvalidArgumentError("error while reading job file '" + path + "'");
  }
  MERIDIAN_ASSIGN_OR_RETURN(pb::JobConfig config,
                            ParseJobConfig(text.str(), path, issues));
  ResolveJobRelativePaths(path, &config);
  return config;
}

Result<int> FindSite(const pb::JobConfig& config, std::string_view name) {
  std::string known;
  for (int i = 0; i < config.site_size(); ++i) {
    if (config.site(i).name() == name) return i;
    if (!known.empty()) known += ", ";
    known += config.site(i).name();
  }
  return NotFoundError("no site named '" + std::string(name) +
                       "' in the job (sites: " + known + ")");
}

uint32_t SiteWorkerCount(const pb::SiteConfig& site) {
  uint32_t count = 0;
  for (const pb::WorkerGroup& group : site.workers()) count += group.count();
  return count;
}

uint32_t TotalWorkerCount(const pb::JobConfig& config) {
  uint32_t count = 0;
  for (const pb::SiteConfig& site : config.site()) {
    count += SiteWorkerCount(site);
  }
  return count;
}

double JobTarget(const pb::JobConfig& config) {
  return config.target_metric() > 0 ? config.target_metric()
                                    : config.target_accuracy();
}

bool HasServer(const pb::SiteConfig& site) {
  return site.server_site().empty();
}

bool HasWorkerLinks(const pb::JobConfig& config) {
  for (const pb::SiteConfig& site : config.site()) {
    for (const pb::WorkerGroup& group : site.workers()) {
      if (group.has_link()) return true;
    }
  }
  return false;
}

int ServingSite(const pb::JobConfig& config, int site_index) {
  const pb::SiteConfig& site = config.site(site_index);
  if (HasServer(site)) return site_index;
  Result<int> target = FindSite(config, site.server_site());
  return target.ok() ? *target : site_index;
}

std::vector<WorkerRef> ServedWorkers(const pb::JobConfig& config,
                                     int site_index) {
  std::vector<WorkerRef> served;
  if (!HasServer(config.site(site_index))) return served;
  for (int s = 0; s < config.site_size(); ++s) {
    if (ServingSite(config, s) != site_index) continue;
    const uint32_t count = SiteWorkerCount(config.site(s));
    for (uint32_t w = 0; w < count; ++w) served.push_back(WorkerRef{s, w});
  }
  return served;
}

const pb::WorkerGroup& WorkerGroupOf(const pb::SiteConfig& site,
                                     uint32_t index) {
  for (const pb::WorkerGroup& group : site.workers()) {
    if (index < group.count()) return group;
    index -= group.count();
  }
  return site.workers(site.workers_size() - 1);  // precondition violated
}

SkewKnob SkewKnobOf(const pb::SyncConfig& sync) {
  if (sync.kind() == pb::MODEL_AVERAGING || sync.kind() == pb::DILOCO) {
    return SkewKnob::kAveragingPeriod;
  }
  const pb::SelectionKind selection = sync.compression().selection();
  const bool top_k = selection == pb::TOP_K || selection == pb::TOP_K_SAMPLED;
  return sync.kind() == pb::GAIA && sync.threshold() == 0 && top_k
             ? SkewKnob::kTopKDensity
             : SkewKnob::kTheta;
}

const char* SkewKnobName(SkewKnob knob) {
  switch (knob) {
    case SkewKnob::kTopKDensity:
      return "top_k_fraction";
    case SkewKnob::kAveragingPeriod:
      return "averaging_period";
    case SkewKnob::kTheta:
    default:
      return "theta";
  }
}

}  // namespace meridian
