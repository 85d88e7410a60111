// `meridian run`: the one-command local path. Spawns every role of a job as
// a child process of this one (the same roles a deployment runs alone),
// shows live progress, and writes the run report.
#ifndef MERIDIAN_LAUNCHER_H_
#define MERIDIAN_LAUNCHER_H_

#include <atomic>
#include <cstdio>
#include <functional>
#include <string>

#include "meridian/job.pb.h"
#include "meridian/report.pb.h"
#include "meridian/status.h"

namespace meridian {

struct RunOptions {
  std::string config_path;  // the job file, passed on to every child
  std::string out_dir;      // report.json, timeline.csv, logs/
  // The meridian executable the children run; empty: this process's own.
  std::string binary;
  // Where live progress goes (null: nowhere). Not owned.
  std::FILE* progress = stdout;
  // Set by a signal handler to stop the job early. May be null. Not owned.
  const std::atomic<bool>* stop_requested = nullptr;
};

// Runs `job` (already validated, loaded from options.config_path) to its
// end. Every child is stopped before this returns, whatever happens: on
// success, on stop_requested, and when any child fails (the error names the
// child, how it ended and the last lines of its log). The report is written
// in every case where the sites produced summaries.
Result<pb::RunReport> RunJob(const pb::JobConfig& job,
                             const RunOptions& options);

// `meridian site --with-workers`: starts every worker of site `site` as a
// child process (`meridian worker --config config_path --site site --index
// i`, logs in log_dir/worker-<site>-<i>.log, `binary` empty: this
// executable), runs `serve` (the site server), then gives the workers
// time to leave and stops the rest. Returns serve's status, or the first
// worker failure when serve succeeded.
Status RunWithSiteWorkers(const std::string& config_path,
                          const pb::JobConfig& job, const std::string& site,
                          const std::string& log_dir, const std::string& binary,
                          const std::function<Status()>& serve);

// Installs SIGINT/SIGTERM handlers that set the returned flag (SIGPIPE is
// ignored). Call once, early in main; the flag lives for the process.
const std::atomic<bool>* InstallStopSignalHandlers();

}  // namespace meridian

#endif  // MERIDIAN_LAUNCHER_H_
