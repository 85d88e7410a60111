#include "meridian/launch/launcher.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "launch/endpoints_file.h"
#include "launch/programs.h"
#include "launch/progress.h"
#include "launch/run_manifest.h"
#include "launch/run_security.h"
#include "launch/supervisor.h"
#include "launch/wanem_control.h"
#include "meridian/config/config.h"
#include "meridian/core/clock.h"
#include "meridian/core/format.h"
#include "meridian/core/log.h"
#include "meridian/core/process.h"
#include "meridian/net/security.h"
#include "meridian/net/transport.h"
#include "meridian/report/report.h"
#include "meridian/sync/sync.h"
#include "meridian/train/model.h"

namespace meridian {
namespace {

constexpr double kProgressPeriodS = 1.0;
// A site whose status requests have gone unanswered this long is shown as
// down on the progress line.
constexpr double kDownAfterS = 2.0;
constexpr auto kStatusTimeout = std::chrono::milliseconds(300);
constexpr auto kSetPeersTimeout = std::chrono::seconds(10);
// model.weights_command: how long it may take (a language model's
// tokenizer is built from its corpus first), and how often it is polled.
constexpr double kWeightsTimeoutS = 600.0;
constexpr auto kPollInterval = std::chrono::milliseconds(20);

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

// How `meridian run` supervises the children of `job`.
SupervisorOptions SupervisionOf(const pb::JobConfig& job,
                                const RunOptions& options) {
  SupervisorOptions supervision;
  supervision.fail_fast = options.fail_fast;
  supervision.max_restarts =
      options.max_restarts.value_or(job.fault().max_restarts());
  supervision.first_backoff_s = job.fault().restart_backoff_s();
  supervision.stop_requested = options.stop_requested;
  supervision.stop_signals = options.stop_signals;
  return supervision;
}

// One `meridian run`: what to start, in which order, and what a restart of
// each role means (SupervisorHooks); the Supervisor runs the children, the
// files of OUT/ are the manifest's and the endpoints file's.
class JobRun final : private SupervisorHooks {
 public:
  JobRun(const pb::JobConfig& job, const RunOptions& options)
      : job_(job),
        options_(options),
        manifest_(options.out_dir),
        endpoints_(options.out_dir + "/endpoints.json", job.name()),
        programs_(MakeProgramContext(options.config_path, options.config_path,
                                     options.out_dir)),
        wanem_control_(job, &manifest_, &wall_),
        supervisor_(SupervisionOf(job, options), &wall_, &manifest_,
                    &endpoints_, this),
        display_(options.progress) {}

  Result<pb::RunReport> Run() {
    // A program that cannot start fails the run before anything starts.
    MERIDIAN_RETURN_IF_ERROR(FindJobPrograms(job_, options_.config_path));
    MERIDIAN_RETURN_IF_ERROR(PrepareOutDir());
    MERIDIAN_RETURN_IF_ERROR(PrepareSecurity());
    MERIDIAN_RETURN_IF_ERROR(WriteMissingWeights());
    MERIDIAN_RETURN_IF_ERROR(PrepareControlToken());
    manifest_.Save();
    if (Status started = StartChildren(); !started.ok()) {
      supervisor_.FailStart(started);
    }
    Monitor();
    ForgetEphemeralKeys();
    return Report();
  }

 private:
  // ---- time, files ---------------------------------------------------------

  double Now() const { return wall_.ElapsedSeconds(); }

  std::string SummaryPath(const std::string& site) const {
    return options_.out_dir + "/site-" + site + ".json";
  }

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
    if (options_.resume) {
      MERIDIAN_RETURN_IF_ERROR(manifest_.Continue());
      MLOG(INFO) << "resuming the run in " << options_.out_dir << " (resume "
                 << manifest_.resumes() << ", started "
                 << FormatSeconds(UnixSeconds() - manifest_.started_unix_s())
                 << " s ago)";
      return Status::Ok();
    }
    std::filesystem::remove_all(options_.out_dir + "/checkpoints", error);
    if (error) {
      return InvalidArgumentError(
          "cannot delete the checkpoints of an earlier "
          "run in '" +
          options_.out_dir + "/checkpoints': " + error.message());
    }
    manifest_.Start(job_, options_.config_path);
    return Status::Ok();
  }

  // CURVE (run_security.h): may point config_path at a derived job file
  // with ephemeral keys.
  Status PrepareSecurity() {
    MERIDIAN_ASSIGN_OR_RETURN(
        RunSecurity security,
        PrepareRunSecurity(job_, options_.out_dir, options_.config_path));
    options_.config_path = std::move(security.config_path);
    // Programs read the job file the other children read; they still run
    // in the directory of the one the user gave.
    std::error_code error;
    programs_.job_path =
        std::filesystem::absolute(options_.config_path, error).string();
    ephemeral_keys_ = std::move(security.ephemeral_keys);
    return Status::Ok();
  }

  // An EXTERNAL model's weights file that does not exist yet is written
  // by model.weights_command, once, before any site reads it; the run
  // fails naming the command when it fails, outlives kWeightsTimeout or
  // writes no file, and whatever a failed command left at the path goes
  // (the file did not exist before it), so a torn file never passes for
  // the weights on the next run. Its output: OUT/logs/weights.log.
  Status WriteMissingWeights() {
    const pb::ModelConfig& model = job_.model();
    std::error_code error;
    if (model.kind() != pb::EXTERNAL || model.weights_command().empty() ||
        std::filesystem::exists(model.weights(), error)) {
      return Status::Ok();
    }
    MERIDIAN_ASSIGN_OR_RETURN(ProgramProcess program,
                              WeightsProgram(job_, programs_));
    const std::string log = options_.out_dir + "/logs/weights.log";
    MLOG(INFO) << model.weights() << " is missing: writing it with `"
               << program.command << "` (log: " << log << ")";
    MERIDIAN_ASSIGN_OR_RETURN(
        ChildProcess child,
        ChildProcess::Spawn("weights", program.argv, log, program.spawn));
    const double deadline = Now() + kWeightsTimeoutS;
    while (!child.Poll()) {
      if (Now() > deadline || (options_.stop_requested != nullptr &&
                               options_.stop_requested->load())) {
        child.Signal(SIGKILL);
        while (!child.Poll()) std::this_thread::sleep_for(kPollInterval);
        std::filesystem::remove(model.weights(), error);
        return DeadlineExceededError(
            "model.weights_command `" + program.command + "` was stopped " +
            (Now() > deadline
                 ? "after " + FormatSeconds(kWeightsTimeoutS) + " s"
                 : std::string("(the run was interrupted)")) +
            " before it wrote " + model.weights() + "; see " + log);
      }
      std::this_thread::sleep_for(kPollInterval);
    }
    if (!child.succeeded() ||
        !std::filesystem::exists(model.weights(), error)) {
      std::filesystem::remove(model.weights(), error);
      return FailedPreconditionError(
          "model.weights_command `" + program.command + "` " +
          (child.succeeded() ? "exited 0 but did not write "
                             : child.DescribeExit() + " and did not write ") +
          model.weights() + "; its output ends with:\n" + child.LogTail(10));
    }
    return Status::Ok();
  }

  // A fresh control token for this run (a resumed run too: its site
  // servers all start again), in <out>/control.token for the site servers
  // and the operator. Only SET_PEERS uses it here; the launcher stops its
  // children with signals.
  Status PrepareControlToken() {
    MERIDIAN_ASSIGN_OR_RETURN(control_token_, GenerateControlToken());
    control_token_file_ = options_.out_dir + "/control.token";
    return WriteControlTokenFile(control_token_file_, control_token_);
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
    endpoints_.Write();
    MERIDIAN_RETURN_IF_ERROR(IntroducePeers());
    size_t workers = 0;
    size_t evaluators = 0;
    for (int s = 0; s < job_.site_size(); ++s) {
      MERIDIAN_RETURN_IF_ERROR(StartWorkers(s, &workers));
      if (!EvaluatorCommand(job_, s).empty()) {
        MERIDIAN_RETURN_IF_ERROR(StartEvaluator(s));
        ++evaluators;
      }
    }
    MLOG(INFO) << "started " << progress_.size() << " site servers and "
               << workers << " workers"
               << (evaluators > 0
                       ? ", " + std::to_string(evaluators) + " evaluators"
                       : std::string())
               << "; logs in " << options_.out_dir << "/logs/";
    if (!options_.fail_fast && supervisor_.max_restarts() > 0) {
      MLOG(INFO) << "a child that fails is restarted up to "
                 << supervisor_.max_restarts()
                 << " times (fault.max_restarts; --fail-fast stops the job "
                    "at the first failure)";
    }
    return Status::Ok();
  }

  // The workers of site `s`: `meridian worker`, or the group's program
  // with the same place in the job (MERIDIAN_*, programs.h).
  Status StartWorkers(int s, size_t* started) {
    const pb::SiteConfig& site = job_.site(s);
    MERIDIAN_ASSIGN_OR_RETURN(const std::string site_endpoint,
                              WorkerEndpoint(s));
    for (uint32_t w = 0; w < SiteWorkerCount(site); ++w) {
      std::string endpoint = site_endpoint;
      if (WorkerGroupOf(site, w).has_link()) {
        MERIDIAN_ASSIGN_OR_RETURN(
            endpoint, wanem_control_.RouteWorker(s, w, site_endpoint));
      }
      Supervised child;
      child.role = Role::kWorker;
      child.name =
          "worker " + std::to_string(w) + " of site '" + site.name() + "'";
      child.subject = site.name() + "/" + std::to_string(w);
      child.site = ServingSite(job_, s);
      if (WorkerGroupOf(site, w).command_size() > 0) {
        MERIDIAN_ASSIGN_OR_RETURN(
            ProgramProcess program,
            WorkerProgram(job_, programs_, s, w, endpoint));
        child.name += " (" + program.command + ")";
        child.argv = std::move(program.argv);
        child.spawn = std::move(program.spawn);
      } else {
        child.argv = {
            binary_,     "worker",    "--config", options_.config_path,
            "--site",    site.name(), "--index",  std::to_string(w),
            "--connect", endpoint};
      }
      child.log_path = options_.out_dir + "/logs/worker-" + site.name() + "-" +
                       std::to_string(w) + ".log";
      MERIDIAN_RETURN_IF_ERROR(supervisor_.Spawn(std::move(child)).status());
      ++*started;
    }
    return Status::Ok();
  }

  // The evaluator program of site `s`, on its server's worker endpoint.
  Status StartEvaluator(int s) {
    const pb::SiteConfig& site = job_.site(s);
    MERIDIAN_ASSIGN_OR_RETURN(
        ProgramProcess program,
        EvaluatorProgram(job_, programs_, s, server_endpoints_[s]));
    Supervised child;
    child.role = Role::kEvaluator;
    child.name =
        "evaluator of site '" + site.name() + "' (" + program.command + ")";
    child.subject = site.name() + "/evaluator";
    child.site = s;
    child.argv = std::move(program.argv);
    child.spawn = std::move(program.spawn);
    child.log_path =
        options_.out_dir + "/logs/evaluator-" + site.name() + ".log";
    return supervisor_.Spawn(std::move(child)).status();
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
      child.argv = {binary_,
                    "site",
                    "--config",
                    options_.config_path,
                    "--site",
                    site.name(),
                    "--bind",
                    "tcp://127.0.0.1:*",
                    "--mirror-bind",
                    "tcp://127.0.0.1:*",
                    "--out",
                    options_.out_dir,
                    "--ready-fd",
                    std::to_string(kReadyFd),
                    "--metrics",
                    "127.0.0.1:0",
                    "--await-peers",
                    "--control-token-file",
                    control_token_file_};
      if (options_.resume) child.argv.push_back("--resume");
      child.log_path = logs + "site-" + site.name() + ".log";
      MERIDIAN_ASSIGN_OR_RETURN(const size_t i,
                                supervisor_.Spawn(std::move(child)));
      started.push_back(i);
    }
    // Every server loads its data at once; wait for their ready lines
    // together (an interrupt meanwhile stops the start).
    const double deadline = Now() + kReadyTimeoutS;
    for (size_t i : started) {
      MERIDIAN_ASSIGN_OR_RETURN(const std::string line,
                                supervisor_.AwaitReadyLine(i, deadline));
      MERIDIAN_RETURN_IF_ERROR(OnSiteReady(i, line));
      supervisor_.MarkRunning(i);
    }
    return Status::Ok();
  }

  // A site server's ready line: "ready <worker endpoint> [<mirror
  // endpoint>] [metrics=<address>]". The first records its endpoints and
  // fixes them in its restart command (so workers, peers and wanem routes
  // reach a restarted server where they reached the first); later ones
  // must match.
  Status OnSiteReady(size_t i, const std::string& line) {
    const Supervised& server = supervisor_.child(i);
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
      std::vector<std::string> argv = server.argv;
      auto set_flag = [&](const std::string& flag, const std::string& value) {
        auto it = std::find(argv.begin(), argv.end(), flag);
        if (it != argv.end() && it + 1 != argv.end()) *(it + 1) = value;
      };
      set_flag("--bind", endpoint);
      if (!mirror.empty()) set_flag("--mirror-bind", mirror);
      if (std::find(argv.begin(), argv.end(), "--resume") == argv.end()) {
        argv.push_back("--resume");
      }
      supervisor_.SetRestartArgv(i, std::move(argv));
      SiteProgress progress;
      progress.name = job_.site(s).name();
      progress.child = i;
      pb::Endpoint self;
      self.set_site(job_.site(s).name());
      self.set_role(pb::ROLE_LAUNCHER);
      progress.client =
          std::make_unique<RpcClient>(context_, server_endpoints_[s], self);
      if (WorkerCurveEnabled(job_, s)) {
        // Status requests and SET_PEERS reach a CURVE worker endpoint only
        // with the workers' key (<key_dir>/workers/<site>.key).
        MERIDIAN_ASSIGN_OR_RETURN(const WorkerCurveKeys keys,
                                  LoadWorkerCurveKeys(job_, s, ""));
        MERIDIAN_RETURN_IF_ERROR(progress.client->SetCurve(
            keys.own.public_key, keys.own.secret_key, keys.server_public_key));
      }
      progress.last_answer_s = Now();
      progress_.push_back(std::move(progress));
    } else if (endpoint != server_endpoints_[s] ||
               (!mirror_endpoints_[s].empty() &&
                mirror != mirror_endpoints_[s])) {
      return FailedPreconditionError(
          server.name + " came back on " + endpoint + " " + mirror +
          " instead of " + server_endpoints_[s] + " " + mirror_endpoints_[s]);
    }
    endpoints_.Set(server.name, "site", job_.site(s).name(), metrics,
                   "running");
    return Status::Ok();
  }

  // Tells every site server where its sync peers listen; keeps each
  // request to tell a restarted server again.
  Status IntroducePeers() {
    for (const SiteProgress& progress : progress_) {
      const int s = supervisor_.child(progress.child).site;
      if (mirror_endpoints_[s].empty()) continue;  // syncs with nobody
      pb::Header request;
      request.set_type(pb::SET_PEERS);
      request.set_control_token(control_token_);
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
      if (supervisor_.child(progress.child).site != s) continue;
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
    return wanem_control_.Route(from, to, mirror_endpoints_[to]);
  }

  // Where the workers of site `s` connect: their serving site's server,
  // across the WAN when it is another site's.
  Result<std::string> WorkerEndpoint(int s) {
    const int serving = ServingSite(job_, s);
    if (serving == s) return server_endpoints_[s];
    return wanem_control_.Route(s, serving, server_endpoints_[serving]);
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
    if (!HasCrossSiteTraffic() && !HasWorkerLinks(job_)) return Status::Ok();
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
    MERIDIAN_ASSIGN_OR_RETURN(const size_t i,
                              supervisor_.Spawn(std::move(child)));
    MERIDIAN_ASSIGN_OR_RETURN(const std::string line,
                              supervisor_.ReadReadyLine(i));
    OnWanemReady(line);
    supervisor_.MarkRunning(i);
    MLOG(INFO) << "wanem shapes every link between sites"
               << (HasWorkerLinks(job_) ? " and every worker's access link"
                                        : "")
               << "; control at " << wanem_control_.endpoint();
    return Status::Ok();
  }

  // wanem's ready line: "ready <control endpoint> [metrics=<address>]".
  // A new process: a new entry of the manifest, counting from 0.
  void OnWanemReady(const std::string& line) {
    std::string rest = line.substr(6);
    const std::string metrics = TakeMetricsField(&rest);
    const std::string& name = supervisor_.child(*supervisor_.wanem()).name;
    endpoints_.Set(name, "wanem", "", metrics, "running");
    endpoints_.SetControlAddress(name, rest);
    endpoints_.Write();
    wanem_control_.Connect(rest);
  }

  // ---- what a restart means per role (SupervisorHooks) ---------------------

  Status TakeReadyLine(size_t child, const std::string& line) override {
    if (supervisor_.child(child).role == Role::kSite) {
      return OnSiteReady(child, line);
    }
    OnWanemReady(line);
    return Status::Ok();
  }

  Status CompleteStart(size_t child) override {
    const Supervised& started = supervisor_.child(child);
    return started.role == Role::kSite ? SendPeers(started.site)
                                       : wanem_control_.ReAddRoutes();
  }

  std::string RecoveryNote(size_t child) override {
    switch (supervisor_.child(child).role) {
      case Role::kSite:
        return "; continues from its checkpoint (--resume)";
      case Role::kWanem:
        return "; " + std::to_string(wanem_control_.routes()) +
               " routes re-added on their ports";
      case Role::kWorker:
      case Role::kEvaluator:
        return "";
    }
    return "";
  }

  void BeforeRestart(size_t child) override {
    switch (supervisor_.child(child).role) {
      case Role::kWanem:
        // The new process truncates traffic.csv.
        manifest_.SetAsideTrafficCsv();
        return;
      case Role::kSite:
        for (SiteProgress& progress : progress_) {
          if (progress.child == child) progress.status.reset();
        }
        return;
      case Role::kWorker:
      case Role::kEvaluator:
        return;
    }
  }

  void WanemEnded() override { wanem_control_.Ended(); }

  void ReadFinalWanCounters() override { wanem_control_.ReadFinal(); }

  // ---- the monitor loop ----------------------------------------------------

  // A child's end is noticed within about kMonitorInterval: a pass waits
  // for wanem at most kCounterPollTimeout (and not at all once its process
  // is gone); only a site server that does not answer its status request
  // (once per kProgressPeriodS) holds a pass up to kStatusTimeout.
  void Monitor() {
    while (supervisor_.stage() != Stage::kDone) {
      supervisor_.CheckSignals();
      // A change was logged: the live block is drawn again below the log
      // lines instead of over them.
      if (supervisor_.StepChildren()) display_.Detach();
      supervisor_.AdvanceStop();
      const Stage stage = supervisor_.stage();
      if (stage == Stage::kRunning || stage == Stage::kStopWorkers ||
          stage == Stage::kStopSites) {
        PollWanem();
      }
      if (stage == Stage::kRunning) ShowProgress();
      std::this_thread::sleep_for(kMonitorInterval);
    }
  }

  // wanem's counters, about once per kWanPollPeriodS, while its process
  // runs: checked (waitpid) right before, so a dead wanem is not asked.
  void PollWanem() {
    const std::optional<size_t> wanem = supervisor_.wanem();
    if (!wanem || !supervisor_.ProcessRunning(*wanem)) return;
    wanem_control_.Poll();
  }

  // ---- progress ------------------------------------------------------------

  void ShowProgress() {
    const double now = Now();
    if (now < next_progress_s_) return;
    next_progress_s_ = now + kProgressPeriodS;
    PollProgress();
    if (!display_.Due(now)) return;
    SiteLines sites;
    for (const SiteProgress& site : progress_) {
      sites.emplace_back(site.name, FormatSiteProgress(View(site)));
    }
    display_.Draw(sites, now);
  }

  SiteProgressView View(const SiteProgress& site) const {
    const Supervised& child = supervisor_.child(site.child);
    SiteProgressView view;
    view.metric = ModelMetric(job_.model()).name;
    view.status = site.status ? &*site.status : nullptr;
    view.clock = site.clock;
    view.restarting = child.state == ChildState::kBackoff ||
                      child.state == ChildState::kStarting;
    view.attempt =
        child.policy.restarts() + (child.state == ChildState::kBackoff ? 1 : 0);
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
      if (supervisor_.child(site.child).state != ChildState::kRunning) {
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
    const std::string& failure = supervisor_.failure();
    if (!failure.empty()) {
      // Who failed and how; the log's tail stays in the error.
      const std::string first_line = failure.substr(0, failure.find('\n'));
      outcome = "failed: " + first_line.substr(0, first_line.find("; its log"));
    } else if (supervisor_.interrupted()) {
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
    manifest_.CompleteReport(&report);
    if (report.links_size() > 0) AddWanCost(job_, &report);
    if (!report.flush_complete()) {
      MLOG(WARNING) << "final flush incomplete (" << DescribeUnflushed(report)
                    << "): the replicas differ; `meridian run --resume "
                    << options_.out_dir << "` completes it";
    }
    MERIDIAN_RETURN_IF_ERROR(
        WriteJsonFile(report, options_.out_dir + "/report.json"));
    MERIDIAN_RETURN_IF_ERROR(
        WriteTimelineCsv(summaries, options_.out_dir + "/timeline.csv"));
    if (!failure.empty()) return UnavailableError(failure);
    if (summaries.empty()) {
      return UnavailableError("no site server wrote its summary (" + missing +
                              ")");
    }
    if (!missing.empty()) {
      return UnavailableError("site servers without a summary: " + missing);
    }
    return report;
  }

  const pb::JobConfig& job_;
  // A copy: PrepareSecurity may point config_path at the derived job file.
  RunOptions options_;
  std::vector<std::string> ephemeral_keys_;  // secret key files we wrote
  std::string control_token_;                // this run's (PrepareControlToken)
  std::string control_token_file_;           // <out>/control.token
  Stopwatch wall_;
  zmq::context_t context_;
  std::string binary_;
  // OUT/run.json: the launcher's events and wanem's counters live here.
  RunManifestFile manifest_;
  EndpointsFile endpoints_;  // OUT/endpoints.json
  ProgramContext programs_;  // where worker and evaluator programs run
  WanemControl wanem_control_;
  // Every child; its indices are those of progress_ and the hooks.
  Supervisor supervisor_;
  std::vector<std::string> server_endpoints_;  // by site index; "" if none
  std::vector<std::string> mirror_endpoints_;  // by site index; "" if none
  std::map<int, pb::Header> peers_requests_;   // SET_PEERS by site index
  std::vector<SiteProgress> progress_;         // one per site server
  double next_progress_s_ = 0;
  ProgressDisplay display_;  // where the progress goes (options_.progress)
};

}  // namespace

Result<pb::RunReport> RunJob(const pb::JobConfig& job,
                             const RunOptions& options) {
  SetLogRole("launcher");
  JobRun run(job, options);
  return run.Run();
}

}  // namespace meridian
