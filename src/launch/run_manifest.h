// OUT/run.json (pb::RunManifest) of `meridian run`: what the run is (job,
// job file, working directory, start, resumes), the launcher's fault
// events, and one entry per wanem process with the counters last read from
// it and the file its traffic samples went to. Saved atomically after every
// change, so that `meridian run --resume` continues it after every process
// was killed and the report counts wanem's traffic across its processes.
// Its public face is meridian/launch/run_manifest.h (ResumeConfigPath);
// both are implemented by run_manifest.cc.
//
// Ownership and threads: owned by the launcher's JobRun and used by the
// thread that called RunJob alone; not thread-safe.
// Size: an event per child failure and per restart (port retries record
// nothing) and one per resume. A child fails at most max_restarts + 1
// times in a row and starts its count again only after kHealthyPeriodS
// (60 s) up, so over T seconds of a run it adds at most
// 2 * (max_restarts + 1) * (1 + T / 60) events, and never more than
// kMaxFaultEvents (fault_events.h; later ones are logged only). One wanem
// entry per wanem process.
// (The guard names src/: include/meridian/launch/run_manifest.h has the
// plain one.)
#ifndef MERIDIAN_SRC_LAUNCH_RUN_MANIFEST_H_
#define MERIDIAN_SRC_LAUNCH_RUN_MANIFEST_H_

#include <string>
#include <vector>

#include "meridian/core/status.h"
#include "meridian/job.pb.h"
#include "meridian/launch/run_manifest.h"
#include "meridian/report.pb.h"
#include "report/fault_events.h"

namespace meridian {

// wanem's counters are read this often, so a crash loses at most about
// this much of its count.
inline constexpr double kWanPollPeriodS = 1.0;

class RunManifestFile {
 public:
  explicit RunManifestFile(std::string out_dir);
  RunManifestFile(const RunManifestFile&) = delete;
  RunManifestFile& operator=(const RunManifestFile&) = delete;

  std::string Path() const { return out_dir_ + "/run.json"; }
  double started_unix_s() const { return manifest_.started_unix_s(); }
  uint32_t resumes() const { return manifest_.resumes(); }

  // A fresh run of `job` (from `config_path`), starting now; the traffic
  // files of an earlier run's wanem processes in the directory go. Not
  // saved yet.
  void Start(const pb::JobConfig& job, const std::string& config_path);
  // `--resume`: the manifest of the run goes on (a JOB_RESUMED event). Its
  // last emulator process died with its launcher, within a poll period of
  // its last count.
  Status Continue();
  // run.json, atomically. A failure is logged once: the run goes on (only
  // a later --resume needs the file).
  void Save();

  // Records a fault event of the launcher (site ""); returns its index, or -1
  // when it was not kept (kMaxFaultEvents).
  int AddEvent(pb::FaultKind kind, const std::string& subject,
               const std::string& detail, double duration_s);
  // The outage the events at `events` (AddEvent's indices) belong to is
  // over: each lasted from its time until now.
  void EndOutage(const std::vector<int>& events);

  // A new wanem process is up: a new entry, counting from 0.
  void StartWanIncarnation();
  bool has_wan_incarnation() const { return manifest_.wanem_size() > 0; }
  // The counters the live wanem process reported; `final`: its last.
  void RecordWanCounters(std::vector<pb::LinkTraffic> links, bool final);
  // The live wanem process ended: unless its final counters were read,
  // what it carried since the last read is not counted.
  void EndWanIncarnation();
  // A new wanem process is about to truncate traffic.csv: the samples of
  // the last one move to a file of their own first.
  void SetAsideTrafficCsv();

  // Adds the launcher's events and wanem's traffic (over every process) to
  // `report`, merges the traffic files into one series and saves run.json.
  void CompleteReport(pb::RunReport* report);

 private:
  // Moves traffic.csv of the process `incarnation` describes (number
  // `number`, from 1) to traffic.wanem-<number>.csv.
  void KeepTrafficCsv(pb::WanIncarnation* incarnation, int number);
  // With several wanem processes, OUT/traffic.csv becomes one series.
  void MergeTrafficFiles();

  const std::string out_dir_;
  pb::RunManifest manifest_;
  bool warned_ = false;         // a failed save was logged
  bool events_capped_ = false;  // the event bound was logged
};

}  // namespace meridian

#endif  // MERIDIAN_SRC_LAUNCH_RUN_MANIFEST_H_
