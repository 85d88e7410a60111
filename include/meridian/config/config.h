// The job file: a text-format pb::JobConfig. Loading reports every problem
// with its line and column; the rest of the system only ever sees configs
// that passed validation.
#ifndef MERIDIAN_CONFIG_CONFIG_H_
#define MERIDIAN_CONFIG_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "meridian/job.pb.h"
#include "meridian/core/status.h"

namespace meridian {

// The most compute threads one worker may train on (workers.threads).
inline constexpr int kMaxWorkerThreads = 64;

// One problem in a job file. line and column are 1-based; 0 when the
// problem has no single place (e.g. a required field that is absent).
struct ConfigIssue {
  int line = 0;
  int column = 0;
  std::string field;    // dotted path, e.g. "site[1].workers[0].count"
  std::string message;  // what is wrong and what is allowed
};

// "<source>:<line>:<column>: <field>: <message>" (line/column omitted when
// 0), one issue per line.
std::string FormatConfigIssues(std::string_view source,
                               const std::vector<ConfigIssue>& issues);

// Parses `text` and validates the result. Returns the config when there is
// no issue; otherwise fills `issues` (when non-null) with every syntax and
// semantic problem found and returns InvalidArgument whose message is
// FormatConfigIssues(source, issues).
Result<pb::JobConfig> ParseJobConfig(
    std::string_view text, std::string_view source,
    std::vector<ConfigIssue>* issues = nullptr);

// Reads `path` and calls ParseJobConfig. A missing or unreadable file is
// NotFound / InvalidArgument naming the path. Paths in the file that are
// relative to the job file's directory come back absolute (model.weights),
// so every process that loads the file, and every file derived from the
// loaded config (`meridian run`'s job with ephemeral keys), reads the same
// file wherever it runs.
Result<pb::JobConfig> LoadJobConfig(const std::string& path,
                                    std::vector<ConfigIssue>* issues = nullptr);

// Semantic checks on an already-parsed config (no locations). Used by
// ParseJobConfig and by code that builds configs programmatically.
std::vector<ConfigIssue> ValidateJobConfig(const pb::JobConfig& config);

// Index of the site called `name` in config.site(), or NotFound listing the
// known names.
Result<int> FindSite(const pb::JobConfig& config, std::string_view name);

// Workers of a site (sum of its worker groups' counts).
uint32_t SiteWorkerCount(const pb::SiteConfig& site);
// Total workers over all sites.
uint32_t TotalWorkerCount(const pb::JobConfig& config);
// A worker of the job: its site (index into config.site()) and its index
// inside that site.
struct WorkerRef {
  int site = 0;
  uint32_t index = 0;
  friend bool operator==(const WorkerRef&, const WorkerRef&) = default;
};

// The job's target on its model's metric: target_metric when set (matrix
// factorisation's RMSE), else target_accuracy; 0: none.
double JobTarget(const pb::JobConfig& config);

// Whether the site runs a site server (server_site unset).
bool HasServer(const pb::SiteConfig& site);
// The site whose server the workers of `site_index` use: itself, or the site
// its server_site names. Precondition: a validated config.
int ServingSite(const pb::JobConfig& config, int site_index);
// The workers the server of `site_index` serves, in config order: its own
// and those of every site whose server_site names it. Empty when the site
// has no server.
std::vector<WorkerRef> ServedWorkers(const pb::JobConfig& config,
                                     int site_index);

// The group a worker index belongs to (workers are numbered group by group).
// Precondition: index < SiteWorkerCount(site).
const pb::WorkerGroup& WorkerGroupOf(const pb::SiteConfig& site,
                                     uint32_t index);

// Whether any worker group of the job sits behind an access link
// (workers.link).
bool HasWorkerLinks(const pb::JobConfig& config);

// What SkewScout (sync.skewscout) moves for a job's sync: the averaging
// period (clocks) under MODEL_AVERAGING and DILOCO; the density of a top-k
// selection when GAIA sends every change (threshold 0) through
// compression.selection TOP_K or TOP_K_SAMPLED (deep gradient
// compression's knob); else Gaia's threshold θ.
enum class SkewKnob { kTheta, kTopKDensity, kAveragingPeriod };
SkewKnob SkewKnobOf(const pb::SyncConfig& sync);
// "theta", "top_k_fraction" or "averaging_period", as report.json names
// the knob.
const char* SkewKnobName(SkewKnob knob);

}  // namespace meridian

#endif  // MERIDIAN_CONFIG_CONFIG_H_
