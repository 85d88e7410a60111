// The site server's evaluator thread: evaluates a snapshot of the site's
// model on the test set every eval_period_s (the timeline of the report),
// and, when the event loop asks, the global loss on fixed training
// minibatches for the intra-site policy (ADSP, ADACOMM) — so that neither
// ever blocks a commit.
//
// Threads: Start() runs the thread; RequestLoss(), TakeLossResults() and
// the readers are called from the event loop (or any thread) and share
// only what is GUARDED_BY(mu_) with it. The thread reads the store through
// ParameterStore::Snapshot (shard-locked) and uses its own model copy and
// data sets, which nothing else touches while it runs.
// Size: the timeline grows by one point per eval_period_s (a 10 h job at
// 1 s: 36,000 points of 40 bytes); loss requests coalesce into one.
// Crash: nothing here outlives the process; the timeline is written with
// the site summary.
#ifndef MERIDIAN_SITE_EVALUATOR_H_
#define MERIDIAN_SITE_EVALUATOR_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "meridian/core/clock.h"
#include "meridian/core/status.h"
#include "meridian/job.pb.h"
#include "meridian/train/dataset.h"
#include "meridian/train/model.h"
#include "meridian/core/mutex.h"
#include "meridian/ps/param_store.h"
#include "meridian/report.pb.h"
#include "meridian/sync/skew_control.h"
#include "meridian/core/thread_annotations.h"

namespace meridian {

struct EvaluatorOptions {
  const ParameterStore* store = nullptr;  // not owned; outlives the evaluator
  std::unique_ptr<Model> model;           // the evaluation copy (owned)
  Dataset test_set;
  // Fixed training minibatches of the policy's loss evaluations; empty:
  // loss requests are ignored.
  Dataset loss_set;
  // SkewScout's held-out sample of the site's own training data, on which
  // travelled models are scored; empty: travel requests are refused.
  Dataset holdout_set;
  double eval_period_s = 1;
  // On the model's metric (model->metric() says which way is better);
  // 0: none.
  double target = 0;
  const Clock* clock = SystemClock();  // time stamps of loss evaluations
  // Both called on the evaluator thread, so thread-safe: seconds of
  // training now (frozen once the job ended), and commits applied so far.
  std::function<double()> training_s;
  std::function<uint64_t()> commits;
  // The sync's threshold now, for the timeline (may be empty).
  std::function<double()> theta;
  // SkewScout's knob now (may be empty; nullopt: no SkewScout).
  std::function<std::optional<double>()> skew_knob;
};

// The data sets a site's evaluator works on: the test set; when the
// policy evaluates the global loss (ADSP, ADACOMM), fixed training
// minibatches (loss_eval_batches x batch_size samples of the training set,
// the same at every site); with SkewScout, a held-out sample of this
// site's share (holdout_samples, a seed per site).
struct EvaluationSets {
  Dataset test;
  Dataset loss;
  Dataset holdout;
};
// `raw`: the job's data with its training images (LoadRawData). Errors:
// the site's share cannot be worked out (SiteSampleIndices).
Result<EvaluationSets> MakeEvaluationSets(const pb::JobConfig& job,
                                          int site_index, const RawData& raw);

// A peer's travelled model to score (SkewScout) and, once scored, how it
// and this site's own model did on the held-out sample.
struct TravelScore {
  std::string peer;
  uint64_t travel_id = 0;
  int64_t clock = 0;
  TravelScores scores;
};

class Evaluator {
 public:
  explicit Evaluator(EvaluatorOptions options);
  ~Evaluator();  // stops the thread
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // Starts the thread (once); Stop() ends and joins it (idempotent).
  void Start();
  void Stop();

  // Asks for one loss evaluation of the model as it is now (requests made
  // while one is pending are merged). Any thread.
  void RequestLoss();
  bool evaluates_loss() const { return options_.loss_set.size() > 0; }
  uint64_t test_set_size() const { return options_.test_set.size(); }
  // Finished loss evaluations: (loss, when the snapshot was taken).
  std::vector<std::pair<double, Duration>> TakeLossResults();

  // Scores `model` (a peer's, travelled) and a snapshot of this site's on
  // the held-out sample, on the evaluator thread; neither touches the
  // store. One at a time: false (and nothing kept) while one is pending or
  // without a held-out sample. Any thread.
  bool RequestTravelScore(TravelScore request, std::vector<float> model);
  // Finished scores, in order.
  std::vector<TravelScore> TakeTravelScores();

  // Evaluates the model once more on the calling thread and records it
  // (the final evaluation). Only while the thread is not running.
  void EvaluateNow();

  // The evaluations so far, the last one, and when the target was reached
  // (-1: not yet). Any thread.
  std::vector<pb::EvalPoint> Timeline() const;
  std::optional<pb::EvalPoint> Last() const;
  double time_to_target_s() const;
  bool target_reached() const { return target_reached_.load(); }

  // Continues the timeline of a checkpoint (a site restarted with
  // --resume). Before Start().
  void Restore(std::vector<pb::EvalPoint> timeline, double time_to_target_s);

 private:
  void Loop();
  // Evaluates `params` (the model at `version`, after `commits`) on the
  // test set and records the point.
  void EvaluateTestSet(std::span<const float> params, uint64_t version,
                       uint64_t commits);
  void Record(const EvalResult& result, uint64_t version, uint64_t commits)
      EXCLUDES(mu_);

  EvaluatorOptions options_;  // the model and data: the thread's alone
  std::thread thread_;
  bool started_ = false;  // owner's thread

  mutable Mutex mu_;
  std::condition_variable_any cv_;  // loss requested or stop
  bool stop_ GUARDED_BY(mu_) = false;
  bool loss_requested_ GUARDED_BY(mu_) = false;
  std::vector<std::pair<double, Duration>> loss_results_ GUARDED_BY(mu_);
  // At most one travelled model waits (its size: one model).
  std::optional<std::pair<TravelScore, std::vector<float>>> travel_
      GUARDED_BY(mu_);
  std::vector<TravelScore> travel_scores_ GUARDED_BY(mu_);
  std::vector<pb::EvalPoint> timeline_ GUARDED_BY(mu_);
  double time_to_target_s_ GUARDED_BY(mu_) = -1;
  std::atomic<bool> target_reached_{false};
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_EVALUATOR_H_
