#include "meridian/config/config.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/generated_enum_reflection.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <system_error>
#include <tuple>
#include <utility>

#include "meridian/metrics/metrics.h"
#include "meridian/wan/presets.h"
#include "meridian/wan/units.h"
#include "meridian/core/z85.h"

namespace meridian {
namespace {

namespace gpb = google::protobuf;
using ParseInfoTree = gpb::TextFormat::ParseInfoTree;
using ParseLocation = gpb::TextFormat::ParseLocation;

// Fashion-MNIST has ten classes, labelled 0..9.
constexpr uint32_t kNumClasses = 10;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr uint64_t kUnbounded = std::numeric_limits<uint64_t>::max();

std::string FormatReal(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", value);
  return buffer;
}

// The allowed values of a real field: an interval, unbounded above when `hi`
// is +inf. NaN and +-Inf are never allowed.
struct RealRange {
  double lo;
  bool lo_open;
  double hi;
  bool hi_open;

  bool Contains(double value) const {
    if (!std::isfinite(value)) return false;
    if (lo_open ? value <= lo : value < lo) return false;
    if (hi_open ? value >= hi : value > hi) return false;
    return true;
  }
  // "> 0", ">= 0", "in [0, 1)".
  std::string Describe() const {
    if (std::isinf(hi)) return (lo_open ? "> " : ">= ") + FormatReal(lo);
    return std::string("in ") + (lo_open ? "(" : "[") + FormatReal(lo) + ", " +
           FormatReal(hi) + (hi_open ? ")" : "]");
  }
};

// The allowed values of an integer field: [lo, hi], unbounded above when
// `hi` is kUnbounded.
struct CountRange {
  uint64_t lo;
  uint64_t hi;

  bool Contains(uint64_t value) const { return value >= lo && value <= hi; }
  std::string Describe() const {
    if (hi == kUnbounded) return ">= " + std::to_string(lo);
    return "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  }
};

constexpr RealRange kPositive{0, true, kInf, true};      // > 0
constexpr RealRange kNonNegative{0, false, kInf, true};  // >= 0
constexpr RealRange kUnitInterval{0, false, 1, false};   // [0, 1]
constexpr RealRange kDecayFactor{0, true, 1, false};     // (0, 1]
constexpr RealRange kFraction{0, true, 1, false};        // (0, 1]
constexpr RealRange kOpenUnit{0, true, 1, true};         // (0, 1)
constexpr RealRange kHalfOpenUnit{0, false, 1, true};    // [0, 1)
constexpr RealRange kMomentum = kHalfOpenUnit;
constexpr RealRange kAboveOne{1, true, kInf, true};  // > 1

constexpr CountRange kAtLeastOne{1, kUnbounded};
constexpr CountRange kWorkersPerGroup{1, 1024};
constexpr CountRange kHiddenUnits{1, 65536};
constexpr CountRange kInputChannels{1, 4096};
constexpr CountRange kBatchSize{1, 65536};
constexpr CountRange kNumShards{1, 256};
constexpr CountRange kBlockSize{1, 1 << 20};
constexpr CountRange kClassLabel{0, kNumClasses - 1};
constexpr CountRange kClassesPerPart{1, kNumClasses};
constexpr CountRange kFactorRank{1, 1024};
constexpr CountRange kMatrixRows{1, 1 << 24};  // exact as floats
// A fit of l(t) = 1/(a^2 t + b) + c has 3 parameters.
constexpr CountRange kSamplesPerPeriod{3, 1000};
constexpr RealRange kImprovement{0, false, 1, true};  // [0, 1)

constexpr std::string_view kEndpointSchemes[] = {"tcp://", "ipc://",
                                                 "inproc://"};

std::string Indexed(std::string_view field, int index) {
  return std::string(field) + "[" + std::to_string(index) + "]";
}

// Records issues under a dotted field-path prefix ("site[1].workers[0]").
// Copies share the issue list; Nested() returns a reporter one level deeper.
class IssueReporter {
 public:
  explicit IssueReporter(std::vector<ConfigIssue>* issues,
                         std::string prefix = "")
      : issues_(issues), prefix_(std::move(prefix)) {}

  IssueReporter Nested(std::string_view field) const {
    return IssueReporter(issues_, Path(field));
  }
  IssueReporter Nested(std::string_view field, int index) const {
    return IssueReporter(issues_, Path(Indexed(field, index)));
  }

  void Report(std::string_view field, std::string message) const {
    ConfigIssue issue;
    issue.field = Path(field);
    issue.message = std::move(message);
    issues_->push_back(std::move(issue));
  }

  void Check(bool ok, std::string_view field, std::string message) const {
    if (!ok) Report(field, std::move(message));
  }

  void Real(std::string_view field, double value,
            const RealRange& range) const {
    if (range.Contains(value)) return;
    Report(field, std::string("must be ") +
                      (std::isfinite(value) ? "" : "finite and ") +
                      range.Describe() + ", got " + FormatReal(value));
  }

  void Count(std::string_view field, uint64_t value,
             const CountRange& range) const {
    Check(range.Contains(value), field,
          "must be " + range.Describe() + ", got " + std::to_string(value));
  }

  void NonEmpty(std::string_view field, const std::string& value) const {
    Check(!value.empty(), field, "must be non-empty");
  }

  // The value must be a declared enumerator other than the UNSPECIFIED (0)
  // one.
  template <typename Enum>
  void Specified(std::string_view field, Enum value) const {
    const gpb::EnumDescriptor* type = gpb::GetEnumDescriptor<Enum>();
    const gpb::EnumValueDescriptor* named = type->FindValueByNumber(value);
    if (named != nullptr && named->number() != 0) return;
    std::string allowed;
    for (int i = 0; i < type->value_count(); ++i) {
      if (type->value(i)->number() == 0) continue;
      if (!allowed.empty()) allowed += ", ";
      allowed += type->value(i)->name();
    }
    Report(field,
           "must be one of " + allowed + ", got " +
               (named != nullptr ? named->name() : std::to_string(value)));
  }

 private:
  std::string Path(std::string_view field) const {
    if (prefix_.empty()) return std::string(field);
    return prefix_ + "." + std::string(field);
  }

  std::vector<ConfigIssue>* issues_;
  std::string prefix_;
};

// Site names become parts of file names (logs, reports).
bool IsFileNameSafe(std::string_view name) {
  if (name.empty() || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
  });
}

bool IsEndpoint(std::string_view address) {
  return std::any_of(std::begin(kEndpointSchemes), std::end(kEndpointSchemes),
                     [&](std::string_view scheme) {
                       return address.size() > scheme.size() &&
                              address.substr(0, scheme.size()) == scheme;
                     });
}

void ValidateSiteName(const std::string& name, int index,
                      std::map<std::string, int>* first_use,
                      const IssueReporter& r) {
  if (name.empty()) {
    r.Report("name", "must be non-empty (every site needs a unique name)");
    return;
  }
  if (!IsFileNameSafe(name)) {
    r.Report("name",
             "must contain only letters, digits, '_', '.' and '-' and not be "
             "'.' or '..' (it is used in file names), got '" +
                 name + "'");
    return;
  }
  const auto [it, inserted] = first_use->emplace(name, index);
  r.Check(inserted, "name",
          "duplicate site name '" + name + "' (also used by site[" +
              std::to_string(it->second) + "]); site names must be unique");
}

// server_site names another site that runs its own server (no chains).
void ValidateServerSites(const pb::JobConfig& config,
                         const IssueReporter& root) {
  for (int i = 0; i < config.site_size(); ++i) {
    const pb::SiteConfig& site = config.site(i);
    if (site.server_site().empty()) continue;
    const IssueReporter r = root.Nested("site", i);
    Result<int> target = FindSite(config, site.server_site());
    if (!target.ok()) {
      r.Report("server_site", target.status().message());
    } else if (*target == i) {
      r.Report("server_site",
               "names the site itself; leave it empty for a site with its "
               "own server");
    } else {
      r.Check(config.site(*target).server_site().empty(), "server_site",
              "site '" + site.server_site() +
                  "' has no server of its own (its server_site is '" +
                  config.site(*target).server_site() +
                  "'); name a site that runs one");
    }
  }
}

void ReportAtPath(const Status& status, const IssueReporter& root);

// A worker group's access link: a known preset, unit strings that parse,
// and a place `meridian run` can emulate it (the worker's own site server,
// not another site's across the WAN; no standalone wanem).
void ValidateWorkerLink(const pb::JobConfig& config, const pb::SiteConfig& site,
                        const pb::WorkerLinkConfig& link,
                        const IssueReporter& group) {
  const IssueReporter r = group.Nested("link");
  if (!link.preset().empty() && !wan::FindAccessLinkPreset(link.preset())) {
    r.Report("preset", "unknown access network '" + link.preset() +
                           "'; the presets are " +
                           wan::AccessLinkPresetNames());
  }
  for (const auto& [name, has, direction] :
       {std::tuple<const char*, bool, const pb::LinkDirectionConfig*>{
            "both", link.has_both(), &link.both()},
        {"up", link.has_up(), &link.up()},
        {"down", link.has_down(), &link.down()}}) {
    if (!has) continue;
    wan::DirectionModel model = wan::DefaultDirectionModel();
    if (Status status = wan::ApplyDirectionConfig(*direction, "", &model);
        !status.ok()) {
      ReportAtPath(status, r.Nested(name));
    }
  }
  group.Check(HasServer(site), "link",
              "workers of a site without a server of its own (server_site '" +
                  site.server_site() +
                  "') reach it over the WAN link already; an access link is "
                  "for workers of the site's own server");
  group.Check(config.wan().wanem_host().empty(), "link",
              "access links are emulated by `meridian run`; with "
              "wan.wanem_host (standalone roles) shape the workers' network "
              "yourself");
}

void ValidateSites(const pb::JobConfig& config, const IssueReporter& root) {
  root.Check(config.site_size() > 0, "site",
             "at least one site is required, e.g. site { name: \"a\" "
             "workers { count: 2 } }");
  std::map<std::string, int> first_use;
  for (int i = 0; i < config.site_size(); ++i) {
    const pb::SiteConfig& site = config.site(i);
    const IssueReporter r = root.Nested("site", i);
    ValidateSiteName(site.name(), i, &first_use, r);
    if (site.has_region() && !wan::IsKnownRegion(site.region())) {
      std::string known;
      for (const std::string& region : wan::KnownRegions()) {
        known += (known.empty() ? "" : ", ") + region;
      }
      r.Report("region", "unknown region '" + site.region() +
                             "'; the presets know " + known);
    }
    r.Check(IsEndpoint(site.address()), "address",
            "must be a ZeroMQ endpoint starting with tcp://, ipc:// or "
            "inproc://, got '" +
                site.address() + "'");
    r.Check(IsEndpoint(site.mirror_address()), "mirror_address",
            "must be a ZeroMQ endpoint starting with tcp://, ipc:// or "
            "inproc://, got '" +
                site.mirror_address() + "'");
    if (!site.metrics_address().empty()) {
      const Result<MetricsAddress> metrics =
          ParseMetricsAddress(site.metrics_address());
      if (!metrics.ok()) {
        r.Report("metrics_address", metrics.status().message());
      }
    }
    // With every group's count >= 1 this also guarantees >= 1 worker.
    r.Check(site.workers_size() > 0, "workers",
            "a site needs at least one worker group, e.g. workers { count: "
            "2 }");
    for (int g = 0; g < site.workers_size(); ++g) {
      const IssueReporter w = r.Nested("workers", g);
      w.Count("count", site.workers(g).count(), kWorkersPerGroup);
      w.Real("step_time_s", site.workers(g).step_time_s(), kNonNegative);
      w.Count("threads", site.workers(g).threads(),
              CountRange{1, kMaxWorkerThreads});
      if (site.workers(g).has_link()) {
        ValidateWorkerLink(config, site, site.workers(g).link(), w);
      }
      w.Check(site.workers(g).threads() <= 1 ||
                  config.model().kind() != pb::MATRIX_FACTORIZATION,
              "threads",
              "matrix factorisation trains on one thread per worker (its "
              "steps touch a few rows each); leave threads at 1");
    }
  }
  ValidateServerSites(config, root);
}

void ValidateModel(const pb::ModelConfig& model, const IssueReporter& r) {
  r.Specified("kind", model.kind());
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
}

void ValidateFault(const pb::FaultConfig& fault, const IssueReporter& r) {
  r.Real("heartbeat_interval_s", fault.heartbeat_interval_s(), kPositive);
  r.Real("worker_timeout_s", fault.worker_timeout_s(), kPositive);
  r.Real("server_timeout_s", fault.server_timeout_s(), kPositive);
  r.Real("worker_give_up_s", fault.worker_give_up_s(), kNonNegative);
  r.Real("peer_timeout_s", fault.peer_timeout_s(), kPositive);
  r.Specified("partition_policy", fault.partition_policy());
  r.Real("checkpoint_period_s", fault.checkpoint_period_s(), kNonNegative);
  r.Real("restart_backoff_s", fault.restart_backoff_s(), kNonNegative);
  // A peer is declared silent only after several heartbeats it missed.
  for (const auto& [field, timeout] :
       {std::pair<std::string_view, double>{"worker_timeout_s",
                                            fault.worker_timeout_s()},
        {"server_timeout_s", fault.server_timeout_s()},
        {"peer_timeout_s", fault.peer_timeout_s()}}) {
    if (std::isfinite(timeout) && std::isfinite(fault.heartbeat_interval_s()) &&
        timeout < 2 * fault.heartbeat_interval_s()) {
      r.Report(field, "must be at least twice heartbeat_interval_s (" +
                          FormatReal(fault.heartbeat_interval_s()) + "), got " +
                          FormatReal(timeout) +
                          ": one late heartbeat would declare a live "
                          "process dead");
    }
  }
  if (fault.has_retention_limit()) {
    Result<uint64_t> limit = wan::ParseByteSize(fault.retention_limit());
    if (!limit.ok()) {
      r.Report("retention_limit", limit.status().message());
    } else if (*limit < (uint64_t{64} << 10)) {
      r.Report("retention_limit",
               "must be at least 64kb, got '" + fault.retention_limit() + "'");
    }
  }
}

// Reports an error of the form "field.path: message" at that field.
void ReportAtPath(const Status& status, const IssueReporter& root) {
  const std::string& text = status.message();
  const size_t colon = text.find(": ");
  if (colon == std::string::npos || text.find(' ') < colon) {
    root.Report("", text);
  } else {
    root.Report(text.substr(0, colon), text.substr(colon + 2));
  }
}

void ValidateWan(const pb::JobConfig& config, const IssueReporter& r,
                 const IssueReporter& root) {
  const pb::WanConfig& wan = config.wan();
  r.Real("sample_period_s", wan.sample_period_s(), kPositive);
  r.Check(IsEndpoint(wan.control_address()), "control_address",
          "must be a ZeroMQ endpoint starting with tcp://, ipc:// or "
          "inproc://, got '" +
              wan.control_address() + "'");
  if (!wan.metrics_address().empty()) {
    const Result<MetricsAddress> metrics =
        ParseMetricsAddress(wan.metrics_address());
    if (!metrics.ok()) {
      r.Report("metrics_address", metrics.status().message());
    }
  }
  if (!wan.wanem_host().empty()) {
    r.Check(wan.wanem_host().find_first_of(":/ ") == std::string::npos,
            "wanem_host",
            "must be a host name or IPv4 address (no scheme, no port), got '" +
                wan.wanem_host() + "'");
    // Two ports per ordered pair of sites (sync and worker routes).
    const uint64_t sites = static_cast<uint64_t>(config.site_size());
    const uint64_t last = uint64_t{wan.route_base_port()} + 2 * sites * sites;
    r.Check(wan.route_base_port() > 0 && last <= 65536, "route_base_port",
            "routes need ports " + std::to_string(wan.route_base_port()) +
                ".." + std::to_string(last - 1) +
                " (2 x sites^2 of them), which must lie in 1..65535");
    for (int i = 0; i < config.site_size(); ++i) {
      const pb::SiteConfig& site = config.site(i);
      const IssueReporter s = root.Nested("site", i);
      for (const auto& [field, value] :
           {std::pair<const char*, const std::string&>{"address",
                                                       site.address()},
            {"mirror_address", site.mirror_address()}}) {
        s.Check(value.rfind("tcp://", 0) == 0, field,
                "must be a tcp:// endpoint when wan.wanem_host routes the "
                "sites through a standalone wanem, got '" +
                    value + "'");
      }
    }
  }
  std::map<std::pair<int, int>, int> first_use;
  for (int i = 0; i < wan.link_size(); ++i) {
    const pb::LinkConfig& link = wan.link(i);
    const IssueReporter l = r.Nested("link", i);
    Result<int> a = FindSite(config, link.a());
    Result<int> b = FindSite(config, link.b());
    if (!a.ok()) l.Report("a", a.status().message());
    if (!b.ok()) l.Report("b", b.status().message());
    if (!a.ok() || !b.ok()) continue;
    if (*a == *b) {
      l.Report("b", "a link joins two different sites; both ends are '" +
                        link.a() + "'");
      continue;
    }
    const auto [it, inserted] = first_use.emplace(std::minmax(*a, *b), i);
    l.Check(inserted, "b",
            "the link " + link.a() + "-" + link.b() +
                " is already configured by wan.link[" +
                std::to_string(it->second) + "]");
  }
  // Unit strings: each direction config applied to a default model.
  auto check_direction = [&](const pb::LinkDirectionConfig& direction,
                             const std::string& path) {
    wan::DirectionModel model = wan::DefaultDirectionModel();
    if (Status status = wan::ApplyDirectionConfig(direction, path, &model);
        !status.ok()) {
      ReportAtPath(status, root);
    }
  };
  if (wan.has_default_link()) {
    check_direction(wan.default_link(), "wan.default_link");
  }
  for (int i = 0; i < wan.link_size(); ++i) {
    const std::string path = "wan." + Indexed("link", i);
    if (wan.link(i).has_both()) {
      check_direction(wan.link(i).both(), path + ".both");
    }
    if (wan.link(i).has_a_to_b()) {
      check_direction(wan.link(i).a_to_b(), path + ".a_to_b");
    }
    if (wan.link(i).has_b_to_a()) {
      check_direction(wan.link(i).b_to_a(), path + ".b_to_a");
    }
  }
}

void ValidateCompression(const pb::CompressionConfig& compression,
                         const IssueReporter& r) {
  r.Specified("selection", compression.selection());
  r.Real("top_k_fraction", compression.top_k_fraction(), kFraction);
  r.Specified("index_coding", compression.index_coding());
  r.Specified("value_coding", compression.value_coding());
  r.Count("block_size", compression.block_size(), kBlockSize);
  r.Specified("rounding", compression.rounding());
  r.Check(compression.zstd_level() >= 0 && compression.zstd_level() <= 22,
          "zstd_level",
          "must be in [0, 22] (0: no zstd stage), got " +
              std::to_string(compression.zstd_level()));
}

// A site name used by the sync topology: it must name a site with a server.
void CheckTopologySite(const pb::JobConfig& config, const std::string& name,
                       std::string_view field, const IssueReporter& r) {
  Result<int> site = FindSite(config, name);
  if (!site.ok()) {
    r.Report(field, site.status().message());
  } else {
    r.Check(HasServer(config.site(*site)), field,
            "site '" + name +
                "' runs no site server (server_site is set), so it takes no "
                "part in the sync");
  }
}

// SkewScout's options (skew_control.h states the same ranges); it moves
// Gaia's threshold, a top-k density or the averaging period (SkewKnobOf),
// which must start inside its bounds.
void ValidateSkewScout(const pb::SyncConfig& sync, const IssueReporter& r) {
  const pb::SkewScoutConfig& scout = sync.skewscout();
  constexpr CountRange kHoldout{1, 100000};
  r.Count("travel_period", scout.travel_period(), kAtLeastOne);
  r.Count("holdout_samples", scout.holdout_samples(), kHoldout);
  r.Real("target_loss", scout.target_loss(), kOpenUnit);
  r.Real("dead_band", scout.dead_band(), kHalfOpenUnit);
  r.Real("smoothing", scout.smoothing(), kFraction);
  r.Real("tighten_factor", scout.tighten_factor(), kAboveOne);
  r.Real("loosen_factor", scout.loosen_factor(), kAboveOne);
  r.Count("patience", scout.patience(), kAtLeastOne);
  r.Real("min_theta", scout.min_theta(), kPositive);
  r.Real("max_theta", scout.max_theta(), kPositive);
  r.Real("significance_z", scout.significance_z(), kNonNegative);
  r.Specified("travel_value_coding", scout.travel_value_coding());
  if (scout.max_travel_period() != 0) {
    r.Check(scout.max_travel_period() >= scout.travel_period(),
            "max_travel_period",
            "must be 0 (8 x travel_period) or at least travel_period (" +
                std::to_string(scout.travel_period()) + "), got " +
                std::to_string(scout.max_travel_period()));
  }
  if (std::isfinite(scout.min_theta()) && std::isfinite(scout.max_theta())) {
    r.Check(scout.min_theta() <= scout.max_theta(), "max_theta",
            "must be at least min_theta (" + FormatReal(scout.min_theta()) +
                "), got " + FormatReal(scout.max_theta()));
  }
  r.Real("min_density", scout.min_density(), kFraction);
  r.Real("max_density", scout.max_density(), kFraction);
  if (std::isfinite(scout.min_density()) &&
      std::isfinite(scout.max_density())) {
    r.Check(scout.min_density() <= scout.max_density(), "max_density",
            "must be at least min_density (" + FormatReal(scout.min_density()) +
                "), got " + FormatReal(scout.max_density()));
  }
  r.Count("min_averaging_period", scout.min_averaging_period(), kAtLeastOne);
  r.Count("max_averaging_period", scout.max_averaging_period(), kAtLeastOne);
  r.Check(scout.min_averaging_period() <= scout.max_averaging_period(),
          "max_averaging_period",
          "must be at least min_averaging_period (" +
              std::to_string(scout.min_averaging_period()) + "), got " +
              std::to_string(scout.max_averaging_period()));
  if (!scout.enabled()) return;
  r.Check(sync.kind() == pb::GAIA || sync.kind() == pb::MODEL_AVERAGING ||
              sync.kind() == pb::DILOCO,
          "enabled",
          "SkewScout moves Gaia's threshold, a top-k density or the "
          "averaging period: it needs sync.kind GAIA, MODEL_AVERAGING or "
          "DILOCO, got " +
              pb::SyncKind_Name(sync.kind()));
  if (SkewKnobOf(sync) == SkewKnob::kAveragingPeriod) {
    r.Check(sync.kind() != pb::DILOCO || sync.diloco().fragments() <= 1,
            "enabled",
            "moves the averaging period, which the staggered rounds of "
            "sync.diloco.fragments > 1 cannot follow: use one fragment");
    r.Check(sync.averaging_period() >= scout.min_averaging_period() &&
                sync.averaging_period() <= scout.max_averaging_period(),
            "enabled",
            "the controller starts at sync.averaging_period (" +
                std::to_string(sync.averaging_period()) +
                "), which must lie in [" +
                std::to_string(scout.min_averaging_period()) + ", " +
                std::to_string(scout.max_averaging_period()) +
                "] (min_averaging_period, max_averaging_period)");
    return;
  }
  const bool density = SkewKnobOf(sync) == SkewKnob::kTopKDensity;
  const double knob =
      density ? sync.compression().top_k_fraction() : sync.threshold();
  const double low = density ? scout.min_density() : scout.min_theta();
  const double high = density ? scout.max_density() : scout.max_theta();
  if (std::isfinite(knob) && std::isfinite(low) && std::isfinite(high)) {
    r.Check(
        knob >= low && knob <= high, "enabled",
        std::string("the controller starts at ") +
            (density ? "sync.compression.top_k_fraction" : "sync.threshold") +
            " (" + FormatReal(knob) + "), which must lie in [" +
            FormatReal(low) + ", " + FormatReal(high) + "] (" +
            (density ? "min_density, max_density" : "min_theta, max_theta") +
            ")");
  }
}

void ValidateDiLoCo(const pb::SyncConfig& sync, const IssueReporter& r) {
  const pb::DiLoCoConfig& diloco = sync.diloco();
  r.Real("outer_lr", diloco.outer_lr(), kPositive);
  r.Real("outer_momentum", diloco.outer_momentum(), kMomentum);
  r.Count("fragments", diloco.fragments(), kAtLeastOne);
  if (diloco.fragments() > 0 && sync.averaging_period() > 0) {
    r.Check(sync.averaging_period() % diloco.fragments() == 0, "fragments",
            "must divide sync.averaging_period (" +
                std::to_string(sync.averaging_period()) +
                "): the fragments' rounds are staggered by period / "
                "fragments clocks, got " +
                std::to_string(diloco.fragments()));
  }
}

void ValidateSync(const pb::JobConfig& config, const IssueReporter& r) {
  const pb::SyncConfig& sync = config.sync();
  r.Specified("kind", sync.kind());
  r.Real("threshold", sync.threshold(), kNonNegative);
  r.Specified("threshold_mode", sync.threshold_mode());
  r.Specified("threshold_schedule", sync.threshold_schedule());
  r.Real("adaptive_step", sync.adaptive_step(), kPositive);
  r.Real("adaptive_max", sync.adaptive_max(), kNonNegative);
  if (sync.adaptive_threshold() && std::isfinite(sync.adaptive_max()) &&
      std::isfinite(sync.threshold())) {
    r.Check(sync.adaptive_max() >= sync.threshold(), "adaptive_max",
            "must be at least threshold (" + FormatReal(sync.threshold()) +
                "), got " + FormatReal(sync.adaptive_max()));
  }
  r.Real("selective_barrier_fraction", sync.selective_barrier_fraction(),
         kUnitInterval);
  r.Real("send_period_s", sync.send_period_s(), kNonNegative);
  r.Check(sync.send_period_s() == 0 || sync.kind() == pb::GAIA ||
              sync.kind() == pb::DENSE,
          "send_period_s",
          "applies to GAIA and DENSE only (MODEL_AVERAGING and DILOCO send "
          "in rounds)");
  if (sync.has_bandwidth_budget()) {
    Result<double> budget = wan::ParseBandwidth(sync.bandwidth_budget());
    if (!budget.ok()) {
      r.Report("bandwidth_budget", budget.status().message());
    } else {
      r.Check(*budget > 0, "bandwidth_budget",
              "must be a positive rate such as \"50mbit\"");
    }
  }
  r.Count("averaging_period", sync.averaging_period(), kAtLeastOne);
  ValidateDiLoCo(sync, r.Nested("diloco"));
  ValidateSkewScout(sync, r.Nested("skewscout"));
  ValidateCompression(sync.compression(), r.Nested("compression"));
  r.Specified("topology", sync.topology());
  if (sync.kind() == pb::DILOCO || sync.kind() == pb::MODEL_AVERAGING) {
    r.Check(sync.topology() == pb::FULL_MESH, "topology",
            "sync.kind " + pb::SyncKind_Name(sync.kind()) +
                " averages every site's outer gradient at every site: it "
                "needs FULL_MESH");
  }
  if (sync.topology() == pb::STAR) {
    CheckTopologySite(config, sync.hub(), "hub", r);
  }
  if (sync.topology() != pb::GROUPS) {
    r.Check(sync.group_size() == 0, "group",
            "groups are only used by topology: GROUPS");
    return;
  }
  r.Check(sync.group_size() > 0, "group",
          "topology GROUPS needs at least one group { hub: ... site: ... }");
  std::map<std::string, std::string> placed;  // site -> where it was placed
  auto place = [&](const std::string& site, const std::string& where,
                   std::string_view field, const IssueReporter& g) {
    const auto [it, inserted] = placed.emplace(site, where);
    g.Check(inserted, field,
            "site '" + site + "' is already in " + it->second +
                "; every site belongs to exactly one group");
  };
  for (int i = 0; i < sync.group_size(); ++i) {
    const pb::SiteGroup& group = sync.group(i);
    const IssueReporter g = r.Nested("group", i);
    const std::string where = Indexed("group", i);
    CheckTopologySite(config, group.hub(), "hub", g);
    place(group.hub(), where, "hub", g);
    for (int j = 0; j < group.site_size(); ++j) {
      CheckTopologySite(config, group.site(j), Indexed("site", j), g);
      place(group.site(j), where, Indexed("site", j), g);
    }
  }
  for (const pb::SiteConfig& site : config.site()) {
    if (HasServer(site) && !placed.contains(site.name())) {
      r.Report("group", "site '" + site.name() + "' is in no group");
    }
  }
}

// Public keys are well-formed and distinct. With CURVE on, the sites that
// sync either all list a key or none does: `meridian run` then generates
// ephemeral keys, and a site started alone refuses to run without keys.
// A worker_curve_public_key is Z85, on a site with a server that lists its
// own curve_public_key, with CURVE on, and distinct from every other key.
void ValidateSecurity(const pb::JobConfig& config, const IssueReporter& root) {
  std::map<std::string, std::string> first_use;  // key -> site name
  for (int i = 0; i < config.site_size(); ++i) {
    const pb::SiteConfig& site = config.site(i);
    if (!site.has_curve_public_key()) continue;
    const IssueReporter r = root.Nested("site", i);
    const std::string& key = site.curve_public_key();
    if (!IsZ85Key(key)) {
      r.Report("curve_public_key",
               "must be a CURVE public key: 40 characters of the Z85 "
               "alphabet, as `meridian keygen` prints it (got " +
                   std::to_string(key.size()) + " characters)");
      continue;
    }
    const auto [it, inserted] = first_use.emplace(key, site.name());
    r.Check(inserted, "curve_public_key",
            "duplicates the key of site '" + it->second +
                "'; every site needs its own key pair");
  }
  // A worker key turns CURVE on at the site's worker endpoint: it needs the
  // site's own key pair (the server side), CURVE on, and a key of its own.
  std::map<std::string, std::string> worker_use;  // key -> site name
  for (int i = 0; i < config.site_size(); ++i) {
    const pb::SiteConfig& site = config.site(i);
    if (!site.has_worker_curve_public_key()) continue;
    const IssueReporter r = root.Nested("site", i);
    const std::string& key = site.worker_curve_public_key();
    if (!IsZ85Key(key)) {
      r.Report("worker_curve_public_key",
               "must be a CURVE public key: 40 characters of the Z85 "
               "alphabet, as `meridian keygen --site " +
                   site.name() + " --out DIR/workers` prints it (got " +
                   std::to_string(key.size()) + " characters)");
      continue;
    }
    if (!HasServer(site)) {
      r.Report("worker_curve_public_key",
               "is set but site '" + site.name() +
                   "' runs no server (server_site '" + site.server_site() +
                   "'): set it on the serving site");
      continue;
    }
    if (!config.security().curve()) {
      r.Report("worker_curve_public_key",
               "needs security { curve: true }: with curve off the worker "
               "endpoint would stay plaintext");
      continue;
    }
    if (!site.has_curve_public_key()) {
      r.Report("worker_curve_public_key",
               "needs the site's curve_public_key: the worker endpoint is a "
               "CURVE server with the site's own key pair (`meridian keygen "
               "--site " +
                   site.name() + " --out DIR` prints the line)");
      continue;
    }
    if (const auto it = first_use.find(key); it != first_use.end()) {
      r.Report("worker_curve_public_key",
               "is the curve_public_key of site '" + it->second +
                   "'; the workers need a key pair of their own");
      continue;
    }
    const auto [it, inserted] = worker_use.emplace(key, site.name());
    r.Check(inserted, "worker_curve_public_key",
            "duplicates the worker key of site '" + it->second +
                "'; each site's workers need a key pair of their own");
  }
  if (!config.security().curve()) return;
  std::vector<int> syncing;
  for (int i = 0; i < config.site_size(); ++i) {
    if (HasServer(config.site(i))) syncing.push_back(i);
  }
  if (config.sync().kind() == pb::SYNC_NONE || syncing.size() < 2) return;
  std::string listed;
  for (int i : syncing) {
    if (config.site(i).has_curve_public_key()) {
      listed = config.site(i).name();
      break;
    }
  }
  if (listed.empty()) return;
  for (int i : syncing) {
    const pb::SiteConfig& site = config.site(i);
    root.Nested("site", i).Check(
        site.has_curve_public_key(), "curve_public_key",
        "is missing while site '" + listed +
            "' lists one: with security.curve on, every site that "
            "syncs needs its key (`meridian keygen --site " +
            site.name() +
            " --out DIR` prints the line), or set security { curve: "
            "false }");
  }
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
  ValidateSites(config, root);
  ValidateModel(config.model(), root.Nested("model"));
  ValidateData(config.data(), config.site_size(), root.Nested("data"));
  ValidateOptimizer(config.optimizer(), root.Nested("optimizer"));
  ValidateServer(config.server(), root.Nested("server"));
  ValidatePolicy(config.policy(), root.Nested("policy"));
  ValidateWan(config, root.Nested("wan"), root);
  ValidateSync(config, root.Nested("sync"));
  ValidateSecurity(config, root);
  ValidateFault(config.fault(), root.Nested("fault"));
  root.Real("target_accuracy", config.target_accuracy(), kUnitInterval);
  root.Real("target_metric", config.target_metric(), kNonNegative);
  const bool mf = config.model().kind() == pb::MATRIX_FACTORIZATION;
  root.Check(mf == config.data().has_ratings(), "data",
             mf ? "model.kind MATRIX_FACTORIZATION trains on a generated "
                  "rating matrix: give data { ratings { ... } }"
                : "data.ratings is the data of model.kind "
                  "MATRIX_FACTORIZATION, not of " +
                      pb::ModelKind_Name(config.model().kind()));
  root.Check(!mf || config.target_accuracy() == 0, "target_accuracy",
             "a MATRIX_FACTORIZATION job's target is its test RMSE: use "
             "target_metric");
  root.Check(mf || !(std::isfinite(config.target_metric()) &&
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
  return ParseJobConfig(text.str(), path, issues);
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
