// CURVE for `meridian run` (meridian/net/security.h): which links of a job
// are encrypted, and the keys the children read. A job that lists the
// sites' public keys runs as is: each site reads <security.key_dir>/
// <site>.key. A job without keys gets ephemeral key pairs in OUT/keys/, and
// every role runs the derived job file OUT/job.pbtxt that lists them. A
// site with worker_curve_public_key needs security.key_dir: its workers
// read <key_dir>/workers/<site>.key (no ephemeral worker keys are made).
//
// Called once by the launcher's JobRun before any child starts, on the
// thread that called RunJob.
#ifndef MERIDIAN_LAUNCH_RUN_SECURITY_H_
#define MERIDIAN_LAUNCH_RUN_SECURITY_H_

#include <string>
#include <vector>

#include "meridian/core/status.h"
#include "meridian/job.pb.h"

namespace meridian {

struct RunSecurity {
  // The job file every role runs: the one given, or the derived job file
  // with ephemeral public keys.
  std::string config_path;
  // Secret key files written for this run: the launcher deletes them once
  // every child has exited.
  std::vector<std::string> ephemeral_keys;
};

// Prepares CURVE for `job` (loaded from `config_path`), writing into
// `out_dir` what a job without keys needs; logs which links are encrypted
// and warns about the plaintext ones. Unsets $MERIDIAN_SECRET_KEY when
// site servers are to read their own key files. Fails (FailedPrecondition)
// when the job lists keys but no security.key_dir; errors name the file
// that could not be written.
Result<RunSecurity> PrepareRunSecurity(const pb::JobConfig& job,
                                       const std::string& out_dir,
                                       const std::string& config_path);

}  // namespace meridian

#endif  // MERIDIAN_LAUNCH_RUN_SECURITY_H_
