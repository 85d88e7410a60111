// Validation of the job's sites: names, addresses, worker groups and
// their access links, and which site serves which workers.

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "config/validate.h"
#include "meridian/wan/presets.h"
#include "meridian/wan/units.h"

namespace meridian::config_internal {

namespace {

// Site names become parts of file names (logs, reports).
bool IsFileNameSafe(std::string_view name) {
  if (name.empty() || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
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

}  // namespace

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
    r.Endpoint("address", site.address());
    r.Endpoint("mirror_address", site.mirror_address());
    r.MetricsAddress("metrics_address", site.metrics_address());
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

}  // namespace meridian::config_internal
