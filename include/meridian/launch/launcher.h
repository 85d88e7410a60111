// `meridian run`: the one-command local path. Spawns every role of a job as
// a child process of this one (the same roles a deployment runs alone),
// shows live progress, and writes the run report.
#ifndef MERIDIAN_LAUNCH_LAUNCHER_H_
#define MERIDIAN_LAUNCH_LAUNCHER_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

#include "meridian/job.pb.h"
#include "meridian/report.pb.h"
#include "meridian/core/status.h"

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
  // How many stop signals arrived (InstallStopSignalHandlers); from the
  // second on, every child is killed at once instead of stopped in order.
  // May be null. Not owned.
  const std::atomic<int>* stop_signals = nullptr;
  // Continue the run in out_dir (`meridian run --resume`): its run.json
  // exists; site servers start with --resume, workers fresh.
  bool resume = false;
  // The first failure of any child stops the job (no restarts).
  bool fail_fast = false;
  // Restarts of one child before the job fails; unset: fault.max_restarts.
  std::optional<uint32_t> max_restarts;
};

// Runs `job` (already validated, loaded from options.config_path) to its
// end, supervising every child:
//   - a child that ends abnormally (non-zero status, or a signal) while
//     the job runs is started again with the same command after a backoff
//     (RestartBackoffSeconds), at most max_restarts times per child; a
//     site server restarts with --resume on the endpoints it bound first,
//     wanem on the same route ports. Past the limit (or fail_fast) the job
//     stops and fails, naming the child, how it ended and its log's tail.
//   - the job stops in order: workers (told by their sites, else SIGTERM),
//     then site servers (SIGTERM: they finish, flush to their peers and
//     write their summaries), then wanem after its final counters are read.
// Every child is stopped before this returns, whatever happens. report.json
// is written in every case (with the summaries that exist, and outcome
// "failed: ..." when the job failed); the error is then returned too.
// OUT/run.json (pb::RunManifest) lets RunJob continue with
// options.resume after every process was killed.
Result<pb::RunReport> RunJob(const pb::JobConfig& job,
                             const RunOptions& options);

// The pause before restart number `restart` (1 for the first) of one child:
// first_s doubled per restart, at most 30 s; 0 for a first_s that is not
// positive and finite.
double RestartBackoffSeconds(double first_s, uint32_t restart);

// `meridian run --resume DIR`: the job file the run in DIR ran, from its
// run.json. Errors name the file.
Result<std::string> ResumeConfigPath(const std::string& run_dir);

// One site on the live progress line.
struct SiteProgressView {
  const pb::SiteStatus* status = nullptr;  // its last status reply, if any
  int64_t clock = 0;                       // that reply's header clock
  // The launcher is restarting it: attempt number `attempt`.
  bool restarting = false;
  uint32_t attempt = 0;
  // Seconds since its status last answered, when the last request went
  // unanswered; < 0 while it answers.
  double silent_s = -1;
  bool finished = false;  // its process ended after finishing the job
  // The model's metric, shown instead of accuracy when it is not accuracy
  // ("rmse 0.8123").
  std::string metric = "accuracy";
};

// "train 12.0 s  acc 0.9012 ..." (with "  workers dead 1", "  peers
// unreachable 1" when non-zero), "restarting (attempt 2)", "down (no answer
// for 7 s)", "starting" or "1/4 workers joined".
std::string FormatSiteProgress(const SiteProgressView& site);

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
// How many SIGINT/SIGTERM arrived since InstallStopSignalHandlers.
const std::atomic<int>* StopSignalCount();

}  // namespace meridian

#endif  // MERIDIAN_LAUNCH_LAUNCHER_H_
