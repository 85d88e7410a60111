#include "meridian/worker/worker.h"

#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>
#include <zmq.hpp>

#include "meridian/sync/addresses.h"
#include "meridian/core/clock.h"
#include "meridian/config/config.h"
#include "meridian/train/dataset.h"
#include "meridian/core/log.h"
#include "meridian/net/message.h"
#include "meridian/metrics/metrics.h"
#include "meridian/train/model.h"
#include "meridian/train/optimizer.h"
#include "meridian/sched/policy.h"
#include "meridian/net/security.h"
#include "meridian/net/transport.h"
#include "meridian/core/format.h"

namespace meridian {
namespace {

// Backoff while the site server does not answer yet (it may start after
// the worker when roles are started by hand or in containers), and between
// HELLOs of a rejoin.
constexpr auto kFirstProbeWait = std::chrono::seconds(1);
constexpr auto kMaxProbeWait = std::chrono::seconds(30);
// Consecutive refused commits after which the worker gives up.
constexpr int kMaxConsecutiveRejections = 5;
// Smoothing of the reported training loss and commit overhead.
constexpr double kEmaWeight = 0.1;
// How often the training loop updates the metrics registry.
constexpr double kMetricsPeriodS = 0.5;
// Most samples a sparse model's worker plans ahead (and asks its server the
// rows of) at a commit.
constexpr uint64_t kMaxPlannedSamples = uint64_t{1} << 20;

double Ema(double previous, double sample, bool first) {
  return first ? sample : (1 - kEmaWeight) * previous + kEmaWeight * sample;
}

// A random non-zero number that differs between processes (HELLO's
// incarnation).
uint64_t RandomIncarnation() {
  std::random_device device;
  std::seed_seq seed{
      device(), device(), static_cast<unsigned>(::getpid()),
      static_cast<unsigned>(
          std::chrono::steady_clock::now().time_since_epoch().count())};
  std::mt19937_64 rng(seed);
  uint64_t value = 0;
  while (value == 0) value = rng();
  return value;
}

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
       std::unique_ptr<Model> model)
      : options_(std::move(options)),
        job_(options_.job),
        site_index_(site_index),
        site_config_(job_.site(site_index)),
        step_time_s_(WorkerGroupOf(site_config_, options_.index).step_time_s()),
        clock_(options_.clock != nullptr ? options_.clock : SystemClock()),
        timeouts_(options_.timeouts.value_or(WorkerTimeouts::FromJob(job_))),
        incarnation_(options_.incarnation != 0 ? options_.incarnation
                                               : RandomIncarnation()),
        data_(std::move(data)),
        model_(std::move(model)),
        optimizer_(job_.optimizer(), model_->layout().num_elements()),
        params_(model_->layout().num_elements()),
        base_(model_->layout().num_elements()),
        grad_(model_->layout().num_elements()),
        rng_(job_.seed() * 1000003ull + site_index * 1009ull + options_.index),
        client_(context_, Endpoint(), Self(), options_.stop_requested, clock_) {
    liveness_.heartbeat_interval = FromSeconds(timeouts_.heartbeat_interval_s);
    liveness_.silence_timeout = FromSeconds(timeouts_.server_timeout_s);
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
      client_.HeartbeatIfIdle(liveness_);
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
        if (attempt > 1)
          MLOG(INFO) << "site server at " << Endpoint() << " is up";
        return Status::Ok();
      }
      if (reply.status().code() == StatusCode::kCancelled || StopRequested()) {
        return CancelledError("stopped while waiting for the site server");
      }
      const auto next =
          std::min<std::chrono::milliseconds>(wait * 2, kMaxProbeWait);
      MLOG(WARNING) << "waiting for site server '"
                    << job_.site(ServingSite(job_, site_index_)).name()
                    << "' at " << Endpoint() << ": no answer within "
                    << wait.count() / 1000.0 << " s (attempt " << attempt
                    << "; next wait " << next.count() / 1000.0 << " s)";
      wait = next;
    }
  }

  pb::Header Hello() const {
    pb::Header hello;
    hello.set_type(pb::HELLO);
    hello.mutable_hello()->set_worker_index(options_.index);
    hello.mutable_hello()->set_incarnation(incarnation_);
    LayoutToSpecs(model_->layout(), hello.mutable_hello()->mutable_layout());
    return hello;
  }

  // Joins the site: HELLO, then WELCOME once training starts (the server
  // holds the HELLO until then and sends HEARTBEATs meanwhile). False when
  // the job ended before this worker got to train (it has said BYE).
  Result<bool> Join() {
    MLOG(INFO) << "joining the site server at " << Endpoint() << " with "
               << data_.size() << " samples (incarnation " << incarnation_
               << ", " << ModelKernels() << " kernels)";
    Result<Envelope> reply = client_.CallWhileAlive(Hello(), {}, liveness_);
    if (!reply.ok() && reply.status().code() == StatusCode::kDeadlineExceeded) {
      reply = Rejoin(reply.status().message(), ServerSilentSince());
    }
    if (!reply.ok()) return reply.status();
    if (reply->header.type() == pb::MODEL && reply->header.model().stop()) {
      // Stopped before training started.
      MERIDIAN_RETURN_IF_ERROR(Leave(reply->header.model().stop_reason()));
      return false;
    }
    MERIDIAN_RETURN_IF_ERROR(CheckWelcome(*reply));
    const pb::Welcome& welcome = reply->header.welcome();
    if (welcome.stop()) {
      MERIDIAN_RETURN_IF_ERROR(Leave("the job is over"));
      return false;
    }
    MERIDIAN_RETURN_IF_ERROR(LoadModel(*reply, welcome.model_version()));
    trigger_.Reset(welcome.plan(), clock_->Now());
    MLOG(INFO) << "joined; plan: commit every " << welcome.plan().local_steps()
               << " steps";
    return true;
  }

  // A reply to HELLO must be a WELCOME for this worker's model.
  Status CheckWelcome(const Envelope& reply) const {
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
        LayoutFromSpecs(reply.header.welcome().layout()));
    if (!(layout == model_->layout())) {
      return FailedPreconditionError("site server's model [" +
                                     layout.DebugString() +
                                     "] differs from this worker's [" +
                                     model_->layout().DebugString() + "]");
    }
    return Status::Ok();
  }

  // When the server was last heard from, given that it has just been
  // silent for the whole timeout.
  Duration ServerSilentSince() const {
    return clock_->Now() - liveness_.silence_timeout;
  }

  // The site server is gone (`why`), or does not know this connection:
  // joins again as the same process over a new connection, with backoff,
  // until a WELCOME (returned, checked). Gives up after give_up_s without
  // hearing from the server since `absent_since`; Cancelled when a stop is
  // requested; a refusal (another process took the index, the job is over
  // for new processes ...) is an error.
  Result<Envelope> Rejoin(const std::string& why, Duration absent_since) {
    ++rejoins_;
    MLOG(WARNING) << "site server gone: " << why
                  << "; joining again as the same process";
    Duration wait =
        std::min<Duration>(kFirstProbeWait, liveness_.silence_timeout);
    const Duration max_wait =
        std::max<Duration>(kMaxProbeWait, liveness_.silence_timeout);
    for (int attempt = 1;; ++attempt) {
      if (StopRequested()) {
        return CancelledError("stopped while rejoining the site server");
      }
      const double absent_s = ToSeconds(clock_->Now() - absent_since);
      if (timeouts_.give_up_s > 0 && absent_s > timeouts_.give_up_s) {
        return UnavailableError("site server at " + Endpoint() + " gone for " +
                                FormatSeconds(absent_s) +
                                " s; giving up (fault.worker_give_up_s = " +
                                FormatSeconds(timeouts_.give_up_s) + ")");
      }
      // A new connection: the old one may be broken for good, and whatever
      // it still owes us must not be taken for the WELCOME.
      client_.Reconnect();
      RpcLiveness liveness = liveness_;
      liveness.silence_timeout = wait;
      Result<Envelope> reply = client_.CallWhileAlive(Hello(), {}, liveness);
      if (reply.ok()) {
        MERIDIAN_RETURN_IF_ERROR(CheckWelcome(*reply));
        MLOG(INFO) << "rejoined the site server after "
                   << FormatSeconds(absent_s) << " s (attempt " << attempt
                   << "); it applied this "
                   << "process's commits up to id "
                   << reply->header.welcome().last_commit_id();
        return reply;
      }
      if (reply.status().code() == StatusCode::kCancelled) {
        return reply.status();
      }
      if (reply.status().code() != StatusCode::kDeadlineExceeded) {
        // Not even sent (e.g. the endpoint cannot be resolved yet): wait out
        // this attempt's time before the next.
        clock_->SleepFor(wait);
      }
      MLOG(WARNING) << "no WELCOME from the site server at " << Endpoint()
                    << " (attempt " << attempt << ", "
                    << FormatSeconds(absent_s)
                    << " s gone): " << reply.status().message();
      wait = std::min(wait * 2, max_wait);
    }
  }

  // Copies the model in `reply` into params_ and base_ after validating it.
  Status LoadModel(const Envelope& reply, uint64_t version) {
    if (Check check = CheckSlicesAgainstLayout(
            reply.header, model_->layout(), /*whole_model=*/true);
        !check.ok()) {
      return check.rejection().ToStatus().WithContext(
          "model from the site server");
    }
    if (Check check = CheckCodec(reply.header, pb::CODEC_RAW, pb::CODEC_ROWS);
        !check.ok()) {
      return check.rejection().ToStatus().WithContext(
          "model from the site server");
    }
    for (const pb::TensorSlice& slice : reply.header.slices()) {
      if (slice.codec() == pb::CODEC_ROWS) return LoadRows(reply, version);
    }
    for (size_t i = 0; i < reply.payload.size(); ++i) {
      const pb::TensorSlice& slice = reply.header.slices(static_cast<int>(i));
      if (Check check = CheckFinite(slice, BytesOf(reply.payload[i]));
          !check.ok()) {
        return check.rejection().ToStatus().WithContext(
            "model from the site server");
      }
      const TensorInfo* tensor = model_->layout().Find(slice.tensor());
      std::memcpy(params_.data() + tensor->offset, reply.payload[i].data(),
                  reply.payload[i].size());
    }
    base_ = params_;
    base_version_ = version;
    ClearTouched();
    return Status::Ok();
  }

  // The answer to a commit that asked for rows (Commit.reads): the rows
  // this worker changed are committed (base_ = params_ there), then the
  // rows and whole tensors of the reply replace both. Rows neither changed
  // nor sent keep their last values: the next batches do not read them.
  Status LoadRows(const Envelope& reply, uint64_t version) {
    std::vector<DecodedRows> decoded(reply.payload.size());
    for (size_t i = 0; i < reply.payload.size(); ++i) {
      const pb::TensorSlice& slice = reply.header.slices(static_cast<int>(i));
      const std::span<const std::byte> bytes = BytesOf(reply.payload[i]);
      Check check;
      if (slice.codec() == pb::CODEC_ROWS) {
        Parsed<DecodedRows> rows =
            DecodeRows(slice, model_->layout().tensors()[i], bytes);
        if (rows.ok()) {
          decoded[i] = std::move(rows).value();
        } else {
          check = std::move(rows).rejection();
        }
      } else {
        check = CheckFinite(slice, bytes);
      }
      if (!check.ok()) {
        return check.rejection().ToStatus().WithContext(
            "model from the site server");
      }
    }
    const std::vector<TensorInfo>& tensors = model_->layout().tensors();
    for (size_t t = 0; t < touched_rows_.size(); ++t) {
      const uint64_t length = std::max<uint64_t>(RowLength(tensors[t]), 1);
      for (uint32_t row : touched_rows_[t]) {
        const uint64_t at = tensors[t].offset + row * length;
        std::copy_n(params_.begin() + static_cast<ptrdiff_t>(at), length,
                    base_.begin() + static_cast<ptrdiff_t>(at));
      }
    }
    for (size_t t = 0; t < tensors.size(); ++t) {
      const TensorInfo& tensor = tensors[t];
      if (reply.header.slices(static_cast<int>(t)).codec() != pb::CODEC_ROWS) {
        std::memcpy(params_.data() + tensor.offset, reply.payload[t].data(),
                    reply.payload[t].size());
        std::memcpy(base_.data() + tensor.offset, reply.payload[t].data(),
                    reply.payload[t].size());
        continue;
      }
      const DecodedRows& rows = decoded[t];
      for (size_t k = 0; k < rows.rows.size(); ++k) {
        const uint64_t at = tensor.offset + rows.rows[k] * rows.row_length;
        const float* values = rows.values.data() + k * rows.row_length;
        std::copy_n(values, rows.row_length,
                    params_.begin() + static_cast<ptrdiff_t>(at));
        std::copy_n(values, rows.row_length,
                    base_.begin() + static_cast<ptrdiff_t>(at));
      }
    }
    base_version_ = version;
    ClearTouched();
    return Status::Ok();
  }

  // A sparse model's worker plans its next batches now, at a commit, and
  // asks the server for their rows (reads_): as many batches as the plan's
  // local steps (or the steps of the round just ended, when the plan is
  // time-driven), at most kMaxPlannedSamples samples. Dense models ask for
  // the whole model (reads_ empty).
  void PlanReads() {
    reads_.Clear();
    if (model_->SparseRows() == nullptr) return;
    const uint64_t batch = batch_labels_.size();
    const uint64_t steps = std::max<uint64_t>(
        {trigger_.plan().local_steps(), trigger_.steps_since_commit(), 1});
    const uint64_t wanted =
        std::min<uint64_t>(steps * batch, kMaxPlannedSamples);
    // Samples planned before and not trained yet stay first.
    planned_.erase(planned_.begin(),
                   planned_.begin() + static_cast<ptrdiff_t>(planned_cursor_));
    planned_cursor_ = 0;
    while (planned_.size() < wanted) planned_.push_back(DrawSample());
    Eigen::MatrixXf features(data_.input_dim(),
                             static_cast<Eigen::Index>(planned_.size()));
    for (size_t j = 0; j < planned_.size(); ++j) {
      features.col(static_cast<Eigen::Index>(j)) =
          data_.features.col(planned_[j]);
    }
    std::vector<ElementRange> ranges;
    model_->SampleRows(features, &ranges);
    const std::vector<TensorInfo>& tensors = model_->layout().tensors();
    std::vector<pb::RowRead*> by_tensor(tensors.size(), nullptr);
    ForEachRow(ranges, [&](size_t t, uint32_t row) {
      if (by_tensor[t] == nullptr) {
        by_tensor[t] = reads_.Add();
        by_tensor[t]->set_tensor(tensors[t].name);
      }
      by_tensor[t]->add_rows(row);  // ascending: the ranges are
    });
    // Tensors the batches do not read at all come as no rows, not whole.
    for (size_t t = 0; t < tensors.size(); ++t) {
      if (by_tensor[t] == nullptr && RowLength(tensors[t]) > 0) {
        reads_.Add()->set_tensor(tensors[t].name);
      }
    }
  }

  // Calls fn(tensor index, row) for every row the ranges (ascending,
  // disjoint) cover, in order, each once.
  template <typename Fn>
  void ForEachRow(const std::vector<ElementRange>& ranges, Fn&& fn) const {
    const std::vector<TensorInfo>& tensors = model_->layout().tensors();
    size_t t = 0;
    int64_t last_row = -1;
    for (const ElementRange& range : ranges) {
      while (t < tensors.size() &&
             range.begin >= tensors[t].offset + tensors[t].size) {
        ++t;
        last_row = -1;
      }
      if (t == tensors.size()) return;
      const uint64_t row_length = std::max<uint64_t>(RowLength(tensors[t]), 1);
      const uint64_t rows = tensors[t].shape.empty() ? 1 : tensors[t].shape[0];
      const uint64_t first = (range.begin - tensors[t].offset) / row_length;
      const uint64_t end = std::min<uint64_t>(
          (range.end - tensors[t].offset + row_length - 1) / row_length, rows);
      for (uint64_t row = first; row < end; ++row) {
        if (static_cast<int64_t>(row) <= last_row) continue;
        fn(t, static_cast<uint32_t>(row));
        last_row = static_cast<int64_t>(row);
      }
    }
  }

  // ---- sparse models: the rows changed since the last pull ------------------
  // touched_rows_[t] lists the rows of tensor t the steps since base_ wrote
  // (unordered, each once, flagged in touched_flags_[t]); a sparse model's
  // commit carries only those (CODEC_ROWS). Bounded by the tensor's rows.

  void NoteTouched(const std::vector<ElementRange>& ranges) {
    const std::vector<TensorInfo>& tensors = model_->layout().tensors();
    if (touched_rows_.empty()) {
      touched_rows_.resize(tensors.size());
      touched_flags_.resize(tensors.size());
      for (size_t t = 0; t < tensors.size(); ++t) {
        touched_flags_[t].assign(
            tensors[t].shape.empty() ? 1 : tensors[t].shape[0], 0);
      }
    }
    ForEachRow(ranges, [&](size_t t, uint32_t row) {
      if (touched_flags_[t][row] == 0) {
        touched_flags_[t][row] = 1;
        touched_rows_[t].push_back(row);
      }
    });
  }

  void ClearTouched() {
    for (size_t t = 0; t < touched_rows_.size(); ++t) {
      for (uint32_t row : touched_rows_[t]) touched_flags_[t][row] = 0;
      touched_rows_[t].clear();
    }
  }

  // Whether tensor t's touched rows make a smaller frame than the tensor.
  bool SparseIsSmaller(size_t t) const {
    const TensorInfo& tensor = model_->layout().tensors()[t];
    const uint64_t rows =
        t < touched_rows_.size() ? touched_rows_[t].size() : 0;
    return RowLength(tensor) > 0 && RowsPayloadBytes(rows, RowLength(tensor)) <
                                        tensor.size * sizeof(float);
  }

  // A CODEC_ROWS frame of the change of `rows` of `tensor` (sorted here).
  zmq::message_t RowsFrame(const TensorInfo& tensor,
                           std::vector<uint32_t>& rows, pb::Header* header) {
    std::sort(rows.begin(), rows.end());
    const uint64_t row_length = RowLength(tensor);
    zmq::message_t frame(RowsPayloadBytes(rows.size(), row_length));
    float* values =
        AddRowsSlice(tensor, rows,
                     std::span<std::byte>(static_cast<std::byte*>(frame.data()),
                                          frame.size()),
                     header);
    // memcpy: a small frame's bytes need not be aligned for floats.
    row_change_.resize(row_length);
    for (uint32_t row : rows) {
      const uint64_t at = tensor.offset + uint64_t{row} * row_length;
      for (uint64_t k = 0; k < row_length; ++k) {
        row_change_[k] = params_[at + k] - base_[at + k];
      }
      std::memcpy(values, row_change_.data(), row_length * sizeof(float));
      values += row_length;
    }
    return frame;
  }

  // One minibatch step; true when the plan says to commit now.
  bool TrainOneStep() {
    const Duration start = clock_->Now();
    NextBatch();
    const float loss =
        model_->LossAndGradient(params_, batch_features_, batch_labels_, grad_);
    if (const std::vector<ElementRange>* rows = model_->SparseRows()) {
      optimizer_.Step(params_, grad_, *rows);
      NoteTouched(*rows);
    } else {
      optimizer_.Step(params_, grad_);
    }
    model_->ApplyStateUpdate(params_);
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

  // The next sample of the epoch's shuffled order.
  uint32_t DrawSample() {
    if (cursor_ >= order_.size()) {
      std::shuffle(order_.begin(), order_.end(), rng_);
      cursor_ = 0;
    }
    return order_[cursor_++];
  }

  void NextBatch() {
    const auto batch = static_cast<size_t>(batch_labels_.size());
    for (size_t j = 0; j < batch; ++j) {
      const uint32_t sample = planned_cursor_ < planned_.size()
                                  ? planned_[planned_cursor_++]
                                  : DrawSample();
      batch_features_.col(static_cast<Eigen::Index>(j)) =
          data_.features.col(sample);
      batch_labels_[j] = data_.labels[sample];
    }
  }

  // A COMMIT of the change since the last pull (params_ - base_, which
  // stay untouched until the answer is loaded), computed from
  // `base_version`, with id `commit_id`.
  std::pair<pb::Header, std::vector<zmq::message_t>> BuildCommit(
      uint64_t commit_id, uint64_t base_version) {
    pb::Header header;
    header.set_type(pb::COMMIT);
    header.set_clock(static_cast<int64_t>(stats_.commits()));
    std::vector<zmq::message_t> frames;
    const std::vector<TensorInfo>& tensors = model_->layout().tensors();
    for (size_t t = 0; t < tensors.size(); ++t) {
      const TensorInfo& tensor = tensors[t];
      if (model_->SparseRows() != nullptr && SparseIsSmaller(t)) {
        frames.push_back(RowsFrame(tensor, touched_rows_[t], &header));
        continue;
      }
      zmq::message_t frame = MakeFloatFrame(tensor.size);
      float* update = static_cast<float*>(frame.data());
      const float* now = params_.data() + tensor.offset;
      const float* then = base_.data() + tensor.offset;
      for (uint64_t k = 0; k < tensor.size; ++k) update[k] = now[k] - then[k];
      frames.push_back(std::move(frame));
      AddTensorSlice(tensor, &header);
    }
    uint64_t bytes = 0;
    for (const zmq::message_t& frame : frames) bytes += frame.size();
    stats_.set_commit_bytes(stats_.commit_bytes() + bytes);
    pb::Commit* commit = header.mutable_commit();
    commit->set_base_version(base_version);
    commit->set_local_steps(trigger_.steps_since_commit());
    commit->set_commit_id(commit_id);
    *commit->mutable_reads() = reads_;
    *commit->mutable_stats() = stats_;
    return {std::move(header), std::move(frames)};
  }

  // Why an answer calls for a rejoin: the server was silent (no reply, no
  // heartbeat) or does not know this connection (it restarted, declared
  // this worker dead, or ZeroMQ reconnected underneath). Empty: it does not.
  static std::string RejoinReason(const Result<Envelope>& reply) {
    if (!reply.ok()) {
      return reply.status().code() == StatusCode::kDeadlineExceeded
                 ? reply.status().message()
                 : std::string();
    }
    if (reply->header.type() == pb::ERROR &&
        reply->header.error().code() == pb::ERROR_UNKNOWN_SENDER) {
      return "it does not know this connection: " +
             reply->header.error().message();
    }
    return std::string();
  }

  // Sends the accumulated change and loads the reply. Returns false when
  // the job is over (the worker has said BYE).
  Result<bool> Commit() {
    PlanReads();
    const uint64_t commit_id = ++last_commit_id_;
    const Duration sent = clock_->Now();
    auto [header, frames] = BuildCommit(commit_id, base_version_);
    Result<Envelope> reply =
        client_.CallWhileAlive(std::move(header), std::move(frames), liveness_);
    // Until the commit is answered: rejoin whenever the server is gone, and
    // send the commit again (same id, rebased) unless the site says it was
    // applied.
    for (std::string why = RejoinReason(reply); !why.empty();
         why = RejoinReason(reply)) {
      const Duration absent_since =
          reply.ok() ? clock_->Now() : ServerSilentSince();
      MERIDIAN_ASSIGN_OR_RETURN(Envelope welcome, Rejoin(why, absent_since));
      const pb::Welcome& w = welcome.header.welcome();
      if (commit_id <= w.last_commit_id()) {
        // Applied before the answer was lost: the WELCOME is its answer.
        MLOG(INFO) << "commit " << commit_id << " was applied before the "
                   << "connection was lost";
        RecordRoundTrip(sent);
        stats_.set_commits(stats_.commits() + 1);
        consecutive_rejections_ = 0;
        if (w.stop()) {
          MERIDIAN_RETURN_IF_ERROR(Leave("the job is over"));
          return false;
        }
        MERIDIAN_RETURN_IF_ERROR(LoadModel(welcome, w.model_version()));
        trigger_.Reset(w.plan(), clock_->Now());
        return true;
      }
      MLOG(INFO) << "commit " << commit_id << " was not applied (the site "
                 << "applied up to " << w.last_commit_id()
                 << "): sending it again on model version "
                 << w.model_version();
      auto [again, again_frames] = BuildCommit(commit_id, w.model_version());
      reply = client_.CallWhileAlive(std::move(again), std::move(again_frames),
                                     liveness_);
    }
    if (!reply.ok()) return reply.status();
    RecordRoundTrip(sent);

    if (reply->header.type() == pb::ERROR) {
      // The update is dropped; say so, resynchronise and go on, unless the
      // server keeps refusing (then something is really wrong).
      MLOG(ERROR) << "commit of " << trigger_.steps_since_commit()
                  << " steps dropped by the site server: "
                  << pb::ErrorCode_Name(reply->header.error().code()) << ": "
                  << reply->header.error().message();
      if (++consecutive_rejections_ >= kMaxConsecutiveRejections) {
        return FailedPreconditionError(
            "site server refused " + std::to_string(consecutive_rejections_) +
            " commits in a row; last: " + reply->header.error().message());
      }
      MERIDIAN_RETURN_IF_ERROR(Pull());
      return true;
    }
    consecutive_rejections_ = 0;
    if (reply->header.type() != pb::MODEL) {
      return DataLossError("expected MODEL, got " +
                           DescribeHeader(reply->header));
    }
    stats_.set_commits(stats_.commits() + 1);
    const pb::Model& model = reply->header.model();
    if (model.stop()) {
      MERIDIAN_RETURN_IF_ERROR(Leave(model.stop_reason()));
      return false;
    }
    MERIDIAN_RETURN_IF_ERROR(LoadModel(*reply, model.version()));
    trigger_.Reset(model.plan(), clock_->Now());
    return true;
  }

  // Time waiting for a commit's answer (blocked, and the smoothed round
  // trip the worker reports).
  void RecordRoundTrip(Duration sent) {
    const double round_trip = ToSeconds(clock_->Now() - sent);
    stats_.set_blocked_s(stats_.blocked_s() + round_trip);
    stats_.set_commit_overhead_s(
        Ema(stats_.commit_overhead_s(), round_trip, stats_.commits() == 0));
  }

  // Fetches the current model (after a refused commit).
  Status Pull() {
    pb::Header header;
    header.set_type(pb::PULL);
    header.mutable_pull();
    Result<Envelope> answer = client_.CallWhileAlive(header, {}, liveness_);
    if (const std::string why = RejoinReason(answer); !why.empty()) {
      MERIDIAN_ASSIGN_OR_RETURN(
          Envelope welcome,
          Rejoin(why, answer.ok() ? clock_->Now() : ServerSilentSince()));
      const pb::Welcome& w = welcome.header.welcome();
      // After the end the next commit is answered with stop.
      if (w.stop()) return Status::Ok();
      MERIDIAN_RETURN_IF_ERROR(LoadModel(welcome, w.model_version()));
      trigger_.Reset(w.plan(), clock_->Now());
      return Status::Ok();
    }
    MERIDIAN_ASSIGN_OR_RETURN(Envelope reply, std::move(answer));
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
  Clock* const clock_;
  const WorkerTimeouts timeouts_;
  // This process's identity at the site, and the id of its last commit
  // (1, 2, 3 ...; a commit sent again keeps its id).
  const uint64_t incarnation_;
  uint64_t last_commit_id_ = 0;
  uint64_t rejoins_ = 0;

  Dataset data_;
  std::unique_ptr<Model> model_;
  SgdOptimizer optimizer_;
  std::vector<float> params_;  // the local model
  std::vector<float> base_;    // the model last pulled
  std::vector<float> grad_;
  uint64_t base_version_ = 0;
  std::vector<std::vector<uint32_t>> touched_rows_;
  std::vector<std::vector<uint8_t>> touched_flags_;
  std::vector<float> row_change_;
  // Sparse models: the samples of the next batches, planned at the last
  // commit (trained from planned_cursor_ on), and the rows they read.
  std::vector<uint32_t> planned_;
  size_t planned_cursor_ = 0;
  google::protobuf::RepeatedPtrField<pb::RowRead> reads_;

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
  RpcLiveness liveness_;  // from timeouts_

  // Metrics endpoint (off unless asked for): the training loop publishes,
  // the server's thread renders.
  MetricsRegistry metrics_registry_;
  std::unique_ptr<MetricsServer> metrics_server_;
  double metrics_last_s_ = -1;
  uint64_t metrics_last_steps_ = 0;

 public:
  // Makes the connection to the server a CURVE client with `keys`.
  Status SecureClient(const WorkerCurveKeys& keys) {
    return client_.SetCurve(keys.own.public_key, keys.own.secret_key,
                            keys.server_public_key);
  }

  void StartMetrics() {
    metrics_server_ =
        StartMetricsServerOrWarn(&metrics_registry_, options_.metrics_address,
                                 "worker " + std::to_string(options_.index) +
                                     " of site '" + site_config_.name() + "'");
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
              "Training samples per second since the previous update", labels)
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
    r.Counter("meridian_worker_rejoins_total",
              "Times the worker joined its site server again after the "
              "server was gone or did not know its connection",
              labels)
        ->Set(static_cast<double>(rejoins_));
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
