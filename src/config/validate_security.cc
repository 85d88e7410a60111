// Validation of security {} and the sites' CURVE keys.

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "config/validate.h"
#include "meridian/core/z85.h"

namespace meridian::config_internal {

namespace {

using KeyOwners = std::map<std::string, std::string>;  // key -> site name

// Whether `key` is a CURVE public key; when not, says so at `field`.
// `keygen`: the command that prints one.
bool CheckCurveKey(const IssueReporter& r, std::string_view field,
                   const std::string& key, const std::string& keygen) {
  const bool z85 = IsZ85Key(key);
  r.Check(z85, field,
          "must be a CURVE public key: 40 characters of the Z85 alphabet, "
          "as `" +
              keygen + "` prints it (got " + std::to_string(key.size()) +
              " characters)");
  return z85;
}

// The sites' public keys are well-formed and distinct; returns whose each
// well-formed key is.
KeyOwners ValidateSiteKeys(const pb::JobConfig& config,
                           const IssueReporter& root) {
  KeyOwners first_use;
  for (int i = 0; i < config.site_size(); ++i) {
    const pb::SiteConfig& site = config.site(i);
    if (!site.has_curve_public_key()) continue;
    const IssueReporter r = root.Nested("site", i);
    const std::string& key = site.curve_public_key();
    if (!CheckCurveKey(r, "curve_public_key", key, "meridian keygen")) {
      continue;
    }
    const auto [it, inserted] = first_use.emplace(key, site.name());
    r.Check(inserted, "curve_public_key",
            "duplicates the key of site '" + it->second +
                "'; every site needs its own key pair");
  }
  return first_use;
}

// A worker key turns CURVE on at the site's worker endpoint: it needs the
// site's own key pair (the server side), CURVE on, and a key of its own
// (none of `site_keys`, nor another site's workers').
void ValidateWorkerKeys(const pb::JobConfig& config, const IssueReporter& root,
                        const KeyOwners& site_keys) {
  KeyOwners worker_use;
  for (int i = 0; i < config.site_size(); ++i) {
    const pb::SiteConfig& site = config.site(i);
    if (!site.has_worker_curve_public_key()) continue;
    const IssueReporter r = root.Nested("site", i);
    const std::string& key = site.worker_curve_public_key();
    if (!CheckCurveKey(
            r, "worker_curve_public_key", key,
            "meridian keygen --site " + site.name() + " --out DIR/workers")) {
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
    if (const auto it = site_keys.find(key); it != site_keys.end()) {
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
}

// With CURVE on, the sites that sync either all list a key or none does.
void ValidateKeysListed(const pb::JobConfig& config,
                        const IssueReporter& root) {
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

}  // namespace

// Public keys are well-formed and distinct. With CURVE on, the sites that
// sync either all list a key or none does: `meridian run` then generates
// ephemeral keys, and a site started alone refuses to run without keys.
// A worker_curve_public_key is Z85, on a site with a server that lists its
// own curve_public_key, with CURVE on, and distinct from every other key.
void ValidateSecurity(const pb::JobConfig& config, const IssueReporter& root) {
  const KeyOwners site_keys = ValidateSiteKeys(config, root);
  ValidateWorkerKeys(config, root, site_keys);
  if (config.security().curve()) ValidateKeysListed(config, root);
}

}  // namespace meridian::config_internal
