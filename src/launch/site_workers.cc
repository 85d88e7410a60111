#include "meridian/launch/site_workers.h"

#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "launch/programs.h"
#include "launch/supervisor.h"
#include "meridian/config/config.h"
#include "meridian/core/clock.h"
#include "meridian/core/format.h"
#include "meridian/core/log.h"
#include "meridian/core/process.h"
#include "meridian/launch/launcher.h"
#include "meridian/sync/addresses.h"

namespace meridian {
namespace {

constexpr const char* kLauncher = "meridian site";

// One worker or the evaluator of the site, across its restarts.
struct SiteChild {
  std::string name;  // "worker 1 of site 'a' (python3 train.py)"
  std::vector<std::string> argv;
  SpawnOptions spawn;
  std::string log_path;
  std::optional<ChildProcess> process;  // the latest process
  RestartPolicy policy;
  bool done = false;       // ended for good
  bool backoff = false;    // waiting until next_try_s to start again
  bool signalled = false;  // stopped by us: its end is no failure
  double next_try_s = 0;
  std::string ended;  // how its latest process ended
};

// The children of one `meridian site --with-workers`, supervised as
// `meridian run` supervises its workers (RestartPolicy, the same backoff
// and restart separators; no fault events: the site server records its
// workers' outages itself).
//
// Ownership and threads: owned by RunWithSiteWorkers. The caller's thread
// calls Start; from then on the supervision thread alone calls Supervise,
// which returns once every child has ended (PR_SET_PDEATHSIG ties a
// restarted child to that thread: it must not end before them). The
// serving thread only sets `site_done`. failure() is read after the
// supervision thread was joined. Size: one entry per worker of the site,
// plus its evaluator.
class SiteChildren {
 public:
  SiteChildren(const SiteWorkersOptions& options, uint32_t max_restarts,
               double first_backoff_s)
      : options_(options),
        max_restarts_(max_restarts),
        first_backoff_s_(first_backoff_s) {}

  // Starts the first process of every child (none on error).
  Status Start(std::vector<SiteChild> children) {
    for (SiteChild& child : children) {
      child.policy = RestartPolicy(max_restarts_, first_backoff_s_);
      MERIDIAN_ASSIGN_OR_RETURN(
          ChildProcess process,
          ChildProcess::Spawn(child.name, child.argv, child.log_path,
                              child.spawn));
      child.process.emplace(std::move(process));
      child.policy.Up(wall_.ElapsedSeconds());
      children_.push_back(std::move(child));
    }
    return Status::Ok();
  }

  // Restarts children that fail until `site_done`, then stops them in
  // order (told by the site, else SIGTERM, then SIGKILL).
  void Supervise(const std::atomic<bool>& site_done) {
    while (!site_done.load()) {
      for (SiteChild& child : children_) Step(child, /*site_running=*/true);
      std::this_thread::sleep_for(kMonitorInterval);
    }
    for (SiteChild& child : children_) {
      child.done |= child.backoff;  // pending restarts are cancelled
    }
    double deadline = wall_.ElapsedSeconds() + kWorkerGraceS;
    int signal = 0;
    while (!AllDone()) {
      for (SiteChild& child : children_) Step(child, /*site_running=*/false);
      if (wall_.ElapsedSeconds() > deadline && signal != SIGKILL) {
        signal = signal == 0 ? SIGTERM : SIGKILL;
        for (SiteChild& child : children_) {
          if (child.done) continue;
          child.signalled = true;
          child.process->Signal(signal);
        }
        deadline = wall_.ElapsedSeconds() + kKillGraceS;
      }
      std::this_thread::sleep_for(kMonitorInterval);
    }
  }

  const Status& failure() const { return failure_; }

 private:
  bool AllDone() const {
    for (const SiteChild& child : children_) {
      if (!child.done) return false;
    }
    return true;
  }

  void Step(SiteChild& child, bool site_running) {
    if (child.done) return;
    const double now = wall_.ElapsedSeconds();
    if (child.backoff) {
      if (now >= child.next_try_s) Restart(child);
      return;
    }
    if (!child.process->Poll()) return;
    child.ended = child.process->DescribeExit();
    if (child.process->succeeded() || child.signalled) {
      child.done = true;
      return;
    }
    OnFailure(child, site_running);
  }

  // The latest process of `child` ended abnormally.
  void OnFailure(SiteChild& child, bool site_running) {
    const bool reset = child.policy.Failed(wall_.ElapsedSeconds());
    std::string verdict;
    if (!site_running) {
      verdict = "not restarted: the site server has ended";
    } else if (!child.policy.CanRestart()) {
      verdict = max_restarts_ == 0
                    ? "not restarted: fault.max_restarts is 0"
                    : "not restarted: it was restarted " +
                          std::to_string(child.policy.restarts()) +
                          " times already, the limit (fault.max_restarts)";
    } else {
      child.backoff = true;
      child.next_try_s = wall_.ElapsedSeconds() + child.policy.NextBackoffS();
      verdict =
          "restarting it in " + FormatSeconds(child.policy.NextBackoffS()) +
          " s: restart " + std::to_string(child.policy.next_restart()) +
          " of " + std::to_string(max_restarts_) +
          (reset ? " (it had run " + FormatSeconds(child.policy.last_up_s()) +
                       " s: its count of restarts starts again)"
                 : "");
    }
    const std::string note = child.name + " " + child.ended + " (" + verdict +
                             "); its log " + child.log_path + " ends with:\n" +
                             child.process->LogTail(kLogTailLines);
    if (child.backoff || !site_running) {
      child.done = !child.backoff;
      MLOG(WARNING) << note;
      return;
    }
    child.done = true;
    MLOG(ERROR) << note;
    if (failure_.ok()) {
      failure_ = UnavailableError(note);
      if (options_.stop_site) options_.stop_site();
    }
  }

  void Restart(SiteChild& child) {
    child.backoff = false;
    child.policy.Restarted();
    AppendRestartSeparator(kLauncher, child.log_path, child.policy.restarts(),
                           max_restarts_, child.name, child.ended);
    child.process.reset();
    Result<ChildProcess> process = ChildProcess::Spawn(
        child.name, child.argv, child.log_path, child.spawn);
    if (!process.ok()) {
      child.done = true;
      MLOG(ERROR) << child.name
                  << " could not be started again: " << process.status();
      if (failure_.ok()) {
        failure_ = process.status();
        if (options_.stop_site) options_.stop_site();
      }
      return;
    }
    child.process.emplace(std::move(*process));
    child.policy.Up(wall_.ElapsedSeconds());
    MLOG(INFO) << "restarted " << child.name << " (restart "
               << child.policy.restarts() << " of " << max_restarts_ << ", pid "
               << child.process->pid() << ")";
  }

  const SiteWorkersOptions& options_;
  const uint32_t max_restarts_;
  const double first_backoff_s_;
  Stopwatch wall_;
  std::vector<SiteChild> children_;
  Status failure_;  // the first child that failed the site
};

// The site's workers and evaluator, as SiteChildren starts them.
Result<std::vector<SiteChild>> SiteChildrenOf(const pb::JobConfig& job,
                                              const SiteWorkersOptions& options,
                                              int s) {
  const pb::SiteConfig& site = job.site(s);
  const std::string logs = options.out_dir + "/logs/";
  const std::string self =
      options.binary.empty() ? SelfExecutable() : options.binary;
  const ProgramContext context = MakeProgramContext(
      options.config_path, options.config_path, options.out_dir);
  // Where `meridian worker` connects here: $MERIDIAN_CONNECT, else the
  // job's address of the serving site.
  const char* connect_variable = std::getenv("MERIDIAN_CONNECT");
  const std::string connect = connect_variable != nullptr && *connect_variable
                                  ? connect_variable
                                  : WorkerServerEndpoint(job, s);
  std::vector<SiteChild> children;
  for (uint32_t w = 0; w < SiteWorkerCount(site); ++w) {
    SiteChild child;
    child.name =
        "worker " + std::to_string(w) + " of site '" + site.name() + "'";
    child.log_path =
        logs + "worker-" + site.name() + "-" + std::to_string(w) + ".log";
    if (WorkerGroupOf(site, w).command_size() > 0) {
      MERIDIAN_ASSIGN_OR_RETURN(ProgramProcess program,
                                WorkerProgram(job, context, s, w, connect));
      child.name += " (" + program.command + ")";
      child.argv = std::move(program.argv);
      child.spawn = std::move(program.spawn);
    } else {
      child.argv = {self,     "worker",    "--config", options.config_path,
                    "--site", site.name(), "--index",  std::to_string(w)};
    }
    children.push_back(std::move(child));
  }
  if (!EvaluatorCommand(job, s).empty()) {
    MERIDIAN_ASSIGN_OR_RETURN(ProgramProcess program,
                              EvaluatorProgram(job, context, s, connect));
    SiteChild child;
    child.name =
        "evaluator of site '" + site.name() + "' (" + program.command + ")";
    child.log_path = logs + "evaluator-" + site.name() + ".log";
    child.argv = std::move(program.argv);
    child.spawn = std::move(program.spawn);
    children.push_back(std::move(child));
  }
  return children;
}

}  // namespace

Status RunWithSiteWorkers(const pb::JobConfig& job,
                          const SiteWorkersOptions& options,
                          const std::function<Status()>& serve) {
  MERIDIAN_ASSIGN_OR_RETURN(const int s, FindSite(job, options.site));
  MERIDIAN_RETURN_IF_ERROR(FindJobPrograms(job, options.config_path, s));
  std::error_code error;
  std::filesystem::create_directories(options.out_dir + "/logs", error);
  if (error) {
    return InvalidArgumentError("cannot create log directory '" +
                                options.out_dir + "/logs': " + error.message());
  }
  MERIDIAN_ASSIGN_OR_RETURN(std::vector<SiteChild> first,
                            SiteChildrenOf(job, options, s));
  const size_t count = first.size();
  SiteChildren children(options, job.fault().max_restarts(),
                        job.fault().restart_backoff_s());
  MERIDIAN_RETURN_IF_ERROR(children.Start(std::move(first)));
  MLOG(INFO) << "started " << count << " worker and evaluator processes of "
             << "site '" << options.site << "'; their logs are in "
             << options.out_dir << "/logs";
  std::atomic<bool> site_done{false};
  std::thread supervision([&] { children.Supervise(site_done); });
  const Status served = serve();
  site_done.store(true);
  supervision.join();
  if (!served.ok()) return served;
  return children.failure();
}

}  // namespace meridian
