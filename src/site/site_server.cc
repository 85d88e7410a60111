// The site server: its composition root and the phases of its job (workers
// join, training, workers leave and the final evaluation). Each concern is
// a part with its own file under src/site/:
//   event_loop.h       a turn of the event loop; dispatch; control requests
//   worker_endpoint.h  the worker socket: bind, receive, refuse, send
//   membership.h       HELLO, BYE, HEARTBEAT, liveness, fault events
//   commit_path.h      COMMIT and PULL: sender, parse, policy, apply
//   policy_driver.h    the intra-site policy's events and decisions
//   replies.h          WELCOME and MODEL, held while the sync says wait
//   site_clock.h       the site's clock as the inter-site sync sees it
//   site_durability.h  checkpoints: what, when, and resuming from one
//   site_monitor.h     the status reply, the metrics, what the site awaits
//   site_summary.h     the summary and the final model, at the end
//   evaluation.h       the curve, the target and the policy's loss
//                      evaluations: builtin_evaluator.h (a thread, built-in
//                      models) or remote_evaluator.h (an evaluator process)
//   site_model.h       the model: layout, initial values, metric
//   worker_table.h     the workers' slots (membership and commit ids)
// and the state they share is site_context.h (fixed) and site_state.h
// (the phase of the job, the counters). Impl owns every part and builds
// them in the order they depend on each other.
//
// Threads, and the state each may touch
// -------------------------------------
// - The event loop (the thread that calls Run()): every part above except
//   the evaluator's thread, the SyncEngine (every call), the summary. It
//   alone applies to the ParameterStore (writes go through no other
//   thread).
// - The evaluator thread (BuiltinEvaluator, built-in models only): its own
//   model copy and data sets; reads the store through
//   ParameterStore::Snapshot (shard locks), the commit count and the
//   training time (atomics of site_state.h) and the sync knobs (atomics
//   here); shares its timeline and loss results under its mutex. An
//   external model's RemoteEvaluator runs on the event loop.
// - The metrics HTTP server's threads (inside SiteMonitor): render the
//   MetricsRegistry (atomic cells) and never touch Impl; the event loop
//   publishes into the registry.
// - The sync engine's ZAP handler thread (under CURVE, inside SyncEngine):
//   answers libzmq's authentication requests from the job's key list;
//   never touches Impl or the engine's channels.
// - The worker socket's ZAP handler thread (inside WorkerEndpoint, only
//   when the site lists worker_curve_public_key): admits only the
//   workers' key; never touches Impl. A ZAP handler serves one ZeroMQ
//   context, so the worker socket lives in the endpoint's context and the
//   sync engine in sync_context_, each with its own I/O thread and handler.
// - The checkpoint writer (inside SiteDurability's SiteCheckpointer):
//   writes the snapshot the event loop hands it (a copy), never reads Impl.
// - Any thread: SiteServer::Snapshot() (the store's shard locks), and the
//   endpoints (fixed once Create returned).
#include "meridian/site/site_server.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>
#include <zmq.hpp>

#include "meridian/config/config.h"
#include "meridian/core/format.h"
#include "meridian/core/log.h"
#include "meridian/net/message.h"
#include "meridian/net/security.h"
#include "meridian/net/transport.h"
#include "meridian/ps/param_store.h"
#include "meridian/sched/policy.h"
#include "meridian/sync/sync.h"
#include "meridian/train/dataset.h"
#include "meridian/train/model.h"
#include "site/commit_path.h"
#include "site/builtin_evaluator.h"
#include "site/remote_evaluator.h"
#include "site/event_loop.h"
#include "site/membership.h"
#include "site/policy_driver.h"
#include "site/replies.h"
#include "site/site_clock.h"
#include "site/site_context.h"
#include "site/site_durability.h"
#include "site/site_model.h"
#include "site/site_monitor.h"
#include "site/site_state.h"
#include "site/site_summary.h"
#include "site/worker_endpoint.h"
#include "site/worker_table.h"
#include "sync/sync_engine.h"

namespace meridian {
namespace {

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

pb::Endpoint MakeSelf(const std::string& site) {
  pb::Endpoint self;
  self.set_site(site);
  self.set_role(pb::ROLE_SITE_SERVER);
  self.set_id(0);
  return self;
}

// Slots in config order: this site's workers, then those of the sites
// whose server_site names this one. Policies see slot numbers.
std::vector<WorkerSlot> MakeSlots(const pb::JobConfig& job, int site_index) {
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

SiteContext MakeContext(const SiteServerOptions& options, int site_index,
                        const ModelLayout& layout) {
  const pb::JobConfig& job = options.job;
  const pb::SiteConfig& config = job.site(site_index);
  return SiteContext{
      .job = job,
      .site_index = site_index,
      .config = config,
      .self = MakeSelf(config.name()),
      .clock = options.clock != nullptr ? options.clock : SystemClock(),
      .wall_clock = options.wall_clock != nullptr ? options.wall_clock
                                                  : SystemWallClock(),
      .timeouts = options.timeouts.value_or(SiteServerTimeouts::FromJob(job)),
      .layout = layout,
      .bounds = EndpointBounds::FromConfig(job.server().limits(), layout),
  };
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
  Impl(SiteServerOptions options, int site_index, SiteModel model,
       std::unique_ptr<IntraSitePolicy> policy);
  ~Impl() { evaluator_->Stop(); }

  // Initial model, the worker socket, the sync engine, the parts, the
  // checkpoints (resuming from one) and the metrics endpoint.
  Status Init();
  // The summary's label_histogram and partition (SiteSummaryWriter).
  Status DescribeTrainingData(std::span<const uint8_t> train_labels) {
    return summary_.DescribeTrainingData(train_labels);
  }
  Status Run();

  const std::string& endpoint() const { return endpoint_.endpoint(); }
  std::vector<float> Snapshot() const {
    std::vector<float> model(store_.num_elements());
    store_.Snapshot(model);
    return model;
  }
  std::string mirror_endpoint() const {
    return sync_ ? sync_->mirror_endpoint() : std::string();
  }
  std::string metrics_address() const {
    return monitor_ ? monitor_->address() : std::string();
  }
  const pb::SiteSummary& summary() const { return summary_.summary(); }

 private:
  // How the model is evaluated (a built-in model by a thread of this
  // server, an external one by the site's evaluator process), and what a
  // point records of the server (the training time, the commit count, the
  // sync knobs).
  std::unique_ptr<Evaluation> MakeEvaluation();
  // The sync engine, for a site that exchanges updates with other sites.
  Status CreateSync();
  // Every part, in the order they depend on each other.
  void BuildParts();

  // Whether this site exchanges updates with other sites.
  bool SyncsWithPeers() const {
    if (site_.job.sync().kind() == pb::SYNC_NONE) return false;
    return !RoleOf(site_.job, site_.site_index).Peers().empty();
  }
  bool StopRequested() const {
    return options_.stop_requested != nullptr &&
           options_.stop_requested->load(std::memory_order_relaxed);
  }

  // ---- phase 1: workers join -----------------------------------------------
  // Until every worker is live, or the join timeout passed with at least
  // min_workers live (the rest may join late).
  Status AwaitWorkers();
  // Training waits for SET_PEERS (SiteServerOptions::await_peers).
  bool AwaitingPeers() const {
    return options_.await_peers && sync_ != nullptr && !loop_->peers_set();
  }
  void StartTraining();

  // ---- phase 2: training ---------------------------------------------------
  Status Serve();
  void CheckStopConditions();

  // ---- phase 3: let workers leave, final evaluation ------------------------
  // Until every live worker said BYE (dead ones never will), at most
  // drain_s.
  Status Drain();
  // The final evaluation, the summary and the final model, the final
  // checkpoint and metrics.
  void Finish();
  // Resumed a job this site had finished: once told its peers (SET_PEERS
  // under --await-peers), completes a final flush that was incomplete.
  Status CompleteFlush();

  // ---- between turns of the event loop -------------------------------------
  // Hands finished loss evaluations to the policy, and the scores of
  // travelled models (SkewScout) back to their sites.
  void DeliverLossEvaluations();
  // θ and SkewScout's knob for the evaluator's timeline.
  void PublishSyncKnobs();

  // ---- configuration and the model (fixed after construction) --------------
  SiteServerOptions options_;
  SiteModel model_;  // layout, initial values, metric; evaluation's parts
  const SiteContext site_;

  // ---- state the parts share (event loop, unless atomic) -------------------
  std::unique_ptr<IntraSitePolicy> policy_;
  ParameterStore store_;  // thread-safe reads; written by the event loop
  WorkerTable workers_;
  TrainingPhase phase_;
  SiteCounters counters_;
  // The sync's threshold and SkewScout's knob (NaN: no SkewScout), for the
  // evaluator's timeline: the event loop writes, the evaluator reads.
  struct SyncKnobs {
    std::atomic<double> theta{0};
    std::atomic<double> skew_knob{std::numeric_limits<double>::quiet_NaN()};
  } knobs_;
  std::unique_ptr<Evaluation> evaluator_;  // see evaluation.h
  SiteSummaryWriter summary_;

  // ---- sockets: each closes before its ZAP handler, and that before its
  // context (WorkerEndpoint; sync_context_ outlives sync_).
  WorkerEndpoint endpoint_;
  zmq::context_t sync_context_;
  std::unique_ptr<SyncEngine> sync_;  // null for a site that syncs with nobody

  // ---- the parts, built by Init once the sync engine exists ----------------
  std::unique_ptr<SiteClock> clock_;
  std::unique_ptr<Replies> replies_;
  std::unique_ptr<PolicyDriver> driver_;
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<SiteDurability> durability_;
  std::unique_ptr<CommitPath> commits_;
  std::unique_ptr<SiteMonitor> monitor_;  // its server stops first
  std::unique_ptr<SiteEventLoop> loop_;
};

SiteServer::Impl::Impl(SiteServerOptions options, int site_index,
                       SiteModel model,
                       std::unique_ptr<IntraSitePolicy> policy)
    : options_(std::move(options)),
      model_(std::move(model)),
      site_(MakeContext(options_, site_index, model_.layout)),
      policy_(std::move(policy)),
      store_(model_.layout, site_.job.server().num_shards(),
             ApplyRule::FromConfig(site_.job.server(),
                                   ContributingWorkers(site_.job, site_index))),
      workers_(MakeSlots(site_.job, site_index), site_.name(),
               site_.timeouts.worker_timeout_s),
      phase_(site_.clock),
      evaluator_(MakeEvaluation()),
      summary_(site_, options_.out_dir,
               {.phase = &phase_,
                .counters = &counters_,
                .workers = &workers_,
                .store = &store_,
                .policy = policy_.get(),
                .evaluator = evaluator_.get(),
                .metric = model_.metric.name}),
      endpoint_(site_, &counters_) {}

std::unique_ptr<Evaluation> SiteServer::Impl::MakeEvaluation() {
  EvalTimeline::Sources sources;
  sources.training_s = [this] { return phase_.EvalTime(); };
  sources.commits = [this] { return counters_.commits.load(); };
  sources.theta = [this] {
    return knobs_.theta.load(std::memory_order_relaxed);
  };
  sources.skew_knob = [this]() -> std::optional<double> {
    const double knob = knobs_.skew_knob.load(std::memory_order_relaxed);
    if (std::isnan(knob)) return std::nullopt;
    return knob;
  };
  if (model_.external()) {
    // endpoint_ is constructed after this; the evaluator uses it only
    // once the loop runs.
    return std::make_unique<RemoteEvaluator>(site_, &endpoint_, &store_,
                                             model_.metric, std::move(sources));
  }
  EvaluatorOptions eval;
  eval.store = &store_;
  eval.model = std::move(model_.eval_model);
  eval.test_set = std::move(model_.eval_sets.test);
  eval.loss_set = std::move(model_.eval_sets.loss);
  eval.holdout_set = std::move(model_.eval_sets.holdout);
  eval.eval_period_s = site_.job.server().eval_period_s();
  eval.target = JobTarget(site_.job);
  eval.clock = site_.clock;
  eval.sources = std::move(sources);
  return std::make_unique<BuiltinEvaluator>(std::move(eval));
}

Status SiteServer::Impl::Init() {
  MERIDIAN_RETURN_IF_ERROR(store_.Assign(model_.initial));
  model_.initial = {};  // the store has it
  MERIDIAN_RETURN_IF_ERROR(
      endpoint_.Bind(options_.bind, options_.secret_key_file, workers_.size()));
  if (SyncsWithPeers()) MERIDIAN_RETURN_IF_ERROR(CreateSync());
  BuildParts();
  MERIDIAN_RETURN_IF_ERROR(durability_->Open());
  // The first evaluations already see the knob (restored or initial).
  if (sync_) PublishSyncKnobs();
  monitor_->StartServer(options_.metrics_address.empty()
                            ? site_.config.metrics_address()
                            : options_.metrics_address);
  MLOG(INFO) << "site server listening on " << endpoint_.endpoint() << " for "
             << workers_.size() << " workers; model "
             << site_.layout.DebugString() << " ("
             << site_.layout.num_elements() << " parameters, "
             << store_.num_shards() << " shards); policy " << policy_->name()
             << "; evaluated by " << evaluator_->Describe()
             << "; a worker silent for "
             << FormatSeconds(site_.timeouts.worker_timeout_s, 1)
             << " s is declared dead; one connection may hold at most "
             << FormatSeconds(
                    site_.bounds.PerConnectionBytes(site_.layout) / 1048576.0,
                    1)
             << " MiB (server.limits)";
  if (const wan::ConnectionFront* front = endpoint_.front()) {
    auto mib = [](uint64_t bytes) {
      return FormatSeconds(bytes / 1048576.0, 2) + " MiB";
    };
    MLOG(INFO) << "worker endpoint front: at most "
               << front->stats().max_connections << " connections; "
               << mib(site_.bounds.untrusted_connection_bytes)
               << " unread per connection before its worker joined, "
               << mib(site_.bounds.trusted_connection_bytes)
               << " after; at most "
               << mib(front->MemoryBound())
               << " held for peers in all (server.limits)";
  }
  return Status::Ok();
}

Status SiteServer::Impl::CreateSync() {
  SyncEngineOptions sync;
  sync.job = &site_.job;
  sync.site_index = site_.site_index;
  sync.store = &store_;
  sync.context = &sync_context_;
  sync.mirror_bind = options_.mirror_bind;
  sync.secret_key_file = options_.secret_key_file;
  sync.clock = site_.clock;
  sync.wall_clock = site_.wall_clock;
  sync.score_travelled = [this](const std::string& peer, uint64_t travel_id,
                                int64_t clock, std::vector<float> model) {
    TravelScore request;
    request.peer = peer;
    request.travel_id = travel_id;
    request.clock = clock;
    return evaluator_->RequestTravelScore(std::move(request), std::move(model));
  };
  MERIDIAN_ASSIGN_OR_RETURN(sync_, SyncEngine::Create(std::move(sync)));
  return Status::Ok();
}

void SiteServer::Impl::BuildParts() {
  SyncEngine* sync = sync_.get();
  std::unique_ptr<OwnChangeHold> hold;
  const pb::OwnChanges own = site_.job.sync().own_changes();
  if (sync != nullptr && (own == pb::OWN_CHANGES_WITH_PEERS ||
                          own == pb::OWN_CHANGES_AS_SENT)) {
    // At most DS + 1 clocks ahead of the slowest counted peer, and the
    // clock being trained: the queue's bound.
    store_.HoldOwnChanges();
    hold = std::make_unique<OwnChangeHold>(
        &store_, site_.job.sync().max_clock_skew() + 2,
        own == pb::OWN_CHANGES_AS_SENT);
  }
  clock_ = std::make_unique<SiteClock>(sync, std::move(hold));
  replies_ =
      std::make_unique<Replies>(site_, &endpoint_, &workers_, &store_,
                                policy_.get(), sync, &phase_, clock_.get());
  driver_ = std::make_unique<PolicyDriver>(
      site_, policy_.get(), &store_, &workers_, replies_.get(),
      evaluator_.get(), clock_.get(), &phase_);
  membership_ = std::make_unique<Membership>(
      site_, &workers_, &endpoint_, replies_.get(), driver_.get(), &phase_);
  SiteDurability::Parts durable;
  durable.store = &store_;
  durable.sync = sync;
  durable.workers = &workers_;
  durable.events = &membership_->events();
  durable.policy = driver_.get();
  durable.clock = clock_.get();
  durable.phase = &phase_;
  durable.counters = &counters_;
  durable.evaluator = evaluator_.get();
  durability_ = std::make_unique<SiteDurability>(site_, options_, durable);
  commits_ = std::make_unique<CommitPath>(
      site_, &store_, &workers_, membership_.get(), &endpoint_, replies_.get(),
      driver_.get(), durability_.get(), &phase_, &counters_);
  SiteMonitor::Sources sources;
  sources.phase = &phase_;
  sources.counters = &counters_;
  sources.workers = &workers_;
  sources.store = &store_;
  sources.clock = clock_.get();
  sources.policy = driver_.get();
  sources.evaluator = evaluator_.get();
  sources.sync = sync;
  sources.front = endpoint_.front();
  monitor_ = std::make_unique<SiteMonitor>(site_, sources);
  SiteEventLoop::Parts loop;
  loop.endpoint = &endpoint_;
  loop.sync = sync;
  loop.membership = membership_.get();
  loop.commits = commits_.get();
  loop.replies = replies_.get();
  loop.policy = driver_.get();
  loop.durability = durability_.get();
  loop.monitor = monitor_.get();
  loop.phase = &phase_;
  loop.clock = clock_.get();
  // The evaluator process's messages come through the event loop.
  loop.evaluator = dynamic_cast<RemoteEvaluator*>(evaluator_.get());
  loop_ = std::make_unique<SiteEventLoop>(site_, options_.control_token, loop);
}

Status SiteServer::Impl::Run() {
  // The process's role too (SetLogRole), unless several servers share
  // the process (tests): then each thread names its own site.
  ThreadLogRole log_role(site_.name() + "/server");
  if (durability_->resumed_finished()) {
    // Resumed a job this site had finished: complete its final flush if
    // it was not, and report it again.
    MERIDIAN_RETURN_IF_ERROR(CompleteFlush());
    Finish();
    return Status::Ok();
  }
  MERIDIAN_RETURN_IF_ERROR(AwaitWorkers());
  if (phase_.finished()) {  // stopped before training began
    summary_.Write();
    return Status::Ok();
  }
  StartTraining();
  MERIDIAN_RETURN_IF_ERROR(Serve());
  MERIDIAN_RETURN_IF_ERROR(Drain());
  // Every accepted commit is in (and in the replica, held or not); what
  // the peers have not got yet goes out losslessly, and theirs comes in,
  // before the final evaluation. The loop keeps answering status requests
  // meanwhile.
  clock_->ApplyAllOwnChanges();
  if (sync_) sync_->Finish([this] { return loop_->PollOnce(); });
  Finish();
  return Status::Ok();
}

Status SiteServer::Impl::CompleteFlush() {
  if (!sync_) return Status::Ok();
  const double deadline = site_.Now() + site_.timeouts.join_timeout_s;
  while (AwaitingPeers() && !StopRequested()) {
    if (site_.Now() > deadline) {
      return DeadlineExceededError("site server '" + site_.name() +
                                   "' was told to wait for SET_PEERS "
                                   "(--await-peers) and got none within " +
                                   FormatSeconds(site_.timeouts.join_timeout_s,
                                                 0) +
                                   " s");
    }
    MERIDIAN_RETURN_IF_ERROR(loop_->PollOnce());
  }
  if (StopRequested()) return Status::Ok();
  // Complete here, the flush may not be at a peer, which needs this site
  // to acknowledge its final (FinalFlush: after the exchange).
  MLOG(INFO) << (sync_->flush_complete()
                     ? "the final flush was complete when this site stopped: "
                       "staying until the peers say theirs is too"
                     : "the final flush was incomplete when this site "
                       "stopped: completing it");
  if (Status status = sync_->Connect(); !status.ok()) {
    MLOG(ERROR) << "cannot reach the peer sites: " << status;
  }
  clock_->ApplyAllOwnChanges();
  sync_->Finish([this] { return loop_->PollOnce(); });
  return Status::Ok();
}

// ---- phase 1: workers join -------------------------------------------------

Status SiteServer::Impl::AwaitWorkers() {
  const double deadline = site_.Now() + site_.timeouts.join_timeout_s;
  const uint32_t needed = std::min(site_.timeouts.min_workers, workers_.size());
  while (workers_.LiveCount() < workers_.size() || AwaitingPeers()) {
    if (StopRequested()) {
      loop_->FinishJob("stopped before all workers joined");
      return Status::Ok();
    }
    if (workers_.AllLeft()) {
      loop_->FinishJob("every worker left before training began");
      return Status::Ok();
    }
    if (site_.Now() > deadline && AwaitingPeers()) {
      return DeadlineExceededError(
          "site server '" + site_.name() +
          "' was told to wait for SET_PEERS (--await-peers) and got none "
          "within " +
          FormatSeconds(site_.timeouts.join_timeout_s, 0) + " s");
    }
    if (site_.Now() > deadline) {
      if (workers_.LiveCount() >= needed && workers_.LiveCount() > 0) break;
      return DeadlineExceededError(
          "workers [" + workers_.DescribeNotLive() + "] of site server '" +
          site_.name() + "' did not join within " +
          FormatSeconds(site_.timeouts.join_timeout_s, 0) + " s (" +
          std::to_string(workers_.LiveCount()) + " joined, at least " +
          std::to_string(std::max<uint32_t>(needed, 1)) +
          " needed: fault.min_workers)");
    }
    MERIDIAN_RETURN_IF_ERROR(loop_->PollOnce());
    if (phase_.finished()) return Status::Ok();
  }
  return Status::Ok();
}

void SiteServer::Impl::StartTraining() {
  if (sync_) {
    if (Status status = sync_->Connect(); !status.ok()) {
      MLOG(ERROR) << "cannot reach the peer sites: " << status;
    }
  }
  phase_.Start();
  monitor_->ResetWaiting();
  driver_->Start(site_.clock->Now());
  if (workers_.LiveCount() == workers_.size()) {
    MLOG(INFO) << "all " << workers_.size() << " workers joined; training";
  } else {
    MLOG(WARNING) << workers_.LiveCount() << " of " << workers_.size()
                  << " workers joined within "
                  << FormatSeconds(site_.timeouts.join_timeout_s, 0)
                  << " s; training without [" << workers_.DescribeNotLive()
                  << "] (they may join late)";
  }
  for (uint32_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i].state == SlotState::kLive &&
        workers_[i].pending == Pending::kHello) {
      replies_->SendReply(i);  // WELCOME
    }
  }
  evaluator_->Start();
  durability_->CheckpointBeforeTraining();
}

// ---- phase 2: training -----------------------------------------------------

Status SiteServer::Impl::Serve() {
  while (!phase_.finished()) {
    MERIDIAN_RETURN_IF_ERROR(loop_->PollOnce());
    driver_->OnTick(site_.clock->Now());
    DeliverLossEvaluations();
    CheckStopConditions();
  }
  return Status::Ok();
}

void SiteServer::Impl::CheckStopConditions() {
  if (phase_.finished()) return;
  const pb::JobConfig& job = site_.job;
  if (job.stop_at_target() && evaluator_->timeline().target_reached()) {
    loop_->FinishJob("target " + model_.metric.name + " reached");
  } else if (phase_.Elapsed() >= job.time_budget_s()) {
    loop_->FinishJob("time budget of " + FormatSeconds(job.time_budget_s(), 0) +
                     " s used");
  } else if (StopRequested()) {
    loop_->FinishJob("stopped on request (signal)");
  } else if (sync_ && sync_->peer_finished()) {
    summary_.NoteStoppedByPeer();
    loop_->FinishJob("site '" + sync_->finished_peer() + "' finished the job");
  } else if (workers_.AllLeft()) {
    // BYEs only: dead workers may still come back.
    loop_->FinishJob("every worker left");
  }
}

// ---- phase 3: let workers leave, final evaluation --------------------------

Status SiteServer::Impl::Drain() {
  const double deadline = site_.Now() + site_.timeouts.drain_s;
  while (site_.Now() < deadline && !workers_.NoneLive()) {
    MERIDIAN_RETURN_IF_ERROR(loop_->PollOnce());
  }
  return Status::Ok();
}

void SiteServer::Impl::Finish() {
  evaluator_->Stop();
  // The final model's quality, measured once more after the last update.
  if (Status final = evaluator_->EvaluateFinal([this] { return loop_->PollOnce(); });
      !final.ok()) {
    MLOG(ERROR) << "final evaluation: " << final;
  }
  if (std::string why = evaluator_->MissingCurveReason(); !why.empty()) {
    MLOG(WARNING) << "site '" << site_.name() << "' has no curve: " << why;
    summary_.NoteMissingCurve(why);
  }
  summary_.Complete(membership_->events(), sync_.get(),
                    durability_->recovery());
  summary_.Write();
  summary_.WriteModel();
  durability_->FinalCheckpoint();
  monitor_->Publish(/*force=*/true);
}

void SiteServer::Impl::DeliverLossEvaluations() {
  for (const auto& [loss, taken_at] : evaluator_->TakeLossResults()) {
    ++counters_.loss_evaluations;
    driver_->OnLossEvaluation(loss, taken_at);
  }
  if (!sync_) return;
  for (const TravelScore& score : evaluator_->TakeTravelScores()) {
    sync_->OnTravelScored(score.peer, score.travel_id, score.clock,
                          score.scores);
  }
  PublishSyncKnobs();
}

void SiteServer::Impl::PublishSyncKnobs() {
  knobs_.theta.store(sync_->theta(), std::memory_order_relaxed);
  knobs_.skew_knob.store(
      sync_->skew_knob().value_or(std::numeric_limits<double>::quiet_NaN()),
      std::memory_order_relaxed);
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
  MERIDIAN_ASSIGN_OR_RETURN(SiteModel model, LoadSiteModel(job, site_index));
  MERIDIAN_ASSIGN_OR_RETURN(auto policy, MakePolicy(job.policy()));
  std::vector<uint8_t> train_labels = std::move(model.train_labels);
  auto impl = std::make_unique<Impl>(std::move(options), site_index,
                                     std::move(model), std::move(policy));
  // An external model's data is the user's: without data { } the server
  // knows no labels.
  if (!train_labels.empty()) {
    MERIDIAN_RETURN_IF_ERROR(impl->DescribeTrainingData(train_labels));
  }
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
