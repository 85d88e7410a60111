#include "meridian/launcher.h"

#include <google/protobuf/text_format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "meridian/clock.h"
#include "meridian/config.h"
#include "meridian/log.h"
#include "meridian/report.h"
#include "meridian/security.h"
#include "meridian/sync.h"
#include "meridian/transport.h"
#include "meridian/wan_control.h"
#include "runtime/process.h"

namespace meridian {
namespace {

// How long a site server (or wanem) may take to load its data and bind.
constexpr auto kReadyTimeout = std::chrono::seconds(120);
constexpr double kReadyTimeoutS = 120.0;
// The ordered stop. Workers get this long to leave (told by their sites,
// or after SIGTERM); site servers, after SIGTERM, this long to finish:
// drain their workers (fault: 5 s), send their final flush and wait up to
// 60 s for their peers' (kSyncFinishTimeoutS of the site server), evaluate
// once more and write their summary. Anyone still running after SIGTERM
// and kKillGraceS more gets SIGKILL.
constexpr double kWorkerGraceS = 15.0;
constexpr double kSiteGraceS = 100.0;
constexpr double kKillGraceS = 10.0;
// Restart backoff ceiling (fault.restart_backoff_s doubles up to it).
constexpr double kMaxBackoffS = 30.0;
// A restarted site server or wanem whose port is still taken is started
// again this many times, 0.5 s, 1 s, 2 s ... apart, without counting as a
// restart.
constexpr int kBindRetries = 5;
constexpr double kBindRetryFirstS = 0.5;
// Between attempts of the steps after a restarted child's ready line
// (SET_PEERS, re-adding wanem's routes).
constexpr double kStartStepRetryS = 0.5;
constexpr auto kMonitorInterval = std::chrono::milliseconds(100);
constexpr double kProgressPeriodS = 1.0;
constexpr double kPlainProgressPeriodS = 5.0;
// wanem's counters are read this often, so a crash loses at most about
// this much of its count.
constexpr double kWanPollPeriodS = 1.0;
// A site whose status requests have gone unanswered this long is shown as
// down on the progress line.
constexpr double kDownAfterS = 2.0;
constexpr auto kStatusTimeout = std::chrono::milliseconds(300);
constexpr auto kSetPeersTimeout = std::chrono::seconds(10);
constexpr auto kControlTimeout = std::chrono::seconds(2);
constexpr int kLogTailLines = 8;
// Starts the line written into a child's log before each restart.
constexpr const char* kSeparatorPrefix = "===== meridian run: ";

std::atomic<bool> g_stop_signal{false};
std::atomic<int> g_stop_signals{0};

void OnStopSignal(int) {
  g_stop_signal.store(true);
  g_stop_signals.fetch_add(1);
}

std::string SelfExecutable() {
  std::error_code error;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string("meridian") : path.string();
}

std::string LocalTimeNow() {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &local);
  return stamp;
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", s);
  return buf;
}

// Every site on one line (logs, pipes): "[ t s] a: ...  | b: ...".
std::string FormatProgress(
    const std::vector<std::pair<std::string, std::string>>& sites,
    double wall_s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "[%6.1f s]", wall_s);
  std::string line = buf;
  for (size_t i = 0; i < sites.size(); ++i) {
    line += (i == 0 ? " " : "  | ") + sites[i].first + ": " + sites[i].second;
  }
  return line;
}

// One line per site (a terminal), names aligned, the time on the first.
std::vector<std::string> FormatProgressLines(
    const std::vector<std::pair<std::string, std::string>>& sites,
    double wall_s) {
  size_t width = 0;
  for (const auto& site : sites) width = std::max(width, site.first.size());
  char stamp[32];
  std::snprintf(stamp, sizeof(stamp), "[%6.1f s]", wall_s);
  std::vector<std::string> lines;
  for (size_t i = 0; i < sites.size(); ++i) {
    std::string name = sites[i].first;
    name.resize(width, ' ');
    lines.push_back(
        (i == 0 ? std::string(stamp) : std::string(std::strlen(stamp), ' ')) +
        " " + name + "  " + sites[i].second);
  }
  return lines;
}

// Removes the "metrics=HOST:PORT" field from the fields of a ready line
// and returns its value ("" without one).
std::string TakeMetricsField(std::string* fields) {
  const size_t at = fields->find("metrics=");
  if (at == std::string::npos) return "";
  size_t end = fields->find(' ', at);
  if (end == std::string::npos) end = fields->size();
  std::string value = fields->substr(at + 8, end - at - 8);
  fields->erase(at, end - at);
  while (!fields->empty() && fields->back() == ' ') fields->pop_back();
  return value;
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

// One child process the launcher supervises, across its restarts.
enum class Role { kSite, kWorker, kWanem };

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
  std::string log_path;
  std::optional<ChildProcess> process;  // the latest process
  ChildState state = ChildState::kStarting;
  uint32_t restarts = 0;    // processes started after the first
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

// What the launcher does with a child whose process ended abnormally.
enum class Verdict {
  kRestart,  // start it again after the backoff
  kFail,     // the job fails (fail-fast, restart limit)
  kLetGo,    // the job is ending anyway: record it, nothing more
};

// A site server on the progress line.
struct SiteProgress {
  std::string name;
  size_t child = 0;  // index into the supervised children
  std::unique_ptr<RpcClient> client;
  std::optional<pb::SiteStatus> status;
  int64_t clock = 0;         // from the status reply's header
  double last_answer_s = 0;  // when a status request last answered
  bool answering = true;     // the last status request answered
};

// A wanem route the launcher added: re-added with the same listen address
// when wanem restarts, so the sites' connections find it again.
struct RouteRecord {
  std::string link;
  std::string from_site;
  std::string listen;  // HOST:PORT as bound by the first wanem
  std::string forward;
};

// The stop of the job, in order. kRunning: children are supervised
// (restarted); kStopWorkers: workers leave (told by their sites, or
// SIGTERM); kStopSites: site servers finish (SIGTERM: final flush,
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

class JobRun {
 public:
  JobRun(const pb::JobConfig& job, const RunOptions& options)
      : job_(job),
        options_(options),
        max_restarts_(
            options.max_restarts.value_or(job.fault().max_restarts())),
        first_backoff_s_(job.fault().restart_backoff_s()) {}

  Result<pb::RunReport> Run() {
    MERIDIAN_RETURN_IF_ERROR(PrepareOutDir());
    MERIDIAN_RETURN_IF_ERROR(PrepareSecurity());
    SaveManifest();
    if (Status started = StartChildren(); !started.ok()) {
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
    Monitor();
    ForgetEphemeralKeys();
    return Report();
  }

 private:
  // ---- time, files ---------------------------------------------------------

  double Now() const { return wall_.ElapsedSeconds(); }

  bool StopRequested() const {
    return options_.stop_requested != nullptr &&
           options_.stop_requested->load();
  }

  std::string SummaryPath(const std::string& site) const {
    return options_.out_dir + "/site-" + site + ".json";
  }
  std::string ManifestPath() const { return options_.out_dir + "/run.json"; }

  // OUT/logs/; site summaries of an earlier run go. A fresh run starts a
  // new manifest and deletes OUT/checkpoints/ (an earlier run's checkpoints
  // must never be resumed by accident); a resumed one continues the
  // manifest and keeps them.
  Status PrepareOutDir() {
    std::error_code error;
    std::filesystem::create_directories(options_.out_dir + "/logs", error);
    if (error) {
      return InvalidArgumentError("cannot create output directory '" +
                                  options_.out_dir + "': " + error.message());
    }
    for (const pb::SiteConfig& site : job_.site()) {
      std::filesystem::remove(SummaryPath(site.name()), error);
    }
    if (options_.resume) return ContinueManifest();
    std::filesystem::remove_all(options_.out_dir + "/checkpoints", error);
    if (error) {
      return InvalidArgumentError(
          "cannot delete the checkpoints of an earlier "
          "run in '" +
          options_.out_dir + "/checkpoints': " + error.message());
    }
    // Traffic files of an earlier run's emulator restarts.
    std::vector<std::filesystem::path> stale;
    for (const auto& entry :
         std::filesystem::directory_iterator(options_.out_dir, error)) {
      if (entry.path().filename().string().rfind("traffic.wanem-", 0) == 0) {
        stale.push_back(entry.path());
      }
    }
    for (const auto& path : stale) std::filesystem::remove(path, error);
    manifest_.set_job(job_.name());
    manifest_.set_config_path(
        std::filesystem::absolute(options_.config_path, error).string());
    manifest_.set_working_dir(std::filesystem::current_path(error).string());
    manifest_.set_started_unix_s(UnixSeconds());
    return Status::Ok();
  }

  // `--resume`: the manifest of the run goes on. Its last emulator process
  // died with its launcher, within a poll period of its last count.
  Status ContinueManifest() {
    MERIDIAN_RETURN_IF_ERROR(ReadJsonFile(ManifestPath(), &manifest_));
    manifest_.set_resumes(manifest_.resumes() + 1);
    if (manifest_.wanem_size() > 0) {
      pb::WanIncarnation* last =
          manifest_.mutable_wanem(manifest_.wanem_size() - 1);
      if (!last->final() && last->uncounted_s() == 0) {
        last->set_uncounted_s(kWanPollPeriodS);
      }
      KeepTrafficCsv(last, manifest_.wanem_size());
    }
    std::error_code error;
    const std::string here = std::filesystem::current_path(error).string();
    if (!manifest_.working_dir().empty() && manifest_.working_dir() != here) {
      MLOG(WARNING) << "the run started in " << manifest_.working_dir()
                    << "; relative paths of its job file now start from "
                    << here;
    }
    AddEvent(pb::JOB_RESUMED, "job",
             "meridian run --resume " + options_.out_dir + " (resume " +
                 std::to_string(manifest_.resumes()) +
                 "): site servers continue from their checkpoints, workers "
                 "start fresh",
             0);
    MLOG(INFO) << "resuming the run in " << options_.out_dir << " (resume "
               << manifest_.resumes() << ", started "
               << Seconds(UnixSeconds() - manifest_.started_unix_s())
               << " s ago)";
    return Status::Ok();
  }

  // A new wanem process truncates traffic.csv: the samples of the process
  // `incarnation` describes (number `number`, from 1) move to a file of
  // their own first.
  void KeepTrafficCsv(pb::WanIncarnation* incarnation, int number) {
    if (incarnation->traffic_csv() != "traffic.csv") return;
    const std::string name = "traffic.wanem-" + std::to_string(number) + ".csv";
    std::error_code error;
    std::filesystem::rename(options_.out_dir + "/traffic.csv",
                            options_.out_dir + "/" + name, error);
    if (error) {
      MLOG(WARNING) << "cannot keep the traffic samples of wanem process "
                    << number << ": " << error.message();
      incarnation->clear_traffic_csv();
      return;
    }
    incarnation->set_traffic_csv(name);
  }

  // run.json, atomically. A failure is logged once: the run goes on (only
  // a later --resume needs the file).
  void SaveManifest() {
    Status saved = WriteJsonFile(manifest_, ManifestPath());
    if (!saved.ok() && !manifest_warned_) {
      manifest_warned_ = true;
      MLOG(WARNING) << "cannot write " << ManifestPath() << ": " << saved;
    }
  }

  // Records a fault event of the launcher (site ""); returns its index.
  int AddEvent(pb::FaultKind kind, const std::string& subject,
               const std::string& detail, double duration_s) {
    pb::FaultEvent* event = manifest_.add_events();
    event->set_kind(kind);
    event->set_site("");
    event->set_subject(subject);
    event->set_unix_s(UnixSeconds());
    event->set_t_s(event->unix_s() - manifest_.started_unix_s());
    event->set_duration_s(duration_s);
    event->set_detail(detail);
    SaveManifest();
    return manifest_.events_size() - 1;
  }

  // CURVE between site servers (security.h). A job that lists the sites'
  // public keys runs as is: each site reads <security.key_dir>/<site>.key.
  // A job without keys gets ephemeral key pairs in OUT/keys/, and every
  // role runs the derived job file OUT/job.pbtxt that lists them.
  Status PrepareSecurity() {
    std::vector<int> syncing;
    for (int s = 0; s < job_.site_size(); ++s) {
      if (HasServer(job_.site(s)) && job_.sync().kind() != pb::SYNC_NONE &&
          !RoleOf(job_, s).Peers().empty()) {
        syncing.push_back(s);
      }
    }
    std::vector<int> remote_workers;  // sites whose workers cross the WAN
    for (int s = 0; s < job_.site_size(); ++s) {
      if (ServingSite(job_, s) != s) remote_workers.push_back(s);
    }
    if (syncing.empty() && remote_workers.empty()) return Status::Ok();
    if (!job_.security().curve()) {
      MLOG(WARNING) << "cross-site links are plaintext: security { curve: "
                       "false }";
      return Status::Ok();
    }
    for (int s : remote_workers) {
      MLOG(WARNING) << "workers of site '" << job_.site(s).name()
                    << "' reach site '" << job_.site(s).server_site()
                    << "''s server in plaintext (server_site, the "
                       "BSP-over-WAN baseline, is not encrypted)";
    }
    if (syncing.empty()) return Status::Ok();
    // One machine, one key file per site: a key file meant for a single
    // role must not reach every site.
    if (std::getenv(kSecretKeyEnv) != nullptr) {
      MLOG(WARNING) << "ignoring $" << kSecretKeyEnv
                    << ": each site reads its own key file";
      ::unsetenv(kSecretKeyEnv);
    }
    const bool listed = std::any_of(syncing.begin(), syncing.end(), [&](int s) {
      return job_.site(s).has_curve_public_key();
    });
    if (listed) {
      if (job_.security().key_dir().empty()) {
        return FailedPreconditionError(
            "the job lists the sites' curve_public_key but no security { "
            "key_dir }: `meridian run` reads each site's secret key from "
            "<key_dir>/<site>.key");
      }
      MLOG(INFO) << "CURVE on: links between site servers are encrypted; "
                    "sites read their secret keys from "
                 << job_.security().key_dir();
      return Status::Ok();
    }
    std::error_code error;
    const std::string key_dir =
        std::filesystem::absolute(options_.out_dir + "/keys", error).string();
    pb::JobConfig derived = job_;
    for (int s : syncing) {
      const std::string& name = job_.site(s).name();
      // Ephemeral: the keys of an earlier run into this directory go.
      std::filesystem::remove(key_dir + "/" + name + ".key", error);
      std::filesystem::remove(key_dir + "/" + name + ".pub", error);
      MERIDIAN_ASSIGN_OR_RETURN(CurveKeyPair pair, GenerateCurveKeyPair());
      MERIDIAN_RETURN_IF_ERROR(WriteCurveKeyFiles(key_dir, name, pair));
      ephemeral_keys_.push_back(key_dir + "/" + name + ".key");
      derived.mutable_site(s)->set_curve_public_key(pair.public_key);
    }
    derived.mutable_security()->set_key_dir(key_dir);
    std::string text;
    if (!google::protobuf::TextFormat::PrintToString(derived, &text)) {
      return InternalError("cannot print the derived job file");
    }
    std::string path = options_.out_dir + "/job.pbtxt";
    if (std::filesystem::equivalent(options_.config_path, path, error)) {
      path = options_.out_dir + "/job-curve.pbtxt";  // never the input
    }
    {
      std::ofstream out(path, std::ios::trunc);
      out << "# Written by `meridian run` from " << options_.config_path
          << ": the job with ephemeral CURVE keys (secret halves in " << key_dir
          << ").\n"
          << text;
      if (!out) return InvalidArgumentError("cannot write '" + path + "'");
    }
    options_.config_path = path;
    MLOG(INFO) << "CURVE on: generated ephemeral key pairs for "
               << syncing.size() << " sites in " << key_dir
               << "; every role runs " << path << " (the job plus their "
               << "public keys)";
    return Status::Ok();
  }

  // Every child has exited: the secret halves of ephemeral keys go (the
  // public halves stay with the derived job file).
  void ForgetEphemeralKeys() {
    std::error_code error;
    for (const std::string& path : ephemeral_keys_) {
      std::filesystem::remove(path, error);
    }
    ephemeral_keys_.clear();
  }

  // ---- start ---------------------------------------------------------------

  Status StartChildren() {
    binary_ = options_.binary.empty() ? SelfExecutable() : options_.binary;
    MERIDIAN_RETURN_IF_ERROR(StartSiteServers());
    MERIDIAN_RETURN_IF_ERROR(StartWanem());
    WriteEndpoints();
    MERIDIAN_RETURN_IF_ERROR(IntroducePeers());
    const std::string logs = options_.out_dir + "/logs/";
    size_t workers = 0;
    for (int s = 0; s < job_.site_size(); ++s) {
      const pb::SiteConfig& site = job_.site(s);
      MERIDIAN_ASSIGN_OR_RETURN(const std::string endpoint, WorkerEndpoint(s));
      for (uint32_t w = 0; w < SiteWorkerCount(site); ++w) {
        Supervised child;
        child.role = Role::kWorker;
        child.name =
            "worker " + std::to_string(w) + " of site '" + site.name() + "'";
        child.subject = site.name() + "/" + std::to_string(w);
        child.site = ServingSite(job_, s);
        child.argv = {
            binary_,     "worker",    "--config", options_.config_path,
            "--site",    site.name(), "--index",  std::to_string(w),
            "--connect", endpoint};
        child.log_path =
            logs + "worker-" + site.name() + "-" + std::to_string(w) + ".log";
        MERIDIAN_ASSIGN_OR_RETURN(
            ChildProcess process,
            ChildProcess::Spawn(child.name, child.argv, child.log_path));
        child.process.emplace(std::move(process));
        child.state = ChildState::kRunning;
        children_.push_back(std::move(child));
        ++workers;
      }
    }
    MLOG(INFO) << "started " << progress_.size() << " site servers and "
               << workers << " workers; logs in " << logs;
    if (!options_.fail_fast && max_restarts_ > 0) {
      MLOG(INFO) << "a child that fails is restarted up to " << max_restarts_
                 << " times (fault.max_restarts; --fail-fast stops the job "
                    "at the first failure)";
    }
    return Status::Ok();
  }

  // Starts a server for every site that runs one and waits until each
  // listens; records their endpoints. A restart reuses those endpoints.
  Status StartSiteServers() {
    const std::string logs = options_.out_dir + "/logs/";
    server_endpoints_.assign(job_.site_size(), "");
    mirror_endpoints_.assign(job_.site_size(), "");
    std::vector<size_t> started;
    for (int s = 0; s < job_.site_size(); ++s) {
      const pb::SiteConfig& site = job_.site(s);
      if (!HasServer(site)) continue;
      Supervised child;
      child.role = Role::kSite;
      child.name = "site server '" + site.name() + "'";
      child.subject = "site '" + site.name() + "'";
      child.site = s;
      child.argv = {binary_,         "site",
                    "--config",      options_.config_path,
                    "--site",        site.name(),
                    "--bind",        "tcp://127.0.0.1:*",
                    "--mirror-bind", "tcp://127.0.0.1:*",
                    "--out",         options_.out_dir,
                    "--ready-fd",    std::to_string(kReadyFd),
                    "--metrics",     "127.0.0.1:0"};
      if (options_.resume) child.argv.push_back("--resume");
      child.log_path = logs + "site-" + site.name() + ".log";
      MERIDIAN_ASSIGN_OR_RETURN(
          ChildProcess process,
          ChildProcess::Spawn(child.name, child.argv, child.log_path));
      child.process.emplace(std::move(process));
      started.push_back(children_.size());
      children_.push_back(std::move(child));
    }
    // Every server loads its data at once; wait for their ready lines
    // together (an interrupt meanwhile stops the start).
    const double deadline = Now() + kReadyTimeoutS;
    for (size_t i : started) {
      Supervised& server = children_[i];
      std::optional<std::string> line;
      std::string problem;
      while (!line && problem.empty()) {
        Result<std::optional<std::string>> read =
            server.process->TryReadReadyLine();
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
        for (int wait = 0; wait < 20 && !server.process->Poll(); ++wait) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return UnavailableError(
            server.name + " did not start (" +
            (line ? "unexpected '" + *line + "'" : problem) + "; " +
            server.process->DescribeExit() + "); its log " + server.log_path +
            " ends with:\n" + server.process->LogTail(kLogTailLines));
      }
      MERIDIAN_RETURN_IF_ERROR(OnSiteReady(i, *line));
      server.state = ChildState::kRunning;
    }
    return Status::Ok();
  }

  // A site server's ready line: "ready <worker endpoint> [<mirror
  // endpoint>] [metrics=<address>]". The first records its endpoints and
  // fixes them in its restart command (so workers, peers and wanem routes
  // reach a restarted server where they reached the first); later ones
  // must match.
  Status OnSiteReady(size_t i, const std::string& line) {
    Supervised& server = children_[i];
    const int s = server.site;
    std::string rest = line.substr(6);
    const std::string metrics = TakeMetricsField(&rest);
    std::istringstream fields(rest);
    std::string endpoint, mirror;
    fields >> endpoint >> mirror;
    const bool first = server_endpoints_[s].empty();
    if (first) {
      server_endpoints_[s] = endpoint;
      mirror_endpoints_[s] = mirror;
      auto set_flag = [&](const std::string& flag, const std::string& value) {
        auto it = std::find(server.argv.begin(), server.argv.end(), flag);
        if (it != server.argv.end() && it + 1 != server.argv.end()) {
          *(it + 1) = value;
        }
      };
      set_flag("--bind", endpoint);
      if (!mirror.empty()) set_flag("--mirror-bind", mirror);
      if (std::find(server.argv.begin(), server.argv.end(), "--resume") ==
          server.argv.end()) {
        server.argv.push_back("--resume");
      }
      SiteProgress progress;
      progress.name = job_.site(s).name();
      progress.child = i;
      pb::Endpoint self;
      self.set_site(job_.site(s).name());
      self.set_role(pb::ROLE_LAUNCHER);
      progress.client =
          std::make_unique<RpcClient>(context_, server_endpoints_[s], self);
      progress.last_answer_s = Now();
      progress_.push_back(std::move(progress));
    } else if (endpoint != server_endpoints_[s] ||
               (!mirror_endpoints_[s].empty() &&
                mirror != mirror_endpoints_[s])) {
      return FailedPreconditionError(
          server.name + " came back on " + endpoint + " " + mirror +
          " instead of " + server_endpoints_[s] + " " + mirror_endpoints_[s]);
    }
    SetEndpoint(server, "site", job_.site(s).name(), metrics, "running");
    return Status::Ok();
  }

  // Records where a child serves its metrics and its state ("" address:
  // keep the one known).
  void SetEndpoint(const Supervised& child, const std::string& role,
                   const std::string& site, const std::string& address,
                   const std::string& state) {
    pb::ProcessEndpoint* entry = nullptr;
    for (pb::ProcessEndpoint& e : *endpoints_.mutable_process()) {
      if (e.name() == child.name) entry = &e;
    }
    if (entry == nullptr) {
      if (address.empty()) return;  // no metrics: nothing to list
      entry = endpoints_.add_process();
      entry->set_name(child.name);
      entry->set_role(role);
      entry->set_site(site);
    }
    if (!address.empty()) {
      entry->set_metrics_address(address);
      entry->set_metrics_url("http://" + address + "/metrics");
    }
    entry->set_state(state);
  }

  // Only the state of a listed child.
  void SetEndpointState(const Supervised& child, const std::string& state) {
    if (child.role == Role::kWorker) return;
    for (pb::ProcessEndpoint& e : *endpoints_.mutable_process()) {
      if (e.name() == child.name) e.set_state(state);
    }
    WriteEndpoints();
  }

  // OUT/endpoints.json: every child's metrics endpoint (`meridian top
  // --run OUT` reads it on every refresh).
  void WriteEndpoints() {
    endpoints_.set_job(job_.name());
    Status written =
        WriteJsonFile(endpoints_, options_.out_dir + "/endpoints.json");
    if (!written.ok()) MLOG(WARNING) << written;
  }

  // Tells every site server where its sync peers listen; keeps each
  // request to tell a restarted server again.
  Status IntroducePeers() {
    for (const SiteProgress& progress : progress_) {
      const int s = children_[progress.child].site;
      if (mirror_endpoints_[s].empty()) continue;  // syncs with nobody
      pb::Header request;
      request.set_type(pb::SET_PEERS);
      pb::Peers* peers = request.mutable_peers();
      for (int peer : RoleOf(job_, s).Peers()) {
        pb::Peer* entry = peers->add_peer();
        entry->set_site(job_.site(peer).name());
        MERIDIAN_ASSIGN_OR_RETURN(std::string endpoint,
                                  MirrorEndpoint(s, peer));
        entry->set_endpoint(std::move(endpoint));
      }
      peers_requests_[s] = request;
      MERIDIAN_RETURN_IF_ERROR(SendPeers(s).WithContext("introducing peers"));
    }
    return Status::Ok();
  }

  Status SendPeers(int s) {
    auto request = peers_requests_.find(s);
    if (request == peers_requests_.end()) return Status::Ok();
    for (SiteProgress& progress : progress_) {
      if (children_[progress.child].site != s) continue;
      Result<Envelope> reply =
          progress.client->Call(request->second, {}, kSetPeersTimeout);
      if (!reply.ok()) return reply.status();
      if (reply->header.type() == pb::ERROR) {
        return FailedPreconditionError(
            "site '" + job_.site(s).name() +
            "' refused its peers: " + reply->header.error().message());
      }
    }
    return Status::Ok();
  }

  // Where site `from`'s server sends its updates for site `to`: through a
  // wanem route when the WAN is emulated.
  Result<std::string> MirrorEndpoint(int from, int to) {
    return Route(from, to, mirror_endpoints_[to]);
  }

  // Where the workers of site `s` connect: their serving site's server,
  // across the WAN when it is another site's.
  Result<std::string> WorkerEndpoint(int s) {
    const int serving = ServingSite(job_, s);
    if (serving == s) return server_endpoints_[s];
    return Route(s, serving, server_endpoints_[serving]);
  }

  // Whether any two sites exchange traffic (a site using another's server,
  // or sites that sync).
  bool HasCrossSiteTraffic() const {
    for (int s = 0; s < job_.site_size(); ++s) {
      if (ServingSite(job_, s) != s) return true;
      if (HasServer(job_.site(s)) && job_.sync().kind() != pb::SYNC_NONE &&
          !RoleOf(job_, s).Peers().empty()) {
        return true;
      }
    }
    return false;
  }

  // Starts `meridian wanem` with every link of the job; routes are added
  // as the pairs of sites that talk are known. Every cross-site byte then
  // crosses it and is counted (shaped unless wan.emulate is false).
  Status StartWanem() {
    if (!HasCrossSiteTraffic()) return Status::Ok();
    Supervised child;
    child.role = Role::kWanem;
    child.name = "wanem";
    child.subject = "wanem";
    child.argv = {binary_,
                  "wanem",
                  "--config",
                  options_.config_path,
                  "--dynamic-routes",
                  "--control",
                  "tcp://127.0.0.1:0",
                  "--traffic-csv",
                  options_.out_dir + "/traffic.csv",
                  "--ready-fd",
                  std::to_string(kReadyFd),
                  "--metrics",
                  "127.0.0.1:0"};
    child.log_path = options_.out_dir + "/logs/wanem.log";
    MERIDIAN_ASSIGN_OR_RETURN(
        ChildProcess process,
        ChildProcess::Spawn(child.name, child.argv, child.log_path));
    child.process.emplace(std::move(process));
    wanem_ = children_.size();
    children_.push_back(std::move(child));
    Supervised& wanem = children_[*wanem_];
    Result<std::string> line = wanem.process->ReadReadyLine(kReadyTimeout);
    if (!line.ok() || line->rfind("ready ", 0) != 0) {
      wanem.process->Poll();
      return UnavailableError(
          "wanem did not start (" +
          (line.ok() ? "unexpected '" + *line + "'" : line.status().message()) +
          "; " + wanem.process->DescribeExit() + "); its log " +
          wanem.log_path + " ends with:\n" +
          wanem.process->LogTail(kLogTailLines));
    }
    OnWanemReady(*line);
    wanem.state = ChildState::kRunning;
    MLOG(INFO) << "wanem shapes every link between sites; control at "
               << wan_control_->endpoint();
    return Status::Ok();
  }

  // wanem's ready line: "ready <control endpoint> [metrics=<address>]".
  // A new process: a new entry of the manifest, counting from 0.
  void OnWanemReady(const std::string& line) {
    std::string rest = line.substr(6);
    const std::string metrics = TakeMetricsField(&rest);
    SetEndpoint(children_[*wanem_], "wanem", "", metrics, "running");
    for (pb::ProcessEndpoint& entry : *endpoints_.mutable_process()) {
      if (entry.name() == children_[*wanem_].name) {
        entry.set_control_address(rest);
      }
    }
    WriteEndpoints();
    wan_control_ = std::make_unique<wan::ControlClient>(rest, kControlTimeout);
    pb::WanIncarnation* incarnation = manifest_.add_wanem();
    incarnation->set_started_unix_s(UnixSeconds());
    incarnation->set_traffic_csv("traffic.csv");
    SaveManifest();
    routes_added_.assign(routes_.size(), false);
    next_wan_poll_s_ = Now() + kWanPollPeriodS;
  }

  // The endpoint site `from` uses to reach `target` (a ZeroMQ tcp endpoint
  // of site `to`): a wanem listener forwarding to it, or `target` itself
  // without wanem. The route is recorded to be re-added on a restart.
  Result<std::string> Route(int from, int to, const std::string& target) {
    if (!wan_control_) return target;
    const std::string prefix = "tcp://";
    if (target.rfind(prefix, 0) != 0) {
      return InvalidArgumentError("cannot route '" + target +
                                  "' through wanem: only tcp:// endpoints");
    }
    const int a = std::min(from, to);
    const int b = std::max(from, to);
    RouteRecord route;
    route.link = job_.site(a).name() + "-" + job_.site(b).name();
    route.from_site = job_.site(from).name();
    route.forward = target.substr(prefix.size());
    MERIDIAN_ASSIGN_OR_RETURN(
        route.listen, wan_control_->AddRoute(route.link, route.from_site,
                                             "127.0.0.1:0", route.forward));
    routes_.push_back(route);
    routes_added_.push_back(true);
    return prefix + route.listen;
  }

  // ---- supervision ---------------------------------------------------------

  void Monitor() {
    while (stage_ != Stage::kDone) {
      CheckSignals();
      for (size_t i = 0; i < children_.size(); ++i) Step(i);
      AdvanceStop();
      if (stage_ == Stage::kRunning || stage_ == Stage::kStopWorkers ||
          stage_ == Stage::kStopSites) {
        PollWanem();
      }
      if (stage_ == Stage::kRunning) ShowProgress();
      std::this_thread::sleep_for(kMonitorInterval);
    }
  }

  void CheckSignals() {
    if (StopRequested() && !interrupted_ && stage_ == Stage::kRunning) {
      interrupted_ = true;
      MLOG(WARNING) << "interrupted: stopping every process in order (Ctrl-C "
                       "again kills them at once)";
      BeginStop();
    }
    if (options_.stop_signals != nullptr &&
        options_.stop_signals->load() >= 2 && stage_ != Stage::kKilling &&
        stage_ != Stage::kDone) {
      interrupted_ = true;
      MLOG(WARNING) << "interrupted again: killing every process now";
      stage_ = Stage::kKilling;
      for (Supervised& child : children_) {
        if (child.state == ChildState::kBackoff)
          child.state = ChildState::kDone;
        Stop(child, SIGKILL);
      }
    }
  }

  // Sends `signal` to a child's live process; its end is then no failure.
  void Stop(Supervised& child, int signal) {
    if (child.state == ChildState::kDone ||
        child.state == ChildState::kBackoff || !child.process ||
        child.process->exited()) {
      return;
    }
    child.signalled = true;
    child.process->Signal(signal);
  }

  void Step(size_t i) {
    const ChildState before = children_[i].state;
    StepChild(i);
    // A change was logged: the live block is drawn again below the log
    // lines instead of over them.
    if (children_[i].state != before) progress_lines_ = 0;
  }

  void StepChild(size_t i) {
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
  // make it whole again (SET_PEERS; wanem's routes), each retried until
  // the start deadline.
  void StepStarting(size_t i) {
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
      Result<std::optional<std::string>> line =
          child.process->TryReadReadyLine();
      if (line.ok() && *line) {
        Status taken;
        if ((**line).rfind("ready ", 0) != 0) {
          taken = UnavailableError("unexpected ready line '" + **line + "'");
        } else if (child.role == Role::kSite) {
          taken = OnSiteReady(i, **line);
        } else {
          OnWanemReady(**line);
        }
        if (!taken.ok()) {
          KillAndReap(child);
          OnStartFailed(i, taken.message());
          return;
        }
        child.ready = true;
        WriteEndpoints();
      }
    }
    if (child.ready && Now() >= child.next_step_s) {
      Status whole =
          child.role == Role::kSite ? SendPeers(child.site) : ReAddRoutes();
      if (whole.ok()) {
        child.state = ChildState::kRunning;
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
      OnStartFailed(
          i, "did not report ready within " + Seconds(kReadyTimeoutS) + " s");
    }
  }

  // SIGKILL to a child's process, and waits for its end (prompt: nothing
  // can hold off SIGKILL), keeping it for its log tail.
  static void KillAndReap(Supervised& child) {
    if (!child.process) return;
    child.process->Signal(SIGKILL);
    while (!child.process->Poll()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // Every route wanem had, on the same listen address, so the sites'
  // connections find their ports again. Unavailable while one is missing.
  Status ReAddRoutes() {
    for (size_t r = 0; r < routes_.size(); ++r) {
      if (routes_added_[r]) continue;
      const RouteRecord& route = routes_[r];
      Result<std::string> bound = wan_control_->AddRoute(
          route.link, route.from_site, route.listen, route.forward);
      if (!bound.ok()) {
        return UnavailableError(
            "route " + route.listen + " -> " + route.forward + " of link " +
            route.link + " could not be re-added: " + bound.status().message());
      }
      routes_added_[r] = true;
    }
    return Status::Ok();
  }

  // The latest process of child `i` ended.
  void OnExit(size_t i) {
    Supervised& child = children_[i];
    child.ended = child.process->DescribeExit();
    if (child.role == Role::kWanem) OnWanemEnded();
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
  void OnStartFailed(size_t i, const std::string& how) {
    Supervised& child = children_[i];
    child.ended = how;
    if (child.role == Role::kWanem && child.ready) OnWanemEnded();
    child.ready = false;
    if (LatestLogText(child.log_path).find("ddress already in use") !=
            std::string::npos &&
        child.bind_retries < kBindRetries) {
      const double wait = kBindRetryFirstS * std::pow(2.0, child.bind_retries);
      ++child.bind_retries;
      --child.restarts;  // this attempt does not count
      child.state = ChildState::kBackoff;
      child.next_try_s = Now() + wait;
      child.backoff_s = wait;
      MLOG(WARNING) << child.name << " could not bind its port yet (still in "
                    << "use); trying again in " << Seconds(wait) << " s";
      return;
    }
    OnFailure(i, how);
  }

  // Child `i` failed (`how`): recorded and logged; restarted, let go, or
  // the job fails.
  void OnFailure(size_t i, const std::string& how) {
    Supervised& child = children_[i];
    const std::string tail =
        child.process ? child.process->LogTail(kLogTailLines) : std::string();
    if (child.outage_events.empty()) child.down_since_s = Now();
    child.outage_events.push_back(
        AddEvent(pb::PROCESS_FAILED, child.subject, how, 0));
    std::string reason;
    const Verdict verdict = Judge(child, &reason);
    const std::string note = child.name + " " + how + " (" + reason +
                             "); its log " + child.log_path + " ends with:\n" +
                             tail;
    switch (verdict) {
      case Verdict::kRestart: {
        child.backoff_s =
            RestartBackoffSeconds(first_backoff_s_, child.restarts + 1);
        child.state = ChildState::kBackoff;
        child.next_try_s = Now() + child.backoff_s;
        SetEndpointState(
            child, "restarting (attempt " + std::to_string(child.restarts + 1) +
                       " of " + std::to_string(max_restarts_) + ")");
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
  Verdict Judge(const Supervised& child, std::string* reason) const {
    // The job is ending anyway: nothing to restart, nothing to fail.
    const bool serving_done =
        child.role == Role::kWorker && SiteChildDone(child.site);
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
    if (max_restarts_ == 0) {
      *reason = "not restarted: fault.max_restarts is 0";
      return Verdict::kFail;
    }
    if (child.restarts >= max_restarts_) {
      *reason = "not restarted: it was restarted " +
                std::to_string(child.restarts) +
                " times already, the limit (fault.max_restarts or "
                "--max-restarts)";
      return Verdict::kFail;
    }
    *reason =
        "restarting it in " +
        Seconds(RestartBackoffSeconds(first_backoff_s_, child.restarts + 1)) +
        " s: restart " + std::to_string(child.restarts + 1) + " of " +
        std::to_string(max_restarts_) +
        (child.role == Role::kSite ? ", from its checkpoint (--resume)" : "");
    return Verdict::kRestart;
  }

  // Whether the server of site `s` has ended for good.
  bool SiteChildDone(int s) const {
    for (const Supervised& child : children_) {
      if (child.role == Role::kSite && child.site == s) {
        return child.state == ChildState::kDone;
      }
    }
    return true;
  }

  // Starts child `i` again (its backoff passed).
  void Restart(size_t i) {
    Supervised& child = children_[i];
    ++child.restarts;
    const std::string separator =
        std::string(kSeparatorPrefix) + "restart " +
        std::to_string(child.restarts) + " of " +
        std::to_string(max_restarts_) + " of " + child.name + " at " +
        LocalTimeNow() + " (the previous process " + child.ended + ") =====";
    if (Status appended = AppendLogLine(child.log_path, separator);
        !appended.ok()) {
      MLOG(WARNING) << appended;
    }
    if (child.role == Role::kWanem && manifest_.wanem_size() > 0) {
      KeepTrafficCsv(manifest_.mutable_wanem(manifest_.wanem_size() - 1),
                     manifest_.wanem_size());
      SaveManifest();
    }
    if (child.role == Role::kSite) {
      for (SiteProgress& progress : progress_) {
        if (progress.child == i) progress.status.reset();
      }
    }
    child.process.reset();
    Result<ChildProcess> process =
        ChildProcess::Spawn(child.name, child.argv, child.log_path);
    if (!process.ok()) {
      OnFailure(i, "could not be started: " + process.status().message());
      return;
    }
    child.process.emplace(std::move(*process));
    child.signalled = false;
    child.ready = false;
    MLOG(INFO) << "restarted " << child.name << " (restart " << child.restarts
               << " of " << max_restarts_ << ", pid " << child.process->pid()
               << ")";
    if (child.role == Role::kWorker) {
      child.state = ChildState::kRunning;
      Recovered(i);
      return;
    }
    child.state = ChildState::kStarting;
    child.next_try_s = Now() + kReadyTimeoutS;
    child.next_step_s = 0;
  }

  // Child `i` is back: PROCESS_RESTARTED with its downtime, which is also
  // the duration of the failures of the outage.
  void Recovered(size_t i) {
    Supervised& child = children_[i];
    const double down_s = Now() - child.down_since_s;
    const double now_unix = UnixSeconds();
    for (int e : child.outage_events) {
      pb::FaultEvent* event = manifest_.mutable_events(e);
      event->set_duration_s(now_unix - event->unix_s());
    }
    child.outage_events.clear();
    child.bind_retries = 0;
    AddEvent(pb::PROCESS_RESTARTED, child.subject,
             "restart " + std::to_string(child.restarts) + " of " +
                 std::to_string(max_restarts_) + " after a backoff of " +
                 Seconds(child.backoff_s) + " s" +
                 (child.role == Role::kSite
                      ? "; continues from its checkpoint (--resume)"
                  : child.role == Role::kWanem
                      ? "; " + std::to_string(routes_.size()) +
                            " routes re-added on their ports"
                      : ""),
             down_s);
    SetEndpointState(child, "running");
    MLOG(INFO) << child.name << " is back after " << Seconds(down_s)
               << " s down";
  }

  // ---- wanem's counters ----------------------------------------------------

  // Reads wanem's counters about once a second into the manifest, so a
  // crash loses at most the traffic since the last read.
  void PollWanem() {
    if (!wanem_ || children_[*wanem_].state != ChildState::kRunning ||
        !wan_control_ || Now() < next_wan_poll_s_) {
      return;
    }
    next_wan_poll_s_ = Now() + kWanPollPeriodS;
    ReadWanCounters(/*final=*/false);
  }

  bool ReadWanCounters(bool final) {
    if (manifest_.wanem_size() == 0) return false;
    Result<pb::WanControlReply> status = wan_control_->GetStatus();
    if (!status.ok()) {
      if (final) {
        MLOG(ERROR) << "cannot read wanem's final counters: "
                    << status.status();
      }
      return false;
    }
    pb::WanIncarnation* current =
        manifest_.mutable_wanem(manifest_.wanem_size() - 1);
    current->clear_links();
    for (pb::LinkTraffic& link : wan::LinkTrafficFromReply(*status)) {
      *current->add_links() = std::move(link);
    }
    current->set_counted_unix_s(UnixSeconds());
    current->set_final(final);
    SaveManifest();
    return true;
  }

  // wanem's process ended: unless its final counters were read, what it
  // carried since the last read is not counted.
  void OnWanemEnded() {
    wan_control_.reset();
    if (manifest_.wanem_size() == 0) return;
    pb::WanIncarnation* current =
        manifest_.mutable_wanem(manifest_.wanem_size() - 1);
    if (current->final()) return;
    const double since = current->counted_unix_s() > 0
                             ? current->counted_unix_s()
                             : current->started_unix_s();
    current->set_uncounted_s(std::max(0.0, UnixSeconds() - since));
    SaveManifest();
  }

  // ---- the ordered stop ----------------------------------------------------

  // The job must stop now (interrupt, a failure past the restart limit):
  // workers first (SIGTERM), pending restarts cancelled.
  void BeginStop() {
    if (stage_ != Stage::kRunning) return;
    MLOG(INFO) << "stopping workers (up to " << Seconds(kWorkerGraceS)
               << " s), then site servers with their final flush (up to "
               << Seconds(kSiteGraceS) << " s), then wanem";
    stage_ = Stage::kStopWorkers;
    stop_deadline_s_ = Now() + kWorkerGraceS;
    workers_signal_ = SIGTERM;
    for (Supervised& child : children_) {
      if (child.role == Role::kWanem) continue;
      if (child.state == ChildState::kBackoff) {
        child.state = ChildState::kDone;
        SetEndpointState(child, "failed: " + child.ended);
      }
      if (child.role == Role::kWorker) Stop(child, SIGTERM);
    }
  }

  bool AllDone(Role role) const {
    return std::all_of(
        children_.begin(), children_.end(), [role](const Supervised& child) {
          return child.role != role || child.state == ChildState::kDone;
        });
  }

  // Names of the children of `role` not done yet.
  std::string Remaining(Role role) const {
    std::string names;
    for (const Supervised& child : children_) {
      if (child.role == role && child.state != ChildState::kDone) {
        names += (names.empty() ? "" : ", ") + child.name;
      }
    }
    return names;
  }

  void SignalAll(Role role, int signal) {
    for (Supervised& child : children_) {
      if (child.role == role) Stop(child, signal);
    }
  }

  void AdvanceStop() {
    const double now = Now();
    switch (stage_) {
      case Stage::kRunning:
        if (!AllDone(Role::kSite)) return;
        // Every site finished the job and told its workers to stop.
        stage_ = Stage::kStopWorkers;
        stop_deadline_s_ = now + kWorkerGraceS;
        workers_signal_ = 0;
        for (Supervised& child : children_) {
          if (child.role == Role::kWorker &&
              child.state == ChildState::kBackoff) {
            child.state = ChildState::kDone;
          }
        }
        return;
      case Stage::kStopWorkers:
        if (AllDone(Role::kWorker)) {
          stage_ = Stage::kStopSites;
          stop_deadline_s_ = now + kSiteGraceS;
          if (!AllDone(Role::kSite)) {
            MLOG(INFO) << "workers stopped; stopping the site servers: final "
                          "flush to their peers and summary (up to "
                       << Seconds(kSiteGraceS) << " s)";
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
          MLOG(WARNING) << (workers_signal_ == SIGTERM ? "SIGTERM" : "SIGKILL")
                        << " to workers still running: "
                        << Remaining(Role::kWorker);
          SignalAll(Role::kWorker, workers_signal_);
          stop_deadline_s_ = now + kKillGraceS;
        }
        return;
      case Stage::kStopSites:
        if (AllDone(Role::kSite)) {
          stage_ = Stage::kStopWanem;
          stop_deadline_s_ = now + kKillGraceS;
          StopWanem();
        } else if (now > stop_deadline_s_) {
          MLOG(ERROR) << "site servers did not finish within "
                      << Seconds(kSiteGraceS) << " s: SIGKILL to "
                      << Remaining(Role::kSite);
          SignalAll(Role::kSite, SIGKILL);
          stop_deadline_s_ = now + kKillGraceS;
        }
        return;
      case Stage::kStopWanem:
        if (AllDone(Role::kWanem)) {
          stage_ = Stage::kDone;
        } else if (now > stop_deadline_s_) {
          SignalAll(Role::kWanem, SIGKILL);
          stop_deadline_s_ = now + kKillGraceS;
        }
        return;
      case Stage::kKilling:
        if (AllDone(Role::kSite) && AllDone(Role::kWorker) &&
            AllDone(Role::kWanem)) {
          stage_ = Stage::kDone;
        }
        return;
      case Stage::kDone:
        return;
    }
  }

  // Every site server is done: wanem's counters are final. Read them, then
  // stop it — last, so that the sites' final flushes could cross.
  void StopWanem() {
    if (!wanem_) return;
    Supervised& wanem = children_[*wanem_];
    if (wanem.state == ChildState::kBackoff) {
      wanem.state = ChildState::kDone;
      return;
    }
    if (wanem.state == ChildState::kDone) return;
    MLOG(INFO) << "site servers done; reading wanem's final counters and "
                  "stopping it";
    if (wanem.state == ChildState::kRunning && wan_control_) {
      ReadWanCounters(/*final=*/true);
    }
    Stop(wanem, SIGTERM);
  }

  // ---- progress ------------------------------------------------------------

  void ShowProgress() {
    const double now = Now();
    if (now < next_progress_s_) return;
    next_progress_s_ = now + kProgressPeriodS;
    PollProgress();
    const bool tty =
        options_.progress != nullptr && ::isatty(::fileno(options_.progress));
    if (!tty && (options_.progress == nullptr || now < next_plain_s_)) return;
    std::vector<std::pair<std::string, std::string>> sites;
    for (const SiteProgress& site : progress_) {
      sites.emplace_back(site.name, FormatSiteProgress(View(site)));
    }
    if (tty) {
      // Redraw the block of site lines in place: up to its first line,
      // then each line cleared and rewritten.
      const std::vector<std::string> lines = FormatProgressLines(sites, now);
      std::string block;
      if (progress_lines_ > 0) {
        block += "\033[" + std::to_string(progress_lines_) + "A";
      }
      for (const std::string& line : lines) block += "\r\033[K" + line + "\n";
      std::fputs(block.c_str(), options_.progress);
      progress_lines_ = static_cast<int>(lines.size());
    } else {
      next_plain_s_ = now + kPlainProgressPeriodS;
      std::fprintf(options_.progress, "%s\n",
                   FormatProgress(sites, now).c_str());
    }
    std::fflush(options_.progress);
  }

  SiteProgressView View(const SiteProgress& site) const {
    const Supervised& child = children_[site.child];
    SiteProgressView view;
    view.status = site.status ? &*site.status : nullptr;
    view.clock = site.clock;
    view.restarting = child.state == ChildState::kBackoff ||
                      child.state == ChildState::kStarting;
    view.attempt =
        child.restarts + (child.state == ChildState::kBackoff ? 1 : 0);
    view.finished = child.state == ChildState::kDone && child.process &&
                    child.process->succeeded();
    const double silent = Now() - site.last_answer_s;
    if (!site.answering && silent >= kDownAfterS) view.silent_s = silent;
    return view;
  }

  // Asks every running site server for its status (a restarting one is
  // not asked: it is shown as restarting).
  void PollProgress() {
    for (SiteProgress& site : progress_) {
      if (children_[site.child].state != ChildState::kRunning) {
        site.last_answer_s = Now();
        site.answering = true;
        continue;
      }
      pb::Header request;
      request.set_type(pb::STATUS_REQUEST);
      Result<Envelope> reply = site.client->Call(request, {}, kStatusTimeout);
      if (reply.ok() && reply->header.type() == pb::STATUS_REPLY) {
        site.status = reply->header.status();
        site.clock = reply->header.clock();
        site.last_answer_s = Now();
        site.answering = true;
      } else {
        site.answering = false;
      }
    }
  }

  // ---- the report ----------------------------------------------------------

  Result<pb::RunReport> Report() {
    std::vector<pb::SiteSummary> summaries;
    std::string missing;
    for (const pb::SiteConfig& site : job_.site()) {
      if (!HasServer(site)) continue;
      pb::SiteSummary summary;
      Status read = ReadJsonFile(SummaryPath(site.name()), &summary);
      if (read.ok()) {
        summaries.push_back(std::move(summary));
      } else {
        missing += (missing.empty() ? "" : ", ") + site.name();
      }
    }
    std::string outcome;
    if (!failure_.empty()) {
      // Who failed and how; the log's tail stays in the error.
      const std::string first_line = failure_.substr(0, failure_.find('\n'));
      outcome = "failed: " + first_line.substr(0, first_line.find("; its log"));
    } else if (interrupted_) {
      outcome = "interrupted";
    } else if (!summaries.empty()) {
      // The reason of a site that stopped on its own account.
      outcome = summaries.front().stop_reason();
      for (const pb::SiteSummary& summary : summaries) {
        if (!summary.stopped_by_peer()) {
          outcome = summary.stop_reason();
          break;
        }
      }
    }
    pb::RunReport report =
        BuildRunReport(job_, summaries, wall_.ElapsedSeconds(), outcome);
    AddFaultEvents({manifest_.events().begin(), manifest_.events().end()},
                   manifest_.started_unix_s(), &report);
    if (manifest_.wanem_size() > 0) {
      AddWanTraffic({manifest_.wanem().begin(), manifest_.wanem().end()},
                    &report);
      MergeTrafficFiles();
    }
    SaveManifest();
    MERIDIAN_RETURN_IF_ERROR(
        WriteJsonFile(report, options_.out_dir + "/report.json"));
    MERIDIAN_RETURN_IF_ERROR(
        WriteTimelineCsv(summaries, options_.out_dir + "/timeline.csv"));
    if (!failure_.empty()) return UnavailableError(failure_);
    if (summaries.empty()) {
      return UnavailableError("no site server wrote its summary (" + missing +
                              ")");
    }
    if (!missing.empty()) {
      return UnavailableError("site servers without a summary: " + missing);
    }
    return report;
  }

  // With several wanem processes, OUT/traffic.csv becomes one series: the
  // last process's file is kept as its own too, so a later resume merges
  // from the per-process files again.
  void MergeTrafficFiles() {
    if (manifest_.wanem_size() < 2) return;
    KeepTrafficCsv(manifest_.mutable_wanem(manifest_.wanem_size() - 1),
                   manifest_.wanem_size());
    std::vector<std::string> inputs;
    std::vector<double> offsets;
    const double first = manifest_.wanem(0).started_unix_s();
    for (const pb::WanIncarnation& incarnation : manifest_.wanem()) {
      if (incarnation.traffic_csv().empty()) continue;
      inputs.push_back(options_.out_dir + "/" + incarnation.traffic_csv());
      offsets.push_back(incarnation.started_unix_s() - first);
    }
    Status merged =
        MergeTrafficCsv(inputs, offsets, options_.out_dir + "/traffic.csv");
    if (!merged.ok()) {
      MLOG(WARNING) << "cannot merge the traffic samples of wanem's "
                    << manifest_.wanem_size() << " processes: " << merged;
    }
  }

  const pb::JobConfig& job_;
  // A copy: PrepareSecurity may point config_path at the derived job file.
  RunOptions options_;
  const uint32_t max_restarts_;
  const double first_backoff_s_;
  std::vector<std::string> ephemeral_keys_;  // secret key files we wrote
  Stopwatch wall_;
  zmq::context_t context_;
  std::string binary_;
  // Every child: site servers, wanem, workers, in start order. Owned here;
  // each entry lives for the run (a restart replaces its process).
  std::vector<Supervised> children_;
  std::optional<size_t> wanem_;                // its index in children_
  std::vector<std::string> server_endpoints_;  // by site index; "" if none
  std::vector<std::string> mirror_endpoints_;  // by site index; "" if none
  std::map<int, pb::Header> peers_requests_;   // SET_PEERS by site index
  std::unique_ptr<wan::ControlClient> wan_control_;  // the live wanem's
  std::vector<RouteRecord> routes_;
  std::vector<bool> routes_added_;  // to the live wanem process
  double next_wan_poll_s_ = 0;
  std::vector<SiteProgress> progress_;  // one per site server
  double next_progress_s_ = 0;
  double next_plain_s_ = kPlainProgressPeriodS;
  int progress_lines_ = 0;      // lines of the live block drawn on a terminal
  pb::RunEndpoints endpoints_;  // written to OUT/endpoints.json
  // OUT/run.json: the launcher's events and wanem's counters live here.
  pb::RunManifest manifest_;
  bool manifest_warned_ = false;
  Stage stage_ = Stage::kRunning;
  double stop_deadline_s_ = 0;
  int workers_signal_ = 0;  // the last signal sent to every worker
  bool interrupted_ = false;
  std::string failure_;
};

}  // namespace

double RestartBackoffSeconds(double first_s, uint32_t restart) {
  if (!std::isfinite(first_s) || first_s <= 0) return 0;
  const double doubled =
      first_s * std::pow(2.0, static_cast<double>(std::max(restart, 1u) - 1));
  return std::min(doubled, kMaxBackoffS);
}

Result<std::string> ResumeConfigPath(const std::string& run_dir) {
  const std::string path = run_dir + "/run.json";
  pb::RunManifest manifest;
  if (Status read = ReadJsonFile(path, &manifest); !read.ok()) {
    return read.code() == StatusCode::kNotFound
               ? NotFoundError("cannot resume: no " + path +
                               " (not a directory of `meridian run`)")
               : read;
  }
  if (manifest.config_path().empty()) {
    return DataLossError("cannot resume: " + path + " names no job file");
  }
  return manifest.config_path();
}

std::string FormatSiteProgress(const SiteProgressView& site) {
  char buf[256];
  if (site.restarting) {
    return "restarting (attempt " + std::to_string(site.attempt) + ")";
  }
  if (site.silent_s >= 0) {
    std::snprintf(buf, sizeof(buf), "down (no answer for %.0f s)",
                  site.silent_s);
    return buf;
  }
  if (site.status == nullptr) return "starting";
  const pb::SiteStatus& status = *site.status;
  std::string line;
  if (status.workers_joined() < status.workers_expected() &&
      status.elapsed_s() <= 0) {
    std::snprintf(buf, sizeof(buf), "%u/%u workers joined",
                  status.workers_joined(), status.workers_expected());
    line = buf;
  } else {
    const pb::EvalPoint& eval = status.last_eval();
    std::snprintf(buf, sizeof(buf),
                  "train %.1f s  acc %.4f  loss %.4f  %.0f commits/s",
                  status.elapsed_s(), eval.accuracy(), eval.loss(),
                  status.commits_per_s());
    line = buf;
    if (status.has_theta()) {
      std::snprintf(buf, sizeof(buf), "  clock %lld  theta %.3g  WAN %.1f MB",
                    static_cast<long long>(site.clock), status.theta(),
                    status.wan_bytes_sent() / 1e6);
      line += buf;
    }
  }
  if (status.workers_dead() > 0) {
    line += "  workers dead " + std::to_string(status.workers_dead());
  }
  if (status.peers_unreachable() > 0) {
    line += "  peers unreachable " + std::to_string(status.peers_unreachable());
  }
  if (site.finished) line += "  finished";
  return line;
}

Result<pb::RunReport> RunJob(const pb::JobConfig& job,
                             const RunOptions& options) {
  SetLogRole("launcher");
  JobRun run(job, options);
  return run.Run();
}

Status RunWithSiteWorkers(const std::string& config_path,
                          const pb::JobConfig& job, const std::string& site,
                          const std::string& log_dir, const std::string& binary,
                          const std::function<Status()>& serve) {
  MERIDIAN_ASSIGN_OR_RETURN(const int s, FindSite(job, site));
  std::error_code error;
  std::filesystem::create_directories(log_dir, error);
  if (error) {
    return InvalidArgumentError("cannot create log directory '" + log_dir +
                                "': " + error.message());
  }
  const std::string self = binary.empty() ? SelfExecutable() : binary;
  std::vector<ChildProcess> workers;
  auto stop_workers = [&](double grace_s) {
    Stopwatch waited;
    int signal = 0;
    while (true) {
      bool all_done = true;
      for (ChildProcess& worker : workers) all_done &= worker.Poll();
      if (all_done) return;
      if (waited.ElapsedSeconds() > grace_s && signal != SIGKILL) {
        signal = signal == 0 ? SIGTERM : SIGKILL;
        for (ChildProcess& worker : workers) worker.Signal(signal);
        waited.Reset();
        grace_s = kKillGraceS;
      }
      std::this_thread::sleep_for(kMonitorInterval);
    }
  };
  for (uint32_t w = 0; w < SiteWorkerCount(job.site(s)); ++w) {
    Result<ChildProcess> child = ChildProcess::Spawn(
        "worker " + std::to_string(w) + " of site '" + site + "'",
        {self, "worker", "--config", config_path, "--site", site, "--index",
         std::to_string(w)},
        log_dir + "/worker-" + site + "-" + std::to_string(w) + ".log");
    if (!child.ok()) {
      stop_workers(0);
      return child.status();
    }
    workers.push_back(std::move(*child));
  }
  MLOG(INFO) << "started " << workers.size() << " workers of site '" << site
             << "'; their logs are in " << log_dir;
  Status served = serve();
  stop_workers(kWorkerGraceS);
  if (!served.ok()) return served;
  for (ChildProcess& worker : workers) {
    if (!worker.succeeded()) {
      return UnavailableError(worker.name() + " " + worker.DescribeExit() +
                              "; its log " + worker.log_path() +
                              " ends with:\n" + worker.LogTail(kLogTailLines));
    }
  }
  return Status::Ok();
}

const std::atomic<bool>* InstallStopSignalHandlers() {
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return &g_stop_signal;
}

const std::atomic<int>* StopSignalCount() { return &g_stop_signals; }

}  // namespace meridian
