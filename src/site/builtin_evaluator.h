// The evaluation of a built-in model, on a thread of the site server
// (evaluation.h): evaluates a snapshot of the site's model on the test set
// every eval_period_s (the timeline of the report), and, when the event
// loop asks, the global loss on fixed training minibatches for the
// intra-site policy (ADSP, ADACOMM) and a travelled model against the
// site's own (SkewScout) — so that none ever blocks a commit.
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
#ifndef MERIDIAN_SITE_BUILTIN_EVALUATOR_H_
#define MERIDIAN_SITE_BUILTIN_EVALUATOR_H_

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
#include "site/evaluation.h"

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
  // What a point records besides the model's numbers.
  EvalTimeline::Sources sources;
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

class BuiltinEvaluator : public Evaluation {
 public:
  explicit BuiltinEvaluator(EvaluatorOptions options);
  ~BuiltinEvaluator() override;  // stops the thread
  BuiltinEvaluator(const BuiltinEvaluator&) = delete;
  BuiltinEvaluator& operator=(const BuiltinEvaluator&) = delete;

  // Starts the thread (once); Stop() ends and joins it (idempotent).
  void Start() override;
  void Stop() override;

  // Loss evaluations run on the thread; any thread may ask.
  void RequestLoss() override;
  std::vector<std::pair<double, Duration>> TakeLossResults() override;

  // Scores `model` and a snapshot of this site's on the held-out sample,
  // on the thread; neither touches the store. False without a held-out
  // sample (no SkewScout) or while one is pending.
  bool RequestTravelScore(TravelScore request,
                          std::vector<float> model) override;
  std::vector<TravelScore> TakeTravelScores() override;

  // Evaluates the model once more on the calling thread (the thread is
  // stopped by then) and records it.
  Status EvaluateFinal(const std::function<Status()>& poll_once) override;

  std::string MissingCurveReason() const override;
  std::string Describe() const override;
  const EvalTimeline& timeline() const override { return timeline_; }
  EvalTimeline& timeline() override { return timeline_; }

 private:
  bool evaluates_loss() const { return options_.loss_set.size() > 0; }
  void Loop();
  // Evaluates `params` (the model at `version`, after `commits`) on the
  // test set and records the point.
  void EvaluateTestSet(std::span<const float> params, uint64_t version,
                       uint64_t commits);
  // Scores a travelled model against `params` (this site's) on the
  // held-out sample.
  void ScoreTravelled(std::span<const float> params,
                      std::span<const float> travelled, TravelScores* scores);

  EvaluatorOptions options_;  // the model and data: the thread's alone
  EvalTimeline timeline_;
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
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_BUILTIN_EVALUATOR_H_
