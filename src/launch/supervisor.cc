#include "launch/supervisor.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "meridian/core/log.h"

namespace meridian {
namespace {

// A restarted site server or wanem whose port is still taken is started
// again this many times, 0.5 s, 1 s, 2 s ... apart, without counting as a
// restart.
constexpr int kBindRetries = 5;
constexpr double kBindRetryFirstS = 0.5;
// Between attempts of the steps after a restarted child's ready line
// (SET_PEERS, re-adding wanem's routes).
constexpr double kStartStepRetryS = 0.5;
// Starts the line written into a child's log before each restart.
constexpr const char* kSeparatorPrefix = "===== meridian run: ";
constexpr const char* kLauncher = "meridian run";

std::string LocalTimeNow() {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &local);
  return stamp;
}

// The part of a child's log after the last restart separator: what the
// latest process wrote.
std::string LatestLogText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  const size_t at = text.rfind(kSeparatorPrefix);
  return at == std::string::npos ? text : text.substr(at);
}

}  // namespace

double RestartBackoffSeconds(double first_s, uint32_t restart) {
  if (!std::isfinite(first_s) || first_s <= 0) return 0;
  const double doubled =
      first_s * std::pow(2.0, static_cast<double>(std::max(restart, 1u) - 1));
  return std::min(doubled, kMaxBackoffS);
}

void AppendRestartSeparator(const std::string& launcher,
                            const std::string& log_path, uint32_t restart,
                            uint32_t max_restarts, const std::string& name,
                            const std::string& ended) {
  const std::string separator =
      "===== " + launcher + ": restart " + std::to_string(restart) + " of " +
      std::to_string(max_restarts) + " of " + name + " at " + LocalTimeNow() +
      " (the previous process " + ended + ") =====";
  if (Status appended = AppendLogLine(log_path, separator); !appended.ok()) {
    MLOG(WARNING) << appended;
  }
}

std::string SelfExecutable() {
  std::error_code error;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string("meridian") : path.string();
}

// ---- RestartPolicy ----------------------------------------------------------

RestartPolicy::RestartPolicy(uint32_t max_restarts, double first_backoff_s,
                             double healthy_period_s)
    : max_restarts_(max_restarts),
      first_backoff_s_(first_backoff_s),
      healthy_period_s_(healthy_period_s) {}

void RestartPolicy::Up(double now_s) { up_since_s_ = now_s; }

bool RestartPolicy::Failed(double now_s) {
  last_up_s_ = up_since_s_ ? std::max(0.0, now_s - *up_since_s_) : 0;
  up_since_s_.reset();
  if (last_up_s_ < healthy_period_s_ || restarts_ == 0) return false;
  restarts_ = 0;
  return true;
}

double RestartPolicy::NextBackoffS() const {
  return RestartBackoffSeconds(first_backoff_s_, next_restart());
}

void RestartPolicy::Restarted() {
  ++restarts_;
  up_since_s_.reset();
}

void RestartPolicy::Uncount() {
  if (restarts_ > 0) --restarts_;
}

// ---- Supervisor: the start --------------------------------------------------

Supervisor::Supervisor(const SupervisorOptions& options, const Stopwatch* wall,
                       RunManifestFile* manifest, EndpointsFile* endpoints,
                       SupervisorHooks* hooks)
    : options_(options),
      wall_(wall),
      manifest_(manifest),
      endpoints_(endpoints),
      hooks_(hooks) {}

bool Supervisor::StopRequested() const {
  return options_.stop_requested != nullptr && options_.stop_requested->load();
}

Result<size_t> Supervisor::Spawn(Supervised child) {
  MERIDIAN_ASSIGN_OR_RETURN(
      ChildProcess process,
      ChildProcess::Spawn(child.name, child.argv, child.log_path, child.spawn));
  child.process.emplace(std::move(process));
  child.policy = RestartPolicy(options_.max_restarts, options_.first_backoff_s);
  child.state = ChildState::kStarting;
  const size_t i = children_.size();
  if (child.role == Role::kWanem) wanem_ = i;
  const bool client =
      child.role == Role::kWorker || child.role == Role::kEvaluator;
  children_.push_back(std::move(child));
  if (client) SetRunning(i);
  return i;
}

Status Supervisor::NotStarted(const Supervised& child,
                              const std::string& problem) {
  return UnavailableError(child.name + " did not start (" + problem + "; " +
                          child.process->DescribeExit() + "); its log " +
                          child.log_path + " ends with:\n" +
                          child.process->LogTail(kLogTailLines));
}

Result<std::string> Supervisor::AwaitReadyLine(size_t i, double deadline) {
  Supervised& child = children_[i];
  std::optional<std::string> line;
  std::string problem;
  while (!line && problem.empty()) {
    Result<std::optional<std::string>> read = child.process->TryReadReadyLine();
    if (!read.ok()) {
      problem = read.status().message();
    } else if (*read) {
      line = **read;
    } else if (StopRequested()) {
      return CancelledError("interrupted while the site servers started");
    } else if (Now() > deadline) {
      problem = "no ready line within " +
                std::to_string(kReadyTimeout.count()) + " s";
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (!line || line->rfind("ready ", 0) != 0) {
    // Give an exiting child a moment, to say how it ended.
    for (int wait = 0; wait < 20 && !child.process->Poll(); ++wait) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return NotStarted(child, line ? "unexpected '" + *line + "'" : problem);
  }
  return *line;
}

Result<std::string> Supervisor::ReadReadyLine(size_t i) {
  Supervised& child = children_[i];
  Result<std::string> line = child.process->ReadReadyLine(kReadyTimeout);
  if (!line.ok() || line->rfind("ready ", 0) != 0) {
    child.process->Poll();
    return NotStarted(child, line.ok() ? "unexpected '" + *line + "'"
                                       : line.status().message());
  }
  return line;
}

void Supervisor::MarkRunning(size_t i) { SetRunning(i); }

void Supervisor::SetRestartArgv(size_t i, std::vector<std::string> argv) {
  children_[i].argv = std::move(argv);
}

void Supervisor::FailStart(const Status& started) {
  // Children that did not get through the start are only stopped.
  for (Supervised& child : children_) {
    if (child.state == ChildState::kStarting) {
      child.state = ChildState::kRunning;
    }
  }
  if (StopRequested()) {
    interrupted_ = true;
  } else {
    failure_ = started.message();
    MLOG(ERROR) << failure_;
  }
  BeginStop();
}

// ---- Supervisor: the monitor loop -------------------------------------------

void Supervisor::CheckSignals() {
  if (StopRequested() && !interrupted_ && stage_ == Stage::kRunning) {
    interrupted_ = true;
    MLOG(WARNING) << "interrupted: stopping every process in order (Ctrl-C "
                     "again kills them at once)";
    BeginStop();
  }
  if (options_.stop_signals != nullptr && options_.stop_signals->load() >= 2 &&
      stage_ != Stage::kKilling && stage_ != Stage::kDone) {
    interrupted_ = true;
    MLOG(WARNING) << "interrupted again: killing every process now";
    stage_ = Stage::kKilling;
    for (Supervised& child : children_) {
      if (child.state == ChildState::kBackoff) child.state = ChildState::kDone;
      Stop(child, SIGKILL);
    }
  }
}

bool Supervisor::StepChildren() {
  bool changed = false;
  for (size_t i = 0; i < children_.size(); ++i) {
    const ChildState before = children_[i].state;
    StepChild(i);
    changed |= children_[i].state != before;
  }
  return changed;
}

bool Supervisor::ProcessRunning(size_t i) {
  Supervised& child = children_[i];
  return child.state == ChildState::kRunning && child.process &&
         !child.process->Poll();
}

void Supervisor::Stop(Supervised& child, int signal) {
  if (child.state == ChildState::kDone || child.state == ChildState::kBackoff ||
      !child.process || child.process->exited()) {
    return;
  }
  child.signalled = true;
  child.process->Signal(signal);
}

void Supervisor::SetRunning(size_t i) {
  children_[i].state = ChildState::kRunning;
  children_[i].policy.Up(Now());
}

void Supervisor::StepChild(size_t i) {
  Supervised& child = children_[i];
  switch (child.state) {
    case ChildState::kDone:
      return;
    case ChildState::kBackoff:
      if (Now() >= child.next_try_s) Restart(i);
      return;
    case ChildState::kStarting:
      StepStarting(i);
      return;
    case ChildState::kRunning:
      if (child.process->Poll()) OnExit(i);
      return;
  }
}

// A restarted site server or wanem: its ready line, then the steps that
// make it whole again (SET_PEERS; wanem's routes), each retried until the
// start deadline.
void Supervisor::StepStarting(size_t i) {
  Supervised& child = children_[i];
  if (child.process->Poll()) {
    if (child.signalled ||
        (child.process->succeeded() && child.role == Role::kSite)) {
      OnExit(i);  // stopped, or finished at once (nothing left to do)
    } else {
      OnStartFailed(i, child.process->DescribeExit());
    }
    return;
  }
  if (child.signalled) return;  // stopping: only waits for the exit
  if (!child.ready) {
    Result<std::optional<std::string>> line = child.process->TryReadReadyLine();
    if (line.ok() && *line) {
      Status taken;
      if ((**line).rfind("ready ", 0) != 0) {
        taken = UnavailableError("unexpected ready line '" + **line + "'");
      } else {
        taken = hooks_->TakeReadyLine(i, **line);
      }
      if (!taken.ok()) {
        KillAndReap(child);
        OnStartFailed(i, taken.message());
        return;
      }
      child.ready = true;
      endpoints_->Write();
    }
  }
  if (child.ready && Now() >= child.next_step_s) {
    Status whole = hooks_->CompleteStart(i);
    if (whole.ok()) {
      SetRunning(i);
      Recovered(i);
      return;
    }
    child.next_step_s = Now() + kStartStepRetryS;
    if (Now() > child.next_try_s) {
      KillAndReap(child);
      OnStartFailed(i, "started, but " + whole.message());
      return;
    }
  }
  if (!child.ready && Now() > child.next_try_s) {
    KillAndReap(child);
    OnStartFailed(i, "did not report ready within " +
                         FormatSeconds(kReadyTimeoutS) + " s");
  }
}

// SIGKILL to a child's process, and waits for its end (prompt: nothing can
// hold off SIGKILL), keeping it for its log tail.
void Supervisor::KillAndReap(Supervised& child) {
  if (!child.process) return;
  child.process->Signal(SIGKILL);
  while (!child.process->Poll()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// The latest process of child `i` ended.
void Supervisor::OnExit(size_t i) {
  Supervised& child = children_[i];
  child.ended = child.process->DescribeExit();
  if (child.role == Role::kWanem) hooks_->WanemEnded();
  const bool clean = child.process->succeeded();
  if (child.signalled || (clean && child.role != Role::kWanem)) {
    child.state = ChildState::kDone;
    SetEndpointState(child, clean ? "finished" : "stopped: " + child.ended);
    if (child.role == Role::kSite && !child.signalled) {
      MLOG(INFO) << child.name << " finished";
    }
    return;
  }
  OnFailure(i, child.ended);
}

// A process of child `i` that did not come up (or whose start steps
// failed). A port still in use is retried without counting.
void Supervisor::OnStartFailed(size_t i, const std::string& how) {
  Supervised& child = children_[i];
  child.ended = how;
  if (child.role == Role::kWanem && child.ready) hooks_->WanemEnded();
  child.ready = false;
  if (LatestLogText(child.log_path).find("ddress already in use") !=
          std::string::npos &&
      child.bind_retries < kBindRetries) {
    const double wait = kBindRetryFirstS * std::pow(2.0, child.bind_retries);
    ++child.bind_retries;
    child.policy.Uncount();  // this attempt does not count
    child.state = ChildState::kBackoff;
    child.next_try_s = Now() + wait;
    child.backoff_s = wait;
    MLOG(WARNING) << child.name << " could not bind its port yet (still in "
                  << "use); trying again in " << FormatSeconds(wait) << " s";
    return;
  }
  OnFailure(i, how);
}

// Child `i` failed (`how`): recorded and logged; restarted, let go, or the
// job fails.
void Supervisor::OnFailure(size_t i, const std::string& how) {
  Supervised& child = children_[i];
  const bool reset = child.policy.Failed(Now());
  const std::string tail =
      child.process ? child.process->LogTail(kLogTailLines) : std::string();
  if (child.outage_events.empty()) child.down_since_s = Now();
  child.outage_events.push_back(
      manifest_->AddEvent(pb::PROCESS_FAILED, child.subject, how, 0));
  std::string reason;
  const Verdict verdict = Judge(child, reset, &reason);
  const std::string note = child.name + " " + how + " (" + reason +
                           "); its log " + child.log_path + " ends with:\n" +
                           tail;
  switch (verdict) {
    case Verdict::kRestart: {
      child.backoff_s = child.policy.NextBackoffS();
      child.state = ChildState::kBackoff;
      child.next_try_s = Now() + child.backoff_s;
      SetEndpointState(child, "restarting (attempt " +
                                  std::to_string(child.policy.next_restart()) +
                                  " of " +
                                  std::to_string(options_.max_restarts) + ")");
      MLOG(WARNING) << note;
      return;
    }
    case Verdict::kLetGo:
      child.state = ChildState::kDone;
      SetEndpointState(child, "failed: " + how);
      MLOG(WARNING) << note;
      return;
    case Verdict::kFail:
      child.state = ChildState::kDone;
      SetEndpointState(child, "failed: " + how);
      MLOG(ERROR) << note;
      if (failure_.empty()) failure_ = note;  // the first one is the cause
      BeginStop();
      return;
  }
}

// Whether a failed child is started again; `reason` says what happens.
Supervisor::Verdict Supervisor::Judge(const Supervised& child, bool reset,
                                      std::string* reason) const {
  // The job is ending anyway: nothing to restart, nothing to fail.
  const bool serving_done =
      (child.role == Role::kWorker || child.role == Role::kEvaluator) &&
      SiteChildDone(child.site);
  if (child.role == Role::kWanem ? stage_ >= Stage::kStopWanem
                                 : stage_ != Stage::kRunning) {
    *reason = "not restarted: the job is stopping";
    return Verdict::kLetGo;
  }
  if (serving_done) {
    *reason = "not restarted: its site server has ended";
    return Verdict::kLetGo;
  }
  if (options_.fail_fast) {
    *reason = "not restarted: --fail-fast";
    return Verdict::kFail;
  }
  if (options_.max_restarts == 0) {
    *reason = "not restarted: fault.max_restarts is 0";
    return Verdict::kFail;
  }
  if (!child.policy.CanRestart()) {
    *reason = "not restarted: it was restarted " +
              std::to_string(child.policy.restarts()) +
              " times already, the limit (fault.max_restarts or "
              "--max-restarts)";
    return Verdict::kFail;
  }
  *reason =
      "restarting it in " + FormatSeconds(child.policy.NextBackoffS()) +
      " s: restart " + std::to_string(child.policy.next_restart()) + " of " +
      std::to_string(options_.max_restarts) +
      (reset ? " (it had run " + FormatSeconds(child.policy.last_up_s()) +
                   " s: its count of restarts starts again)"
             : "") +
      (child.role == Role::kSite ? ", from its checkpoint (--resume)" : "");
  return Verdict::kRestart;
}

// Whether the server of site `s` has ended for good.
bool Supervisor::SiteChildDone(int s) const {
  for (const Supervised& child : children_) {
    if (child.role == Role::kSite && child.site == s) {
      return child.state == ChildState::kDone;
    }
  }
  return true;
}

// Starts child `i` again (its backoff passed).
void Supervisor::Restart(size_t i) {
  Supervised& child = children_[i];
  child.policy.Restarted();
  AppendRestartSeparator(kLauncher, child.log_path, child.policy.restarts(),
                         options_.max_restarts, child.name, child.ended);
  hooks_->BeforeRestart(i);
  child.process.reset();
  Result<ChildProcess> process =
      ChildProcess::Spawn(child.name, child.argv, child.log_path, child.spawn);
  if (!process.ok()) {
    OnFailure(i, "could not be started: " + process.status().message());
    return;
  }
  child.process.emplace(std::move(*process));
  child.signalled = false;
  child.ready = false;
  MLOG(INFO) << "restarted " << child.name << " (restart "
             << child.policy.restarts() << " of " << options_.max_restarts
             << ", pid " << child.process->pid() << ")";
  if (child.role == Role::kWorker || child.role == Role::kEvaluator) {
    SetRunning(i);
    Recovered(i);
    return;
  }
  child.state = ChildState::kStarting;
  child.next_try_s = Now() + kReadyTimeoutS;
  child.next_step_s = 0;
}

// Child `i` is back: PROCESS_RESTARTED with its downtime, which is also the
// duration of the failures of the outage.
void Supervisor::Recovered(size_t i) {
  Supervised& child = children_[i];
  const double down_s = Now() - child.down_since_s;
  manifest_->EndOutage(child.outage_events);
  child.outage_events.clear();
  child.bind_retries = 0;
  manifest_->AddEvent(
      pb::PROCESS_RESTARTED, child.subject,
      "restart " + std::to_string(child.policy.restarts()) + " of " +
          std::to_string(options_.max_restarts) + " after a backoff of " +
          FormatSeconds(child.backoff_s) + " s" + hooks_->RecoveryNote(i),
      down_s);
  SetEndpointState(child, "running");
  MLOG(INFO) << child.name << " is back after " << FormatSeconds(down_s)
             << " s down";
}

void Supervisor::SetEndpointState(const Supervised& child,
                                  const std::string& state) {
  // endpoints.json lists the processes that serve metrics.
  if (child.role == Role::kWorker || child.role == Role::kEvaluator) return;
  endpoints_->SetState(child.name, state);
  endpoints_->Write();
}

// ---- Supervisor: the ordered stop -------------------------------------------

// The job must stop now (interrupt, a failure past the restart limit):
// workers and evaluators first (SIGTERM), pending restarts cancelled.
void Supervisor::BeginStop() {
  if (stage_ != Stage::kRunning) return;
  MLOG(INFO) << "stopping workers (up to " << FormatSeconds(kWorkerGraceS)
             << " s), then site servers with their final flush (up to "
             << FormatSeconds(kSiteGraceS) << " s), then wanem";
  stage_ = Stage::kStopWorkers;
  stop_deadline_s_ = Now() + kWorkerGraceS;
  workers_signal_ = SIGTERM;
  for (Supervised& child : children_) {
    if (child.role == Role::kWanem) continue;
    if (child.state == ChildState::kBackoff) {
      child.state = ChildState::kDone;
      SetEndpointState(child, "failed: " + child.ended);
    }
    if (child.role == Role::kWorker || child.role == Role::kEvaluator) {
      Stop(child, SIGTERM);
    }
  }
}

bool Supervisor::AllDone(Role role) const {
  return std::all_of(
      children_.begin(), children_.end(), [role](const Supervised& child) {
        return child.role != role || child.state == ChildState::kDone;
      });
}

bool Supervisor::AllClientsDone() const {
  return AllDone(Role::kWorker) && AllDone(Role::kEvaluator);
}

// Names of the children of `role` not done yet.
std::string Supervisor::Remaining(Role role) const {
  std::string names;
  for (const Supervised& child : children_) {
    if (child.role == role && child.state != ChildState::kDone) {
      names += (names.empty() ? "" : ", ") + child.name;
    }
  }
  return names;
}

void Supervisor::Escalate(Role role, int signal, double now) {
  for (Supervised& child : children_) {
    if (child.role == role) Stop(child, signal);
  }
  stop_deadline_s_ = now + kKillGraceS;
}

void Supervisor::AdvanceStop() {
  const double now = Now();
  switch (stage_) {
    case Stage::kRunning:
      if (!AllDone(Role::kSite)) return;
      // Every site finished the job and told its workers (and
      // evaluators) to stop.
      stage_ = Stage::kStopWorkers;
      stop_deadline_s_ = now + kWorkerGraceS;
      workers_signal_ = 0;
      for (Supervised& child : children_) {
        if ((child.role == Role::kWorker || child.role == Role::kEvaluator) &&
            child.state == ChildState::kBackoff) {
          child.state = ChildState::kDone;
        }
      }
      return;
    case Stage::kStopWorkers:
      if (AllClientsDone()) {
        stage_ = Stage::kStopSites;
        stop_deadline_s_ = now + kSiteGraceS;
        if (!AllDone(Role::kSite)) {
          MLOG(INFO) << "workers stopped; stopping the site servers: final "
                        "flush to their peers and summary (up to "
                     << FormatSeconds(kSiteGraceS) << " s)";
        }
        for (Supervised& child : children_) {
          if (child.role != Role::kSite) continue;
          if (child.state == ChildState::kBackoff) {
            child.state = ChildState::kDone;
          }
          Stop(child, SIGTERM);
        }
      } else if (now > stop_deadline_s_) {
        workers_signal_ = workers_signal_ == 0 ? SIGTERM : SIGKILL;
        const std::string evaluators = Remaining(Role::kEvaluator);
        MLOG(WARNING) << (workers_signal_ == SIGTERM ? "SIGTERM" : "SIGKILL")
                      << " to workers still running: "
                      << Remaining(Role::kWorker)
                      << (evaluators.empty() ? "" : "; " + evaluators);
        Escalate(Role::kWorker, workers_signal_, now);
        Escalate(Role::kEvaluator, workers_signal_, now);
      }
      return;
    case Stage::kStopSites:
      if (AllDone(Role::kSite)) {
        stage_ = Stage::kStopWanem;
        stop_deadline_s_ = now + kKillGraceS;
        StopWanem();
      } else if (now > stop_deadline_s_) {
        MLOG(ERROR) << "site servers did not finish within "
                    << FormatSeconds(kSiteGraceS) << " s: SIGKILL to "
                    << Remaining(Role::kSite);
        Escalate(Role::kSite, SIGKILL, now);
      }
      return;
    case Stage::kStopWanem:
      if (AllDone(Role::kWanem)) {
        stage_ = Stage::kDone;
      } else if (now > stop_deadline_s_) {
        Escalate(Role::kWanem, SIGKILL, now);
      }
      return;
    case Stage::kKilling:
      if (AllDone(Role::kSite) && AllClientsDone() && AllDone(Role::kWanem)) {
        stage_ = Stage::kDone;
      }
      return;
    case Stage::kDone:
      return;
  }
}

// Every site server is done: wanem's counters are final. Read them, then
// stop it — last, so that the sites' final flushes could cross.
void Supervisor::StopWanem() {
  if (!wanem_) return;
  Supervised& wanem = children_[*wanem_];
  if (wanem.state == ChildState::kBackoff) {
    wanem.state = ChildState::kDone;
    return;
  }
  if (wanem.state == ChildState::kDone) return;
  MLOG(INFO) << "site servers done; reading wanem's final counters and "
                "stopping it";
  if (wanem.state == ChildState::kRunning) hooks_->ReadFinalWanCounters();
  Stop(wanem, SIGTERM);
}

}  // namespace meridian
