// How a site's model is evaluated, whoever evaluates it: the curve (the
// timeline of the report) and the job's target, the intra-site policy's
// loss evaluations (ADSP, ADACOMM), and SkewScout's scoring of a peer's
// travelled model against the site's own. Two implementations:
//   BuiltinEvaluator  (builtin_evaluator.h) a thread of the site server
//                     with its own copy of a built-in model and the job's
//                     data sets;
//   RemoteEvaluator   (remote_evaluator.h) the site's evaluator process
//                     (EvaluatorConfig), a user program that owns the
//                     model's code and data, served over the worker
//                     endpoint — how models the server does not implement
//                     (model.kind EXTERNAL) are evaluated.
// The rest of the site server sees only Evaluation.
//
// Threads: every method is called from the event loop's thread, except the
// readers marked "any thread" (the metrics endpoint, the summary). What an
// implementation's own thread shares is its business.
#ifndef MERIDIAN_SITE_EVALUATION_H_
#define MERIDIAN_SITE_EVALUATION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "meridian/core/clock.h"
#include "meridian/core/mutex.h"
#include "meridian/core/status.h"
#include "meridian/core/thread_annotations.h"
#include "meridian/report.pb.h"
#include "meridian/sync/skew_control.h"
#include "meridian/train/model.h"

namespace meridian {

// A peer's travelled model to score (SkewScout) and, once scored, how it
// and this site's own model did on the site's training sample.
struct TravelScore {
  std::string peer;
  uint64_t travel_id = 0;
  int64_t clock = 0;
  TravelScores scores;
};

// Appends a named metric's value to `point`.
void AddMetric(pb::EvalPoint* point, std::string_view name, double value);

// The timeline of a site's evaluations and whether the job's target was
// reached: what both evaluators record into. Thread-safe (any thread).
// Size: one point per evaluation (eval_period_s apart: a 10 h job at 1 s
// holds 36,000 points); restored from a checkpoint on --resume.
class EvalTimeline {
 public:
  // What a point records besides the evaluation's own numbers; each
  // callable must be thread-safe (it is called on the evaluating thread).
  struct Sources {
    std::function<double()> training_s;  // seconds of training now
    std::function<uint64_t()> commits;   // commits applied so far
    std::function<double()> theta;       // the sync's θ (may be empty)
    // SkewScout's knob (may be empty; nullopt: no SkewScout).
    std::function<std::optional<double>()> skew_knob;
  };
  // `target` on `metric` (0: none).
  EvalTimeline(MetricSpec metric, double target, Sources sources);

  // A point stamped now: training time, θ, SkewScout's knob, and the model
  // version and commit count given. The caller adds the metrics.
  pb::EvalPoint NewPoint(uint64_t version, uint64_t commits) const;
  uint64_t commits() const { return sources_.commits(); }
  // Appends `point` (whose `metric` is the job's metric) and notes when
  // the target is first reached.
  void Record(const pb::EvalPoint& point) EXCLUDES(mu_);

  std::vector<pb::EvalPoint> Points() const EXCLUDES(mu_);
  std::optional<pb::EvalPoint> Last() const EXCLUDES(mu_);
  double time_to_target_s() const EXCLUDES(mu_);
  bool target_reached() const { return target_reached_.load(); }
  const MetricSpec& metric() const { return metric_; }
  // Continues a checkpoint's timeline.
  void Restore(std::vector<pb::EvalPoint> points, double time_to_target_s)
      EXCLUDES(mu_);

 private:
  const MetricSpec metric_;
  const double target_;
  const Sources sources_;
  mutable Mutex mu_;
  std::vector<pb::EvalPoint> points_ GUARDED_BY(mu_);
  double time_to_target_s_ GUARDED_BY(mu_) = -1;
  std::atomic<bool> target_reached_{false};
};

class Evaluation {
 public:
  virtual ~Evaluation() = default;

  // Training started: evaluations begin (every eval_period_s). Stop()
  // ends them (idempotent; the final evaluation comes after).
  virtual void Start() = 0;
  virtual void Stop() = 0;

  // Asks for one loss evaluation of the model as it is now, on the fixed
  // training sample (requests while one is pending merge).
  virtual void RequestLoss() = 0;
  // Finished loss evaluations: (loss, when the snapshot was taken).
  virtual std::vector<std::pair<double, Duration>> TakeLossResults() = 0;

  // Scores `model` (a peer's, travelled) and a snapshot of this site's on
  // the site's training sample. One at a time: false (and nothing kept)
  // while one is pending, or when this site cannot score.
  virtual bool RequestTravelScore(TravelScore request,
                                  std::vector<float> model) = 0;
  virtual std::vector<TravelScore> TakeTravelScores() = 0;

  // The final evaluation, after training ended (Stop()). `poll_once` runs
  // one turn of the event loop (an evaluator process needs the loop to
  // answer); an implementation may call it until it is done or gives up
  // (a missing evaluator is no error: the site just has no final point).
  virtual Status EvaluateFinal(const std::function<Status()>& poll_once) = 0;

  // Why the site has no curve (no evaluator joined ...); empty when it has
  // evaluations. For the summary and the log.
  virtual std::string MissingCurveReason() const = 0;
  // "test set of 10000 samples", "evaluator process": for the log.
  virtual std::string Describe() const = 0;

  // The timeline and the target (any thread).
  virtual const EvalTimeline& timeline() const = 0;
  virtual EvalTimeline& timeline() = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_EVALUATION_H_
