#include "site/remote_evaluator.h"

#include <cmath>
#include <cstring>
#include <set>

#include "meridian/core/format.h"
#include "meridian/core/log.h"
#include "meridian/net/message.h"

namespace meridian {
namespace {

const char* KindName(int kind) {
  static const char* const kNames[] = {"final evaluation", "loss evaluation",
                                       "SkewScout own score",
                                       "SkewScout travelled score",
                                       "curve point"};
  return kNames[kind];
}

}  // namespace

RemoteEvaluator::RemoteEvaluator(const SiteContext& site,
                                 WorkerEndpoint* endpoint,
                                 const ParameterStore* store, MetricSpec metric,
                                 EvalTimeline::Sources sources)
    : site_(site),
      endpoint_(endpoint),
      store_(store),
      timeline_(std::move(metric), JobTarget(site.job), std::move(sources)) {}

// ---- Evaluation -------------------------------------------------------------

void RemoteEvaluator::Start() {
  started_ = true;
  curve_due_ = true;  // the first point at once
  next_curve_s_ = site_.Now() + site_.job.server().eval_period_s();
}

void RemoteEvaluator::Stop() { stopped_ = true; }

void RemoteEvaluator::RequestLoss() { loss_pending_ = true; }

std::vector<std::pair<double, Duration>> RemoteEvaluator::TakeLossResults() {
  return std::exchange(loss_results_, {});
}

bool RemoteEvaluator::RequestTravelScore(TravelScore request,
                                         std::vector<float> model) {
  if (travel_.has_value() || stopped_ || !session_ ||
      model.size() != store_->num_elements()) {
    return false;
  }
  travel_ = PendingTravel{std::move(request), std::move(model), {}, 0};
  Dispatch();
  return true;
}

std::vector<TravelScore> RemoteEvaluator::TakeTravelScores() {
  return std::exchange(travel_scores_, {});
}

Status RemoteEvaluator::EvaluateFinal(
    const std::function<Status()>& poll_once) {
  Stop();
  if (!session_) {
    MLOG(WARNING) << "no evaluator is connected: the final model is not "
                     "evaluated ("
                  << MissingCurveReason() << ")";
    final_done_ = true;
    return Status::Ok();
  }
  final_pending_ = true;
  Dispatch();
  while (!final_done_ && session_) {
    MERIDIAN_RETURN_IF_ERROR(poll_once());
    OnTick();  // a silent evaluator is declared gone: no endless wait
  }
  if (!final_done_) {
    MLOG(WARNING) << "the evaluator went before it evaluated the final model";
  }
  final_done_ = true;
  Dispatch();  // the stop, to a waiting evaluator
  return Status::Ok();
}

std::string RemoteEvaluator::MissingCurveReason() const {
  if (timeline_.Last().has_value()) return "";
  if (!ever_joined_) {
    return "no evaluator joined site '" + site_.name() +
           "' (model.kind EXTERNAL is evaluated only by an evaluator "
           "program: evaluator { command: [...] })";
  }
  return "the evaluator of site '" + site_.name() +
         "' reported no evaluation (" + std::to_string(failures_) +
         " failed or refused)";
}

// ---- messages ---------------------------------------------------------------

void RemoteEvaluator::Handle(const Envelope& message) {
  switch (message.header.type()) {
    case pb::HELLO:
      return HandleHello(message);
    case pb::EVAL_RESULT:
      return HandleResult(message);
    case pb::HEARTBEAT:
      if (session_ && message.routing_id == session_->routing_id) {
        session_->last_heard_s = site_.Now();
      }
      return;  // a stray heartbeat gets no answer
    case pb::BYE:
      if (!FromSession(message)) return;
      MLOG(INFO) << "the evaluator left";
      Requeue();
      session_.reset();
      (void)endpoint_->Send(endpoint_->NewHeader(pb::BYE), {},
                            message.routing_id);
      return;
    default:
      return endpoint_->Refuse(
          message, {pb::ERROR_UNEXPECTED,
                    pb::MessageType_Name(message.header.type()) +
                        " is not a request an evaluator makes"});
  }
}

void RemoteEvaluator::HandleHello(const Envelope& message) {
  const pb::Endpoint& sender = message.header.sender();
  if (sender.site() != site_.name() || sender.id() != 0) {
    return endpoint_->Refuse(
        message, {pb::ERROR_UNKNOWN_SENDER,
                  "HELLO from evaluator " + Sanitized(sender.site(), 64) +
                      "/" + std::to_string(sender.id()) + ": site server '" +
                      site_.name() + "' serves evaluator " + site_.name() +
                      "/0"});
  }
  if (Check layout =
          CheckHelloLayout(message.header.hello(), site_.layout, "evaluator");
      !layout.ok()) {
    return endpoint_->Refuse(message, layout.rejection());
  }
  const uint64_t incarnation = message.header.hello().incarnation();
  if (session_ && session_->routing_id != message.routing_id) {
    MLOG(INFO) << "evaluator "
               << (incarnation == session_->incarnation ? "reconnected"
                                                        : "replaced");
    Requeue();
  } else if (!session_) {
    MLOG(INFO) << "evaluator joined"
               << (ever_joined_ ? " again" : "");
  }
  session_ = Session{message.routing_id, incarnation, site_.Now(), 0, true};
  ever_joined_ = true;
  Dispatch();
}

bool RemoteEvaluator::FromSession(const Envelope& message) {
  if (session_ && message.routing_id == session_->routing_id) {
    session_->last_heard_s = site_.Now();
    return true;
  }
  endpoint_->Refuse(message,
                    {pb::ERROR_UNKNOWN_SENDER,
                     "this connection is not the site's evaluator: send "
                     "HELLO first"});
  return false;
}

void RemoteEvaluator::HandleResult(const Envelope& message) {
  if (!FromSession(message)) return;
  const pb::EvalResult& result = message.header.eval_result();
  const bool current = in_flight_ && result.task_id() == in_flight_->id;
  if (current) {
    const Task task = *std::exchange(in_flight_, std::nullopt);
    if (!result.error().empty()) {
      ++failures_;
      MLOG(WARNING) << "the evaluator could not do the "
                    << KindName(static_cast<int>(task.kind)) << ": "
                    << Sanitized(result.error(), 500);
      if (task.kind == Kind::kFinal) final_done_ = true;
      if (task.kind == Kind::kTravelOwn || task.kind == Kind::kTravelPeer) {
        travel_.reset();
      }
    } else {
      Parsed<Metrics> metrics = ParseMetrics(result);
      if (!metrics.ok()) {
        ++failures_;
        if (task.kind == Kind::kFinal) final_done_ = true;
        if (task.kind == Kind::kTravelOwn || task.kind == Kind::kTravelPeer) {
          travel_.reset();
        }
        return endpoint_->Refuse(message, metrics.rejection());
      }
      Apply(task, *metrics, result.samples());
    }
  }
  session_->waiting = true;
  Dispatch();
}

Parsed<RemoteEvaluator::Metrics> RemoteEvaluator::ParseMetrics(
    const pb::EvalResult& result) const {
  std::set<std::string> known;
  for (const pb::MetricConfig& metric : site_.job.model().metrics()) {
    known.insert(metric.name());
  }
  Metrics metrics;
  std::set<std::string> seen;
  for (const pb::MetricValue& metric : result.metrics()) {
    const std::string name = Sanitized(metric.name(), 64);
    if (known.count(metric.name()) == 0) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      return Rejection{pb::ERROR_MALFORMED,
                       "metric '" + name +
                           "' is not one the job names (model.metrics: " +
                           list + ")"};
    }
    if (!seen.insert(metric.name()).second) {
      return Rejection{pb::ERROR_MALFORMED,
                       "metric '" + name + "' is reported twice"};
    }
    if (!std::isfinite(metric.value())) {
      return Rejection{pb::ERROR_NON_FINITE,
                       "metric '" + name + "' is " +
                           (std::isnan(metric.value()) ? "NaN" : "infinite")};
    }
    metrics.emplace_back(metric.name(), metric.value());
  }
  if (metrics.empty()) {
    return Rejection{pb::ERROR_MALFORMED,
                     "an EVAL_RESULT for a task carries no metric"};
  }
  return metrics;
}

std::optional<double> RemoteEvaluator::ValueOf(const Metrics& metrics,
                                               const std::string& name) const {
  for (const auto& [metric, value] : metrics) {
    if (metric == name) return value;
  }
  return std::nullopt;
}

void RemoteEvaluator::Apply(const Task& task, const Metrics& metrics,
                            uint64_t samples) {
  const MetricSpec& primary = timeline_.metric();
  switch (task.kind) {
    case Kind::kFinal:
      final_done_ = true;
      [[fallthrough]];
    case Kind::kCurve:
      return RecordPoint(task, metrics);
    case Kind::kLoss: {
      const std::string& name = site_.job.model().loss_metric();
      if (std::optional<double> loss = ValueOf(metrics, name)) {
        loss_results_.emplace_back(*loss, task.taken_at);
      } else {
        ++failures_;
        MLOG(WARNING) << "the evaluator's loss evaluation has no '" << name
                      << "' (model.loss_metric): the policy goes without it";
      }
      return;
    }
    case Kind::kTravelOwn:
    case Kind::kTravelPeer: {
      if (!travel_) return;
      const std::optional<double> value = ValueOf(metrics, primary.name);
      if (!value) {
        ++failures_;
        travel_.reset();
        return;
      }
      const double score = primary.higher_is_better ? *value : -*value;
      if (task.kind == Kind::kTravelOwn) {
        travel_->own_score = score;
        travel_->samples = static_cast<uint32_t>(
            std::min<uint64_t>(samples, UINT32_MAX));
        return;
      }
      TravelScore done = std::move(travel_->request);
      TravelScores& scores = done.scores;
      scores.own_accuracy = travel_->own_score.value_or(0);
      scores.travelled_accuracy = score;
      scores.samples = std::max<uint32_t>(travel_->samples, 1);
      const bool proportion = primary.higher_is_better &&
                              scores.own_accuracy >= 0 &&
                              scores.own_accuracy <= 1 && score >= 0 &&
                              score <= 1 && travel_->samples > 0;
      scores.kind = proportion ? ScoreKind::kAccuracy : ScoreKind::kRelative;
      travel_scores_.push_back(std::move(done));
      travel_.reset();
      return;
    }
  }
}

void RemoteEvaluator::RecordPoint(const Task& task, const Metrics& metrics) {
  pb::EvalPoint point = timeline_.NewPoint(task.version, task.commits);
  for (const auto& [name, value] : metrics) {
    AddMetric(&point, name, value);
    if (name == "accuracy") point.set_accuracy(value);
    if (name == "loss") point.set_loss(value);
  }
  if (std::optional<double> value = ValueOf(metrics, timeline_.metric().name)) {
    point.set_metric(*value);
  } else {
    // Without the job's metric the point cannot count towards the target.
    point.set_metric(std::nan(""));
  }
  timeline_.Record(point);
}

// ---- handing out work --------------------------------------------------------

void RemoteEvaluator::OnTick() {
  const double now = site_.Now();
  if (started_ && !stopped_ && now >= next_curve_s_) {
    curve_due_ = true;  // a slow evaluator gets the latest model, once
    next_curve_s_ = now + site_.job.server().eval_period_s();
  }
  if (!session_) return;
  if (now - session_->last_heard_s > site_.timeouts.worker_timeout_s) {
    MLOG(WARNING) << "the evaluator has been silent for "
                  << FormatSeconds(now - session_->last_heard_s)
                  << " s: declared gone (it may join again)";
    Requeue();
    session_.reset();
    return;
  }
  if (session_->waiting &&
      now - session_->last_heartbeat_s >=
          site_.timeouts.heartbeat_interval_s) {
    endpoint_->SendHeartbeat(session_->routing_id);
    session_->last_heartbeat_s = now;
  }
  Dispatch();
}

std::optional<RemoteEvaluator::Task> RemoteEvaluator::NextTask() {
  Task task;
  if (requeued_) {
    task = *std::exchange(requeued_, std::nullopt);
  } else if (final_pending_) {
    final_pending_ = false;
    task.kind = Kind::kFinal;
  } else if (loss_pending_) {
    loss_pending_ = false;
    task.kind = Kind::kLoss;
  } else if (travel_ && !travel_->own_score) {
    task.kind = Kind::kTravelOwn;
  } else if (travel_) {
    task.kind = Kind::kTravelPeer;
  } else if (curve_due_ && !stopped_) {
    curve_due_ = false;
    task.kind = Kind::kCurve;
  } else {
    return std::nullopt;
  }
  task.id = next_task_id_++;
  return task;
}

void RemoteEvaluator::Dispatch() {
  if (!session_ || !session_->waiting || in_flight_) return;
  std::optional<Task> task = NextTask();
  if (!task) {
    if (stopped_ && final_done_) SendStop();
    return;
  }
  const Status sent = SendTask(&*task);
  in_flight_ = *task;
  if (!sent.ok()) {
    // It does not read its replies (ResourceExhausted): as if it died.
    MLOG(WARNING) << "cannot send the evaluator its task (" << sent
                  << "): declared gone";
    Requeue();
    session_.reset();
    return;
  }
  session_->waiting = false;
}

Status RemoteEvaluator::SendTask(Task* task_ptr) {
  Task& task = *task_ptr;
  pb::Header header = endpoint_->NewHeader(pb::EVAL_TASK);
  pb::EvalTask* body = header.mutable_eval_task();
  body->set_task_id(task.id);
  body->set_split(task.kind == Kind::kCurve || task.kind == Kind::kFinal
                      ? pb::VALIDATION
                      : pb::TRAINING_SAMPLE);
  AddLayoutSlices(site_.layout, &header);
  std::vector<zmq::message_t> frames;
  for (const TensorInfo& tensor : site_.layout.tensors()) {
    frames.push_back(MakeFloatFrame(tensor.size));
  }
  if (task.kind == Kind::kTravelPeer) {
    for (size_t t = 0; t < frames.size(); ++t) {
      const TensorInfo& tensor = site_.layout.tensors()[t];
      std::memcpy(frames[t].data(), travel_->model.data() + tensor.offset,
                  tensor.size * sizeof(float));
    }
  } else {
    std::vector<ReadSegment> reads;
    for (size_t t = 0; t < frames.size(); ++t) {
      const TensorInfo& tensor = site_.layout.tensors()[t];
      reads.push_back(ReadSegment{
          tensor.offset, std::span<float>(static_cast<float*>(frames[t].data()),
                                          tensor.size)});
    }
    task.commits = timeline_.commits();
    task.version = store_->version();
    task.taken_at = site_.clock->Now();
    store_->Read(reads);
  }
  body->set_model_version(task.version);
  return endpoint_->Send(header, std::move(frames), session_->routing_id);
}

void RemoteEvaluator::SendStop() {
  pb::Header header = endpoint_->NewHeader(pb::EVAL_TASK);
  header.mutable_eval_task()->set_stop(true);
  header.mutable_eval_task()->set_stop_reason("the job is over");
  (void)endpoint_->Send(header, {}, session_->routing_id);
  session_->waiting = false;
}

void RemoteEvaluator::Requeue() {
  if (!in_flight_) return;
  Task task = *std::exchange(in_flight_, std::nullopt);
  if (task.kind == Kind::kCurve || task.retried) return;
  task.retried = true;
  requeued_ = task;
}

}  // namespace meridian
