// Validation of security {} and the sites' CURVE keys.

#include <map>
#include <string>

#include "config/validate.h"
#include "meridian/core/z85.h"

namespace meridian::config_internal {

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

}  // namespace meridian::config_internal
