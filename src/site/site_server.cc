// The site server: the event loop and the commit path. Membership and
// liveness of the workers live in WorkerTable (worker_table.h), the
// evaluator thread in Evaluator (evaluator.h), the inter-site sync in
// SyncEngine (sync_engine.h).
//
// Threads, and the state each may touch
// -------------------------------------
// - The event loop (the thread that calls Run()): everything of Impl that
//   is not named below — the worker socket, the WorkerTable, the policy,
//   the barrier aggregate, the SyncEngine (every call), the counters, the
//   fault events, the summary, the metrics snapshot. It alone applies to
//   the ParameterStore (writes go through no other thread).
// - The evaluator thread (Evaluator): its own model copy and data sets;
//   reads the store through ParameterStore::Snapshot (shard locks), commits_
//   and the training time (atomics); shares its timeline and loss results
//   under Evaluator::mu_.
// - The metrics HTTP server's threads (MetricsServer): render the
//   MetricsRegistry (atomic cells) and never touch Impl; the event loop
//   publishes into the registry.
// - The sync engine's ZAP handler thread (under CURVE, inside SyncEngine):
//   answers libzmq's authentication requests from the job's key list;
//   never touches Impl or the engine's channels.
// - The worker socket's ZAP handler thread (worker_zap_, only when the
//   site lists worker_curve_public_key): admits only the workers' key;
//   never touches Impl. A ZAP handler serves one ZeroMQ context, so the
//   worker socket lives in context_ and the sync engine in sync_context_,
//   each with its own I/O thread and handler. Impl owns both contexts and
//   the handler; members are declared so that each socket closes before its
//   handler stops and each handler stops before its context ends.
// - The checkpoint writer (SiteCheckpointer's CheckpointWriter): writes
//   the snapshot the event loop hands it (a copy), never reads Impl.
// - Any thread: SiteServer::Snapshot() (the store's shard locks), and the
//   endpoints (fixed once Create returned).
#include "meridian/site/site_server.h"

#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <fstream>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <unordered_map>
#include <vector>
#include <zmq.hpp>

#include "meridian/sync/addresses.h"
#include "meridian/config/config.h"
#include "meridian/train/dataset.h"
#include "meridian/core/log.h"
#include "meridian/net/message.h"
#include "meridian/metrics/metrics.h"
#include "meridian/train/model.h"
#include "meridian/ps/param_store.h"
#include "meridian/sched/policy.h"
#include "meridian/report/report.h"
#include "meridian/net/security.h"
#include "meridian/sync/sync.h"
#include "meridian/net/transport.h"
#include "site/evaluator.h"
#include "report/fault_events.h"
#include "meridian/core/format.h"
#include "site/site_checkpoint.h"
#include "site/site_metrics.h"
#include "sync/sync_engine.h"
#include "site/worker_table.h"

namespace meridian {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(20);
// M of the MEAN apply rule: the workers whose updates end up summed in
// this site's model. When sites exchange every change (GAIA, DENSE), that is
// every worker of the job, so a job divides its updates the same way
// whether its workers share one site or many; otherwise the site's own.
uint32_t ContributingWorkers(const pb::JobConfig& job, int site_index) {
  const pb::SyncKind kind = job.sync().kind();
  if ((kind == pb::GAIA || kind == pb::DENSE) &&
      !RoleOf(job, site_index).Peers().empty()) {
    return TotalWorkerCount(job);
  }
  return static_cast<uint32_t>(ServedWorkers(job, site_index).size());
}

// `count` of the positions [0, total) (all when fewer), the same for the
// same seed, sorted: the training samples of the policy's loss evaluations
// (one seed at every site), and SkewScout's held-out sample of a site's
// share (a seed per site).
std::vector<uint32_t> SeededSample(size_t total, uint64_t count,
                                   uint64_t seed) {
  std::vector<uint32_t> all(total);
  std::iota(all.begin(), all.end(), 0u);
  std::mt19937_64 rng(seed ^ 0x6c6f7373ull);  // "loss"
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(std::min<uint64_t>(count, total));
  std::sort(all.begin(), all.end());
  return all;
}

// How long a finishing site waits for its peers' final flushes.
constexpr double kSyncFinishTimeoutS = 60.0;
// Window of the commits-per-second figure in status replies.
constexpr double kRateWindowS = 5.0;
// How often the event loop copies its counters into the metrics registry.
constexpr double kMetricsPeriodS = 0.25;

const char* PendingName(Pending pending) {
  switch (pending) {
    case Pending::kNone:
      return "nothing";
    case Pending::kHello:
      return "its HELLO";
    case Pending::kCommit:
      return "a COMMIT (applied on arrival)";
    case Pending::kPull:
      return "a PULL";
  }
  return "?";
}

}  // namespace

SiteServerTimeouts SiteServerTimeouts::FromJob(const pb::JobConfig& job) {
  SiteServerTimeouts timeouts;
  const pb::FaultConfig& fault = job.fault();
  timeouts.heartbeat_interval_s =
      Positive(fault.heartbeat_interval_s(), timeouts.heartbeat_interval_s);
  timeouts.worker_timeout_s =
      Positive(fault.worker_timeout_s(), timeouts.worker_timeout_s);
  timeouts.join_timeout_s =
      Positive(job.server().join_timeout_s(), timeouts.join_timeout_s);
  timeouts.min_workers = std::max<uint32_t>(fault.min_workers(), 1);
  return timeouts;
}

class SiteServer::Impl {
 public:
  Impl(SiteServerOptions options, int site_index, std::unique_ptr<Model> model,
       std::unique_ptr<Model> eval_model, Dataset test_set, Dataset loss_set,
       Dataset holdout_set, std::unique_ptr<IntraSitePolicy> policy)
      : options_(std::move(options)),
        job_(options_.job),
        site_index_(site_index),
        site_config_(job_.site(site_index)),
        self_(MakeSelf(site_config_.name())),
        clock_(options_.clock != nullptr ? options_.clock : SystemClock()),
        wall_clock_(options_.wall_clock != nullptr ? options_.wall_clock
                                                   : SystemWallClock()),
        timeouts_(
            options_.timeouts.value_or(SiteServerTimeouts::FromJob(job_))),
        model_(std::move(model)),
        policy_(std::move(policy)),
        store_(model_->layout(), job_.server().num_shards(),
               ApplyRule::FromConfig(job_.server(),
                                     ContributingWorkers(job_, site_index))),
        aggregate_(model_->layout().num_elements()),
        workers_(MakeSlots(job_, site_index), site_config_.name(),
                 timeouts_.worker_timeout_s),
        events_(site_config_.name(), wall_clock_),
        bounds_(EndpointBounds::FromConfig(job_.server().limits(),
                                           model_->layout())),
        socket_(context_, zmq::socket_type::router) {
    open_dead_event_.assign(workers_.size(), -1);
    EvaluatorOptions eval;
    eval.store = &store_;
    eval.model = std::move(eval_model);
    eval.test_set = std::move(test_set);
    eval.loss_set = std::move(loss_set);
    eval.eval_period_s = job_.server().eval_period_s();
    eval.target = JobTarget(job_);
    eval.clock = clock_;
    eval.training_s = [this] { return EvalTime(); };
    eval.commits = [this] { return commits_.load(); };
    eval.theta = [this] { return theta_.load(std::memory_order_relaxed); };
    eval.skew_knob = [this]() -> std::optional<double> {
      const double knob = skew_knob_.load(std::memory_order_relaxed);
      if (std::isnan(knob)) return std::nullopt;
      return knob;
    };
    eval.holdout_set = std::move(holdout_set);
    evaluator_ = std::make_unique<Evaluator>(std::move(eval));
    summary_.set_name(site_config_.name());
  }

  ~Impl() { evaluator_->Stop(); }

  Status Init() {
    std::vector<float> initial(model_->layout().num_elements());
    model_->Initialize(job_.seed(), initial);
    MERIDIAN_RETURN_IF_ERROR(store_.Assign(initial));
    for (const TensorInfo& tensor : model_->layout().tensors()) {
      if (tensor.size * sizeof(float) > bounds_.max_frame_bytes) {
        return InvalidArgumentError(
            "server.limits.max_frame_bytes " +
            std::to_string(bounds_.max_frame_bytes) + " is below the " +
            std::to_string(tensor.size * sizeof(float)) + " bytes of tensor '" +
            tensor.name +
            "': no commit could arrive (leave it 0 for the "
            "default)");
      }
    }
    const std::string bind = options_.bind.empty()
                                 ? BindEndpointFor(site_config_.address())
                                 : options_.bind;
    MERIDIAN_RETURN_IF_ERROR(SecureWorkerSocket());
    try {
      socket_.set(zmq::sockopt::linger, 0);
      // Fail loudly (EHOSTUNREACH) instead of dropping a reply to a worker
      // that went away.
      socket_.set(zmq::sockopt::router_mandatory, 1);
      // Never wait for a peer: a reply that does not fit its connection's
      // queue fails at once (Deliver says what happens then).
      socket_.set(zmq::sockopt::sndtimeo, 0);
      socket_.set(zmq::sockopt::sndhwm, static_cast<int>(bounds_.send_queue));
      socket_.set(zmq::sockopt::rcvhwm,
                  static_cast<int>(bounds_.receive_queue));
      // A frame announced bigger than any valid message has drops its
      // connection before ZeroMQ allocates it.
      socket_.set(zmq::sockopt::maxmsgsize,
                  static_cast<int64_t>(bounds_.max_frame_bytes));
      socket_.bind(bind);
    } catch (const zmq::error_t& error) {
      return UnavailableError("site '" + site_config_.name() +
                              "' cannot listen on '" + bind +
                              "': " + error.what());
    }
    MERIDIAN_ASSIGN_OR_RETURN(endpoint_, BoundEndpoint(socket_));
    if (SyncsWithPeers()) {
      SyncEngineOptions sync;
      sync.job = &job_;
      sync.site_index = site_index_;
      sync.store = &store_;
      sync.context = &sync_context_;
      sync.mirror_bind = options_.mirror_bind;
      sync.secret_key_file = options_.secret_key_file;
      sync.clock = clock_;
      sync.wall_clock = wall_clock_;
      sync.score_travelled = [this](const std::string& peer, uint64_t travel_id,
                                    int64_t clock, std::vector<float> model) {
        TravelScore request;
        request.peer = peer;
        request.travel_id = travel_id;
        request.clock = clock;
        return evaluator_->RequestTravelScore(std::move(request),
                                              std::move(model));
      };
      MERIDIAN_ASSIGN_OR_RETURN(sync_, SyncEngine::Create(std::move(sync)));
    }
    MERIDIAN_RETURN_IF_ERROR(OpenCheckpoints());
    // The first evaluations already see the knob (restored or initial).
    if (sync_) PublishSyncKnobs();
    metrics_server_ = StartMetricsServerOrWarn(
        &metrics_registry_,
        options_.metrics_address.empty() ? site_config_.metrics_address()
                                         : options_.metrics_address,
        "site '" + site_config_.name() + "'");
    MLOG(INFO) << "site server listening on " << endpoint_ << " for "
               << workers_.size() << " workers; model "
               << model_->layout().DebugString() << " ("
               << model_->layout().num_elements() << " parameters, "
               << store_.num_shards() << " shards); policy " << policy_->name()
               << "; test set " << evaluator_->test_set_size()
               << " samples; a worker silent for "
               << FormatSeconds(timeouts_.worker_timeout_s, 1)
               << " s is declared dead; one connection may hold at most "
               << FormatSeconds(
                      bounds_.PerConnectionBytes(model_->layout()) / 1048576.0,
                      1)
               << " MiB (server.limits)";
    return Status::Ok();
  }

  // With worker_curve_public_key (and security.curve): loads the site's
  // key pair, starts the worker socket's ZAP handler in context_ admitting
  // only the workers' key (user id "<site>/workers"), and makes socket_ a
  // CURVE server. Call before socket_ binds, so that no worker connection
  // is ever admitted without the handler. Otherwise does nothing.
  Status SecureWorkerSocket() {
    if (!WorkerCurveEnabled(job_, site_index_)) return Status::Ok();
    const std::string owner =
        "worker socket of site '" + site_config_.name() + "'";
    MERIDIAN_ASSIGN_OR_RETURN(
        SiteCurveKeys keys,
        LoadSiteCurveKeys(job_, site_index_, {}, options_.secret_key_file));
    MERIDIAN_ASSIGN_OR_RETURN(
        worker_zap_, ZapHandler::Start(context_,
                                       {{site_config_.worker_curve_public_key(),
                                         site_config_.name() + "/workers"}},
                                       owner));
    MERIDIAN_RETURN_IF_ERROR(
        MakeCurveServer(socket_, keys.own).WithContext(owner));
    MLOG(INFO) << "CURVE on the worker endpoint: admitting only the workers' "
                  "key "
               << site_config_.worker_curve_public_key()
               << "; this site's public key " << keys.own.public_key;
    return Status::Ok();
  }

  const std::string& endpoint() const { return endpoint_; }
  std::vector<float> Snapshot() const {
    std::vector<float> model(store_.num_elements());
    store_.Snapshot(model);
    return model;
  }
  std::string mirror_endpoint() const {
    return sync_ ? sync_->mirror_endpoint() : std::string();
  }
  std::string metrics_address() const {
    return metrics_server_ ? metrics_server_->address() : std::string();
  }
  const pb::SiteSummary& summary() const { return summary_; }

  // The summary's label_histogram (the served sites' shares of the
  // training set, per class) and partition (this site's, in words).
  Status DescribeTrainingData(std::span<const uint8_t> train_labels) {
    const int num_classes = PartitionClassCount(train_labels);
    std::vector<uint64_t> histogram(num_classes, 0);
    for (int s = 0; s < job_.site_size(); ++s) {
      if (s != site_index_ && ServingSite(job_, s) != site_index_) continue;
      MERIDIAN_ASSIGN_OR_RETURN(const std::vector<uint64_t> share,
                                SiteLabelHistogram(job_, train_labels, s));
      for (int c = 0; c < num_classes; ++c) histogram[c] += share[c];
    }
    summary_.clear_label_histogram();
    for (uint64_t count : histogram) {
      summary_.add_label_histogram(static_cast<uint32_t>(count));
    }
    summary_.set_partition(DescribePartition(job_.data().site_partition(),
                                             num_classes, job_.site_size(),
                                             site_index_));
    return Status::Ok();
  }

  Status Run() {
    // The process's role too (SetLogRole), unless several servers share
    // the process (tests): then each thread names its own site.
    ThreadLogRole log_role(site_config_.name() + "/server");
    if (resumed_finished_) {
      // Resumed a job this site had finished: report it again.
      finished_ = true;
      Finish();
      return Status::Ok();
    }
    MERIDIAN_RETURN_IF_ERROR(AwaitWorkers());
    if (finished_) {  // stopped before training began
      WriteSummary();
      return Status::Ok();
    }
    StartTraining();
    MERIDIAN_RETURN_IF_ERROR(Serve());
    MERIDIAN_RETURN_IF_ERROR(Drain());
    // Every accepted commit is in; what the peers have not got yet goes out
    // losslessly, and theirs comes in, before the final evaluation.
    if (sync_) sync_->Finish(kSyncFinishTimeoutS);
    Finish();
    return Status::Ok();
  }

 private:
  static pb::Endpoint MakeSelf(const std::string& site) {
    pb::Endpoint self;
    self.set_site(site);
    self.set_role(pb::ROLE_SITE_SERVER);
    self.set_id(0);
    return self;
  }

  // Slots in config order: this site's workers, then those of the sites
  // whose server_site names this one. Policies see slot numbers.
  static std::vector<WorkerSlot> MakeSlots(const pb::JobConfig& job,
                                           int site_index) {
    std::vector<WorkerSlot> slots;
    for (const WorkerRef& ref : ServedWorkers(job, site_index)) {
      const pb::SiteConfig& site = job.site(ref.site);
      WorkerSlot slot;
      slot.site = site.name();
      slot.index = ref.index;
      slot.step_time_s = WorkerGroupOf(site, ref.index).step_time_s();
      slots.push_back(std::move(slot));
    }
    return slots;
  }

  double Now() const { return clock_->NowSeconds(); }

  // Whether this site exchanges updates with other sites.
  bool SyncsWithPeers() const {
    if (job_.sync().kind() == pb::SYNC_NONE) return false;
    return !RoleOf(job_, site_index_).Peers().empty();
  }
  // Seconds of training, the run this one resumed included.
  double Elapsed() const { return Now() - start_s_ + trained_before_s_; }
  // Evaluation timestamps: seconds of training, frozen once the job ended.
  // Any thread.
  double EvalTime() const {
    const double frozen = training_s_.load();
    return frozen > 0 ? frozen : Elapsed();
  }
  bool StopRequested() const {
    return options_.stop_requested != nullptr &&
           options_.stop_requested->load(std::memory_order_relaxed);
  }

  // ---- phase 1: workers join -----------------------------------------------
  // Until every worker is live, or the join timeout passed with at least
  // min_workers live (the rest may join late).
  Status AwaitWorkers() {
    const double deadline = Now() + timeouts_.join_timeout_s;
    const uint32_t needed = std::min(timeouts_.min_workers, workers_.size());
    while (workers_.LiveCount() < workers_.size() || AwaitingPeers()) {
      if (StopRequested()) {
        FinishJob("stopped before all workers joined");
        return Status::Ok();
      }
      if (workers_.AllLeft()) {
        FinishJob("every worker left before training began");
        return Status::Ok();
      }
      if (Now() > deadline && AwaitingPeers()) {
        return DeadlineExceededError(
            "site server '" + site_config_.name() +
            "' was told to wait for SET_PEERS (--await-peers) and got none "
            "within " +
            FormatSeconds(timeouts_.join_timeout_s, 0) + " s");
      }
      if (Now() > deadline) {
        if (workers_.LiveCount() >= needed && workers_.LiveCount() > 0) break;
        return DeadlineExceededError(
            "workers [" + workers_.DescribeNotLive() + "] of site server '" +
            site_config_.name() + "' did not join within " +
            FormatSeconds(timeouts_.join_timeout_s, 0) + " s (" +
            std::to_string(workers_.LiveCount()) + " joined, at least " +
            std::to_string(std::max<uint32_t>(needed, 1)) +
            " needed: fault.min_workers)");
      }
      MERIDIAN_RETURN_IF_ERROR(PollOnce());
      if (finished_) return Status::Ok();
    }
    return Status::Ok();
  }

  // Training waits for SET_PEERS (SiteServerOptions::await_peers).
  bool AwaitingPeers() const {
    return options_.await_peers && sync_ != nullptr && !peers_set_;
  }

  void StartTraining() {
    if (sync_) {
      if (Status status = sync_->Connect(); !status.ok()) {
        MLOG(ERROR) << "cannot reach the peer sites: " << status;
      }
    }
    start_s_ = Now();
    training_ = true;
    waiting_notice_.Reset();
    const Duration now = clock_->Now();
    policy_->Start(workers_.size(), now);
    // Nobody waits for a worker that is not here; it may join late.
    for (uint32_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i].state != SlotState::kLive) {
        Execute(policy_->OnLeave(i, now));
      }
    }
    if (workers_.LiveCount() == workers_.size()) {
      MLOG(INFO) << "all " << workers_.size() << " workers joined; training";
    } else {
      MLOG(WARNING) << workers_.LiveCount() << " of " << workers_.size()
                    << " workers joined within "
                    << FormatSeconds(timeouts_.join_timeout_s, 0)
                    << " s; training without [" << workers_.DescribeNotLive()
                    << "] (they may join late)";
    }
    for (uint32_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i].state == SlotState::kLive &&
          workers_[i].pending == Pending::kHello) {
        SendWelcome(i);
      }
    }
    evaluator_->Start();
    if (checkpointer_ && recovery_.restarts() == 0) {
      // A durable point before the first update leaves this site: a crash
      // at any moment from now on finds a checkpoint and the log after it
      // (without one, a restart would begin from the initial model while
      // its peers kept what it had sent).
      TakeCheckpoint(/*finished=*/false);
      if (Status written = checkpointer_->Flush(); !written.ok()) {
        MLOG(ERROR) << "cannot write the first checkpoint: " << written;
      }
    }
  }

  // ---- phase 2: training ---------------------------------------------------
  Status Serve() {
    while (!finished_) {
      MERIDIAN_RETURN_IF_ERROR(PollOnce());
      Execute(policy_->OnTick(clock_->Now()));
      DeliverLossEvaluations();
      CheckStopConditions();
    }
    return Status::Ok();
  }

  void CheckStopConditions() {
    if (finished_) return;
    if (job_.stop_at_target() && evaluator_->target_reached()) {
      FinishJob("target " + model_->metric().name + " reached");
    } else if (Elapsed() >= job_.time_budget_s()) {
      FinishJob("time budget of " + FormatSeconds(job_.time_budget_s(), 0) +
                " s used");
    } else if (StopRequested()) {
      FinishJob("stopped on request (signal)");
    } else if (sync_ && sync_->peer_finished()) {
      summary_.set_stopped_by_peer(true);
      FinishJob("site '" + sync_->finished_peer() + "' finished the job");
    } else if (workers_.AllLeft()) {
      // BYEs only: dead workers may still come back.
      FinishJob("every worker left");
    }
  }

  // Ends training: nothing more is scheduled; waiting workers are told to
  // stop. A BSP aggregate of a clock that never closed is applied, so that
  // no accepted commit is lost.
  void FinishJob(const std::string& reason) {
    if (finished_) return;
    finished_ = true;
    stop_reason_ = reason;
    training_s_ = training_ ? Elapsed() : 0;
    MLOG(INFO) << "finishing: " << reason;
    if (aggregate_.count() > 0) {
      MLOG(INFO) << "applying the open barrier's " << aggregate_.count()
                 << " commits before stopping";
      FlushAggregate();
    }
    for (uint32_t i = 0; i < workers_.size(); ++i) {
      workers_[i].held = false;
      if (workers_[i].state == SlotState::kLive &&
          workers_[i].awaiting_reply()) {
        SendReply(i);
      }
    }
  }

  // ---- phase 3: let workers leave, final evaluation ------------------------
  // Until every live worker said BYE (dead ones never will), at most
  // drain_s.
  Status Drain() {
    const double deadline = Now() + timeouts_.drain_s;
    while (Now() < deadline && !workers_.NoneLive()) {
      MERIDIAN_RETURN_IF_ERROR(PollOnce());
    }
    return Status::Ok();
  }

  void Finish() {
    evaluator_->Stop();
    // The final model's quality, measured once more after the last update.
    evaluator_->EvaluateNow();
    const pb::EvalPoint last = evaluator_->Last().value_or(pb::EvalPoint());
    summary_.set_final_accuracy(last.accuracy());
    summary_.set_final_metric(last.metric());
    summary_.set_final_loss(last.loss());
    summary_.set_model_version(store_.version());
    summary_.set_commits(commits_.load());
    summary_.set_rejected(rejected_);
    summary_.set_training_s(training_s_);
    summary_.set_stop_reason(stop_reason_);
    summary_.set_model_parameters(
        static_cast<uint32_t>(model_->layout().num_elements()));
    summary_.clear_events();
    events_.CopyTo(summary_.mutable_events());
    if (sync_) {
      *summary_.mutable_sync() = sync_->Summary();
      sync_->events().CopyTo(summary_.mutable_events());
    }
    if (recovery_.restarts() > 0) *summary_.mutable_recovery() = recovery_;
    summary_.set_search_time_s(policy_->search_time_s());
    summary_.set_loss_evaluations(static_cast<uint32_t>(loss_evaluations_));
    summary_.set_server_momentum(store_.rule().momentum);
    const double time_to_target = evaluator_->time_to_target_s();
    summary_.set_reached_target(time_to_target >= 0);
    summary_.set_time_to_target_s(time_to_target);
    MLOG(INFO) << "final " << model_->metric().name << " " << last.metric()
               << " accuracy " << last.accuracy() << " loss " << last.loss()
               << " after " << commits_.load() << " commits (" << stop_reason_
               << ")";
    WriteSummary();
    WriteModelFile();
    FinalCheckpoint();
    PublishMetrics(/*force=*/true);
  }

  // <out_dir>/model-<site>.f32: the final model, little-endian float32 in
  // layout order (the summary's model_parameters of them), for comparing
  // replicas and for using the model.
  void WriteModelFile() {
    if (options_.out_dir.empty()) return;
    const std::string path =
        options_.out_dir + "/model-" + site_config_.name() + ".f32";
    const std::vector<float> model = Snapshot();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(model.data()),
              static_cast<std::streamsize>(model.size() * sizeof(float)));
    if (!out) MLOG(ERROR) << "cannot write the final model to " << path;
  }

  void WriteSummary() {
    summary_.clear_timeline();
    for (const pb::EvalPoint& point : evaluator_->Timeline()) {
      *summary_.add_timeline() = point;
    }
    summary_.clear_workers();
    for (const WorkerSlot& slot : workers_.slots()) {
      pb::WorkerSummary* w = summary_.add_workers();
      w->set_site(slot.site);
      w->set_index(slot.index);
      const pb::WorkerStats s = WorkerTable::TotalStats(slot);
      w->set_steps(s.steps());
      w->set_commits(s.commits());
      w->set_compute_s(s.compute_s());
      w->set_device_wait_s(s.device_wait_s());
      w->set_blocked_s(s.blocked_s());
      w->set_commit_bytes(static_cast<double>(s.commit_bytes()));
      w->set_step_time_s(slot.step_time_s);
      w->set_steps_per_s(training_s_ > 0 ? s.steps() / training_s_ : 0);
      w->set_commits_applied(static_cast<uint32_t>(slot.commits_applied));
      w->set_incarnations(slot.incarnations);
    }
    summary_.set_duplicate_commits(
        static_cast<uint32_t>(workers_.duplicate_commits()));
    if (options_.out_dir.empty()) return;
    const std::string path =
        options_.out_dir + "/site-" + site_config_.name() + ".json";
    if (Status status = WriteJsonFile(summary_, path); !status.ok()) {
      MLOG(ERROR) << "cannot write the site summary: " << status;
    }
  }

  // ---- the event loop ------------------------------------------------------
  // Waits up to kPollInterval for the worker socket and the sync sockets,
  // then handles what arrived and looks after the workers' liveness.
  Status PollOnce() {
    std::vector<zmq::pollitem_t> items = {{socket_.handle(), 0, ZMQ_POLLIN, 0}};
    if (sync_) sync_->AddPollItems(&items);
    try {
      zmq::poll(items.data(), items.size(), kPollInterval);
    } catch (const zmq::error_t& error) {
      if (error.num() == EINTR) return Status::Ok();  // a signal: look again
      return UnavailableError(std::string("polling: ") + error.what());
    }
    if (items[0].revents & ZMQ_POLLIN) {
      Result<Received> received =
          ReceiveMessage(socket_, true, std::chrono::milliseconds(0));
      if (!received.ok()) return received.status();
      if (received->refused) {
        Refuse(received->refused->routing_id, received->refused->header,
               received->refused->rejection);
      } else if (received->message) {
        DispatchGuarded(*received->message);
      }
    }
    DropWorkersNotReading();
    if (sync_) {
      sync_->HandleReadable(std::span<const zmq::pollitem_t>(items).subspan(1));
      AdvanceClock();  // the clock floor moves with what peers say
      ReleaseHeld();
    }
    MaybeCheckpoint();
    CheckLiveness();
    SampleRate();
    NoteWaiting();
    PublishMetrics();
    return Status::Ok();
  }

  void Refuse(const std::string& routing_id, const pb::Header& header,
              const Rejection& rejection) {
    ++rejected_;
    RefuseMessage(socket_, self_, ++sequence_, routing_id, header, rejection);
  }

  // Dispatch, with any exception a handler lets out (an allocation that
  // failed under a memory limit, a ZeroMQ error) turned into an
  // ERROR_INTERNAL reply: the request failed, the server goes on. Every
  // handler checks a request completely before it changes the model, so a
  // failure leaves the model as it was.
  void DispatchGuarded(Envelope& message) {
    std::string what;
    try {
      return Dispatch(message);
    } catch (const std::bad_alloc&) {
      what = "out of memory";
    } catch (const zmq::error_t& error) {
      what = std::string("ZeroMQ: ") + error.what();
    } catch (const std::exception& error) {
      what = error.what();
    }
    Refuse(message.routing_id, message.header,
           {pb::ERROR_INTERNAL, "site server '" + site_config_.name() +
                                    "' failed handling it (" + what +
                                    "); the model is unchanged"});
  }

  void Dispatch(Envelope& message) {
    switch (message.header.type()) {
      case pb::HELLO:
        return HandleHello(message);
      case pb::COMMIT:
        return HandleCommit(message);
      case pb::PULL:
        return HandlePull(message);
      case pb::BYE:
        return HandleBye(message);
      case pb::HEARTBEAT:
        if (!workers_.OnHeartbeat(message.header, message.routing_id, Now())) {
          // One of our workers over a connection this server does not know
          // (it restarted, or declared the worker dead): tell it to rejoin
          // now instead of after server_timeout_s of silence.
          (void)SendError(socket_, self_, ++sequence_,
                          {pb::ERROR_UNKNOWN_SENDER,
                           "site server '" + site_config_.name() +
                               "' does not know this connection: join again"},
                          0, message.routing_id);
        }
        return;
      case pb::STATUS_REQUEST:
        return SendStatus(message);
      case pb::SET_PEERS:
        if (!Authorized(message)) return;
        return HandleSetPeers(message);
      case pb::SHUTDOWN:
        if (!Authorized(message)) return;
        FinishJob("shutdown requested: " +
                  (message.header.shutdown().reason().empty()
                       ? std::string("no reason given")
                       : message.header.shutdown().reason()));
        return SendStatus(message);
      default:
        return Refuse(message.routing_id, message.header,
                      {pb::ERROR_UNEXPECTED,
                       pb::MessageType_Name(message.header.type()) +
                           " is not a request a site server serves"});
    }
  }

  // Whether a control message carries the job's control token; refuses
  // it otherwise.
  bool Authorized(const Envelope& message) {
    const std::string& token = options_.control_token;
    if (!token.empty() &&
        ConstantTimeEquals(message.header.control_token(), token)) {
      return true;
    }
    Refuse(message.routing_id, message.header,
           {pb::ERROR_UNAUTHORIZED,
            token.empty() ? "site server '" + site_config_.name() +
                                "' obeys no control message (it was started "
                                "without a control token)"
                          : "control messages need the job's control token"});
    return false;
  }

  void HandleSetPeers(const Envelope& message) {
    if (!sync_) {
      return Refuse(
          message.routing_id, message.header,
          {pb::ERROR_UNEXPECTED, "site '" + site_config_.name() +
                                     "' does not sync with other sites"});
    }
    if (training_) {
      return Refuse(
          message.routing_id, message.header,
          {pb::ERROR_UNEXPECTED, "peers are set before training starts"});
    }
    std::map<std::string, std::string> endpoints;
    for (const pb::Peer& peer : message.header.peers().peer()) {
      endpoints[peer.site()] = peer.endpoint();
    }
    if (Status status = sync_->SetPeerEndpoints(endpoints); !status.ok()) {
      return Refuse(message.routing_id, message.header,
                    {pb::ERROR_UNKNOWN_SENDER, status.message()});
    }
    peers_set_ = true;
    SendStatus(message);
  }

  // The slot behind a request from a live worker, or nullopt after
  // refusing it.
  std::optional<uint32_t> Sender(const Envelope& message,
                                 bool allow_pending = false) {
    const WorkerTable::Checked checked = workers_.CheckRequest(
        message.header, message.routing_id, Now(), allow_pending);
    if (!checked.slot) {
      Refuse(message.routing_id, message.header, checked.refusal);
    }
    return checked.slot;
  }

  // ---- membership ----------------------------------------------------------
  void HandleHello(Envelope& message) {
    const pb::Endpoint& sender = message.header.sender();
    const pb::Hello& hello = message.header.hello();
    const uint32_t index = hello.worker_index();
    const std::optional<uint32_t> found =
        sender.role() == pb::ROLE_WORKER && sender.id() == index
            ? workers_.Find(sender.site(), index)
            : std::nullopt;
    if (!found) {
      return Refuse(
          message.routing_id, message.header,
          {pb::ERROR_UNKNOWN_SENDER,
           "HELLO from worker " + Sanitized(sender.site(), 64) + "/" +
               std::to_string(index) + ": site server '" + site_config_.name() +
               "' serves " + workers_.Describe()});
    }
    Result<ModelLayout> layout = LayoutFromSpecs(hello.layout());
    if (!layout.ok() || !(*layout == model_->layout())) {
      return Refuse(
          message.routing_id, message.header,
          {pb::ERROR_LAYOUT_MISMATCH,
           "worker's model [" +
               (layout.ok() ? layout->DebugString()
                            : layout.status().message()) +
               "] differs from the site's [" + model_->layout().DebugString() +
               "]: are both started from the same job file?"});
    }
    const uint32_t worker = *found;
    const bool same_process =
        hello.incarnation() != 0 &&
        hello.incarnation() == workers_[worker].incarnation;
    if (finished_ && !same_process) {
      // Only a process that may still hold an unanswered commit is let in
      // after the end (to send it again).
      return Refuse(message.routing_id, message.header,
                    {pb::ERROR_UNEXPECTED, "the job has finished"});
    }
    const Admission admission =
        workers_.Admit(worker, hello.incarnation(), message.routing_id,
                       message.header.sequence(), Now());
    if (admission.kind == Admission::Kind::kRefused) {
      return Refuse(message.routing_id, message.header, admission.refusal);
    }
    if (finished_) {
      MLOG(INFO) << "worker " << workers_[worker].Name()
                 << " came back after the end of the job: it may send its "
                    "unanswered commit again, then stops";
      return SendReply(worker);  // WELCOME with stop
    }
    OnAdmitted(worker, admission);
  }

  // A worker was admitted: log, record the event, and during training tell
  // the policy (which releases the joiner's WELCOME when it may start).
  // Before training every live worker waits for the start.
  void OnAdmitted(uint32_t worker, const Admission& admission) {
    const WorkerSlot& slot = workers_[worker];
    const Duration now = clock_->Now();
    switch (admission.kind) {
      case Admission::Kind::kJoined:
        if (!training_) {
          MLOG(INFO) << "worker " << slot.Name() << " joined ("
                     << workers_.LiveCount() << "/" << workers_.size() << ")";
          return;
        }
        MLOG(INFO) << "worker " << slot.Name() << " joined late ("
                   << workers_.LiveCount() << "/" << workers_.size()
                   << " live)";
        RecordEvent(
            pb::WORKER_JOINED_LATE, slot.Name(), 0,
            "joined " + FormatSeconds(Elapsed(), 1) + " s into training");
        Execute(policy_->OnJoin(worker, now));
        return;
      case Admission::Kind::kReconnected:
        MLOG(INFO) << "worker " << slot.Name()
                   << " reconnected (same process, new connection)"
                   << (admission.request_pending
                           ? "; its pending request is answered there"
                           : "");
        // A held request is answered when it is released, as a WELCOME.
        if (training_ && !admission.request_pending) Answer(worker);
        return;
      case Admission::Kind::kRejoined:
        MLOG(WARNING) << "worker " << slot.Name() << " is back after "
                      << FormatSeconds(admission.dead_s, 1)
                      << " s declared dead (same process); last commit id "
                      << slot.last_commit_id;
        CloseDeadEvent(worker, admission.dead_s);
        RecordEvent(pb::WORKER_REJOINED, slot.Name(), admission.dead_s,
                    "same process; its last applied commit id " +
                        std::to_string(slot.last_commit_id));
        if (training_) Execute(policy_->OnJoin(worker, now));
        return;
      case Admission::Kind::kRestarted: {
        std::string detail = "a new process took the slot";
        if (admission.previous == SlotState::kLive) {
          detail += "; the old one's unanswered request (" +
                    std::string(PendingName(admission.dropped)) +
                    ") is dropped";
        }
        MLOG(WARNING) << "worker " << slot.Name() << " restarted (process "
                      << slot.incarnations << " of this slot): " << detail;
        if (admission.previous == SlotState::kDead) {
          CloseDeadEvent(worker, admission.dead_s);
        }
        RecordEvent(
            pb::WORKER_RESTARTED, slot.Name(),
            admission.previous == SlotState::kDead ? admission.dead_s : 0,
            detail);
        if (!training_) return;
        if (admission.previous == SlotState::kLive) {
          Execute(policy_->OnLeave(worker, now));
        }
        Execute(policy_->OnJoin(worker, now));
        return;
      }
      case Admission::Kind::kRefused:
        return;
    }
  }

  // Declares silent workers dead, forgives our own stalls, and sends
  // HEARTBEATs to the workers whose replies we hold.
  void CheckLiveness() {
    const double now = Now();
    double stalled_s = 0;
    for (const WorkerTable::Death& death :
         workers_.CheckLiveness(now, &stalled_s)) {
      DeclareDead(death,
                  "silent for " + FormatSeconds(death.silent_s, 1) + " s");
    }
    if (stalled_s > 0) {
      MLOG(WARNING) << "the event loop did not run for "
                    << FormatSeconds(stalled_s, 1)
                    << " s (was this process stopped or starved?): every "
                       "live worker gets a fresh "
                    << FormatSeconds(timeouts_.worker_timeout_s, 1)
                    << " s window";
    }
    for (uint32_t worker :
         workers_.DueForHeartbeat(now, timeouts_.heartbeat_interval_s)) {
      pb::Header heartbeat = MakeHeader(pb::HEARTBEAT, self_, 0);
      heartbeat.mutable_heartbeat();
      // Never blocks; a heartbeat a dying connection cannot take is lost.
      (void)TrySendMessage(socket_, heartbeat, workers_[worker].routing_id);
      workers_.NoteSent(worker, now);
    }
  }

  // `why`: "silent for 12.0 s", ...
  void DeclareDead(const WorkerTable::Death& death, const std::string& why) {
    const WorkerSlot& slot = workers_[death.slot];
    ++worker_deaths_;
    MLOG(WARNING) << "worker " << slot.Name() << " " << why << ": declared dead"
                  << (death.dropped == Pending::kNone
                          ? std::string()
                          : std::string("; its unanswered request (") +
                                PendingName(death.dropped) +
                                ") will not be answered")
                  << "; " << workers_.LiveCount() << " of " << workers_.size()
                  << " workers live";
    open_dead_event_[death.slot] =
        RecordEvent(pb::WORKER_DEAD, slot.Name(), 0, why);
    if (training_ && !finished_) {
      Execute(policy_->OnLeave(death.slot, clock_->Now()));
    }
  }

  // Records a fault event of this server; returns its index, or -1 when
  // it was not kept.
  int RecordEvent(pb::FaultKind kind, const std::string& subject,
                  double duration_s, const std::string& detail) {
    return events_.Record(kind, subject, detail, duration_s);
  }

  // The worker's WORKER_DEAD event is resolved: it lasted `dead_s`.
  void CloseDeadEvent(uint32_t worker, double dead_s) {
    const int index = open_dead_event_[worker];
    open_dead_event_[worker] = -1;
    events_.Resolve(index, dead_s);
  }

  // ---- the commit path -----------------------------------------------------
  void HandleCommit(Envelope& message) {
    const std::optional<uint32_t> found = Sender(message);
    if (!found) return;
    const uint32_t worker = *found;
    WorkerSlot* slot = &workers_[worker];
    if (!training_) {
      return Refuse(message.routing_id, message.header,
                    {pb::ERROR_UNEXPECTED, "training has not started"});
    }
    if (Check check = CheckSlicesAgainstLayout(
            message.header, model_->layout(), /*whole_model=*/true);
        !check.ok()) {
      return Refuse(message.routing_id, message.header, check.rejection());
    }
    if (Check check =
            CheckCodec(message.header, pb::CODEC_RAW, pb::CODEC_ROWS);
        !check.ok()) {
      return Refuse(message.routing_id, message.header, check.rejection());
    }
    // Sparse tensors come as their touched rows (decoded here, once, for
    // Segments); dense ones whole.
    rows_.resize(message.payload.size());
    for (int i = 0; i < message.header.slices_size(); ++i) {
      const pb::TensorSlice& slice = message.header.slices(i);
      const std::span<const std::byte> bytes = BytesOf(message.payload[i]);
      Check check;
      if (slice.codec() == pb::CODEC_ROWS) {
        Parsed<DecodedRows> rows =
            DecodeRows(slice, model_->layout().tensors()[i], bytes);
        if (rows.ok()) {
          rows_[i] = std::move(rows).value();
        } else {
          check = std::move(rows).rejection();
        }
      } else {
        check = CheckFinite(slice, bytes);
      }
      if (!check.ok()) {
        return Refuse(message.routing_id, message.header, check.rejection());
      }
    }
    const pb::Commit& commit = message.header.commit();
    Parsed<RowReads> parsed_reads = ParseRowReads(commit, model_->layout());
    if (!parsed_reads.ok()) {
      return Refuse(message.routing_id, message.header,
                    parsed_reads.rejection());
    }
    RowReads read_rows = std::move(parsed_reads).value();
    if (workers_.IsDuplicate(worker, commit.commit_id())) {
      // Sent again after a reconnect although it was applied: answer it
      // with the model, never apply it twice.
      workers_.RecordDuplicate(worker);
      MLOG(INFO) << "commit " << commit.commit_id() << " of worker "
                 << slot->Name()
                 << " was applied already: answered, not applied again";
      slot->stats = commit.stats();
      slot->pending = Pending::kCommit;
      slot->read_ranges.clear();
      slot->read_rows = std::move(read_rows);
      return Answer(worker);
    }
    if (commit.base_version() > store_.version()) {
      return Refuse(
          message.routing_id, message.header,
          {pb::ERROR_STALE, "commit based on model version " +
                                std::to_string(commit.base_version()) +
                                ", newer than the site's " +
                                std::to_string(store_.version())});
    }
    NoteLostCommits(worker, commit.commit_id());
    staleness_.Add(store_.version() - commit.base_version());
    slot->stats = commit.stats();
    slot->pending = Pending::kCommit;
    slot->read_ranges.clear();
    // The whole model, or the rows the worker's next batches read.
    slot->read_rows = std::move(read_rows);

    if (finished_) {
      // The job is over, but the worker's last update is real work: apply
      // it so that nothing accepted is lost, then tell it to stop.
      ApplyCommit(message);
      workers_.RecordApplied(worker, commit.commit_id());
      SendReply(worker);
      return;
    }
    CommitEvent event;
    event.worker = worker;
    event.base_version = commit.base_version();
    event.current_version = store_.version();
    event.local_steps = commit.local_steps();
    event.now = clock_->Now();
    event.commit_overhead_s = commit.stats().commit_overhead_s();
    PolicyDecision decision = policy_->OnCommit(event);
    switch (decision.update) {
      case PolicyDecision::Update::kApply: {
        workers_.RecordApplied(worker, commit.commit_id());
        auto released =
            std::find(decision.release.begin(), decision.release.end(), worker);
        if (released != decision.release.end() && !decision.flush_aggregate &&
            ReadsAllowed()) {
          // The common asynchronous case: apply and copy the result into
          // the reply in one pass over the model.
          ModelReply reply = NewModelReply(pb::MODEL, {}, slot->read_rows);
          const uint64_t version = store_.Apply(Segments(message), reply.reads);
          ++commits_;
          SendModelReply(worker, version, std::move(reply));
          decision.release.erase(released);
        } else {
          ApplyCommit(message);
        }
        break;
      }
      case PolicyDecision::Update::kAggregate:
        // Applied with its round (FinishJob flushes an open one).
        workers_.RecordApplied(worker, commit.commit_id());
        aggregate_.Add(Segments(message));
        ++commits_;
        break;
      case PolicyDecision::Update::kReject:
        slot->pending = Pending::kNone;
        Refuse(message.routing_id, message.header,
               {pb::ERROR_STALE, decision.reject_reason});
        break;
    }
    Execute(decision);
  }

  void HandlePull(Envelope& message) {
    const std::optional<uint32_t> worker = Sender(message);
    if (!worker) return;
    const pb::Pull& pull = message.header.pull();
    if (pull.ranges_size() > 0) {
      pb::Header wanted;
      *wanted.mutable_slices() = pull.ranges();
      if (Check check = CheckSlicesAgainstLayout(wanted, model_->layout(),
                                                 /*whole_model=*/false);
          !check.ok()) {
        return Refuse(message.routing_id, message.header, check.rejection());
      }
      // Ranges may overlap: without a cap, one small request could ask
      // for thousands of copies of the model.
      uint64_t floats = 0;
      for (const pb::TensorSlice& range : pull.ranges()) {
        floats += range.length();  // each <= the model: cannot overflow
      }
      if (floats > ReplyFloatLimit()) {
        return Refuse(
            message.routing_id, message.header,
            {pb::ERROR_LIMIT, "PULL asks for " + std::to_string(floats) +
                                  " floats; a reply carries at most " +
                                  std::to_string(ReplyFloatLimit()) +
                                  " (server.limits.max_reply_floats)"});
      }
    }
    workers_[*worker].read_ranges.assign(pull.ranges().begin(),
                                         pull.ranges().end());
    workers_[*worker].read_rows.clear();
    workers_[*worker].pending = Pending::kPull;
    ++pulls_;
    if (finished_ || !training_) return SendReply(*worker);
    Execute(policy_->OnPull(*worker, clock_->Now()));
  }

  void HandleBye(Envelope& message) {
    // A BYE may come while a request is pending (a worker stopped while it
    // waited): the request is dropped.
    const std::optional<uint32_t> worker =
        Sender(message, /*allow_pending=*/true);
    if (!worker) return;
    WorkerSlot& slot = workers_[*worker];
    if (message.header.has_bye()) slot.stats = message.header.bye().stats();
    workers_.Leave(*worker);
    MLOG(INFO) << "worker " << slot.Name() << " left after "
               << slot.stats.steps() << " steps, " << slot.stats.commits()
               << " commits";
    pb::Header reply = MakeHeader(pb::BYE, self_, ++sequence_);
    if (Status status = SendMessage(socket_, reply, {}, slot.routing_id);
        !status.ok()) {
      MLOG(WARNING) << "cannot acknowledge BYE of worker " << slot.Name()
                    << ": " << status;
    }
    if (training_ && !finished_) {
      Execute(policy_->OnLeave(*worker, clock_->Now()));
    }
  }

  // The update of a checked COMMIT as segments of the key space: a dense
  // slice is one, a CODEC_ROWS slice one per row (from rows_, decoded by
  // HandleCommit).
  std::vector<UpdateSegment> Segments(const Envelope& message) {
    std::vector<UpdateSegment> segments;
    segments.reserve(message.payload.size());
    scratch_.resize(message.payload.size());
    for (size_t i = 0; i < message.payload.size(); ++i) {
      const pb::TensorSlice& slice = message.header.slices(static_cast<int>(i));
      const TensorInfo* tensor = model_->layout().Find(slice.tensor());
      if (slice.codec() == pb::CODEC_ROWS) {
        const DecodedRows& rows = rows_[i];
        for (size_t k = 0; k < rows.rows.size(); ++k) {
          segments.push_back(UpdateSegment{
              tensor->offset + rows.rows[k] * rows.row_length,
              std::span<const float>(rows.values)
                  .subspan(k * rows.row_length, rows.row_length)});
        }
        continue;
      }
      segments.push_back(
          UpdateSegment{tensor->offset + slice.offset(),
                        FloatsOf(message.payload[i], &scratch_[i])});
    }
    return segments;
  }

  // Floats one PULL reply may carry: the configured limit, at least one
  // whole model (what every COMMIT is answered with anyway).
  uint64_t ReplyFloatLimit() const {
    return std::max<uint64_t>(bounds_.max_reply_floats,
                              model_->layout().num_elements());
  }

  void ApplyCommit(const Envelope& message) {
    store_.Apply(Segments(message));
    ++commits_;
  }

  void FlushAggregate() {
    store_.Apply(aggregate_.Segments());
    aggregate_.Clear();
  }

  void Execute(const PolicyDecision& decision) {
    if (decision.flush_aggregate && aggregate_.count() > 0) FlushAggregate();
    if (decision.evaluate_loss) evaluator_->RequestLoss();
    if (const std::optional<double> momentum = policy_->ServerMomentum();
        momentum && *momentum != store_.rule().momentum) {
      MLOG(INFO) << "server momentum " << store_.rule().momentum << " -> "
                 << *momentum << " (" << policy_->name() << ")";
      store_.SetMomentum(*momentum);
    }
    AdvanceClock();
    for (uint32_t worker : decision.release) {
      if (worker < workers_.size() &&
          workers_[worker].state == SlotState::kLive &&
          workers_[worker].awaiting_reply()) {
        Answer(worker);
      }
    }
  }

  // Tells the sync about every clock the site has completed: the policy's
  // rounds, plus an offset when the site jumped forward (it resumed from a
  // checkpoint, or it was more than DS clocks behind the reachable peers
  // after a freeze or a partition: SyncEngine::ClockFloor). One clock at a
  // time, a jump in one step.
  void AdvanceClock() {
    int64_t clock = static_cast<int64_t>(policy_->clock()) + clock_offset_;
    if (sync_ && training_ && !finished_) {
      const int64_t floor = sync_->ClockFloor();
      if (floor > clock) {
        MLOG(INFO) << "clock " << clock << " -> " << floor
                   << ": more than DS clocks behind the reachable peers";
        clock_offset_ += floor - clock;
        clock = floor;
      }
    }
    if (clock <= last_clock_) return;
    if (!sync_) {
      last_clock_ = clock;
      return;
    }
    if (clock - last_clock_ > 2) {
      last_clock_ = clock;
      sync_->OnLocalClock(last_clock_);
      return;
    }
    while (last_clock_ < clock) {
      ++last_clock_;
      sync_->OnLocalClock(last_clock_);
    }
  }

  // Whether a worker may get the whole model now (the sync's DS bound,
  // averaging round and selective barrier).
  bool ReadsAllowed() const {
    return !sync_ || finished_ || sync_->ReadsAllowed(last_clock_);
  }

  // The same for what `worker`'s pending request reads.
  bool ReadsAllowed(uint32_t worker) const {
    if (!sync_ || finished_) return true;
    std::vector<KeyRange> ranges;
    for (const pb::TensorSlice& slice : workers_[worker].read_ranges) {
      const TensorInfo* tensor = model_->layout().Find(slice.tensor());
      const uint64_t begin = tensor->offset + slice.offset();
      ranges.push_back(KeyRange{begin, begin + slice.length()});
    }
    const auto& rows = workers_[worker].read_rows;
    for (size_t t = 0; t < rows.size(); ++t) {
      const TensorInfo& tensor = model_->layout().tensors()[t];
      if (!rows[t]) {
        ranges.push_back(KeyRange{tensor.offset, tensor.offset + tensor.size});
        continue;
      }
      const uint64_t length = RowLength(tensor);
      for (uint32_t row : *rows[t]) {
        const uint64_t begin = tensor.offset + row * length;
        ranges.push_back(KeyRange{begin, begin + length});
      }
    }
    return sync_->ReadsAllowed(last_clock_, ranges);
  }

  // Answers a released worker, or holds the answer until the sync allows.
  void Answer(uint32_t worker) {
    if (ReadsAllowed(worker)) return SendReply(worker);
    if (!workers_[worker].held) {
      workers_[worker].held = true;
      workers_[worker].held_since_s = Now();
    }
  }

  // Answers every held worker the sync now allows; says why the others
  // wait once they have waited long (NoteHeldWorkers).
  void ReleaseHeld() {
    const double now = Now();
    int still_held = 0;
    double longest_s = 0;
    for (uint32_t i = 0; i < workers_.size(); ++i) {
      WorkerSlot& slot = workers_[i];
      if (!slot.held) continue;
      if (!ReadsAllowed(i)) {
        ++still_held;
        longest_s = std::max(longest_s, now - slot.held_since_s);
        continue;
      }
      slot.held = false;
      sync_->NoteHeld(now - slot.held_since_s);
      if (slot.awaiting_reply() && slot.state == SlotState::kLive) {
        SendReply(i);
      }
    }
    NoteHeldWorkers(still_held, longest_s, now);
  }

  // ---- replies -------------------------------------------------------------
  // A reply carrying the whole model: one payload frame per tensor, and the
  // store reads that fill the frames in place.
  struct ModelReply {
    pb::Header header;
    std::vector<zmq::message_t> frames;
    std::vector<ReadSegment> reads;
  };

  // `ranges`: the slices wanted (validated); empty: every tensor whole.
  // `rows` (a commit's validated reads, one entry per tensor): CODEC_ROWS
  // slices of those rows, other tensors whole.
  ModelReply NewModelReply(
      pb::MessageType type, std::span<const pb::TensorSlice> ranges = {},
      const std::vector<std::optional<std::vector<uint32_t>>>& rows = {}) {
    ModelReply reply;
    reply.header = MakeHeader(type, self_, ++sequence_);
    reply.header.set_clock(last_clock_);
    if (!rows.empty()) return RowsReply(std::move(reply), rows);
    if (ranges.empty()) {
      AddLayoutSlices(model_->layout(), &reply.header);
    } else {
      for (const pb::TensorSlice& range : ranges) {
        pb::TensorSlice* slice = reply.header.add_slices();
        slice->set_tensor(range.tensor());
        slice->set_offset(range.offset());
        slice->set_length(range.length());
        slice->set_payload_bytes(range.length() * sizeof(float));
      }
    }
    for (const pb::TensorSlice& slice : reply.header.slices()) {
      reply.frames.push_back(MakeFloatFrame(slice.length()));
    }
    // Only now point into the frames: a small ZeroMQ message keeps its
    // bytes inside the message object, which moved while the vector grew.
    for (int i = 0; i < reply.header.slices_size(); ++i) {
      const pb::TensorSlice& slice = reply.header.slices(i);
      const TensorInfo* tensor = model_->layout().Find(slice.tensor());
      reply.reads.push_back(ReadSegment{
          tensor->offset + slice.offset(),
          std::span<float>(static_cast<float*>(reply.frames[i].data()),
                           slice.length())});
    }
    return reply;
  }

  // The body of NewModelReply for row reads.
  ModelReply RowsReply(
      ModelReply reply,
      const std::vector<std::optional<std::vector<uint32_t>>>& rows) {
    const std::vector<TensorInfo>& tensors = model_->layout().tensors();
    for (size_t t = 0; t < tensors.size(); ++t) {
      if (rows[t]) {
        reply.frames.emplace_back(
            RowsPayloadBytes(rows[t]->size(), RowLength(tensors[t])));
      } else {
        reply.frames.push_back(MakeFloatFrame(tensors[t].size));
      }
    }
    // The frames are in place: now point into them (see NewModelReply).
    for (size_t t = 0; t < tensors.size(); ++t) {
      const TensorInfo& tensor = tensors[t];
      zmq::message_t& frame = reply.frames[t];
      if (!rows[t]) {
        AddTensorSlice(tensor, &reply.header);
        reply.reads.push_back(ReadSegment{
            tensor.offset,
            std::span<float>(static_cast<float*>(frame.data()), tensor.size)});
        continue;
      }
      float* values =
          AddRowsSlice(tensor, *rows[t],
                       std::span<std::byte>(
                           static_cast<std::byte*>(frame.data()), frame.size()),
                       &reply.header);
      const uint64_t length = RowLength(tensor);
      for (uint32_t row : *rows[t]) {
        reply.reads.push_back(ReadSegment{tensor.offset + row * length,
                                          std::span<float>(values, length)});
        values += length;
      }
    }
    return reply;
  }

  // Answers `worker`'s pending request as its kind says: a HELLO with
  // WELCOME, a COMMIT or PULL with MODEL.
  void SendReply(uint32_t worker) {
    if (workers_[worker].pending == Pending::kHello) return SendWelcome(worker);
    SendModel(worker);
  }

  // The model, the plan, and what the site applied of the worker's
  // process. After the end of the job it says stop (the worker may still
  // send an unapplied commit).
  void SendWelcome(uint32_t worker) {
    ModelReply reply = NewModelReply(pb::WELCOME);
    pb::Welcome* welcome = reply.header.mutable_welcome();
    LayoutToSpecs(model_->layout(), welcome->mutable_layout());
    welcome->set_model_version(store_.version());
    store_.Read(reply.reads);
    *welcome->mutable_plan() = policy_->PlanFor(worker);
    welcome->set_site_workers(workers_.size());
    welcome->set_last_commit_id(workers_[worker].last_commit_id);
    if (finished_) welcome->set_stop(true);
    Deliver(worker, reply.header, std::move(reply.frames));
  }

  void SendModel(uint32_t worker) {
    if (finished_) {
      pb::Header header = MakeHeader(pb::MODEL, self_, ++sequence_);
      header.set_clock(last_clock_);
      pb::Model* model = header.mutable_model();
      model->set_version(store_.version());
      model->set_stop(true);
      model->set_stop_reason(stop_reason_);
      Deliver(worker, header, {});
      return;
    }
    ModelReply reply = NewModelReply(pb::MODEL, workers_[worker].read_ranges,
                                     workers_[worker].read_rows);
    const uint64_t version = store_.version();  // only this thread applies
    store_.Read(reply.reads);
    SendModelReply(worker, version, std::move(reply));
  }

  // Completes and sends a MODEL reply whose frames hold the model at
  // `version`.
  void SendModelReply(uint32_t worker, uint64_t version, ModelReply reply) {
    pb::Model* model = reply.header.mutable_model();
    model->set_version(version);
    *model->mutable_plan() = policy_->PlanFor(worker);
    Deliver(worker, reply.header, std::move(reply.frames));
  }

  void Deliver(uint32_t worker, const pb::Header& header,
               std::vector<zmq::message_t> frames) {
    workers_.NoteAnswered(worker, Now());
    const WorkerSlot& slot = workers_[worker];
    const Status status =
        SendMessage(socket_, header, std::move(frames), slot.routing_id);
    if (status.ok()) return;
    if (status.code() == StatusCode::kResourceExhausted) {
      // The worker does not read: its connection's queue is full. The
      // reply is dropped and, once the event loop is back at its top, the
      // worker declared dead; it must join again (its applied commits
      // stay applied: WELCOME.last_commit_id tells it which).
      not_reading_.push_back({worker, slot.routing_id});
      return;
    }
    // The worker's connection is gone; it will rejoin, and learns from
    // WELCOME.last_commit_id what was applied.
    MLOG(WARNING) << "cannot reply to worker " << slot.Name() << ": " << status;
  }

  // Declares dead the workers whose replies did not fit their queues (see
  // Deliver), unless they joined again meanwhile.
  void DropWorkersNotReading() {
    std::vector<std::pair<uint32_t, std::string>> not_reading;
    not_reading.swap(not_reading_);
    for (const auto& [worker, routing_id] : not_reading) {
      const WorkerSlot& slot = workers_[worker];
      if (slot.state != SlotState::kLive || slot.routing_id != routing_id) {
        continue;
      }
      DeclareDead(workers_.DeclareDead(worker, Now()),
                  "does not read its replies (" +
                      std::to_string(bounds_.send_queue) +
                      " wait for it: server.limits.send_queue); its last "
                      "reply is dropped");
    }
  }

  void SendStatus(const Envelope& request) {
    pb::Header header = MakeHeader(pb::STATUS_REPLY, self_, ++sequence_);
    header.set_clock(last_clock_);
    pb::SiteStatus* status = header.mutable_status();
    status->set_site(site_config_.name());
    status->set_elapsed_s(
        training_ ? (finished_ ? training_s_.load() : Elapsed()) : 0);
    status->set_model_version(store_.version());
    status->set_commits(commits_.load());
    status->set_commits_per_s(CommitRate());
    status->set_workers_joined(workers_.JoinedCount());
    status->set_workers_expected(workers_.size());
    status->set_workers_dead(workers_.Count(SlotState::kDead));
    status->set_finished(finished_);
    status->set_rejected(rejected_);
    if (sync_) {
      status->set_theta(sync_->theta());
      status->set_wan_bytes_sent(sync_->bytes_sent());
      status->set_slowest_peer_clock(sync_->slowest_peer_clock());
      status->set_peers_unreachable(sync_->unreachable_peers());
    }
    if (std::optional<pb::EvalPoint> last = evaluator_->Last()) {
      *status->mutable_last_eval() = *last;
    }
    if (Status sent = SendMessage(socket_, header, {}, request.routing_id);
        !sent.ok() && sent.code() != StatusCode::kResourceExhausted) {
      // (A client that does not read its answers just loses them.)
      MLOG(WARNING) << "cannot answer a status request: " << sent;
    }
  }

  // Says, at growing intervals, what the site is still waiting for: its
  // workers before training, peers that have not introduced themselves
  // during it (their updates are queued meanwhile).
  void NoteWaiting() {
    // Called on every turn of the event loop: one comparison until a line
    // is due, nothing at all once every peer has been heard from (a peer
    // that said MIRROR_HELLO stays heard).
    if (all_peers_heard_ || finished_ || !waiting_notice_.Due(Now())) return;
    if (!training_) {
      if (workers_.LiveCount() < workers_.size()) {
        MLOG(INFO) << "waiting for workers: " << workers_.LiveCount() << " of "
                   << workers_.size() << " joined (listening on " << endpoint_
                   << ")";
      }
      return;
    }
    const std::vector<std::string> silent =
        sync_ ? sync_->silent_peers() : std::vector<std::string>();
    if (silent.empty()) {
      all_peers_heard_ = true;
      return;
    }
    std::string names;
    for (const std::string& peer : silent) {
      names += (names.empty() ? "" : ", ") + peer;
    }
    MLOG(INFO) << "waiting for peer sites " << names
               << ": not heard from yet; updates for them are queued";
  }

  // Says, at growing intervals from kHeldNoticeS on, why `held` workers
  // are held, the longest for `longest_s` (the sync's DS bound, round or
  // barrier: its clocks and each peer's channel), so a stalled job
  // explains itself in the log.
  void NoteHeldWorkers(int held, double longest_s, double now) {
    if (finished_ || longest_s < kHeldNoticeS) {
      held_notice_.Reset();
      return;
    }
    if (!held_notice_.Due(now)) return;
    MLOG(WARNING) << held << " worker(s) held by the sync for up to "
                  << longest_s << " s: " << sync_->DescribeWait(last_clock_);
  }

  // Copies the counters into the metrics registry (which the metrics
  // server's thread renders), at most every kMetricsPeriodS unless `force`.
  void PublishMetrics(bool force = false) {
    if (!metrics_server_) return;
    const double now = Now();
    if (!force && now < next_metrics_s_) return;
    next_metrics_s_ = now + kMetricsPeriodS;
    if (now - staleness_window_start_s_ >= kRateWindowS) {
      staleness_.Roll();
      staleness_window_start_s_ = now;
    }
    SiteMetricsSnapshot s;
    s.training = training_;
    s.finished = finished_;
    s.training_s = training_ ? (finished_ ? training_s_.load() : Elapsed()) : 0;
    s.workers_joined = workers_.JoinedCount();
    s.workers_expected = workers_.size();
    s.workers_dead = workers_.Count(SlotState::kDead);
    s.duplicate_commits = workers_.duplicate_commits();
    s.commits = commits_.load();
    s.commits_per_s = CommitRate();
    s.pulls = pulls_;
    s.rejected = rejected_;
    s.model_version = store_.version();
    s.clock = last_clock_;
    if (std::optional<pb::EvalPoint> last = evaluator_->Last()) {
      s.has_eval = true;
      s.accuracy = last->accuracy();
      s.loss = last->loss();
      s.eval_t_s = last->t_s();
    }
    for (const WorkerSlot& slot : workers_.slots()) {
      s.waiting_workers +=
          slot.awaiting_reply() && slot.state == SlotState::kLive;
      s.held_replies += slot.held;
      const pb::WorkerStats stats = WorkerTable::TotalStats(slot);
      s.workers.push_back(
          {slot.Name(), stats.steps(), stats.commits(), stats.blocked_s()});
    }
    s.barrier_commits = aggregate_.count();
    s.staleness_mean = staleness_.mean();
    s.staleness_max = staleness_.max();
    s.sync = sync_.get();
    site_metrics_.Publish(s);
  }

  void SampleRate() {
    const double now = Now();
    if (!rate_samples_.empty() && now - rate_samples_.back().first < 0.5) {
      return;
    }
    rate_samples_.emplace_back(now, commits_.load());
    while (rate_samples_.size() > 2 &&
           now - rate_samples_.front().first > kRateWindowS) {
      rate_samples_.pop_front();
    }
  }

  double CommitRate() const {
    if (rate_samples_.size() < 2) return 0;
    const auto& [t0, c0] = rate_samples_.front();
    const double dt = Now() - t0;
    return dt > 0 ? static_cast<double>(commits_ - c0) / dt : 0;
  }

  // Event thread: hands finished loss evaluations to the policy, and the
  // scores of travelled models (SkewScout) back to their sites.
  void DeliverLossEvaluations() {
    for (const auto& [loss, taken_at] : evaluator_->TakeLossResults()) {
      ++loss_evaluations_;
      policy_->OnLossEvaluation(loss, taken_at);
    }
    if (!sync_) return;
    for (const TravelScore& score : evaluator_->TakeTravelScores()) {
      sync_->OnTravelScored(score.peer, score.travel_id, score.clock,
                            score.scores);
    }
    PublishSyncKnobs();
  }

  // θ and SkewScout's knob for the evaluator's timeline.
  void PublishSyncKnobs() {
    theta_.store(sync_->theta(), std::memory_order_relaxed);
    skew_knob_.store(sync_->skew_knob().value_or(kNoSkewKnob),
                     std::memory_order_relaxed);
  }

  // ---- durability (checkpoints, site_checkpoint.h) -------------------------
  // Identifies this job, site and model in checkpoint files.
  std::string Fingerprint() const {
    const std::string layout = model_->layout().DebugString();
    const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(layout.data()),
                            static_cast<uInt>(layout.size()));
    char digest[16];
    std::snprintf(digest, sizeof(digest), "%08lx", crc);
    return CheckpointFingerprint(job_.name(), site_config_.name(), job_.seed(),
                                 digest);
  }

  // Where this site keeps its checkpoints: --checkpoint-dir, else
  // fault.checkpoint_dir/<site>, else <out>/checkpoints/<site>; empty: none.
  std::string CheckpointDir() const {
    if (!options_.checkpoint_dir.empty()) return options_.checkpoint_dir;
    const std::string& site = site_config_.name();
    if (job_.fault().has_checkpoint_dir()) {
      return job_.fault().checkpoint_dir() + "/" + site;
    }
    if (!options_.out_dir.empty()) {
      return options_.out_dir + "/checkpoints/" + site;
    }
    return "";
  }

  // Opens the checkpoint directory and, with --resume, continues from its
  // newest checkpoint.
  Status OpenCheckpoints() {
    const pb::FaultConfig& fault = job_.fault();
    const std::string dir = CheckpointDir();
    if (fault.checkpoint_period_s() <= 0 || dir.empty()) {
      if (options_.resume) {
        MLOG(WARNING) << "--resume, but this site keeps no checkpoints ("
                      << (dir.empty() ? "no --out or checkpoint_dir"
                                      : "fault.checkpoint_period_s is 0")
                      << "): starting from the initial model";
      }
      return Status::Ok();
    }
    SiteCheckpointOptions options;
    options.dir = dir;
    options.fingerprint = Fingerprint();
    options.period_s = fault.checkpoint_period_s();
    options.fsync_log = fault.fsync_log();
    Result<std::unique_ptr<SiteCheckpointer>> opened =
        SiteCheckpointer::Open(std::move(options), options_.resume);
    if (!opened.ok()) {
      return opened.status().WithContext("site '" + site_config_.name() + "'");
    }
    checkpointer_ = std::move(*opened);
    if (checkpointer_->recovered()) {
      MERIDIAN_RETURN_IF_ERROR(
          Recover(*checkpointer_->recovered())
              .WithContext("resuming site '" + site_config_.name() + "'"));
      checkpointer_->ForgetRecovered();
    } else if (options_.resume) {
      MLOG(INFO) << "--resume: no checkpoint in " << dir
                 << " yet: starting from the initial model";
    }
    if (sync_) {
      sync_->EnableCheckpoints();
      sync_->SetOutgoingLog([this](const pb::LoggedMessage& message) {
        return checkpointer_->Log(message);
      });
    }
    MLOG(INFO) << "checkpoints every "
               << FormatSeconds(fault.checkpoint_period_s(), 1) << " s in "
               << dir << (fault.fsync_log() ? " (log fsynced per update)" : "");
    return Status::Ok();
  }

  // Continues from a checkpoint: the store's arrays, the sync's channels
  // (and the updates it sent after the checkpoint, taken back), the worker
  // table, counters, timeline and events.
  Status Recover(const SiteCheckpointer::Recovered& recovered) {
    const pb::SiteCheckpoint& meta = recovered.meta;
    MERIDIAN_RETURN_IF_ERROR(RestoreStoreArrays(
        recovered.checkpoint, meta.model_version(), &store_, sync_.get()));
    if (meta.server_momentum() > 0) store_.SetMomentum(meta.server_momentum());
    if (meta.aggregate_commits() > 0) {
      const NamedArray* aggregate = recovered.checkpoint.Find("aggregate");
      if (aggregate == nullptr) {
        return DataLossError("the checkpoint has " +
                             std::to_string(meta.aggregate_commits()) +
                             " commits in an open barrier but no aggregate");
      }
      MERIDIAN_RETURN_IF_ERROR(
          aggregate_.Restore(aggregate->values, meta.aggregate_commits()));
    }
    int64_t clock = meta.clock();
    uint64_t retracted = 0;
    if (sync_) {
      MERIDIAN_ASSIGN_OR_RETURN(
          retracted, sync_->RestoreState(meta.sync(), recovered.logged,
                                         &recovered.checkpoint));
      clock = std::max<int64_t>(clock, sync_->Summary().clock());
    }
    last_clock_ = clock;
    clock_offset_ = clock;  // the policy starts again at 0
    std::vector<CommitRecord> records;
    for (const pb::WorkerSlotCheckpoint& slot : meta.workers()) {
      records.push_back({slot.incarnation(), slot.last_commit_id(),
                         slot.commits_applied(), slot.incarnations(),
                         slot.stats(), slot.retired_stats()});
    }
    workers_.RestoreCommitRecords(records);
    restored_incarnation_.assign(workers_.size(), 0);
    for (uint32_t i = 0; i < workers_.size() && i < records.size(); ++i) {
      restored_incarnation_[i] = records[i].incarnation;
    }
    commits_ = meta.commits();
    rejected_ = meta.rejected();
    pulls_ = meta.pulls();
    trained_before_s_ = meta.training_s();
    evaluator_->Restore({meta.timeline().begin(), meta.timeline().end()},
                        meta.time_to_target_s());
    events_.Restore(meta.events());
    recovery_ = meta.recovery();
    recovery_.set_restarts(recovery_.restarts() + 1);
    recovery_.set_checkpoint_t_s(meta.training_s());
    recovery_.set_lost_clock_from(meta.clock());
    recovery_.set_lost_clock_to(clock);
    recovery_.set_retracted_updates(recovery_.retracted_updates() +
                                    static_cast<uint32_t>(retracted));
    if (meta.finished()) {
      resumed_finished_ = true;
      stop_reason_ = meta.stop_reason();
      training_s_ = meta.training_s();
    }
    std::string detail =
        "from " + recovered.path + " (" + FormatSeconds(meta.training_s(), 1) +
        " s of training, clock " + std::to_string(meta.clock()) + "); " +
        std::to_string(recovered.logged.size()) +
        " messages sent after it go out again; " + std::to_string(retracted) +
        " updates of the lost window taken back from the peers; clock now " +
        std::to_string(clock);
    for (const std::string& note : recovered.notes) detail += "; " + note;
    MLOG(WARNING) << "resumed " << detail;
    RecordEvent(pb::SITE_RECOVERED, "site '" + site_config_.name() + "'", 0,
                detail);
    return Status::Ok();
  }

  // After a restart from a checkpoint, a worker's first commit (of the
  // incarnation the checkpoint knew) shows how many of its commits this
  // site answered after the checkpoint and lost with the crash: commit ids
  // run 1, 2, 3 ... per worker process.
  void NoteLostCommits(uint32_t worker, uint64_t commit_id) {
    if (worker >= restored_incarnation_.size() ||
        restored_incarnation_[worker] == 0) {
      return;
    }
    const uint64_t incarnation = restored_incarnation_[worker];
    restored_incarnation_[worker] = 0;
    const WorkerSlot& slot = workers_[worker];
    if (slot.incarnation != incarnation ||
        commit_id <= slot.last_commit_id + 1) {
      return;
    }
    const uint64_t lost = commit_id - slot.last_commit_id - 1;
    recovery_.set_lost_commits(recovery_.lost_commits() +
                               static_cast<uint32_t>(lost));
    MLOG(WARNING) << "worker " << slot.Name() << ": " << lost
                  << " commits after the checkpoint were lost with the crash "
                  << "(ids " << slot.last_commit_id + 1 << " to "
                  << commit_id - 1 << ")";
  }

  // Every turn of the event loop: acknowledges durable checkpoints to the
  // peers, and takes a checkpoint when one is due.
  void MaybeCheckpoint() {
    if (!checkpointer_) return;
    if (std::optional<pb::SyncCheckpoint> durable =
            checkpointer_->TakeDurable();
        durable && sync_) {
      sync_->NoteDurable(*durable);
    }
    if (!training_ || finished_) return;
    if (!checkpointer_->Due(Now(), sync_ && sync_->CheckpointWanted())) return;
    TakeCheckpoint(/*finished=*/false);
  }

  // The site's state now (on the event loop: a consistent snapshot), handed
  // to the background writer.
  void TakeCheckpoint(bool finished) {
    pb::SiteCheckpoint meta;
    meta.set_site(site_config_.name());
    meta.set_model_version(store_.version());
    meta.set_clock(last_clock_);
    meta.set_training_s(training_ ? (finished_ ? training_s_.load() : Elapsed())
                                  : trained_before_s_);
    meta.set_commits(commits_.load());
    meta.set_rejected(rejected_);
    meta.set_pulls(pulls_);
    meta.set_duplicate_commits(workers_.duplicate_commits());
    meta.set_server_momentum(store_.rule().momentum);
    meta.set_time_to_target_s(evaluator_->time_to_target_s());
    for (const pb::EvalPoint& point : evaluator_->Timeline()) {
      *meta.add_timeline() = point;
    }
    events_.CopyTo(meta.mutable_events());
    *meta.mutable_recovery() = recovery_;
    for (const CommitRecord& record : workers_.CommitRecords()) {
      pb::WorkerSlotCheckpoint* slot = meta.add_workers();
      slot->set_incarnation(record.incarnation);
      slot->set_last_commit_id(record.last_commit_id);
      slot->set_commits_applied(record.commits_applied);
      slot->set_incarnations(record.incarnations);
      *slot->mutable_stats() = record.stats;
      *slot->mutable_retired_stats() = record.retired_stats;
    }
    if (sync_) sync_->SaveState(meta.mutable_sync());
    std::vector<NamedArray> arrays = StoreArrays(store_, sync_.get());
    if (aggregate_.count() > 0) {
      meta.set_aggregate_commits(aggregate_.count());
      arrays.push_back(
          {"aggregate", {aggregate_.sum().begin(), aggregate_.sum().end()}});
    }
    meta.set_finished(finished);
    if (finished) meta.set_stop_reason(stop_reason_);
    checkpointer_->Submit(std::move(meta), std::move(arrays), Now());
  }

  // After the final flush: the job's end is durable too, so a --resume of
  // it reports the end instead of training on.
  void FinalCheckpoint() {
    if (!checkpointer_ || resumed_finished_) return;
    TakeCheckpoint(/*finished=*/true);
    if (Status flushed = checkpointer_->Flush(); !flushed.ok()) {
      MLOG(ERROR) << "cannot write the final checkpoint: " << flushed;
    }
  }

  // ---- configuration (fixed after construction) ----------------------------
  SiteServerOptions options_;
  const pb::JobConfig& job_;
  const int site_index_;
  const pb::SiteConfig& site_config_;
  const pb::Endpoint self_;
  Clock* const clock_;
  const WallClock* const wall_clock_;
  const SiteServerTimeouts timeouts_;

  // ---- the model and the commit path (event loop) --------------------------
  std::unique_ptr<Model> model_;  // layout and initial parameters
  std::unique_ptr<IntraSitePolicy> policy_;
  ParameterStore store_;  // thread-safe reads; written by the event loop
  UpdateAccumulator aggregate_;
  std::vector<std::vector<float>> scratch_;  // realigned payloads
  // The CODEC_ROWS slices of the commit being handled, decoded.
  std::vector<DecodedRows> rows_;
  int64_t last_clock_ = 0;  // the clock the sync was last told about

  // ---- membership (event loop) ---------------------------------------------
  WorkerTable workers_;
  // This server's fault events (the sync engine keeps its own).
  FaultEventLog events_;
  // Per slot, the index of its unresolved WORKER_DEAD event (-1: none).
  std::vector<int> open_dead_event_;
  uint64_t worker_deaths_ = 0;
  bool peers_set_ = false;  // a SET_PEERS was applied

  // ---- sockets (event loop) ------------------------------------------------
  const EndpointBounds bounds_;  // what one worker connection may cost
  // Workers (slot, connection) whose reply did not fit their queue.
  std::vector<std::pair<uint32_t, std::string>> not_reading_;
  zmq::context_t context_;  // the worker socket's (and its ZAP handler's)
  // Null unless the worker endpoint is CURVE; outlives socket_.
  std::unique_ptr<ZapHandler> worker_zap_;
  zmq::socket_t socket_;
  std::string endpoint_;
  uint64_t sequence_ = 0;
  zmq::context_t sync_context_;       // the sync engine's; outlives sync_
  std::unique_ptr<SyncEngine> sync_;  // null for a site that syncs with nobody

  // ---- job state and counters (event loop, unless atomic) ------------------
  bool training_ = false;
  bool finished_ = false;
  WaitNotice waiting_notice_;  // for workers, then for peer sites
  static constexpr double kHeldNoticeS = 5.0;
  WaitNotice held_notice_{1.0, 60.0};
  bool all_peers_heard_ = false;
  std::string stop_reason_;
  // Read by the evaluator thread too, hence atomic.
  std::atomic<double> start_s_{0};
  std::atomic<double> training_s_{0};
  std::atomic<uint64_t> commits_{0};
  // The sync's threshold, for the evaluator's timeline (event loop writes).
  std::atomic<double> theta_{0};
  // SkewScout's knob, likewise; NaN: no SkewScout.
  static constexpr double kNoSkewKnob =
      std::numeric_limits<double>::quiet_NaN();
  std::atomic<double> skew_knob_{kNoSkewKnob};
  uint64_t rejected_ = 0;
  uint64_t pulls_ = 0;
  uint64_t loss_evaluations_ = 0;
  std::deque<std::pair<double, uint64_t>> rate_samples_;
  StalenessWindow staleness_;
  double staleness_window_start_s_ = 0;
  pb::SiteSummary summary_;

  // ---- durability (event loop; the writer's thread inside checkpointer_) --
  std::unique_ptr<SiteCheckpointer> checkpointer_;  // null: no checkpoints
  double trained_before_s_ = 0;  // training time of the run resumed from
  int64_t clock_offset_ = 0;     // site clock = policy clock + this
  // Per slot, the incarnation a checkpoint restored, until its first
  // commit (NoteLostCommits); 0: none.
  std::vector<uint64_t> restored_incarnation_;
  pb::SiteRecovery recovery_;
  bool resumed_finished_ = false;  // resumed a job that had ended here

  // ---- evaluator thread (owns its state; see evaluator.h) ------------------
  std::unique_ptr<Evaluator> evaluator_;

  // ---- metrics: the event loop publishes into the registry, the server's
  // threads render it (declared in this order so the server stops first).
  MetricsRegistry metrics_registry_;
  SiteMetrics site_metrics_{&metrics_registry_, site_config_.name()};
  std::unique_ptr<MetricsServer> metrics_server_;
  double next_metrics_s_ = 0;
};

EndpointBounds EndpointBounds::FromConfig(const pb::EndpointLimits& limits,
                                          const ModelLayout& layout) {
  constexpr uint32_t kDefaultSendQueue = 4;
  constexpr uint32_t kDefaultReceiveQueue = 8;
  const uint64_t largest_tensor_bytes =
      layout.LargestTensorSize() * sizeof(float);
  EndpointBounds bounds;
  bounds.max_frame_bytes =
      limits.max_frame_bytes() > 0
          ? limits.max_frame_bytes()
          : std::max<uint64_t>(largest_tensor_bytes, kMaxHeaderBytes);
  bounds.max_reply_floats = limits.max_reply_floats() > 0
                                ? limits.max_reply_floats()
                                : layout.num_elements();
  bounds.send_queue =
      limits.send_queue() > 0 ? limits.send_queue() : kDefaultSendQueue;
  bounds.receive_queue = limits.receive_queue() > 0 ? limits.receive_queue()
                                                    : kDefaultReceiveQueue;
  return bounds;
}

uint64_t EndpointBounds::PerConnectionBytes(const ModelLayout& layout) const {
  const uint64_t frames = layout.tensors().size() + 1;
  const uint64_t largest_message =
      std::min(frames * max_frame_bytes,
               kMaxHeaderBytes + layout.num_elements() * sizeof(float));
  return static_cast<uint64_t>(send_queue + receive_queue) *
         std::max(largest_message, max_frame_bytes);
}

Result<std::unique_ptr<SiteServer>> SiteServer::Create(
    SiteServerOptions options) {
  MERIDIAN_ASSIGN_OR_RETURN(const int site_index,
                            FindSite(options.job, options.site));
  if (!HasServer(options.job.site(site_index))) {
    return FailedPreconditionError("site '" + options.site +
                                   "' runs no site server: its workers use "
                                   "site '" +
                                   options.job.site(site_index).server_site() +
                                   "''s");
  }
  SetLogRole(options.site + "/server");
  const pb::JobConfig& job = options.job;
  // The training images are read for their normalisation statistics, and
  // for the fixed minibatches of the policy's global loss evaluations.
  MERIDIAN_ASSIGN_OR_RETURN(RawData raw, LoadRawData(job.data(), true, true));
  Dataset test_set = MakeTestDataset(raw, job.data().normalization());
  Dataset loss_set;
  const pb::PolicyKind kind = job.policy().kind();
  if (kind == pb::ADSP || kind == pb::ADACOMM) {
    const std::vector<uint32_t> sample =
        SeededSample(raw.train_labels.size(),
                     static_cast<uint64_t>(job.policy().loss_eval_batches()) *
                         job.optimizer().batch_size(),
                     job.seed());
    loss_set = MakeTrainDataset(raw, sample, job.data().normalization());
  }
  Dataset holdout_set;
  if (job.sync().skewscout().enabled()) {
    MERIDIAN_ASSIGN_OR_RETURN(
        const std::vector<uint32_t> share,
        SiteSampleIndices(job, raw.train_labels, site_index));
    const std::vector<uint32_t> positions =
        SeededSample(share.size(), job.sync().skewscout().holdout_samples(),
                     job.seed() ^ static_cast<uint64_t>(site_index + 1));
    std::vector<uint32_t> sample;
    sample.reserve(positions.size());
    for (uint32_t position : positions) sample.push_back(share[position]);
    holdout_set = MakeTrainDataset(raw, sample, job.data().normalization());
  }
  const int input_dim = raw.input_dim();
  MERIDIAN_ASSIGN_OR_RETURN(auto model, MakeJobModel(job, input_dim, 10));
  MERIDIAN_ASSIGN_OR_RETURN(auto eval_model, MakeJobModel(job, input_dim, 10));
  MERIDIAN_ASSIGN_OR_RETURN(auto policy, MakePolicy(job.policy()));
  auto impl = std::make_unique<Impl>(std::move(options), site_index,
                                     std::move(model), std::move(eval_model),
                                     std::move(test_set), std::move(loss_set),
                                     std::move(holdout_set), std::move(policy));
  MERIDIAN_RETURN_IF_ERROR(impl->DescribeTrainingData(raw.train_labels));
  MERIDIAN_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<SiteServer>(new SiteServer(std::move(impl)));
}

SiteServer::SiteServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SiteServer::~SiteServer() = default;

const std::string& SiteServer::endpoint() const { return impl_->endpoint(); }
std::vector<float> SiteServer::Snapshot() const { return impl_->Snapshot(); }
std::string SiteServer::mirror_endpoint() const {
  return impl_->mirror_endpoint();
}
std::string SiteServer::metrics_address() const {
  return impl_->metrics_address();
}
Status SiteServer::Run() { return impl_->Run(); }
const pb::SiteSummary& SiteServer::summary() const { return impl_->summary(); }

}  // namespace meridian
