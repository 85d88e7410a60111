// The `meridian` command line: parses flags and calls the library. No logic
// a test needs lives here.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <ctime>
#include <string>

#include "meridian/config.h"
#include "meridian/launcher.h"
#include "meridian/log.h"
#include "meridian/site_server.h"
#include "meridian/worker.h"

namespace meridian {
namespace {

// Exit codes: 0 success, 1 the job or role failed, 2 bad input (flags or
// job file), 130 interrupted.
constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitInterrupted = 130;

// Loads and validates the job file, printing every problem.
bool LoadJob(const std::string& path, pb::JobConfig* job) {
  Result<pb::JobConfig> loaded = LoadJobConfig(path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().message().c_str());
    return false;
  }
  *job = std::move(*loaded);
  return true;
}

std::string DefaultOutDir(const pb::JobConfig& job) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &local);
  return "runs/" + job.name() + "-" + stamp;
}

int Validate(const std::string& path) {
  pb::JobConfig job;
  if (!LoadJob(path, &job)) return kExitBadInput;
  std::printf("%s: OK (%d sites, %u workers, %s)\n", path.c_str(),
              job.site_size(), TotalWorkerCount(job),
              pb::PolicyKind_Name(job.policy().kind()).c_str());
  return 0;
}

int Run(const std::string& path, std::string out_dir) {
  pb::JobConfig job;
  if (!LoadJob(path, &job)) return kExitBadInput;
  const std::atomic<bool>* stop = InstallStopSignalHandlers();
  if (out_dir.empty()) out_dir = DefaultOutDir(job);
  RunOptions options;
  options.config_path = path;
  options.out_dir = out_dir;
  options.stop_requested = stop;
  std::printf("running job '%s' (%d sites, %u workers); output in %s\n",
              job.name().c_str(), job.site_size(), TotalWorkerCount(job),
              out_dir.c_str());
  std::fflush(stdout);
  Result<pb::RunReport> report = RunJob(job, options);
  if (!report.ok()) {
    std::fprintf(stderr, "meridian run failed: %s\n",
                 report.status().message().c_str());
    return stop->load() ? kExitInterrupted : kExitFailure;
  }
  if (report->reached_target()) {
    std::printf("reached target accuracy %.4f at %.1f s of training\n",
                report->target_accuracy(), report->time_to_target_s());
  } else if (report->target_accuracy() > 0) {
    std::printf("did not reach target accuracy %.4f (%s)\n",
                report->target_accuracy(), report->outcome().c_str());
  }
  std::printf("final accuracy %.4f, loss %.4f, wall time %.1f s\n",
              report->final_accuracy(), report->final_loss(), report->wall_s());
  std::printf("report: %s/report.json\ntimeline: %s/timeline.csv\n",
              out_dir.c_str(), out_dir.c_str());
  return stop->load() ? kExitInterrupted : 0;
}

int Site(const std::string& path, const std::string& site,
         const std::string& bind, const std::string& out_dir, int ready_fd) {
  SiteServerOptions options;
  if (!LoadJob(path, &options.job)) return kExitBadInput;
  options.site = site;
  options.bind = bind;
  options.out_dir = out_dir;
  options.stop_requested = InstallStopSignalHandlers();
  Result<std::unique_ptr<SiteServer>> server =
      SiteServer::Create(std::move(options));
  if (!server.ok()) {
    MLOG(ERROR) << server.status();
    return kExitFailure;
  }
  if (ready_fd >= 0) {
    const std::string line = "ready " + (*server)->endpoint() + "\n";
    if (::write(ready_fd, line.data(), line.size()) !=
        static_cast<ssize_t>(line.size())) {
      MLOG(WARNING) << "cannot write the ready line to fd " << ready_fd;
    }
    ::close(ready_fd);
  }
  if (Status status = (*server)->Run(); !status.ok()) {
    MLOG(ERROR) << status;
    return kExitFailure;
  }
  return 0;
}

int WorkerRole(const std::string& path, const std::string& site, uint32_t index,
               const std::string& connect) {
  WorkerOptions options;
  if (!LoadJob(path, &options.job)) return kExitBadInput;
  options.site = site;
  options.index = index;
  options.connect = connect;
  options.stop_requested = InstallStopSignalHandlers();
  Result<std::unique_ptr<Worker>> worker = Worker::Create(std::move(options));
  if (!worker.ok()) {
    MLOG(ERROR) << worker.status();
    return kExitFailure;
  }
  if (Status status = (*worker)->Run(); !status.ok()) {
    MLOG(ERROR) << status;
    return status.code() == StatusCode::kCancelled ? kExitInterrupted
                                                   : kExitFailure;
  }
  return 0;
}

int Main(int argc, char** argv) {
  CLI::App app{
      "Meridian: geo-distributed training with site parameter servers"};
  app.require_subcommand(1);

  std::string config;
  std::string out_dir;
  std::string site;
  std::string endpoint;
  uint32_t index = 0;
  int ready_fd = -1;

  CLI::App* validate = app.add_subcommand(
      "validate", "Check a job file; print every problem with line:column");
  validate->add_option("FILE", config, "job file (text-format JobConfig)")
      ->required();

  CLI::App* run = app.add_subcommand(
      "run", "Run a whole job on this machine: every role as a child process");
  run->add_option("FILE", config, "job file")->required();
  run->add_option("--out", out_dir,
                  "output directory (default runs/<job>-<time>)");

  CLI::App* site_cmd =
      app.add_subcommand("site", "Run one site server of a job");
  site_cmd->add_option("--config", config, "job file")->required();
  site_cmd->add_option("--site", site, "site name in the job file")->required();
  site_cmd->add_option("--bind", endpoint,
                       "ZeroMQ endpoint to listen on (default: the site's "
                       "address)");
  site_cmd->add_option("--out", out_dir,
                       "directory for the site summary (site-<name>.json)");
  site_cmd->add_option("--ready-fd", ready_fd,
                       "write 'ready <endpoint>' to this fd once listening");

  CLI::App* worker_cmd = app.add_subcommand("worker", "Run one worker");
  worker_cmd->add_option("--config", config, "job file")->required();
  worker_cmd->add_option("--site", site, "site name in the job file")
      ->required();
  worker_cmd->add_option("--index", index, "worker index inside the site")
      ->required();
  worker_cmd->add_option("--connect", endpoint,
                         "site server endpoint (default: the site's "
                         "address)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : kExitBadInput;
  }
  if (*validate) return Validate(config);
  if (*run) return Run(config, out_dir);
  if (*site_cmd) return Site(config, site, endpoint, out_dir, ready_fd);
  if (*worker_cmd) return WorkerRole(config, site, index, endpoint);
  return kExitBadInput;
}

}  // namespace
}  // namespace meridian

int main(int argc, char** argv) { return meridian::Main(argc, argv); }
