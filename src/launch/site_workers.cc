#include "meridian/launch/site_workers.h"

#include <signal.h>

#include <filesystem>
#include <system_error>
#include <thread>
#include <vector>

#include "launch/supervisor.h"
#include "meridian/config/config.h"
#include "meridian/core/clock.h"
#include "meridian/core/log.h"
#include "meridian/core/process.h"

namespace meridian {

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

}  // namespace meridian
