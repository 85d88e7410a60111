#include "launch/run_manifest.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "meridian/core/clock.h"
#include "meridian/core/log.h"
#include "meridian/report/report.h"

namespace meridian {

RunManifestFile::RunManifestFile(std::string out_dir)
    : out_dir_(std::move(out_dir)) {}

void RunManifestFile::Start(const pb::JobConfig& job,
                            const std::string& config_path) {
  std::error_code error;
  std::vector<std::filesystem::path> stale;
  for (const auto& entry :
       std::filesystem::directory_iterator(out_dir_, error)) {
    if (entry.path().filename().string().rfind("traffic.wanem-", 0) == 0) {
      stale.push_back(entry.path());
    }
  }
  for (const auto& path : stale) std::filesystem::remove(path, error);
  manifest_.set_job(job.name());
  manifest_.set_config_path(
      std::filesystem::absolute(config_path, error).string());
  manifest_.set_working_dir(std::filesystem::current_path(error).string());
  manifest_.set_started_unix_s(UnixSeconds());
}

Status RunManifestFile::Continue() {
  MERIDIAN_RETURN_IF_ERROR(ReadJsonFile(Path(), &manifest_));
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
                  << "; relative paths of its job file now start from " << here;
  }
  AddEvent(pb::JOB_RESUMED, "job",
           "meridian run --resume " + out_dir_ + " (resume " +
               std::to_string(manifest_.resumes()) +
               "): site servers continue from their checkpoints, workers "
               "start fresh",
           0);
  return Status::Ok();
}

void RunManifestFile::Save() {
  Status saved = WriteJsonFile(manifest_, Path());
  if (!saved.ok() && !warned_) {
    warned_ = true;
    MLOG(WARNING) << "cannot write " << Path() << ": " << saved;
  }
}

int RunManifestFile::AddEvent(pb::FaultKind kind, const std::string& subject,
                              const std::string& detail, double duration_s) {
  pb::FaultEvent event;
  event.set_kind(kind);
  event.set_site("");
  event.set_subject(subject);
  event.set_unix_s(UnixSeconds());
  event.set_t_s(event.unix_s() - manifest_.started_unix_s());
  event.set_duration_s(duration_s);
  event.set_detail(detail);
  const int index =
      AppendFaultEvent(std::move(event), manifest_.mutable_events(),
                       &events_capped_, "launcher fault events");
  if (index >= 0) Save();
  return index;
}

void RunManifestFile::EndOutage(const std::vector<int>& events) {
  const double now_unix = UnixSeconds();
  for (int e : events) {
    if (e < 0 || e >= manifest_.events_size()) continue;  // not kept
    pb::FaultEvent* event = manifest_.mutable_events(e);
    event->set_duration_s(now_unix - event->unix_s());
  }
}

void RunManifestFile::StartWanIncarnation() {
  pb::WanIncarnation* incarnation = manifest_.add_wanem();
  incarnation->set_started_unix_s(UnixSeconds());
  incarnation->set_traffic_csv("traffic.csv");
  Save();
}

void RunManifestFile::RecordWanCounters(std::vector<pb::LinkTraffic> links,
                                        bool final) {
  pb::WanIncarnation* current =
      manifest_.mutable_wanem(manifest_.wanem_size() - 1);
  current->clear_links();
  for (pb::LinkTraffic& link : links) {
    *current->add_links() = std::move(link);
  }
  current->set_counted_unix_s(UnixSeconds());
  current->set_final(final);
  Save();
}

void RunManifestFile::EndWanIncarnation() {
  if (manifest_.wanem_size() == 0) return;
  pb::WanIncarnation* current =
      manifest_.mutable_wanem(manifest_.wanem_size() - 1);
  if (current->final()) return;
  const double since = current->counted_unix_s() > 0
                           ? current->counted_unix_s()
                           : current->started_unix_s();
  current->set_uncounted_s(std::max(0.0, UnixSeconds() - since));
  Save();
}

void RunManifestFile::SetAsideTrafficCsv() {
  if (manifest_.wanem_size() == 0) return;
  KeepTrafficCsv(manifest_.mutable_wanem(manifest_.wanem_size() - 1),
                 manifest_.wanem_size());
  Save();
}

void RunManifestFile::CompleteReport(pb::RunReport* report) {
  AddFaultEvents({manifest_.events().begin(), manifest_.events().end()},
                 manifest_.started_unix_s(), report);
  if (manifest_.wanem_size() > 0) {
    AddWanTraffic({manifest_.wanem().begin(), manifest_.wanem().end()}, report);
    MergeTrafficFiles();
  }
  Save();
}

void RunManifestFile::KeepTrafficCsv(pb::WanIncarnation* incarnation,
                                     int number) {
  if (incarnation->traffic_csv() != "traffic.csv") return;
  const std::string name = "traffic.wanem-" + std::to_string(number) + ".csv";
  std::error_code error;
  std::filesystem::rename(out_dir_ + "/traffic.csv", out_dir_ + "/" + name,
                          error);
  if (error) {
    MLOG(WARNING) << "cannot keep the traffic samples of wanem process "
                  << number << ": " << error.message();
    incarnation->clear_traffic_csv();
    return;
  }
  incarnation->set_traffic_csv(name);
}

// The last process's file is kept as its own too, so a later resume merges
// from the per-process files again.
void RunManifestFile::MergeTrafficFiles() {
  if (manifest_.wanem_size() < 2) return;
  KeepTrafficCsv(manifest_.mutable_wanem(manifest_.wanem_size() - 1),
                 manifest_.wanem_size());
  std::vector<std::string> inputs;
  std::vector<double> offsets;
  const double first = manifest_.wanem(0).started_unix_s();
  for (const pb::WanIncarnation& incarnation : manifest_.wanem()) {
    if (incarnation.traffic_csv().empty()) continue;
    inputs.push_back(out_dir_ + "/" + incarnation.traffic_csv());
    offsets.push_back(incarnation.started_unix_s() - first);
  }
  Status merged = MergeTrafficCsv(inputs, offsets, out_dir_ + "/traffic.csv");
  if (!merged.ok()) {
    MLOG(WARNING) << "cannot merge the traffic samples of wanem's "
                  << manifest_.wanem_size() << " processes: " << merged;
  }
}

// Declared in meridian/launcher.h.
Result<std::string> ResumeConfigPath(const std::string& run_dir) {
  const std::string path = RunManifestFile(run_dir).Path();
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

}  // namespace meridian
