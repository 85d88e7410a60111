// `meridian site --with-workers`: a site server with its workers as child
// processes, for a deployment that runs one site per machine.
#ifndef MERIDIAN_LAUNCH_SITE_WORKERS_H_
#define MERIDIAN_LAUNCH_SITE_WORKERS_H_

#include <functional>
#include <string>

#include "meridian/core/status.h"
#include "meridian/job.pb.h"

namespace meridian {

// Starts every worker of site `site` as a child process (`meridian worker
// --config config_path --site site --index i`, logs in
// log_dir/worker-<site>-<i>.log, `binary` empty: this executable), runs
// `serve` (the site server), then gives the workers time to leave and
// stops the rest. Returns serve's status, or the first worker failure when
// serve succeeded.
Status RunWithSiteWorkers(const std::string& config_path,
                          const pb::JobConfig& job, const std::string& site,
                          const std::string& log_dir, const std::string& binary,
                          const std::function<Status()>& serve);

}  // namespace meridian

#endif  // MERIDIAN_LAUNCH_SITE_WORKERS_H_
