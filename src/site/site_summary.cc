#include "site/site_summary.h"

#include <fstream>
#include <optional>
#include <utility>

#include "meridian/config/config.h"
#include "meridian/core/log.h"
#include "meridian/report/report.h"
#include "meridian/train/dataset.h"
#include "site/site_model.h"

namespace meridian {

SiteSummaryWriter::SiteSummaryWriter(const SiteContext& site,
                                     std::string out_dir, Sources sources)
    : site_(site), out_dir_(std::move(out_dir)), sources_(sources) {
  summary_.set_name(site.name());
}

Status SiteSummaryWriter::DescribeTrainingData(
    std::span<const uint8_t> train_labels) {
  const pb::JobConfig& job = site_.job;
  const int num_classes = PartitionClassCount(train_labels);
  std::vector<uint64_t> histogram(num_classes, 0);
  for (int s = 0; s < job.site_size(); ++s) {
    if (s != site_.site_index && ServingSite(job, s) != site_.site_index) {
      continue;
    }
    MERIDIAN_ASSIGN_OR_RETURN(const std::vector<uint64_t> share,
                              SiteLabelHistogram(job, train_labels, s));
    for (int c = 0; c < num_classes; ++c) histogram[c] += share[c];
  }
  summary_.clear_label_histogram();
  for (uint64_t count : histogram) {
    summary_.add_label_histogram(static_cast<uint32_t>(count));
  }
  summary_.set_partition(DescribePartition(job.data().site_partition(),
                                           num_classes, job.site_size(),
                                           site_.site_index));
  return Status::Ok();
}

void SiteSummaryWriter::Complete(const FaultEventLog& events,
                                 const SyncEngine* sync,
                                 const pb::SiteRecovery& recovery) {
  const EvalTimeline& timeline = sources_.evaluator->timeline();
  const ParameterStore& store = *sources_.store;
  const TrainingPhase& phase = *sources_.phase;
  const uint64_t commits = sources_.counters->commits.load();
  const pb::EvalPoint last = timeline.Last().value_or(pb::EvalPoint());
  summary_.set_final_accuracy(last.accuracy());
  summary_.set_final_metric(last.metric());
  summary_.set_final_loss(last.loss());
  summary_.set_model_version(store.version());
  summary_.set_commits(commits);
  summary_.set_rejected(sources_.counters->rejected);
  summary_.set_training_s(phase.final_training_s());
  summary_.set_stop_reason(phase.stop_reason());
  summary_.set_model_parameters(
      static_cast<uint32_t>(site_.layout.num_elements()));
  summary_.clear_events();
  events.CopyTo(summary_.mutable_events());
  if (sync != nullptr) {
    *summary_.mutable_sync() = sync->Summary();
    sync->events().CopyTo(summary_.mutable_events());
  }
  if (recovery.restarts() > 0) *summary_.mutable_recovery() = recovery;
  summary_.set_search_time_s(sources_.policy->search_time_s());
  summary_.set_loss_evaluations(
      static_cast<uint32_t>(sources_.counters->loss_evaluations));
  summary_.set_server_momentum(store.rule().momentum);
  const double time_to_target = timeline.time_to_target_s();
  summary_.set_reached_target(time_to_target >= 0);
  summary_.set_time_to_target_s(time_to_target);
  MLOG(INFO) << "final " << sources_.metric << " " << last.metric()
             << " accuracy " << last.accuracy() << " loss " << last.loss()
             << " after " << commits << " commits (" << phase.stop_reason()
             << ")";
}

void SiteSummaryWriter::Write() {
  summary_.clear_timeline();
  for (const pb::EvalPoint& point : sources_.evaluator->timeline().Points()) {
    *summary_.add_timeline() = point;
  }
  const double training_s = sources_.phase->final_training_s();
  const WorkerTable& workers = *sources_.workers;
  summary_.clear_workers();
  for (const WorkerSlot& slot : workers.slots()) {
    pb::WorkerSummary* w = summary_.add_workers();
    w->set_site(slot.site);
    w->set_index(slot.index);
    const pb::WorkerStats s = WorkerTable::TotalStats(slot);
    w->set_steps(s.steps());
    w->set_commits(s.commits());
    w->set_compute_s(s.compute_s());
    w->set_device_wait_s(s.device_wait_s());
    w->set_blocked_s(s.blocked_s());
    w->set_commit_bytes(static_cast<double>(s.commit_bytes()));
    w->set_step_time_s(slot.step_time_s);
    w->set_steps_per_s(training_s > 0 ? s.steps() / training_s : 0);
    w->set_commits_applied(static_cast<uint32_t>(slot.commits_applied));
    w->set_incarnations(slot.incarnations);
  }
  summary_.set_duplicate_commits(
      static_cast<uint32_t>(workers.duplicate_commits()));
  if (out_dir_.empty()) return;
  const std::string path = out_dir_ + "/site-" + site_.name() + ".json";
  if (Status status = WriteJsonFile(summary_, path); !status.ok()) {
    MLOG(ERROR) << "cannot write the site summary: " << status;
  }
}

void SiteSummaryWriter::WriteModel() const {
  if (out_dir_.empty()) return;
  const std::string path = out_dir_ + "/model-" + site_.name() + ".f32";
  std::vector<float> model(sources_.store->num_elements());
  sources_.store->Snapshot(model);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(model.data()),
            static_cast<std::streamsize>(model.size() * sizeof(float)));
  if (!out) MLOG(ERROR) << "cannot write the final model to " << path;
  // The same model by tensor name, each in its own element type: what a
  // PyTorch user loads (meridian.load_weights, load_state_dict).
  const std::string named = out_dir_ + "/model-" + site_.name() + ".safetensors";
  if (Status written = WriteModelFile(named, site_.layout, model);
      !written.ok()) {
    MLOG(ERROR) << "cannot write the final model to " << named << ": "
                << written;
  }
}

}  // namespace meridian
