#include "meridian/worker.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>
#include <zmq.hpp>

#include "meridian/clock.h"
#include "meridian/addresses.h"
#include "meridian/config.h"
#include "meridian/dataset.h"
#include "meridian/log.h"
#include "meridian/metrics.h"
#include "meridian/message.h"
#include "meridian/model.h"
#include "meridian/optimizer.h"
#include "meridian/policy.h"
#include "meridian/transport.h"

namespace meridian {
namespace {

// How long a worker waits for a reply before it declares the site server
// gone. Barriers can legitimately hold a reply while slow peers catch up,
// so this is generous.
constexpr auto kReplyTimeout = std::chrono::seconds(120);
// Backoff while the site server does not answer yet (it may start after
// the worker when roles are started by hand or in containers).
constexpr auto kFirstProbeWait = std::chrono::seconds(1);
constexpr auto kMaxProbeWait = std::chrono::seconds(30);
// Consecutive refused commits after which the worker gives up.
constexpr int kMaxConsecutiveRejections = 5;
// Smoothing of the reported training loss and commit overhead.
constexpr double kEmaWeight = 0.1;
// How often the training loop updates the metrics registry.
constexpr double kMetricsPeriodS = 0.5;

double Ema(double previous, double sample, bool first) {
  return first ? sample : (1 - kEmaWeight) * previous + kEmaWeight * sample;
}

}  // namespace

class Worker::Impl {
 public:
  Impl(WorkerOptions options, int site_index, Dataset data,
       std::unique_ptr<Model> model)
      : options_(std::move(options)),
        job_(options_.job),
        site_index_(site_index),
        site_config_(job_.site(site_index)),
        step_time_s_(WorkerGroupOf(site_config_, options_.index).step_time_s()),
        data_(std::move(data)),
        model_(std::move(model)),
        optimizer_(job_.optimizer(), model_->layout().num_elements()),
        params_(model_->layout().num_elements()),
        base_(model_->layout().num_elements()),
        grad_(model_->layout().num_elements()),
        rng_(job_.seed() * 1000003ull + site_index * 1009ull + options_.index),
        client_(context_, Endpoint(), Self(), options_.stop_requested) {
    order_.resize(data_.size());
    std::iota(order_.begin(), order_.end(), 0u);
    cursor_ = order_.size();  // shuffle before the first batch
    const int batch = static_cast<int>(
        std::min<uint64_t>(job_.optimizer().batch_size(), data_.size()));
    batch_features_.resize(data_.input_dim(), batch);
    batch_labels_.resize(batch);
  }

  const pb::WorkerStats& stats() const { return stats_; }

  Status Run() {
    MERIDIAN_RETURN_IF_ERROR(AwaitServer());
    MERIDIAN_RETURN_IF_ERROR(Join());
    while (true) {
      if (StopRequested()) return Leave("stop requested");
      const bool commit_now = TrainOneStep();
      PublishMetrics();
      if (!commit_now) continue;
      Result<bool> keep_going = Commit();
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

 private:
  // The server this worker commits to: its site's own, or the one its
  // server_site names.
  std::string Endpoint() const {
    if (!options_.connect.empty()) return options_.connect;
    return WorkerServerEndpoint(job_, site_index_);
  }

  pb::Endpoint Self() const {
    pb::Endpoint self;
    self.set_site(site_config_.name());
    self.set_role(pb::ROLE_WORKER);
    self.set_id(options_.index);
    return self;
  }

  bool StopRequested() const {
    return options_.stop_requested != nullptr &&
           options_.stop_requested->load(std::memory_order_relaxed);
  }

  std::chrono::milliseconds JoinTimeout() const {
    // Peers may start in any order; the server waits join_timeout_s for all
    // workers, so a worker waits at least that long for its WELCOME.
    return std::chrono::milliseconds(
        static_cast<int64_t>((job_.server().join_timeout_s() + 30.0) * 1000));
  }

  // Probes the site server until it answers, waiting 1, 2, 4 ... 30 s for
  // each answer and logging every miss; any reply (even an ERROR) means it
  // is up. Returns Cancelled when a stop is requested meanwhile.
  Status AwaitServer() {
    std::chrono::milliseconds wait = kFirstProbeWait;
    for (int attempt = 1;; ++attempt) {
      pb::Header probe;
      probe.set_type(pb::STATUS_REQUEST);
      Result<Envelope> reply = client_.Call(probe, {}, wait);
      if (reply.ok()) {
        if (attempt > 1) MLOG(INFO) << "site server at " << Endpoint() << " is up";
        return Status::Ok();
      }
      if (reply.status().code() == StatusCode::kCancelled || StopRequested()) {
        return CancelledError("stopped while waiting for the site server");
      }
      const auto next = std::min<std::chrono::milliseconds>(wait * 2,
                                                             kMaxProbeWait);
      MLOG(WARNING) << "waiting for site server '"
                    << job_.site(ServingSite(job_, site_index_)).name()
                    << "' at " << Endpoint() << ": no answer within "
                    << wait.count() / 1000.0 << " s (attempt " << attempt
                    << "; next wait " << next.count() / 1000.0 << " s)";
      wait = next;
    }
  }

  Status Join() {
    pb::Header hello;
    hello.set_type(pb::HELLO);
    hello.mutable_hello()->set_worker_index(options_.index);
    model_->layout().ToSpecs(hello.mutable_hello()->mutable_layout());
    MLOG(INFO) << "joining the site server at " << Endpoint() << " with "
               << data_.size() << " samples";
    MERIDIAN_ASSIGN_OR_RETURN(Envelope reply,
                              client_.Call(hello, {}, JoinTimeout()));
    if (reply.header.type() == pb::ERROR) {
      return FailedPreconditionError("site server refused the worker: " +
                                     reply.header.error().message());
    }
    if (reply.header.type() != pb::WELCOME) {
      return DataLossError("expected WELCOME, got " +
                           DescribeHeader(reply.header));
    }
    MERIDIAN_ASSIGN_OR_RETURN(
        ModelLayout layout,
        ModelLayout::FromSpecs(reply.header.welcome().layout()));
    if (!(layout == model_->layout())) {
      return FailedPreconditionError("site server's model [" +
                                     layout.DebugString() +
                                     "] differs from this worker's [" +
                                     model_->layout().DebugString() + "]");
    }
    MERIDIAN_RETURN_IF_ERROR(
        LoadModel(reply, reply.header.welcome().model_version()));
    trigger_.Reset(reply.header.welcome().plan(), clock_->Now());
    MLOG(INFO) << "joined; plan: commit every "
               << reply.header.welcome().plan().local_steps() << " steps";
    return Status::Ok();
  }

  // Copies the model in `reply` into params_ and base_ after validating it.
  Status LoadModel(const Envelope& reply, uint64_t version) {
    if (Verdict verdict = CheckSlicesAgainstLayout(
            reply.header, model_->layout(), /*whole_model=*/true)) {
      return verdict->ToStatus().WithContext("model from the site server");
    }
    if (Verdict verdict = CheckCodec(reply.header, pb::CODEC_RAW)) {
      return verdict->ToStatus().WithContext("model from the site server");
    }
    for (size_t i = 0; i < reply.payload.size(); ++i) {
      const pb::TensorSlice& slice = reply.header.slices(static_cast<int>(i));
      if (Verdict verdict = CheckFinite(slice, BytesOf(reply.payload[i]))) {
        return verdict->ToStatus().WithContext("model from the site server");
      }
      const TensorInfo* tensor = model_->layout().Find(slice.tensor());
      std::memcpy(params_.data() + tensor->offset, reply.payload[i].data(),
                  reply.payload[i].size());
    }
    base_ = params_;
    base_version_ = version;
    return Status::Ok();
  }

  // One minibatch step; true when the plan says to commit now.
  bool TrainOneStep() {
    const Duration start = clock_->Now();
    NextBatch();
    const float loss =
        model_->LossAndGradient(params_, batch_features_, batch_labels_, grad_);
    optimizer_.Step(params_, grad_);
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
    return trigger_.OnStep(clock_->Now());
  }

  void NextBatch() {
    const auto batch = static_cast<size_t>(batch_labels_.size());
    for (size_t j = 0; j < batch; ++j) {
      if (cursor_ >= order_.size()) {
        std::shuffle(order_.begin(), order_.end(), rng_);
        cursor_ = 0;
      }
      const uint32_t sample = order_[cursor_++];
      batch_features_.col(static_cast<Eigen::Index>(j)) =
          data_.features.col(sample);
      batch_labels_[j] = data_.labels[sample];
    }
  }

  // Sends the accumulated change and loads the reply. Returns false when
  // the job is over (the worker has said BYE).
  Result<bool> Commit() {
    pb::Header header;
    header.set_type(pb::COMMIT);
    header.set_clock(static_cast<int64_t>(stats_.commits()));
    std::vector<zmq::message_t> frames;
    for (const TensorInfo& tensor : model_->layout().tensors()) {
      zmq::message_t frame = MakeFloatFrame(tensor.size);
      float* update = static_cast<float*>(frame.data());
      const float* now = params_.data() + tensor.offset;
      const float* then = base_.data() + tensor.offset;
      for (uint64_t k = 0; k < tensor.size; ++k) update[k] = now[k] - then[k];
      frames.push_back(std::move(frame));
      AddTensorSlice(tensor, &header);
    }
    pb::Commit* commit = header.mutable_commit();
    commit->set_base_version(base_version_);
    commit->set_local_steps(trigger_.steps_since_commit());
    *commit->mutable_stats() = stats_;

    const Duration sent = clock_->Now();
    MERIDIAN_ASSIGN_OR_RETURN(
        Envelope reply, client_.Call(header, std::move(frames), kReplyTimeout));
    const double round_trip = ToSeconds(clock_->Now() - sent);
    stats_.set_blocked_s(stats_.blocked_s() + round_trip);
    stats_.set_commit_overhead_s(
        Ema(stats_.commit_overhead_s(), round_trip, stats_.commits() == 0));

    if (reply.header.type() == pb::ERROR) {
      // The update is dropped; say so, resynchronise and go on, unless the
      // server keeps refusing (then something is really wrong).
      MLOG(ERROR) << "commit of " << trigger_.steps_since_commit()
                  << " steps dropped by the site server: "
                  << pb::ErrorCode_Name(reply.header.error().code()) << ": "
                  << reply.header.error().message();
      if (++consecutive_rejections_ >= kMaxConsecutiveRejections) {
        return FailedPreconditionError(
            "site server refused " + std::to_string(consecutive_rejections_) +
            " commits in a row; last: " + reply.header.error().message());
      }
      MERIDIAN_RETURN_IF_ERROR(Pull());
      return true;
    }
    consecutive_rejections_ = 0;
    if (reply.header.type() != pb::MODEL) {
      return DataLossError("expected MODEL, got " +
                           DescribeHeader(reply.header));
    }
    stats_.set_commits(stats_.commits() + 1);
    const pb::Model& model = reply.header.model();
    if (model.stop()) {
      MERIDIAN_RETURN_IF_ERROR(Leave(model.stop_reason()));
      return false;
    }
    MERIDIAN_RETURN_IF_ERROR(LoadModel(reply, model.version()));
    trigger_.Reset(model.plan(), clock_->Now());
    return true;
  }

  Status Pull() {
    pb::Header header;
    header.set_type(pb::PULL);
    header.mutable_pull();
    MERIDIAN_ASSIGN_OR_RETURN(Envelope reply,
                              client_.Call(header, {}, kReplyTimeout));
    if (reply.header.type() != pb::MODEL) {
      return DataLossError("expected MODEL for PULL, got " +
                           DescribeHeader(reply.header));
    }
    if (reply.header.model().stop()) return Status::Ok();
    MERIDIAN_RETURN_IF_ERROR(LoadModel(reply, reply.header.model().version()));
    trigger_.Reset(reply.header.model().plan(), clock_->Now());
    return Status::Ok();
  }

  Status Leave(const std::string& reason) {
    MLOG(INFO) << "leaving (" << reason << ") after " << stats_.steps()
               << " steps and " << stats_.commits() << " commits";
    pb::Header bye;
    bye.set_type(pb::BYE);
    *bye.mutable_bye()->mutable_stats() = stats_;
    // Best effort, and not cancellable (we may be leaving because of a
    // signal): the server may already be gone.
    client_.set_cancel(nullptr);
    Result<Envelope> ack = client_.Call(bye, {}, std::chrono::seconds(5));
    if (!ack.ok()) MLOG(WARNING) << "no BYE acknowledgement: " << ack.status();
    return Status::Ok();
  }

  WorkerOptions options_;
  const pb::JobConfig& job_;
  const int site_index_;
  const pb::SiteConfig& site_config_;
  const double step_time_s_;
  Clock* clock_ = SystemClock();

  Dataset data_;
  std::unique_ptr<Model> model_;
  SgdOptimizer optimizer_;
  std::vector<float> params_;  // the local model
  std::vector<float> base_;    // the model last pulled
  std::vector<float> grad_;
  uint64_t base_version_ = 0;

  std::mt19937_64 rng_;
  std::vector<uint32_t> order_;  // epoch permutation of local samples
  size_t cursor_ = 0;
  Eigen::MatrixXf batch_features_;
  std::vector<uint8_t> batch_labels_;

  CommitTrigger trigger_;
  pb::WorkerStats stats_;
  int consecutive_rejections_ = 0;

  zmq::context_t context_;
  RpcClient client_;

  // Metrics endpoint (off unless asked for): the training loop publishes,
  // the server's thread renders.
  MetricsRegistry metrics_registry_;
  std::unique_ptr<MetricsServer> metrics_server_;
  double metrics_last_s_ = -1;
  uint64_t metrics_last_steps_ = 0;

 public:
  void StartMetrics() {
    metrics_server_ = StartMetricsServerOrWarn(
        &metrics_registry_, options_.metrics_address,
        "worker " + std::to_string(options_.index) + " of site '" +
            site_config_.name() + "'");
  }

 private:
  // Copies the worker's statistics into the registry, every
  // kMetricsPeriodS at most.
  void PublishMetrics() {
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
              "Training samples per second since the previous update",
              labels)
          ->Set(static_cast<double>(stats_.steps() - metrics_last_steps_) *
                static_cast<double>(batch_labels_.size()) /
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
    metrics_last_s_ = now;
    metrics_last_steps_ = stats_.steps();
  }
};

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
  Dataset data = MakeDataset(raw.train_images, raw.train_labels, indices,
                             job.data().normalization(), raw.stats);
  MERIDIAN_ASSIGN_OR_RETURN(
      auto model,
      MakeModel(job.model(), static_cast<int>(raw.train_images.dim()), 10));
  auto impl = std::make_unique<Impl>(std::move(options), site_index,
                                     std::move(data), std::move(model));
  impl->StartMetrics();
  return std::unique_ptr<Worker>(new Worker(std::move(impl)));
}

Worker::Worker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Worker::~Worker() = default;
Status Worker::Run() { return impl_->Run(); }
const pb::WorkerStats& Worker::stats() const { return impl_->stats(); }

}  // namespace meridian
