// `meridian site --with-workers`: a site server with its workers (and its
// evaluator) as child processes, for a deployment that runs one site per
// machine.
#ifndef MERIDIAN_LAUNCH_SITE_WORKERS_H_
#define MERIDIAN_LAUNCH_SITE_WORKERS_H_

#include <functional>
#include <string>

#include "meridian/core/status.h"
#include "meridian/job.pb.h"

namespace meridian {

struct SiteWorkersOptions {
  // The job file the children read (`meridian worker --config`,
  // MERIDIAN_JOB); programs run in its directory.
  std::string config_path;
  std::string site;  // the site's name
  // Logs go to <out_dir>/logs/ (worker-<site>-<i>.log,
  // evaluator-<site>.log); MERIDIAN_OUT.
  std::string out_dir = ".";
  // The meridian executable of built-in workers; empty: this process's.
  std::string binary;
  // Makes `serve` finish early, as a stop signal would: called once, from
  // the supervision thread, when a child fails past the restart limit.
  // May be empty.
  std::function<void()> stop_site;
};

// Starts every worker of the site as a child process (`meridian worker
// --config config_path --site site --index i`, or the group's program,
// WorkerGroup.command) and, when the site has an evaluator command, its
// evaluator; runs `serve` (the site server) on the calling thread; then
// gives the workers and the evaluator time to leave (told by the site,
// else SIGTERM after 15 s, SIGKILL 10 s later). Programs get the MERIDIAN_*
// environment `meridian run` gives them (docs/operations.md).
//
// While `serve` runs, the children are supervised as `meridian run`
// supervises its workers: one that ends abnormally is started again after
// fault.restart_backoff_s (doubled per restart, at most 30 s), up to
// fault.max_restarts times in a row; a restarted worker takes its slot
// back as a new incarnation, so a killed child does not fail the site.
// Past the limit the site is stopped (stop_site) and fails. A child that
// ends after the site server has ended fails nothing.
//
// Returns serve's error, else the failure of a child past the restart
// limit (naming it, how it ended and its log's tail), else Ok. A program
// that cannot be found is an error before any child starts.
Status RunWithSiteWorkers(const pb::JobConfig& job,
                          const SiteWorkersOptions& options,
                          const std::function<Status()>& serve);

}  // namespace meridian

#endif  // MERIDIAN_LAUNCH_SITE_WORKERS_H_
