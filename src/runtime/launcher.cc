#include "meridian/launcher.h"

#include <signal.h>
#include <unistd.h>

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "meridian/clock.h"
#include "meridian/config.h"
#include "meridian/log.h"
#include "meridian/security.h"
#include "meridian/sync.h"
#include "meridian/transport.h"
#include "meridian/wan_control.h"
#include "runtime/process.h"
#include "meridian/report.h"

namespace meridian {
namespace {

// How long a site server may take to load its data and bind.
constexpr auto kReadyTimeout = std::chrono::seconds(120);
// After the site servers finish, how long workers get to exit on their own,
// and after SIGTERM how long anyone gets before SIGKILL.
constexpr double kWorkerGraceS = 15.0;
constexpr double kKillGraceS = 10.0;
constexpr auto kMonitorInterval = std::chrono::milliseconds(100);
constexpr double kProgressPeriodS = 1.0;
constexpr double kPlainProgressPeriodS = 5.0;
constexpr int kLogTailLines = 8;

std::atomic<bool> g_stop_signal{false};

void OnStopSignal(int) { g_stop_signal.store(true); }

std::string SelfExecutable() {
  std::error_code error;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string("meridian") : path.string();
}

// Live progress of one site, as of its last status reply.
struct SiteProgress {
  std::string name;
  std::unique_ptr<RpcClient> client;
  std::optional<pb::SiteStatus> status;
  int64_t clock = 0;  // from the status reply's header
};

// One site's progress, without its name.
std::string FormatSiteProgress(const SiteProgress& site) {
  char buf[256];
  if (!site.status) return "starting";
  if (site.status->workers_joined() < site.status->workers_expected()) {
    std::snprintf(buf, sizeof(buf), "%u/%u workers joined",
                  site.status->workers_joined(),
                  site.status->workers_expected());
    return buf;
  }
  const pb::EvalPoint& eval = site.status->last_eval();
  std::snprintf(buf, sizeof(buf),
                "train %.1f s  acc %.4f  loss %.4f  %.0f commits/s",
                site.status->elapsed_s(), eval.accuracy(), eval.loss(),
                site.status->commits_per_s());
  std::string line = buf;
  if (site.status->has_theta()) {
    std::snprintf(buf, sizeof(buf), "  clock %lld  theta %.3g  WAN %.1f MB",
                  static_cast<long long>(site.clock), site.status->theta(),
                  site.status->wan_bytes_sent() / 1e6);
    line += buf;
  }
  return line;
}

// Every site on one line (logs, pipes): "[ t s] a: ...  | b: ...".
std::string FormatProgress(const std::vector<SiteProgress>& sites,
                           double wall_s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "[%6.1f s]", wall_s);
  std::string line = buf;
  for (size_t i = 0; i < sites.size(); ++i) {
    line += (i == 0 ? " " : "  | ") + sites[i].name + ": " +
            FormatSiteProgress(sites[i]);
  }
  return line;
}

// One line per site (a terminal), names aligned, the time on the first.
std::vector<std::string> FormatProgressLines(
    const std::vector<SiteProgress>& sites, double wall_s) {
  size_t width = 0;
  for (const SiteProgress& site : sites) {
    width = std::max(width, site.name.size());
  }
  char stamp[32];
  std::snprintf(stamp, sizeof(stamp), "[%6.1f s]", wall_s);
  std::vector<std::string> lines;
  for (size_t i = 0; i < sites.size(); ++i) {
    std::string name = sites[i].name;
    name.resize(width, ' ');
    lines.push_back((i == 0 ? std::string(stamp)
                            : std::string(std::strlen(stamp), ' ')) +
                    " " + name + "  " + FormatSiteProgress(sites[i]));
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

class JobRun {
 public:
  JobRun(const pb::JobConfig& job, const RunOptions& options)
      : job_(job), options_(options) {}

  Result<pb::RunReport> Run() {
    MERIDIAN_RETURN_IF_ERROR(PrepareOutDir());
    MERIDIAN_RETURN_IF_ERROR(PrepareSecurity());
    Status started = StartChildren();
    if (!started.ok()) {
      StopAll(SIGTERM);
      WaitAll();
      ForgetEphemeralKeys();
      return started;
    }
    Monitor();
    ForgetEphemeralKeys();
    return Report();
  }

 private:
  bool StopRequested() const {
    return options_.stop_requested != nullptr &&
           options_.stop_requested->load();
  }

  Status PrepareOutDir() {
    std::error_code error;
    std::filesystem::create_directories(options_.out_dir + "/logs", error);
    if (error) {
      return InvalidArgumentError("cannot create output directory '" +
                                  options_.out_dir + "': " + error.message());
    }
    // A summary left from an earlier run into the same directory must not
    // be mistaken for this run's.
    for (const pb::SiteConfig& site : job_.site()) {
      std::filesystem::remove(SummaryPath(site.name()), error);
    }
    return Status::Ok();
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
          << ": the job with ephemeral CURVE keys (secret halves in "
          << key_dir << ").\n"
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

  std::string SummaryPath(const std::string& site) const {
    return options_.out_dir + "/site-" + site + ".json";
  }

  Status StartChildren() {
    binary_ = options_.binary.empty() ? SelfExecutable() : options_.binary;
    const std::string logs = options_.out_dir + "/logs/";
    MERIDIAN_RETURN_IF_ERROR(StartSiteServers());
    MERIDIAN_RETURN_IF_ERROR(StartWanem());
    MERIDIAN_RETURN_IF_ERROR(WriteEndpoints());
    MERIDIAN_RETURN_IF_ERROR(IntroducePeers());
    for (int s = 0; s < job_.site_size(); ++s) {
      const pb::SiteConfig& site = job_.site(s);
      MERIDIAN_ASSIGN_OR_RETURN(const std::string endpoint, WorkerEndpoint(s));
      for (uint32_t w = 0; w < SiteWorkerCount(site); ++w) {
        MERIDIAN_ASSIGN_OR_RETURN(
            ChildProcess child,
            ChildProcess::Spawn(
                "worker " + std::to_string(w) + " of site '" + site.name() +
                    "'",
                {binary_, "worker", "--config", options_.config_path, "--site",
                 site.name(), "--index", std::to_string(w), "--connect",
                 endpoint},
                logs + "worker-" + site.name() + "-" + std::to_string(w) +
                    ".log"));
        workers_.push_back(std::move(child));
      }
    }
    MLOG(INFO) << "started " << sites_.size() << " site servers and "
               << workers_.size() << " workers; logs in " << logs;
    return Status::Ok();
  }

  // Starts a server for every site that runs one and waits until each
  // listens; records their endpoints.
  Status StartSiteServers() {
    const std::string logs = options_.out_dir + "/logs/";
    for (int s = 0; s < job_.site_size(); ++s) {
      const pb::SiteConfig& site = job_.site(s);
      if (!HasServer(site)) continue;
      MERIDIAN_ASSIGN_OR_RETURN(
          ChildProcess child,
          ChildProcess::Spawn(
              "site server '" + site.name() + "'",
              {binary_, "site", "--config", options_.config_path, "--site",
               site.name(), "--bind", "tcp://127.0.0.1:*", "--mirror-bind",
               "tcp://127.0.0.1:*", "--out", options_.out_dir, "--ready-fd",
               std::to_string(kReadyFd), "--metrics", "127.0.0.1:0"},
              logs + "site-" + site.name() + ".log"));
      sites_.push_back(std::move(child));
      server_site_index_.push_back(s);
    }
    server_endpoints_.assign(job_.site_size(), "");
    mirror_endpoints_.assign(job_.site_size(), "");
    for (size_t i = 0; i < sites_.size(); ++i) {
      ChildProcess& server = sites_[i];
      Result<std::string> line = server.ReadReadyLine(kReadyTimeout);
      if (!line.ok() || line->rfind("ready ", 0) != 0) {
        server.Poll();
        return UnavailableError(server.name() + " did not start (" +
                                (line.ok() ? "unexpected '" + *line + "'"
                                           : line.status().message()) +
                                "; " + server.DescribeExit() + "); its log " +
                                server.log_path() + " ends with:\n" +
                                server.LogTail(kLogTailLines));
      }
      // "ready <worker endpoint> [<mirror endpoint>] [metrics=<address>]"
      const int s = server_site_index_[i];
      std::string rest = line->substr(6);
      AddMetricsEndpoint(server.name(), "site", job_.site(s).name(),
                         TakeMetricsField(&rest));
      std::istringstream fields(rest);
      fields >> server_endpoints_[s] >> mirror_endpoints_[s];
      progress_.push_back(
          SiteProgress{job_.site(s).name(), nullptr, std::nullopt});
      pb::Endpoint self;
      self.set_site(job_.site(s).name());
      self.set_role(pb::ROLE_LAUNCHER);
      progress_.back().client =
          std::make_unique<RpcClient>(context_, server_endpoints_[s], self);
    }
    return Status::Ok();
  }

  // Records where a child serves its metrics ("" = it has no endpoint).
  void AddMetricsEndpoint(const std::string& name, const std::string& role,
                          const std::string& site,
                          const std::string& address) {
    if (address.empty()) return;
    pb::ProcessEndpoint* entry = endpoints_.add_process();
    entry->set_name(name);
    entry->set_role(role);
    entry->set_site(site);
    entry->set_metrics_address(address);
    entry->set_metrics_url("http://" + address + "/metrics");
  }

  // OUT/endpoints.json: every child's metrics endpoint (`meridian top
  // --run OUT` reads it).
  Status WriteEndpoints() {
    endpoints_.set_job(job_.name());
    return WriteJsonFile(endpoints_, options_.out_dir + "/endpoints.json");
  }

  // Tells every site server where its sync peers listen.
  Status IntroducePeers() {
    for (size_t i = 0; i < server_site_index_.size(); ++i) {
      const int s = server_site_index_[i];
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
      Result<Envelope> reply =
          progress_[i].client->Call(request, {}, std::chrono::seconds(10));
      if (!reply.ok()) return reply.status().WithContext("introducing peers");
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
    MERIDIAN_ASSIGN_OR_RETURN(
        ChildProcess child,
        ChildProcess::Spawn("wanem",
                            {binary_, "wanem", "--config", options_.config_path,
                             "--dynamic-routes",
                             "--control", "tcp://127.0.0.1:0", "--traffic-csv",
                             options_.out_dir + "/traffic.csv", "--ready-fd",
                             std::to_string(kReadyFd), "--metrics",
                             "127.0.0.1:0"},
                            options_.out_dir + "/logs/wanem.log"));
    wanem_.emplace(std::move(child));
    Result<std::string> line = wanem_->ReadReadyLine(kReadyTimeout);
    if (!line.ok() || line->rfind("ready ", 0) != 0) {
      wanem_->Poll();
      return UnavailableError(
          "wanem did not start (" +
          (line.ok() ? "unexpected '" + *line + "'" : line.status().message()) +
          "; " + wanem_->DescribeExit() + "); its log " + wanem_->log_path() +
          " ends with:\n" + wanem_->LogTail(kLogTailLines));
    }
    // "ready <control endpoint> [metrics=<address>]"
    std::string rest = line->substr(6);
    AddMetricsEndpoint("wanem", "wanem", "", TakeMetricsField(&rest));
    wan_control_ = std::make_unique<wan::ControlClient>(rest);
    MLOG(INFO) << "wanem shapes every link between sites; control at "
               << wan_control_->endpoint();
    return Status::Ok();
  }

  // The endpoint site `from` uses to reach `target` (a ZeroMQ tcp endpoint
  // of site `to`): a wanem listener forwarding to it, or `target` itself
  // without wanem.
  Result<std::string> Route(int from, int to, const std::string& target) {
    if (!wan_control_) return target;
    const std::string prefix = "tcp://";
    if (target.rfind(prefix, 0) != 0) {
      return InvalidArgumentError("cannot route '" + target +
                                  "' through wanem: only tcp:// endpoints");
    }
    const int a = std::min(from, to);
    const int b = std::max(from, to);
    const std::string link = job_.site(a).name() + "-" + job_.site(b).name();
    MERIDIAN_ASSIGN_OR_RETURN(
        std::string listen,
        wan_control_->AddRoute(link, job_.site(from).name(), "127.0.0.1:0",
                               target.substr(prefix.size())));
    return prefix + listen;
  }

  std::vector<ChildProcess*> Children() {
    std::vector<ChildProcess*> all;
    for (ChildProcess& c : sites_) all.push_back(&c);
    for (ChildProcess& c : workers_) all.push_back(&c);
    if (wanem_) all.push_back(&*wanem_);
    return all;
  }

  void StopAll(int signal) {
    for (ChildProcess* child : Children()) child->Signal(signal);
  }

  void WaitAll() {
    const double deadline = wall_.ElapsedSeconds() + kKillGraceS;
    while (true) {
      bool all_done = true;
      for (ChildProcess* child : Children()) all_done &= child->Poll();
      if (all_done) return;
      if (wall_.ElapsedSeconds() > deadline) StopAll(SIGKILL);
      std::this_thread::sleep_for(kMonitorInterval);
    }
  }

  // Starts the shutdown of every child; `deadline_s` later the rest get
  // SIGKILL.
  void BeginStop(int signal, double grace_s) {
    if (stopping_) return;
    stopping_ = true;
    if (signal != 0) StopAll(signal);
    terminated_ = signal == SIGTERM;
    kill_deadline_s_ = wall_.ElapsedSeconds() + grace_s;
  }

  void Monitor() {
    double next_progress = 0;
    double next_plain = kPlainProgressPeriodS;
    bool sites_done_seen = false;
    while (true) {
      if (StopRequested() && !interrupted_) {
        interrupted_ = true;
        MLOG(WARNING) << "interrupted: stopping every process";
        BeginStop(SIGTERM, kKillGraceS);
      }
      bool all_done = true;
      for (ChildProcess* child : Children()) {
        const bool was_done = child->exited();
        all_done &= child->Poll();
        if (!was_done && child->exited() && !child->succeeded() && !stopping_) {
          failure_ = child->name() + " " + child->DescribeExit() +
                     "; its log " + child->log_path() + " ends with:\n" +
                     child->LogTail(kLogTailLines);
          MLOG(ERROR) << failure_;
          BeginStop(SIGTERM, kKillGraceS);
        }
      }
      if (all_done) break;
      const bool sites_done =
          std::all_of(sites_.begin(), sites_.end(),
                      [](const ChildProcess& c) { return c.exited(); });
      if (sites_done && !sites_done_seen) {
        sites_done_seen = true;
        // Every site has flushed: the emulator's counters are final.
        StopWanem();
        // Workers leave on their own once told to stop; give them time.
        BeginStop(0, kWorkerGraceS);
      }
      if (stopping_ && wall_.ElapsedSeconds() > kill_deadline_s_) {
        if (!terminated_) {
          terminated_ = true;
          StopAll(SIGTERM);
          kill_deadline_s_ = wall_.ElapsedSeconds() + kKillGraceS;
        } else {
          StopAll(SIGKILL);
        }
      }
      const double now = wall_.ElapsedSeconds();
      if (!stopping_ && now >= next_progress) {
        next_progress = now + kProgressPeriodS;
        PollProgress();
        const bool tty = options_.progress != nullptr &&
                         ::isatty(::fileno(options_.progress));
        if (tty) {
          // Redraw the block of site lines in place: up to its first line,
          // then each line cleared and rewritten.
          const std::vector<std::string> lines =
              FormatProgressLines(progress_, now);
          std::string block;
          if (progress_lines_ > 0) {
            block += "\033[" + std::to_string(progress_lines_) + "A";
          }
          for (const std::string& line : lines) {
            block += "\r\033[K" + line + "\n";
          }
          std::fputs(block.c_str(), options_.progress);
          std::fflush(options_.progress);
          progress_lines_ = static_cast<int>(lines.size());
        } else if (options_.progress != nullptr && now >= next_plain) {
          next_plain = now + kPlainProgressPeriodS;
          std::fprintf(options_.progress, "%s\n",
                       FormatProgress(progress_, now).c_str());
          std::fflush(options_.progress);
        }
      }
      std::this_thread::sleep_for(kMonitorInterval);
    }
  }

  void PollProgress() {
    for (SiteProgress& site : progress_) {
      pb::Header request;
      request.set_type(pb::STATUS_REQUEST);
      Result<Envelope> reply =
          site.client->Call(request, {}, std::chrono::milliseconds(300));
      if (reply.ok() && reply->header.type() == pb::STATUS_REPLY) {
        site.status = reply->header.status();
        site.clock = reply->header.clock();
      }
    }
  }

  // Reads wanem's final counters, then stops it.
  void StopWanem() {
    if (!wanem_ || wanem_->exited()) return;
    Result<pb::WanControlReply> status = wan_control_->GetStatus();
    if (status.ok()) {
      final_traffic_ = std::move(*status);
    } else {
      MLOG(ERROR) << "cannot read wanem's counters: " << status.status();
    }
    wanem_->Signal(SIGTERM);
  }

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
      outcome = "failed: " + failure_.substr(0, failure_.find('\n'));
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
    if (summaries.empty()) {
      return UnavailableError(failure_.empty()
                                  ? "no site server wrote its summary (" +
                                        missing + ")"
                                  : failure_);
    }
    pb::RunReport report =
        BuildRunReport(job_, summaries, wall_.ElapsedSeconds(), outcome);
    if (final_traffic_) {
      double total = 0;
      for (pb::LinkTraffic& link : wan::LinkTrafficFromReply(*final_traffic_)) {
        total += link.bytes();
        *report.add_links() = std::move(link);
      }
      report.set_wan_bytes_total(total);
      if (total > 0) {
        report.set_wan_reduction(report.dense_equivalent_bytes() / total);
      }
    }
    MERIDIAN_RETURN_IF_ERROR(
        WriteJsonFile(report, options_.out_dir + "/report.json"));
    MERIDIAN_RETURN_IF_ERROR(
        WriteTimelineCsv(summaries, options_.out_dir + "/timeline.csv"));
    if (!failure_.empty()) return UnavailableError(failure_);
    if (!missing.empty()) {
      return UnavailableError("site servers without a summary: " + missing);
    }
    return report;
  }

  const pb::JobConfig& job_;
  // A copy: PrepareSecurity may point config_path at the derived job file.
  RunOptions options_;
  std::vector<std::string> ephemeral_keys_;  // secret key files we wrote
  Stopwatch wall_;
  zmq::context_t context_;
  std::string binary_;
  std::vector<ChildProcess> sites_;            // site servers
  std::vector<int> server_site_index_;         // site index of each sites_[i]
  std::vector<std::string> server_endpoints_;  // by site index; "" if none
  std::vector<std::string> mirror_endpoints_;  // by site index; "" if none
  std::optional<ChildProcess> wanem_;          // when sites exchange traffic
  std::unique_ptr<wan::ControlClient> wan_control_;
  std::optional<pb::WanControlReply> final_traffic_;
  std::vector<ChildProcess> workers_;
  std::vector<SiteProgress> progress_;
  bool stopping_ = false;
  bool terminated_ = false;
  bool interrupted_ = false;
  int progress_lines_ = 0;  // lines of the live block drawn on a terminal
  pb::RunEndpoints endpoints_;  // written to OUT/endpoints.json
  double kill_deadline_s_ = 0;
  std::string failure_;
};

}  // namespace

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

}  // namespace meridian
