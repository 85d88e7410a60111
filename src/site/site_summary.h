// The site's summary (pb::SiteSummary): what its share of the training
// data was, how the job went (final quality, counts, the timeline, fault
// events, recovery, each worker's part), written as
// <out_dir>/site-<name>.json when the server is done — the report's input —
// next to the final model, <out_dir>/model-<name>.f32.
//
// Ownership and threads: owned by SiteServer::Impl and filled by its event
// loop (SiteServer::summary() reads it once Run returned). Size: the
// timeline and a line per worker.
#ifndef MERIDIAN_SITE_SITE_SUMMARY_H_
#define MERIDIAN_SITE_SITE_SUMMARY_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "meridian/core/status.h"
#include "meridian/ps/param_store.h"
#include "meridian/report.pb.h"
#include "meridian/sched/policy.h"
#include "report/fault_events.h"
#include "site/evaluation.h"
#include "site/site_context.h"
#include "site/site_state.h"
#include "site/worker_table.h"
#include "sync/sync_engine.h"

namespace meridian {

class SiteSummaryWriter {
 public:
  // What the summary reports; not owned, all outliving this.
  struct Sources {
    const TrainingPhase* phase = nullptr;
    const SiteCounters* counters = nullptr;
    const WorkerTable* workers = nullptr;
    const ParameterStore* store = nullptr;
    const IntraSitePolicy* policy = nullptr;
    const Evaluation* evaluator = nullptr;
    std::string metric;  // the model's metric, for the final log line
  };
  // `out_dir`: where the files go; empty: nowhere.
  SiteSummaryWriter(const SiteContext& site, std::string out_dir,
                    Sources sources);
  SiteSummaryWriter(const SiteSummaryWriter&) = delete;
  SiteSummaryWriter& operator=(const SiteSummaryWriter&) = delete;

  const pb::SiteSummary& summary() const { return summary_; }

  // The label_histogram (the served sites' shares of the training set,
  // per class) and partition (this site's, in words).
  Status DescribeTrainingData(std::span<const uint8_t> train_labels);
  // The job ended because a peer site finished it.
  void NoteStoppedByPeer() { summary_.set_stopped_by_peer(true); }
  // Why the site has no curve (Evaluation::MissingCurveReason).
  void NoteMissingCurve(const std::string& why) {
    summary_.set_no_curve_reason(why);
  }

  // The end of the job, after the final evaluation: how it went, with this
  // server's fault events, the sync's summary and events (`sync` null: the
  // site synced with nobody) and the recovery (restarts 0: none). Logs
  // the final quality.
  void Complete(const FaultEventLog& events, const SyncEngine* sync,
                const pb::SiteRecovery& recovery);
  // Adds the timeline and the workers' lines and writes the summary.
  void Write();
  // Writes the final model, little-endian float32 in layout order (the
  // summary's model_parameters of them), for comparing replicas and for
  // using it.
  void WriteModel() const;

 private:
  const SiteContext& site_;
  const std::string out_dir_;
  const Sources sources_;
  pb::SiteSummary summary_;
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_SITE_SUMMARY_H_
