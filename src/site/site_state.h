// The state of a site server that several of its parts read and write:
// where the job stands (TrainingPhase) and what the site counts
// (SiteCounters).
//
// Ownership and threads: both are owned by SiteServer::Impl and changed by
// its event loop alone; what the evaluator thread reads is atomic
// (TrainingPhase::EvalTime, SiteCounters::commits). Size: fixed.
#ifndef MERIDIAN_SITE_SITE_STATE_H_
#define MERIDIAN_SITE_SITE_STATE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "meridian/core/clock.h"
#include "site/site_metrics.h"

namespace meridian {

// Before training (workers join), training, finished (and why); the
// seconds of training, those of the run this one resumed included.
class TrainingPhase {
 public:
  explicit TrainingPhase(const Clock* clock) : clock_(clock) {}
  TrainingPhase(const TrainingPhase&) = delete;
  TrainingPhase& operator=(const TrainingPhase&) = delete;

  // Training started (it may have finished since).
  bool training() const { return training_; }
  bool finished() const { return finished_; }
  // Training and not finished: the policy and the sync are told events.
  bool running() const { return training_ && !finished_; }
  const std::string& stop_reason() const { return stop_reason_; }

  // Training starts now.
  void Start();
  // Ends the job for `reason` and freezes the training time; false when it
  // had ended already.
  bool Finish(const std::string& reason);

  // Seconds of training, the run this one resumed included.
  double Elapsed() const;
  // Evaluation timestamps: seconds of training, frozen once the job ended.
  // Any thread.
  double EvalTime() const;
  // What a status and the metrics show: 0 before training, frozen once
  // the job ended.
  double ReportedSeconds() const;
  // What a checkpoint records: as ReportedSeconds, but before training the
  // training time of the run resumed from.
  double CheckpointSeconds() const;
  // The frozen training time (0 until the job ended).
  double final_training_s() const { return training_s_.load(); }

  // Continues a checkpoint's run, which had trained `trained_before_s`.
  void Resume(double trained_before_s) { trained_before_s_ = trained_before_s; }
  // ... which had finished the job: the job is over, for `reason`, after
  // `training_s` of training. Before Run().
  void ResumeFinished(const std::string& reason, double training_s);

 private:
  const Clock* const clock_;
  bool training_ = false;
  bool finished_ = false;
  std::string stop_reason_;
  // Read by the evaluator thread too, hence atomic.
  std::atomic<double> start_s_{0};
  std::atomic<double> training_s_{0};
  double trained_before_s_ = 0;  // written before the evaluator starts
};

// What the site counts; each part adds what it does, the status, the
// metrics, the summary and the checkpoint read it.
struct SiteCounters {
  // Commits applied or aggregated (read by the evaluator thread too).
  std::atomic<uint64_t> commits{0};
  uint64_t rejected = 0;          // requests refused
  uint64_t pulls = 0;             // PULLs accepted
  uint64_t loss_evaluations = 0;  // handed to the policy
  StalenessWindow staleness;      // of the commits of the last window
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_SITE_STATE_H_
