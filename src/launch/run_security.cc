#include "launch/run_security.h"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "meridian/config/config.h"
#include "meridian/core/log.h"
#include "meridian/net/security.h"
#include "meridian/sync/sync.h"

namespace meridian {
namespace {

// The sites of a job by what CURVE means for them (site indices).
struct CurveSites {
  std::vector<int> syncing;         // site servers that sync with peers
  std::vector<int> remote_workers;  // sites whose workers cross the WAN
  std::vector<int> worker_curve;    // sites whose worker endpoint is CURVE
};

CurveSites ClassifySites(const pb::JobConfig& job) {
  CurveSites sites;
  for (int s = 0; s < job.site_size(); ++s) {
    if (HasServer(job.site(s)) && job.sync().kind() != pb::SYNC_NONE &&
        !RoleOf(job, s).Peers().empty()) {
      sites.syncing.push_back(s);
    }
  }
  for (int s = 0; s < job.site_size(); ++s) {
    if (ServingSite(job, s) != s) sites.remote_workers.push_back(s);
  }
  for (int s = 0; s < job.site_size(); ++s) {
    if (HasServer(job.site(s)) && WorkerCurveEnabled(job, s)) {
      sites.worker_curve.push_back(s);
    }
  }
  return sites;
}

void WarnPlaintextWorkers(const pb::JobConfig& job, const CurveSites& sites) {
  for (int s : sites.remote_workers) {
    if (WorkerCurveEnabled(job, ServingSite(job, s))) continue;
    MLOG(WARNING) << "workers of site '" << job.site(s).name()
                  << "' reach site '" << job.site(s).server_site()
                  << "''s server in plaintext (server_site, the "
                     "BSP-over-WAN baseline, is not encrypted; the "
                     "serving site may list worker_curve_public_key)";
  }
}

// Sites with worker_curve_public_key: their workers read their keys from
// security.key_dir, which the job must have.
Status CheckWorkerKeys(const pb::JobConfig& job, const CurveSites& sites) {
  if (sites.worker_curve.empty()) return Status::Ok();
  const std::string& name = job.site(sites.worker_curve.front()).name();
  if (job.security().key_dir().empty()) {
    return FailedPreconditionError(
        "site '" + name +
        "' lists worker_curve_public_key but the job has no security { "
        "key_dir }: `meridian run` reads each site's secret key from "
        "<key_dir>/<site>.key and its workers' from <key_dir>/" +
        kWorkerKeySubdir + "/<site>.key (`meridian keygen --site " + name +
        " --out <key_dir>/" + kWorkerKeySubdir +
        "` writes one); it makes no ephemeral worker keys");
  }
  MLOG(INFO) << "CURVE on the worker endpoints of " << sites.worker_curve.size()
             << " site(s); workers read their keys "
             << "from " << job.security().key_dir() << "/" << kWorkerKeySubdir;
  return Status::Ok();
}

// Ephemeral key pairs in OUT/keys/ for the syncing sites, and the derived
// job file listing their public halves (never the input file).
Result<RunSecurity> WriteEphemeralKeys(const pb::JobConfig& job,
                                       const std::vector<int>& syncing,
                                       const std::string& out_dir,
                                       const std::string& config_path) {
  RunSecurity security;
  std::error_code error;
  const std::string key_dir =
      std::filesystem::absolute(out_dir + "/keys", error).string();
  pb::JobConfig derived = job;
  for (int s : syncing) {
    const std::string& name = job.site(s).name();
    // Ephemeral: the keys of an earlier run into this directory go.
    std::filesystem::remove(key_dir + "/" + name + ".key", error);
    std::filesystem::remove(key_dir + "/" + name + ".pub", error);
    MERIDIAN_ASSIGN_OR_RETURN(CurveKeyPair pair, GenerateCurveKeyPair());
    MERIDIAN_RETURN_IF_ERROR(WriteCurveKeyFiles(key_dir, name, pair));
    security.ephemeral_keys.push_back(key_dir + "/" + name + ".key");
    derived.mutable_site(s)->set_curve_public_key(pair.public_key);
  }
  derived.mutable_security()->set_key_dir(key_dir);
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(derived, &text)) {
    return InternalError("cannot print the derived job file");
  }
  std::string path = out_dir + "/job.pbtxt";
  if (std::filesystem::equivalent(config_path, path, error)) {
    path = out_dir + "/job-curve.pbtxt";  // never the input
  }
  {
    std::ofstream out(path, std::ios::trunc);
    out << "# Written by `meridian run` from " << config_path
        << ": the job with ephemeral CURVE keys (secret halves in " << key_dir
        << ").\n"
        << text;
    if (!out) return InvalidArgumentError("cannot write '" + path + "'");
  }
  security.config_path = path;
  MLOG(INFO) << "CURVE on: generated ephemeral key pairs for " << syncing.size()
             << " sites in " << key_dir << "; every role runs " << path
             << " (the job plus their "
             << "public keys)";
  return security;
}

}  // namespace

Result<RunSecurity> PrepareRunSecurity(const pb::JobConfig& job,
                                       const std::string& out_dir,
                                       const std::string& config_path) {
  const RunSecurity as_is{.config_path = config_path, .ephemeral_keys = {}};
  const CurveSites sites = ClassifySites(job);
  if (sites.syncing.empty() && sites.remote_workers.empty() &&
      sites.worker_curve.empty()) {
    return as_is;
  }
  if (!job.security().curve()) {
    MLOG(WARNING) << "cross-site links are plaintext: security { curve: "
                     "false }";
    return as_is;
  }
  WarnPlaintextWorkers(job, sites);
  MERIDIAN_RETURN_IF_ERROR(CheckWorkerKeys(job, sites));
  if (sites.syncing.empty() && sites.worker_curve.empty()) return as_is;
  // One machine, one key file per site: a key file meant for a single
  // role must not reach every site (nor a site's workers).
  if (std::getenv(kSecretKeyEnv) != nullptr) {
    MLOG(WARNING) << "ignoring $" << kSecretKeyEnv
                  << ": each site reads its own key file";
    ::unsetenv(kSecretKeyEnv);
  }
  if (sites.syncing.empty()) return as_is;
  const bool listed =
      std::any_of(sites.syncing.begin(), sites.syncing.end(),
                  [&](int s) { return job.site(s).has_curve_public_key(); });
  if (!listed) {
    return WriteEphemeralKeys(job, sites.syncing, out_dir, config_path);
  }
  if (job.security().key_dir().empty()) {
    return FailedPreconditionError(
        "the job lists the sites' curve_public_key but no security { "
        "key_dir }: `meridian run` reads each site's secret key from "
        "<key_dir>/<site>.key");
  }
  MLOG(INFO) << "CURVE on: links between site servers are encrypted; "
                "sites read their secret keys from "
             << job.security().key_dir();
  return as_is;
}

}  // namespace meridian
