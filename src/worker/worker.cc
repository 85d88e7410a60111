// The worker: trains on its share of the data and follows its site's plan.
// Each concern is a part with its own file under src/worker/:
//   site_connection.h   HELLO/WELCOME, rejoins, liveness, BYE
//   committer.h         the commit cycle: build, send (again), load, plan
//   model_replica.h     params, the base model, the rows changed since
//   training_batches.h  the data's order: epochs and samples planned ahead
// Worker::Impl owns them, runs the training steps and publishes metrics.
// Everything runs on the thread that calls Run(), except the metrics
// server's threads, which only render the registry.
#include "meridian/worker/worker.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "meridian/config/config.h"
#include "meridian/core/clock.h"
#include "meridian/core/format.h"
#include "meridian/core/log.h"
#include "meridian/metrics/metrics.h"
#include "meridian/net/security.h"
#include "meridian/train/dataset.h"
#include "meridian/train/model.h"
#include "meridian/train/optimizer.h"
#include "worker/committer.h"
#include "worker/model_replica.h"
#include "worker/site_connection.h"
#include "worker/training_batches.h"

namespace meridian {
namespace {

// How often the training loop updates the metrics registry.
constexpr double kMetricsPeriodS = 0.5;

}  // namespace

WorkerTimeouts WorkerTimeouts::FromJob(const pb::JobConfig& job) {
  WorkerTimeouts timeouts;
  const pb::FaultConfig& fault = job.fault();
  timeouts.heartbeat_interval_s =
      Positive(fault.heartbeat_interval_s(), timeouts.heartbeat_interval_s);
  timeouts.server_timeout_s =
      Positive(fault.server_timeout_s(), timeouts.server_timeout_s);
  timeouts.give_up_s =
      std::isfinite(fault.worker_give_up_s()) && fault.worker_give_up_s() >= 0
          ? fault.worker_give_up_s()
          : timeouts.give_up_s;
  return timeouts;
}

class Worker::Impl {
 public:
  Impl(WorkerOptions options, int site_index, Dataset data,
       std::unique_ptr<Model> model);

  const pb::WorkerStats& stats() const { return stats_; }

  // Makes the connection to the server a CURVE client with `keys`.
  Status SecureClient(const WorkerCurveKeys& keys) {
    return connection_.Secure(keys);
  }
  void StartMetrics();

  Status Run();

 private:
  bool StopRequested() const {
    return options_.stop_requested != nullptr &&
           options_.stop_requested->load(std::memory_order_relaxed);
  }
  // Joins the site: HELLO, then WELCOME once training starts. False when
  // the job ended before this worker got to train (it has said BYE).
  Result<bool> Join();
  // Says BYE; Run returns OK after it.
  Status Leave(const std::string& reason) {
    connection_.Leave(stats_, reason);
    return Status::Ok();
  }
  // One minibatch step; true when the plan says to commit now.
  bool TrainOneStep();
  // Copies the worker's statistics into the registry, every
  // kMetricsPeriodS at most.
  void PublishMetrics();

  const WorkerOptions options_;
  const pb::SiteConfig& site_config_;
  const double step_time_s_;  // an emulated device's; 0: none
  Clock* const clock_;

  std::unique_ptr<Model> model_;
  SgdOptimizer optimizer_;
  std::vector<float> grad_;
  pb::WorkerStats stats_;
  TrainingBatches batches_;
  ModelReplica replica_;
  SiteConnection connection_;
  Committer committer_;

  // Metrics endpoint (off unless asked for): the training loop publishes,
  // the server's thread renders.
  MetricsRegistry metrics_registry_;
  std::unique_ptr<MetricsServer> metrics_server_;
  double metrics_last_s_ = -1;
  uint64_t metrics_last_steps_ = 0;
};

Worker::Impl::Impl(WorkerOptions options, int site_index, Dataset data,
                   std::unique_ptr<Model> model)
    : options_(std::move(options)),
      site_config_(options_.job.site(site_index)),
      step_time_s_(WorkerGroupOf(site_config_, options_.index).step_time_s()),
      clock_(options_.clock != nullptr ? options_.clock : SystemClock()),
      model_(std::move(model)),
      optimizer_(options_.job.optimizer(), model_->layout().num_elements()),
      grad_(model_->layout().num_elements()),
      batches_(std::move(data), options_.job.optimizer().batch_size(),
               options_.job.seed() * 1000003ull + site_index * 1009ull +
                   options_.index),
      replica_(model_->layout()),
      connection_(
          options_, site_index, model_->layout(), clock_,
          options_.timeouts.value_or(WorkerTimeouts::FromJob(options_.job))),
      committer_(model_.get(), &replica_, &batches_, &connection_, &stats_,
                 clock_) {}

Status Worker::Impl::Run() {
  MERIDIAN_RETURN_IF_ERROR(connection_.AwaitServer());
  Result<bool> joined = Join();
  if (!joined.ok()) {
    if (joined.status().code() == StatusCode::kCancelled) {
      return Leave("stop requested");
    }
    return joined.status();
  }
  if (!*joined) return Status::Ok();  // the job ended before we trained
  while (true) {
    if (StopRequested()) return Leave("stop requested");
    const bool commit_now = TrainOneStep();
    // Between steps: a heartbeat if nothing went out for an interval
    // (never blocks).
    connection_.HeartbeatIfIdle();
    PublishMetrics();
    if (!commit_now) continue;
    Result<bool> keep_going = committer_.Commit();
    if (!keep_going.ok()) {
      // Stopped while waiting for the server: still say goodbye, so that
      // the server does not wait for us.
      if (keep_going.status().code() == StatusCode::kCancelled) {
        return Leave("stop requested");
      }
      return keep_going.status();
    }
    if (!*keep_going) return Status::Ok();
  }
}

Result<bool> Worker::Impl::Join() {
  MLOG(INFO) << "joining the site server at " << connection_.endpoint()
             << " with " << batches_.samples() << " samples (incarnation "
             << connection_.incarnation() << ", " << ModelKernels()
             << " kernels)";
  MERIDIAN_ASSIGN_OR_RETURN(Envelope reply, connection_.Join());
  if (reply.header.type() == pb::MODEL && reply.header.model().stop()) {
    // Stopped before training started.
    MERIDIAN_RETURN_IF_ERROR(Leave(reply.header.model().stop_reason()));
    return false;
  }
  MERIDIAN_RETURN_IF_ERROR(connection_.CheckWelcome(reply));
  const pb::Welcome& welcome = reply.header.welcome();
  if (welcome.stop()) {
    MERIDIAN_RETURN_IF_ERROR(Leave("the job is over"));
    return false;
  }
  MERIDIAN_RETURN_IF_ERROR(
      committer_.Adopt(reply, welcome.model_version(), welcome.plan()));
  MLOG(INFO) << "joined; plan: commit every " << welcome.plan().local_steps()
             << " steps";
  return true;
}

bool Worker::Impl::TrainOneStep() {
  const Duration start = clock_->Now();
  batches_.Next();
  std::vector<float>& params = replica_.params();
  const float loss = model_->LossAndGradient(params, batches_.features(),
                                             batches_.labels(), grad_);
  if (const std::vector<ElementRange>* rows = model_->SparseRows()) {
    optimizer_.Step(params, grad_, *rows);
    replica_.NoteTouched(*rows);
  } else {
    optimizer_.Step(params, grad_);
  }
  model_->ApplyStateUpdate(params);
  const Duration computed = clock_->Now();
  stats_.set_compute_s(stats_.compute_s() + ToSeconds(computed - start));
  // An emulated device is slower than this CPU: wait out the rest.
  if (step_time_s_ > 0) {
    const Duration end = start + FromSeconds(step_time_s_);
    if (end > computed) {
      clock_->SleepUntil(end);
      stats_.set_device_wait_s(stats_.device_wait_s() +
                               ToSeconds(end - computed));
    }
  }
  stats_.set_last_loss(Ema(stats_.last_loss(), loss, stats_.steps() == 0));
  stats_.set_steps(stats_.steps() + 1);
  return committer_.OnStep(clock_->Now());
}

void Worker::Impl::StartMetrics() {
  metrics_server_ =
      StartMetricsServerOrWarn(&metrics_registry_, options_.metrics_address,
                               "worker " + std::to_string(options_.index) +
                                   " of site '" + site_config_.name() + "'");
}

void Worker::Impl::PublishMetrics() {
  if (!metrics_server_) return;
  const double now = clock_->NowSeconds();
  if (metrics_last_s_ >= 0 && now - metrics_last_s_ < kMetricsPeriodS) {
    return;
  }
  const MetricLabels labels = {{"site", site_config_.name()},
                               {"worker", std::to_string(options_.index)}};
  MetricsRegistry& r = metrics_registry_;
  r.Counter("meridian_worker_steps_total", "Local SGD steps", labels)
      ->Set(static_cast<double>(stats_.steps()));
  r.Counter("meridian_worker_commits_total", "Commits answered", labels)
      ->Set(static_cast<double>(stats_.commits()));
  if (metrics_last_s_ >= 0 && now > metrics_last_s_) {
    r.Gauge("meridian_worker_samples_per_second",
            "Training samples per second since the previous update", labels)
        ->Set(static_cast<double>(stats_.steps() - metrics_last_steps_) *
              static_cast<double>(batches_.batch_size()) /
              (now - metrics_last_s_));
  }
  r.Gauge("meridian_worker_loss", "Training loss (moving average)", labels)
      ->Set(stats_.last_loss());
  r.Counter("meridian_worker_compute_seconds_total",
            "Seconds computing gradients and steps", labels)
      ->Set(stats_.compute_s());
  r.Counter("meridian_worker_device_wait_seconds_total",
            "Seconds waiting out an emulated device's step time", labels)
      ->Set(stats_.device_wait_s());
  r.Counter("meridian_worker_blocked_seconds_total",
            "Seconds waiting for commit answers", labels)
      ->Set(stats_.blocked_s());
  r.Gauge("meridian_worker_commit_round_trip_seconds",
          "Commit round trip (moving average)", labels)
      ->Set(stats_.commit_overhead_s());
  r.Counter("meridian_worker_rejoins_total",
            "Times the worker joined its site server again after the "
            "server was gone or did not know its connection",
            labels)
      ->Set(static_cast<double>(connection_.rejoins()));
  metrics_last_s_ = now;
  metrics_last_steps_ = stats_.steps();
}

Result<std::unique_ptr<Worker>> Worker::Create(WorkerOptions options) {
  MERIDIAN_ASSIGN_OR_RETURN(const int site_index,
                            FindSite(options.job, options.site));
  const pb::SiteConfig& site = options.job.site(site_index);
  if (options.index >= SiteWorkerCount(site)) {
    return OutOfRangeError("site '" + site.name() + "' has " +
                           std::to_string(SiteWorkerCount(site)) +
                           " workers; there is no worker " +
                           std::to_string(options.index));
  }
  SetLogRole(options.site + "/w" + std::to_string(options.index));
  const pb::JobConfig& job = options.job;
  // The key is checked before the data is loaded: a wrong key fails fast.
  std::optional<WorkerCurveKeys> curve;
  const int serving = ServingSite(job, site_index);
  if (WorkerCurveEnabled(job, serving)) {
    MERIDIAN_ASSIGN_OR_RETURN(
        curve, LoadWorkerCurveKeys(job, serving, options.secret_key_file));
    MLOG(INFO) << "CURVE to site '" << job.site(serving).name()
               << "''s server with worker key " << curve->own.public_key;
  }
  MERIDIAN_ASSIGN_OR_RETURN(RawData raw, LoadRawData(job.data(), true, false));
  MERIDIAN_ASSIGN_OR_RETURN(
      std::vector<uint32_t> indices,
      WorkerSampleIndices(job, raw.train_labels, site_index,
                          static_cast<int>(options.index)));
  if (indices.empty()) {
    return FailedPreconditionError(
        "worker " + std::to_string(options.index) + " of site '" + site.name() +
        "' has no training samples (partition too small)");
  }
  Dataset data = MakeTrainDataset(raw, indices, job.data().normalization());
  const uint32_t threads = options.threads > 0
                               ? options.threads
                               : WorkerGroupOf(site, options.index).threads();
  MERIDIAN_ASSIGN_OR_RETURN(auto model,
                            MakeJobModelOnThreads(job, raw.input_dim(), 10,
                                                  static_cast<int>(threads)));
  // Dropout masks differ between workers (and between a worker's threads).
  model->SeedRandom(job.seed() ^
                    (uint64_t{static_cast<uint32_t>(site_index)} << 32) ^
                    options.index);
  auto impl = std::make_unique<Impl>(std::move(options), site_index,
                                     std::move(data), std::move(model));
  if (curve) MERIDIAN_RETURN_IF_ERROR(impl->SecureClient(*curve));
  impl->StartMetrics();
  return std::unique_ptr<Worker>(new Worker(std::move(impl)));
}

Worker::Worker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Worker::~Worker() = default;
Status Worker::Run() { return impl_->Run(); }
const pb::WorkerStats& Worker::stats() const { return impl_->stats(); }

}  // namespace meridian
