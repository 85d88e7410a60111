// `meridian run`: the one-command local path. Spawns every role of a job as
// a child process of this one (the same roles a deployment runs alone),
// shows live progress, and writes the run report. The other faces of
// src/launch: run_manifest.h (`meridian run --resume`), site_workers.h
// (`meridian site --with-workers`), stop_signals.h (SIGINT/SIGTERM).
#ifndef MERIDIAN_LAUNCH_LAUNCHER_H_
#define MERIDIAN_LAUNCH_LAUNCHER_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "meridian/core/status.h"
#include "meridian/job.pb.h"
#include "meridian/report.pb.h"

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
//     (fault.restart_backoff_s, doubled per restart up to 30 s), at most
//     max_restarts times per child; a
//     site server restarts with --resume on the endpoints it bound first,
//     wanem on the same route ports. Past the limit (or fail_fast) the job
//     stops and fails, naming the child, how it ended and its log's tail.
//   - a worker group with a command runs that program in place of
//     `meridian worker`, and a site with a server and an evaluator command
//     runs one evaluator process: in the job file's directory, with the
//     MERIDIAN_* environment of docs/operations.md, supervised as the
//     built-in workers are (logs OUT/logs/worker-<site>-<i>.log and
//     OUT/logs/evaluator-<site>.log).
//   - the job stops in order: workers and evaluators (told by their sites,
//     else SIGTERM), then site servers (SIGTERM: they finish, flush to their
//     peers and write their summaries), then wanem after its final counters are
//     read.
// Every child is stopped before this returns, whatever happens. report.json
// is written in every case (with the summaries that exist, and outcome
// "failed: ..." when the job failed); the error is then returned too.
// OUT/run.json (pb::RunManifest) lets RunJob continue with
// options.resume after every process was killed.
Result<pb::RunReport> RunJob(const pb::JobConfig& job,
                             const RunOptions& options);

// Finds the worker and evaluator programs (WorkerGroup.command,
// EvaluatorConfig.command) of every site of `job`, or of site index `site`
// alone (its workers' and its evaluator), as the launcher starts them:
// from the directory of the job file at `config_path`, with this process's
// $PATH (as execvp does; relative program paths against that directory).
// The first that cannot be started is an error (NotFound, or
// FailedPrecondition for a file that is not executable) naming the field,
// the site, the command, where the program was looked for and the working
// directory. RunJob checks it before anything starts; `meridian run` and
// `meridian site --with-workers` call it first to report bad input.
Status FindJobPrograms(const pb::JobConfig& job, const std::string& config_path,
                       int site = -1);

// A program's command as written, for messages: its words joined by
// spaces, an empty word or one holding a space or quote in single quotes
// ("sh -c 'exit 3'").
std::string DescribeCommand(const std::vector<std::string>& command);

}  // namespace meridian

#endif  // MERIDIAN_LAUNCH_LAUNCHER_H_
