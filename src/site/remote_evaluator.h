// The evaluation of a model the site server does not implement
// (evaluation.h; model.kind EXTERNAL): the site's evaluator process — a
// user program that owns the model's code and the user's data
// (EvaluatorConfig) — joins the worker endpoint with a HELLO whose sender
// role is ROLE_EVALUATOR, and asks for work with EVAL_RESULT; the server
// answers each request with an EVAL_TASK carrying a snapshot of the model
// (one RAW slice per tensor) and the split to evaluate it on, or holds it
// (sending HEARTBEATs) until there is a task. docs/worker-protocol.md,
// "Evaluators", is the protocol.
//
// Tasks, in the order they are handed out: the final evaluation; the
// policy's loss evaluation (the training sample; requests merge); a
// SkewScout pair (the site's own snapshot, then the travelled model, both
// on the training sample; one pair at a time); a curve point (the
// validation split, every eval_period_s, on the latest snapshot). One task
// is in flight at a time. A task its evaluator does not finish (it died or
// left) goes to the next one, once; a curve point is simply replaced by the
// next period's.
//
// Results must name the job's metrics (ModelConfig.metrics) with finite
// values: anything else is refused (ERROR_MALFORMED, ERROR_NON_FINITE,
// naming the metric) and the task dropped; the evaluator goes on with the
// next. A failure the user's code reported (EvalResult.error) is logged
// and counted. Evaluation never touches the model.
//
// Ownership and threads: owned by SiteServer::Impl and driven by its event
// loop alone; timeline() is thread-safe. Size: one task in flight (its
// frames: one model), at most one pending task of each kind (a travelled
// model waiting: one model), the results until the loop takes them.
// Crash: nothing here outlives the process; the evaluator joins the
// restarted site server again (the timeline continues from the
// checkpoint).
#ifndef MERIDIAN_SITE_REMOTE_EVALUATOR_H_
#define MERIDIAN_SITE_REMOTE_EVALUATOR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meridian/net/transport.h"
#include "meridian/ps/param_store.h"
#include "site/evaluation.h"
#include "site/site_context.h"
#include "site/worker_endpoint.h"

namespace meridian {

class RemoteEvaluator : public Evaluation {
 public:
  // Not owned, all outliving this (endpoint may not be bound yet).
  RemoteEvaluator(const SiteContext& site, WorkerEndpoint* endpoint,
                  const ParameterStore* store, MetricSpec metric,
                  EvalTimeline::Sources sources);
  RemoteEvaluator(const RemoteEvaluator&) = delete;
  RemoteEvaluator& operator=(const RemoteEvaluator&) = delete;

  // A message from an evaluator (sender role ROLE_EVALUATOR): HELLO,
  // EVAL_RESULT, HEARTBEAT or BYE. Others are refused.
  void Handle(const Envelope& message);
  // Whether `routing_id` is the connection of the evaluator that joined.
  bool IsSessionConnection(const std::string& routing_id) const {
    return session_ && session_->routing_id == routing_id;
  }
  // Once per turn of the event loop: schedules curve points, declares a
  // silent evaluator gone, heartbeats a waiting one, hands out work.
  void OnTick();

  // Evaluation, in the order the tasks are handed out.
  // Asks the evaluator for the final model's metrics and runs the loop
  // until they arrive, the evaluator goes, or worker_timeout_s passes
  // without progress; then tells the evaluator the job is over.
  Status EvaluateFinal(const std::function<Status()>& poll_once) override;
  // A loss evaluation is a TRAINING_SAMPLE task; its result is the value
  // of model.loss_metric, stamped with when its snapshot was read.
  void RequestLoss() override;
  std::vector<std::pair<double, Duration>> TakeLossResults() override;
  // Two TRAINING_SAMPLE tasks, the site's own snapshot then `model`;
  // false while a pair is pending or no evaluator is connected.
  bool RequestTravelScore(TravelScore request,
                          std::vector<float> model) override;
  std::vector<TravelScore> TakeTravelScores() override;
  // Start() schedules a curve point at once and then every eval_period_s;
  // after Stop() no more are scheduled.
  void Start() override;
  void Stop() override;
  std::string MissingCurveReason() const override;
  std::string Describe() const override { return "evaluator process"; }
  const EvalTimeline& timeline() const override { return timeline_; }
  EvalTimeline& timeline() override { return timeline_; }

 private:
  enum class Kind { kFinal, kLoss, kTravelOwn, kTravelPeer, kCurve };
  struct Task {
    Kind kind = Kind::kCurve;
    uint64_t id = 0;
    uint64_t version = 0;  // of the snapshot sent
    uint64_t commits = 0;
    Duration taken_at{};   // when the snapshot was taken
    bool retried = false;  // already given to an evaluator once
  };
  // The evaluator process connected now.
  struct Session {
    std::string routing_id;
    uint64_t incarnation = 0;
    double last_heard_s = 0;
    double last_heartbeat_s = 0;
    bool waiting = false;  // its request is held
  };
  // A SkewScout request: the travelled model, and the own score once the
  // first half of the pair is back.
  struct PendingTravel {
    TravelScore request;
    std::vector<float> model;
    std::optional<double> own_score;
    uint32_t samples = 0;
  };
  // A result's metrics, checked against the job's: name -> value.
  using Metrics = std::vector<std::pair<std::string, double>>;

  void HandleHello(const Envelope& message);
  void HandleResult(const Envelope& message);
  // The session behind `message`, or nullopt after refusing it.
  bool FromSession(const Envelope& message);
  Parsed<Metrics> ParseMetrics(const pb::EvalResult& result) const;
  void Apply(const Task& task, const Metrics& metrics, uint64_t samples);
  void RecordPoint(const Task& task, const Metrics& metrics);
  // The task to hand out next, if any (and takes it off the pending set).
  std::optional<Task> NextTask();
  // Sends work (or the stop) to a waiting evaluator.
  void Dispatch();
  // Fills `task`'s snapshot fields as it reads the model into the frames.
  Status SendTask(Task* task);
  void SendStop();
  // The evaluator went (timed out, left, replaced): its task goes back.
  void Requeue();
  std::optional<double> ValueOf(const Metrics& metrics,
                                const std::string& name) const;

  const SiteContext& site_;
  WorkerEndpoint* const endpoint_;
  const ParameterStore* const store_;
  EvalTimeline timeline_;
  std::optional<Session> session_;
  std::optional<Task> in_flight_;
  std::optional<Task> requeued_;  // the in-flight task of a departed one
  uint64_t next_task_id_ = 1;
  bool started_ = false;
  bool stopped_ = false;
  bool final_pending_ = false;
  bool final_done_ = false;
  bool loss_pending_ = false;
  bool curve_due_ = false;
  double next_curve_s_ = 0;
  std::optional<PendingTravel> travel_;
  std::vector<std::pair<double, Duration>> loss_results_;
  std::vector<TravelScore> travel_scores_;
  uint64_t failures_ = 0;  // tasks whose evaluation failed or was refused
  bool ever_joined_ = false;
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_REMOTE_EVALUATOR_H_
