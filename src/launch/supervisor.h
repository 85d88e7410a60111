// The child processes of `meridian run` and their supervision: each
// child's state across its processes (start, restart after a backoff, the
// port-in-use retries, the restart limit, fail-fast), the fault events of
// its outages, and the ordered stop of the job (workers and evaluators,
// then site servers with their final flush, then wanem; a second interrupt
// kills everything).
// What a restart means for a role beyond its command (a site server's
// peers, wanem's routes and counters, the progress line) is left to
// SupervisorHooks.
//
// Ownership and threads: owned by the launcher's JobRun and used by the
// thread that called RunJob alone (the monitor loop); not thread-safe.
// Time is seconds on JobRun's stopwatch.
// Size: one entry per child (site servers, wanem, workers, evaluators),
// fixed once every role has started; an entry lives for the run (a restart
// replaces its process); per entry at most max_restarts + 1 outage event
// indices (an outage ends when the child is back, and its count of restarts
// only starts again after a healthy run, which ended the outage before).
#ifndef MERIDIAN_LAUNCH_SUPERVISOR_H_
#define MERIDIAN_LAUNCH_SUPERVISOR_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meridian/core/clock.h"
#include "meridian/core/status.h"
#include "launch/endpoints_file.h"
#include "meridian/core/format.h"
#include "meridian/core/process.h"
#include "launch/run_manifest.h"

namespace meridian {

// How long a site server (or wanem) may take to load its data and bind.
inline constexpr auto kReadyTimeout = std::chrono::seconds(120);
inline constexpr double kReadyTimeoutS = 120.0;
// The ordered stop. Workers get this long to leave (told by their sites,
// or after SIGTERM); site servers, after SIGTERM, this long to finish:
// drain their workers (fault: 5 s), send their final flush and wait up to
// 60 s for their peers' (kSyncFinishTimeoutS of the site server), evaluate
// once more and write their summary. Anyone still running after SIGTERM
// and kKillGraceS more gets SIGKILL.
inline constexpr double kWorkerGraceS = 15.0;
inline constexpr double kSiteGraceS = 100.0;
inline constexpr double kKillGraceS = 10.0;
// One pass of the monitor loop; nothing in it blocks much longer, so a
// child's end is noticed within about this much.
inline constexpr auto kMonitorInterval = std::chrono::milliseconds(100);
inline constexpr int kLogTailLines = 8;
// Restart backoff ceiling (fault.restart_backoff_s doubles up to it).
inline constexpr double kMaxBackoffS = 30.0;

// Appends to a restarted child's log, before its new process's output,
// the line "===== <launcher>: restart <restart> of <max_restarts> of
// <name> at <local time> (the previous process <ended>) =====" (a failure
// to write is logged, not returned).
void AppendRestartSeparator(const std::string& launcher,
                            const std::string& log_path, uint32_t restart,
                            uint32_t max_restarts, const std::string& name,
                            const std::string& ended);

// The pause before restart number `restart` (1 for the first) of one child:
// first_s doubled per restart, at most kMaxBackoffS; 0 for a first_s that
// is not positive and finite.
double RestartBackoffSeconds(double first_s, uint32_t restart);

// The meridian executable children run by default: this process's own
// (/proc/self/exe), or "meridian" when that cannot be read.
std::string SelfExecutable();
// A process of a child that was up (ready, its start steps done) at least
// this long before it failed ran healthy: the child's count of restarts and
// its backoff start again, so that only a child that keeps failing reaches
// the restart limit (a long job may lose any process now and then).
inline constexpr double kHealthyPeriodS = 60.0;

// The restart limit and backoff of one child, on time passed in (seconds
// on any one clock): the count of restarts grows by one per restart and
// starts again from 0 (and the backoff from its first value) when a
// process fails after it was up for at least `healthy_period_s`. Pure: no
// I/O, no clock of its own. Copyable; not thread-safe.
class RestartPolicy {
 public:
  RestartPolicy() = default;  // no restarts
  RestartPolicy(uint32_t max_restarts, double first_backoff_s,
                double healthy_period_s = kHealthyPeriodS);

  // The latest process is up (healthy) from `now_s` on.
  void Up(double now_s);
  // The latest process failed at `now_s` (it ended, or its start failed).
  // Returns true if it had been up for at least the healthy period: the
  // count of restarts is 0 again.
  bool Failed(double now_s);
  // Whether one more restart stays within max_restarts.
  bool CanRestart() const { return restarts_ < max_restarts_; }
  // The number (from 1) and the pause, in seconds, of the next restart:
  // first_backoff_s doubled per restart since the count began, at most
  // kMaxBackoffS (RestartBackoffSeconds).
  uint32_t next_restart() const { return restarts_ + 1; }
  double NextBackoffS() const;
  // The next restart happens (a new process is started): it counts.
  void Restarted();
  // The latest restart does not count after all (its port was still in
  // use).
  void Uncount();

  uint32_t restarts() const { return restarts_; }
  uint32_t max_restarts() const { return max_restarts_; }
  // How long the process that failed last had been up; 0 if it never was.
  double last_up_s() const { return last_up_s_; }

 private:
  uint32_t max_restarts_ = 0;
  double first_backoff_s_ = 0;
  double healthy_period_s_ = kHealthyPeriodS;
  uint32_t restarts_ = 0;             // since the count began
  std::optional<double> up_since_s_;  // the latest process, while it is up
  double last_up_s_ = 0;
};

// One child process the launcher supervises, across its restarts. A
// worker is `meridian worker` or the group's program (WorkerGroup.command);
// an evaluator is a site's evaluator program (EvaluatorConfig.command),
// supervised and stopped as the workers are.
enum class Role { kSite, kWorker, kEvaluator, kWanem };

// kStarting: spawned, its ready line (site server, wanem) and the steps
// after it (SET_PEERS, wanem's routes) not all done yet; kRunning: up;
// kBackoff: its process ended abnormally, started again at next_try_s;
// kDone: ended for good (finished, stopped, or not restarted).
enum class ChildState { kStarting, kRunning, kBackoff, kDone };

struct Supervised {
  Role role = Role::kWorker;
  std::string name;     // "site server 'us'": logs and errors
  std::string subject;  // FaultEvent.subject: "site 'us'", "us/1", "wanem"
  int site = -1;        // site server: its site; worker: its serving site
  std::vector<std::string> argv;  // a restart runs this (sites: --resume)
  SpawnOptions spawn;  // programs: their directory and MERIDIAN_* variables
  std::string log_path;
  std::optional<ChildProcess> process;  // the latest process
  ChildState state = ChildState::kStarting;
  RestartPolicy policy;     // its restarts (set by Supervisor::Spawn)
  int bind_retries = 0;     // starts refused for a port in use, this outage
  bool signalled = false;   // the launcher stopped it: not a failure
  bool ready = false;       // kStarting: its ready line was read
  double next_try_s = 0;    // kBackoff: start time; kStarting: deadline
  double next_step_s = 0;   // kStarting: next attempt of a start step
  double down_since_s = 0;  // when the current outage began
  double backoff_s = 0;     // the pause before the pending restart
  std::string ended;        // how its latest process ended
  std::vector<int> outage_events;  // manifest event indices of the outage
};

// The stop of the job, in order. kRunning: children are supervised
// (restarted); kStopWorkers: workers and evaluators leave (told by their
// sites, or SIGTERM); kStopSites: site servers finish (SIGTERM: final flush,
// summary); kStopWanem: wanem's final counters are read, then it stops;
// kKilling: a second interrupt, everything got SIGKILL.
enum class Stage {
  kRunning,
  kStopWorkers,
  kStopSites,
  kStopWanem,
  kKilling,
  kDone
};

// What a restart of a site server or wanem needs beyond its command; the
// launcher implements it. Called on the supervisor's thread.
class SupervisorHooks {
 public:
  virtual ~SupervisorHooks() = default;
  // The ready line ("ready ...") of a restarted site server or wanem. An
  // error kills that process and fails its start.
  virtual Status TakeReadyLine(size_t child, const std::string& line) = 0;
  // The steps after the ready line that make a restarted site server or
  // wanem whole (SET_PEERS; wanem's routes); tried again every 0.5 s until
  // the start deadline while they fail.
  virtual Status CompleteStart(size_t child) = 0;
  // What the PROCESS_RESTARTED event of child `child` adds ("; ..." or "").
  virtual std::string RecoveryNote(size_t child) = 0;
  // Child `child` is about to be started again.
  virtual void BeforeRestart(size_t child) = 0;
  // A wanem process that had come up ended.
  virtual void WanemEnded() = 0;
  // Every site server is done and wanem runs: read its final counters
  // (before it gets SIGTERM).
  virtual void ReadFinalWanCounters() = 0;
};

struct SupervisorOptions {
  bool fail_fast = false;      // the first failure stops the job
  uint32_t max_restarts = 0;   // per child, between healthy runs
  double first_backoff_s = 0;  // doubled per restart (RestartBackoffSeconds)
  // Interrupts (RunOptions); may be null. Not owned.
  const std::atomic<bool>* stop_requested = nullptr;
  const std::atomic<int>* stop_signals = nullptr;
};

class Supervisor {
 public:
  // `wall`, `manifest` (fault events), `endpoints` (the states of site
  // servers and wanem) and `hooks` are not owned and outlive this.
  Supervisor(const SupervisorOptions& options, const Stopwatch* wall,
             RunManifestFile* manifest, EndpointsFile* endpoints,
             SupervisorHooks* hooks);
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // ---- the start of the job: the launcher spawns every child once.

  // Starts `child.argv` and supervises the child from now on; its index.
  // A worker or evaluator is up (kRunning) at once; a site server or wanem
  // stays kStarting until MarkRunning. A spawn error adds no child.
  Result<size_t> Spawn(Supervised child);
  // The ready line of a site server's first process, waited for until
  // `deadline` (Cancelled if the job is interrupted meanwhile). An error
  // names the child, how it ended and its log's tail.
  Result<std::string> AwaitReadyLine(size_t i, double deadline);
  // The same for wanem's first process, waiting up to kReadyTimeout.
  Result<std::string> ReadReadyLine(size_t i);
  // The first process of child `i` is up (its start steps done).
  void MarkRunning(size_t i);
  // Its restart command from now on (a site server's bound endpoints).
  void SetRestartArgv(size_t i, std::vector<std::string> argv);
  // The start failed (`started`): an interrupt, or the job fails; the
  // children started so far are stopped in order.
  void FailStart(const Status& started);

  // ---- the monitor loop: CheckSignals, StepChildren, AdvanceStop.

  // Acts on interrupts: the first stops the job in order, the second
  // kills every child.
  void CheckSignals();
  // Polls every child: exits, restarts due, start steps. True if any
  // child changed state (and logged it).
  bool StepChildren();
  // Moves the ordered stop on when its stage is over (or out of time).
  void AdvanceStop();
  // Whether child `i` is up and its process has not exited (waitpid,
  // without waiting; the exit itself is handled by the next StepChildren).
  bool ProcessRunning(size_t i);

  Stage stage() const { return stage_; }
  uint32_t max_restarts() const { return options_.max_restarts; }
  const Supervised& child(size_t i) const { return children_[i]; }
  std::optional<size_t> wanem() const { return wanem_; }
  // The first failure that failed the job ("" if none), with its log tail.
  const std::string& failure() const { return failure_; }
  bool interrupted() const { return interrupted_; }

 private:
  // What the launcher does with a child whose process ended abnormally.
  enum class Verdict {
    kRestart,  // start it again after the backoff
    kFail,     // the job fails (fail-fast, restart limit)
    kLetGo,    // the job is ending anyway: record it, nothing more
  };

  double Now() const { return wall_->ElapsedSeconds(); }
  bool StopRequested() const;
  // A first process that did not start: `problem`, how it ended, its log.
  static Status NotStarted(const Supervised& child, const std::string& problem);

  void SetRunning(size_t i);
  void StepChild(size_t i);
  void StepStarting(size_t i);
  void OnExit(size_t i);
  void OnStartFailed(size_t i, const std::string& how);
  void OnFailure(size_t i, const std::string& how);
  // `reset`: the count of restarts started again (a healthy run).
  Verdict Judge(const Supervised& child, bool reset, std::string* reason) const;
  bool SiteChildDone(int s) const;
  void Restart(size_t i);
  void Recovered(size_t i);

  // Sends `signal` to a child's live process; its end is then no failure.
  static void Stop(Supervised& child, int signal);
  static void KillAndReap(Supervised& child);
  void SetEndpointState(const Supervised& child, const std::string& state);

  void BeginStop();
  void StopWanem();
  bool AllDone(Role role) const;
  // Workers and evaluators, which leave together.
  bool AllClientsDone() const;
  std::string Remaining(Role role) const;
  // Sends `signal` to every child of `role`; they have kKillGraceS from
  // `now` before the stop goes a step further.
  void Escalate(Role role, int signal, double now);

  const SupervisorOptions options_;
  const Stopwatch* const wall_;
  RunManifestFile* const manifest_;
  EndpointsFile* const endpoints_;
  SupervisorHooks* const hooks_;
  // Every child: site servers, wanem, workers, in start order.
  std::vector<Supervised> children_;
  std::optional<size_t> wanem_;  // its index in children_
  Stage stage_ = Stage::kRunning;
  double stop_deadline_s_ = 0;
  int workers_signal_ = 0;  // the last signal sent to every worker
  bool interrupted_ = false;
  std::string failure_;
};

}  // namespace meridian

#endif  // MERIDIAN_LAUNCH_SUPERVISOR_H_
