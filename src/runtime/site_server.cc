#include "meridian/site_server.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>
#include <zmq.hpp>

#include "meridian/addresses.h"
#include "meridian/config.h"
#include "meridian/dataset.h"
#include "meridian/log.h"
#include "meridian/message.h"
#include "meridian/model.h"
#include "meridian/param_store.h"
#include "meridian/policy.h"
#include "meridian/sync.h"
#include "meridian/transport.h"
#include "meridian/report.h"
#include "meridian/metrics.h"
#include "runtime/site_metrics.h"
#include "runtime/sync_engine.h"

namespace meridian {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(20);
// After the job ends, how long workers get to collect their stop and say
// BYE before the server exits anyway (a worker mid-step needs at most one
// step; one that died never says BYE).
constexpr double kDrainTimeoutS = 5.0;
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

// The training samples of the policy's loss evaluations: `count` of the
// `total` (all when fewer), the same at every site (seeded), sorted.
std::vector<uint32_t> LossSampleIndices(size_t total, uint64_t count,
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

struct WorkerSlot {
  bool joined = false;
  bool left = false;
  std::string routing_id;
  // The worker's COMMIT or PULL that has not been answered yet.
  bool awaiting_reply = false;
  // Sequence number of the worker's last accepted request: a request must
  // carry a larger one (a replayed or reordered message is refused).
  uint64_t last_sequence = 0;
  // Its answer is ready but held by the sync (DS bound etc.) since then.
  bool held = false;
  double held_since_s = 0;
  // What its pending request reads (a PULL's ranges); empty: everything.
  std::vector<pb::TensorSlice> read_ranges;
  pb::WorkerStats stats;
  double step_time_s = 0;
  std::string site;    // the worker's own site (may differ from the server's)
  uint32_t index = 0;  // inside that site
  std::string Name() const { return site + "/" + std::to_string(index); }
};

}  // namespace

class SiteServer::Impl {
 public:
  Impl(SiteServerOptions options, int site_index, std::unique_ptr<Model> model,
       std::unique_ptr<Model> eval_model, Dataset test_set, Dataset loss_set,
       std::unique_ptr<IntraSitePolicy> policy)
      : options_(std::move(options)),
        job_(options_.job),
        site_index_(site_index),
        site_config_(job_.site(site_index)),
        self_(MakeSelf(site_config_.name())),
        model_(std::move(model)),
        eval_model_(std::move(eval_model)),
        test_set_(std::move(test_set)),
        loss_set_(std::move(loss_set)),
        policy_(std::move(policy)),
        store_(model_->layout(), job_.server().num_shards(),
               ApplyRule::FromConfig(job_.server(),
                                     ContributingWorkers(job_, site_index))),
        aggregate_(model_->layout().num_elements()),
        socket_(context_, zmq::socket_type::router) {
    // Slots in config order: this site's workers, then those of the sites
    // whose server_site names this one. Policies see slot numbers.
    for (const WorkerRef& ref : ServedWorkers(job_, site_index)) {
      const pb::SiteConfig& site = job_.site(ref.site);
      WorkerSlot slot;
      slot.site = site.name();
      slot.index = ref.index;
      slot.step_time_s = WorkerGroupOf(site, ref.index).step_time_s();
      workers_.push_back(std::move(slot));
    }
    summary_.set_name(site_config_.name());
  }

  ~Impl() { StopEvaluator(); }

  Status Init() {
    std::vector<float> initial(model_->layout().num_elements());
    model_->Initialize(job_.seed(), initial);
    MERIDIAN_RETURN_IF_ERROR(store_.Assign(initial));
    const std::string bind = options_.bind.empty()
                                 ? BindEndpointFor(site_config_.address())
                                 : options_.bind;
    try {
      socket_.set(zmq::sockopt::linger, 0);
      // Fail loudly (EHOSTUNREACH) instead of dropping a reply to a worker
      // that went away.
      socket_.set(zmq::sockopt::router_mandatory, 1);
      socket_.set(zmq::sockopt::sndtimeo, 1000);
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
      sync.context = &context_;
      sync.mirror_bind = options_.mirror_bind;
      sync.secret_key_file = options_.secret_key_file;
      sync.clock = clock_;
      MERIDIAN_ASSIGN_OR_RETURN(sync_, SyncEngine::Create(std::move(sync)));
    }
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
               << "; test set " << test_set_.size() << " samples";
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

  Status Run() {
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

  double Now() const { return clock_->NowSeconds(); }

  // Whether this site exchanges updates with other sites.
  bool SyncsWithPeers() const {
    if (job_.sync().kind() == pb::SYNC_NONE) return false;
    return !RoleOf(job_, site_index_).Peers().empty();
  }
  double Elapsed() const { return Now() - start_s_; }
  bool StopRequested() const {
    return options_.stop_requested != nullptr &&
           options_.stop_requested->load(std::memory_order_relaxed);
  }

  // ---- phase 1: every worker joins -----------------------------------------
  Status AwaitWorkers() {
    const double deadline = Now() + job_.server().join_timeout_s();
    while (JoinedCount() < workers_.size()) {
      if (StopRequested()) {
        FinishJob("stopped before all workers joined");
        return Status::Ok();
      }
      if (Now() > deadline) {
        std::string missing;
        for (uint32_t i = 0; i < workers_.size(); ++i) {
          if (!workers_[i].joined) {
            missing += (missing.empty() ? "" : ", ") + workers_[i].Name();
          }
        }
        return DeadlineExceededError(
            "workers [" + missing + "] of site server '" + site_config_.name() +
            "' did not join within " +
            std::to_string(job_.server().join_timeout_s()) + " s");
      }
      MERIDIAN_RETURN_IF_ERROR(PollOnce());
      if (finished_) return Status::Ok();
    }
    return Status::Ok();
  }

  uint32_t JoinedCount() const {
    return static_cast<uint32_t>(
        std::count_if(workers_.begin(), workers_.end(),
                      [](const WorkerSlot& w) { return w.joined; }));
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
    policy_->Start(static_cast<uint32_t>(workers_.size()), clock_->Now());
    MLOG(INFO) << "all " << workers_.size() << " workers joined; training";
    for (uint32_t i = 0; i < workers_.size(); ++i) SendWelcome(i);
    StartEvaluator();
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
    if (job_.stop_at_target() && target_reached_.load()) {
      FinishJob("target accuracy reached");
    } else if (Elapsed() >= job_.time_budget_s()) {
      FinishJob("time budget of " + FormatSeconds(job_.time_budget_s()) +
                " s used");
    } else if (StopRequested()) {
      FinishJob("stopped on request (signal)");
    } else if (sync_ && sync_->peer_finished()) {
      summary_.set_stopped_by_peer(true);
      FinishJob("site '" + sync_->finished_peer() + "' finished the job");
    } else if (std::all_of(workers_.begin(), workers_.end(),
                           [](const WorkerSlot& w) { return w.left; })) {
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
      if (workers_[i].awaiting_reply) SendModel(i);
    }
  }

  // ---- phase 3: let workers leave, final evaluation ------------------------
  Status Drain() {
    const double deadline = Now() + kDrainTimeoutS;
    while (Now() < deadline &&
           !std::all_of(workers_.begin(), workers_.end(),
                        [](const WorkerSlot& w) { return w.left; })) {
      MERIDIAN_RETURN_IF_ERROR(PollOnce());
    }
    return Status::Ok();
  }

  void Finish() {
    StopEvaluator();
    // The final model's quality, measured once more after the last update.
    std::vector<float> params(store_.num_elements());
    const uint64_t version = store_.Snapshot(params);
    const EvalResult final_eval = eval_model_->Evaluate(params, test_set_);
    {
      std::lock_guard<std::mutex> lock(eval_mu_);
      RecordEvalLocked(final_eval, version, commits_.load());
    }
    const pb::EvalPoint& last = timeline_.back();
    summary_.set_final_accuracy(last.accuracy());
    summary_.set_final_loss(last.loss());
    summary_.set_model_version(store_.version());
    summary_.set_commits(commits_.load());
    summary_.set_rejected(rejected_);
    summary_.set_training_s(training_s_);
    summary_.set_stop_reason(stop_reason_);
    summary_.set_model_parameters(
        static_cast<uint32_t>(model_->layout().num_elements()));
    if (sync_) *summary_.mutable_sync() = sync_->Summary();
    summary_.set_search_time_s(policy_->search_time_s());
    summary_.set_loss_evaluations(static_cast<uint32_t>(loss_evaluations_));
    summary_.set_server_momentum(store_.rule().momentum);
    summary_.set_reached_target(time_to_target_s_ >= 0);
    summary_.set_time_to_target_s(time_to_target_s_);
    MLOG(INFO) << "final accuracy " << last.accuracy() << " loss "
               << last.loss() << " after " << commits_.load() << " commits ("
               << stop_reason_ << ")";
    WriteSummary();
    PublishMetrics(/*force=*/true);
  }

  void WriteSummary() {
    {
      std::lock_guard<std::mutex> lock(eval_mu_);
      summary_.clear_timeline();
      for (const pb::EvalPoint& point : timeline_) {
        *summary_.add_timeline() = point;
      }
    }
    summary_.clear_workers();
    for (uint32_t i = 0; i < workers_.size(); ++i) {
      pb::WorkerSummary* w = summary_.add_workers();
      w->set_site(workers_[i].site);
      w->set_index(workers_[i].index);
      const pb::WorkerStats& s = workers_[i].stats;
      w->set_steps(s.steps());
      w->set_commits(s.commits());
      w->set_compute_s(s.compute_s());
      w->set_device_wait_s(s.device_wait_s());
      w->set_blocked_s(s.blocked_s());
      w->set_step_time_s(workers_[i].step_time_s);
      w->set_steps_per_s(training_s_ > 0 ? s.steps() / training_s_ : 0);
    }
    if (options_.out_dir.empty()) return;
    const std::string path =
        options_.out_dir + "/site-" + site_config_.name() + ".json";
    if (Status status = WriteJsonFile(summary_, path); !status.ok()) {
      MLOG(ERROR) << "cannot write the site summary: " << status;
    }
  }

  // ---- the event loop ------------------------------------------------------
  // Waits up to kPollInterval for the worker socket and the sync sockets,
  // then handles what arrived.
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
        Dispatch(*received->message);
      }
    }
    if (sync_) {
      sync_->HandleReadable(std::span<const zmq::pollitem_t>(items).subspan(1));
      ReleaseHeld();
    }
    SampleRate();
    NoteWaiting();
    PublishMetrics();
    return Status::Ok();
  }

  void Refuse(const std::string& routing_id, const pb::Header& header,
              const Rejection& rejection) {
    ++rejected_;
    MLOG(ERROR) << "rejected " << DescribeHeader(header) << ": "
                << pb::ErrorCode_Name(rejection.code) << ": "
                << rejection.reason;
    Status status = SendError(socket_, self_, ++sequence_, rejection,
                              header.sequence(), routing_id);
    if (!status.ok()) {
      MLOG(WARNING) << "cannot send the error reply: " << status;
    }
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
      case pb::STATUS_REQUEST:
        return SendStatus(message);
      case pb::SET_PEERS:
        return HandleSetPeers(message);
      case pb::SHUTDOWN:
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
    SendStatus(message);
  }

  // The slot of the worker (site, index), if this server serves it.
  std::optional<uint32_t> FindSlot(const std::string& site,
                                   uint32_t index) const {
    for (uint32_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i].site == site && workers_[i].index == index) return i;
    }
    return std::nullopt;
  }

  std::string ServedDescription() const {
    std::string out;
    for (const WorkerSlot& slot : workers_) {
      out += (out.empty() ? "" : ", ") + slot.Name();
    }
    return out;
  }

  // The slot behind a request from a joined worker, or nullopt after
  // refusing it.
  std::optional<uint32_t> Sender(const Envelope& message) {
    const pb::Endpoint& sender = message.header.sender();
    const std::optional<uint32_t> found =
        sender.role() == pb::ROLE_WORKER ? FindSlot(sender.site(), sender.id())
                                         : std::nullopt;
    if (!found) {
      Refuse(message.routing_id, message.header,
             {pb::ERROR_UNKNOWN_SENDER,
              "sender is not a worker of site server '" + site_config_.name() +
                  "' (it serves " + ServedDescription() + ")"});
      return std::nullopt;
    }
    WorkerSlot& slot = workers_[*found];
    if (!slot.joined || slot.routing_id != message.routing_id) {
      Refuse(
          message.routing_id, message.header,
          {pb::ERROR_UNKNOWN_SENDER,
           "worker " + slot.Name() + " has not joined from this connection"});
      return std::nullopt;
    }
    if (slot.left) {
      Refuse(message.routing_id, message.header,
             {pb::ERROR_UNEXPECTED, "worker " + slot.Name() + " already left"});
      return std::nullopt;
    }
    if (message.header.sequence() <= slot.last_sequence) {
      Refuse(message.routing_id, message.header,
             {pb::ERROR_STALE, "sequence number " +
                                   std::to_string(message.header.sequence()) +
                                   " is not above the last accepted " +
                                   std::to_string(slot.last_sequence) +
                                   " (replayed or reordered request)"});
      return std::nullopt;
    }
    if (slot.awaiting_reply) {
      Refuse(message.routing_id, message.header,
             {pb::ERROR_UNEXPECTED,
              "worker " + slot.Name() +
                  " sent a request before its previous one was answered"});
      return std::nullopt;
    }
    slot.last_sequence = message.header.sequence();
    return found;
  }

  void HandleHello(Envelope& message) {
    const pb::Endpoint& sender = message.header.sender();
    const uint32_t index = message.header.hello().worker_index();
    const std::optional<uint32_t> found =
        sender.role() == pb::ROLE_WORKER && sender.id() == index
            ? FindSlot(sender.site(), index)
            : std::nullopt;
    if (!found) {
      return Refuse(
          message.routing_id, message.header,
          {pb::ERROR_UNKNOWN_SENDER,
           "HELLO from worker " + sender.site() + "/" + std::to_string(index) +
               ": site server '" + site_config_.name() + "' serves " +
               ServedDescription()});
    }
    Result<ModelLayout> layout =
        ModelLayout::FromSpecs(message.header.hello().layout());
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
    WorkerSlot& slot = workers_[*found];
    if (slot.joined) {
      return Refuse(
          message.routing_id, message.header,
          {pb::ERROR_UNEXPECTED, "worker " + slot.Name() + " already joined"});
    }
    if (finished_) {
      return Refuse(message.routing_id, message.header,
                    {pb::ERROR_UNEXPECTED, "the job has finished"});
    }
    slot.joined = true;
    slot.routing_id = message.routing_id;
    slot.awaiting_reply = true;
    slot.last_sequence = message.header.sequence();
    MLOG(INFO) << "worker " << slot.Name() << " joined (" << JoinedCount()
               << "/" << workers_.size() << ")";
    if (training_) SendWelcome(*found);
  }

  void HandleCommit(Envelope& message) {
    const std::optional<uint32_t> found = Sender(message);
    if (!found) return;
    const uint32_t worker = *found;
    WorkerSlot* slot = &workers_[worker];
    if (!training_) {
      return Refuse(message.routing_id, message.header,
                    {pb::ERROR_UNEXPECTED, "training has not started"});
    }
    if (Verdict verdict = CheckSlicesAgainstLayout(
            message.header, model_->layout(), /*whole_model=*/true)) {
      return Refuse(message.routing_id, message.header, *verdict);
    }
    if (Verdict verdict = CheckCodec(message.header, pb::CODEC_RAW)) {
      return Refuse(message.routing_id, message.header, *verdict);
    }
    for (int i = 0; i < message.header.slices_size(); ++i) {
      if (Verdict verdict = CheckFinite(message.header.slices(i),
                                        BytesOf(message.payload[i]))) {
        return Refuse(message.routing_id, message.header, *verdict);
      }
    }
    const pb::Commit& commit = message.header.commit();
    if (commit.base_version() > store_.version()) {
      return Refuse(
          message.routing_id, message.header,
          {pb::ERROR_STALE, "commit based on model version " +
                                std::to_string(commit.base_version()) +
                                ", newer than the site's " +
                                std::to_string(store_.version())});
    }
    staleness_.Add(store_.version() - commit.base_version());
    slot->stats = commit.stats();
    slot->awaiting_reply = true;
    slot->read_ranges.clear();  // a commit is answered with the whole model

    if (finished_) {
      // The job is over, but the worker's last update is real work: apply
      // it so that nothing accepted is lost, then tell it to stop.
      ApplyCommit(message);
      SendModel(worker);
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
        auto released =
            std::find(decision.release.begin(), decision.release.end(), worker);
        if (released != decision.release.end() && !decision.flush_aggregate &&
            ReadsAllowed()) {
          // The common asynchronous case: apply and copy the result into
          // the reply in one pass over the model.
          ModelReply reply = NewModelReply(pb::MODEL);
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
        aggregate_.Add(Segments(message));
        ++commits_;
        break;
      case PolicyDecision::Update::kReject:
        slot->awaiting_reply = false;
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
      if (Verdict verdict = CheckSlicesAgainstLayout(wanted, model_->layout(),
                                                     /*whole_model=*/false)) {
        return Refuse(message.routing_id, message.header, *verdict);
      }
    }
    workers_[*worker].read_ranges.assign(pull.ranges().begin(),
                                         pull.ranges().end());
    workers_[*worker].awaiting_reply = true;
    ++pulls_;
    if (finished_ || !training_) return SendModel(*worker);
    Execute(policy_->OnPull(*worker, clock_->Now()));
  }

  void HandleBye(Envelope& message) {
    const std::optional<uint32_t> worker = Sender(message);
    if (!worker) return;
    WorkerSlot& slot = workers_[*worker];
    if (message.header.has_bye()) slot.stats = message.header.bye().stats();
    slot.left = true;
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

  std::vector<UpdateSegment> Segments(const Envelope& message) {
    std::vector<UpdateSegment> segments;
    segments.reserve(message.payload.size());
    scratch_.resize(message.payload.size());
    for (size_t i = 0; i < message.payload.size(); ++i) {
      const pb::TensorSlice& slice = message.header.slices(static_cast<int>(i));
      const TensorInfo* tensor = model_->layout().Find(slice.tensor());
      segments.push_back(
          UpdateSegment{tensor->offset + slice.offset(),
                        FloatsOf(message.payload[i], &scratch_[i])});
    }
    return segments;
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
    if (decision.evaluate_loss) RequestLossEvaluation();
    if (const std::optional<double> momentum = policy_->ServerMomentum();
        momentum && *momentum != store_.rule().momentum) {
      MLOG(INFO) << "server momentum " << store_.rule().momentum << " -> "
                 << *momentum << " (" << policy_->name() << ")";
      store_.SetMomentum(*momentum);
    }
    AdvanceClock();
    for (uint32_t worker : decision.release) {
      if (worker < workers_.size() && workers_[worker].awaiting_reply &&
          !workers_[worker].left) {
        Answer(worker);
      }
    }
  }

  // Tells the sync about every clock the policy has completed, in order.
  void AdvanceClock() {
    const auto clock = static_cast<int64_t>(policy_->clock());
    while (last_clock_ < clock) {
      ++last_clock_;
      if (sync_) sync_->OnLocalClock(last_clock_);
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
    return sync_->ReadsAllowed(last_clock_, ranges);
  }

  // Answers a released worker, or holds the answer until the sync allows.
  void Answer(uint32_t worker) {
    if (ReadsAllowed(worker)) return SendModel(worker);
    if (!workers_[worker].held) {
      workers_[worker].held = true;
      workers_[worker].held_since_s = Now();
    }
  }

  // Answers every held worker the sync now allows.
  void ReleaseHeld() {
    for (uint32_t i = 0; i < workers_.size(); ++i) {
      WorkerSlot& slot = workers_[i];
      if (!slot.held || !ReadsAllowed(i)) continue;
      slot.held = false;
      sync_->NoteHeld(Now() - slot.held_since_s);
      if (slot.awaiting_reply && !slot.left) SendModel(i);
    }
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
  ModelReply NewModelReply(pb::MessageType type,
                           std::span<const pb::TensorSlice> ranges = {}) {
    ModelReply reply;
    reply.header = MakeHeader(type, self_, ++sequence_);
    reply.header.set_clock(static_cast<int64_t>(policy_->clock()));
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

  void SendWelcome(uint32_t worker) {
    ModelReply reply = NewModelReply(pb::WELCOME);
    pb::Welcome* welcome = reply.header.mutable_welcome();
    model_->layout().ToSpecs(welcome->mutable_layout());
    welcome->set_model_version(store_.version());
    store_.Read(reply.reads);
    *welcome->mutable_plan() = policy_->PlanFor(worker);
    welcome->set_site_workers(static_cast<uint32_t>(workers_.size()));
    Deliver(worker, reply.header, std::move(reply.frames));
  }

  void SendModel(uint32_t worker) {
    if (finished_) {
      pb::Header header = MakeHeader(pb::MODEL, self_, ++sequence_);
      header.set_clock(static_cast<int64_t>(policy_->clock()));
      pb::Model* model = header.mutable_model();
      model->set_version(store_.version());
      model->set_stop(true);
      model->set_stop_reason(stop_reason_);
      Deliver(worker, header, {});
      return;
    }
    ModelReply reply = NewModelReply(pb::MODEL, workers_[worker].read_ranges);
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
    WorkerSlot& slot = workers_[worker];
    slot.awaiting_reply = false;
    if (Status status =
            SendMessage(socket_, header, std::move(frames), slot.routing_id);
        !status.ok()) {
      MLOG(WARNING) << "cannot reply to worker " << slot.Name() << ": "
                    << status;
    }
  }

  void SendStatus(const Envelope& request) {
    pb::Header header = MakeHeader(pb::STATUS_REPLY, self_, ++sequence_);
    header.set_clock(static_cast<int64_t>(policy_->clock()));
    pb::SiteStatus* status = header.mutable_status();
    status->set_site(site_config_.name());
    status->set_elapsed_s(
        training_ ? (finished_ ? training_s_.load() : Elapsed()) : 0);
    status->set_model_version(store_.version());
    status->set_commits(commits_.load());
    status->set_commits_per_s(CommitRate());
    status->set_workers_joined(JoinedCount());
    status->set_workers_expected(static_cast<uint32_t>(workers_.size()));
    status->set_finished(finished_);
    status->set_rejected(rejected_);
    if (sync_) {
      status->set_theta(sync_->theta());
      status->set_wan_bytes_sent(sync_->bytes_sent());
      status->set_slowest_peer_clock(sync_->slowest_peer_clock());
    }
    {
      std::lock_guard<std::mutex> lock(eval_mu_);
      if (!timeline_.empty()) *status->mutable_last_eval() = timeline_.back();
    }
    if (Status sent = SendMessage(socket_, header, {}, request.routing_id);
        !sent.ok()) {
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
      if (JoinedCount() < workers_.size()) {
        MLOG(INFO) << "waiting for workers: " << JoinedCount() << " of "
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
    s.workers_joined = JoinedCount();
    s.workers_expected = static_cast<uint32_t>(workers_.size());
    s.commits = commits_.load();
    s.commits_per_s = CommitRate();
    s.pulls = pulls_;
    s.rejected = rejected_;
    s.model_version = store_.version();
    s.clock = static_cast<int64_t>(policy_->clock());
    {
      std::lock_guard<std::mutex> lock(eval_mu_);
      if (!timeline_.empty()) {
        s.has_eval = true;
        s.accuracy = timeline_.back().accuracy();
        s.loss = timeline_.back().loss();
        s.eval_t_s = timeline_.back().t_s();
      }
    }
    for (const WorkerSlot& slot : workers_) {
      s.waiting_workers += slot.awaiting_reply && !slot.left;
      s.held_replies += slot.held;
      s.workers.push_back({slot.Name(), slot.stats.steps(),
                           slot.stats.commits(), slot.stats.blocked_s()});
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

  // ---- evaluation thread ---------------------------------------------------
  void StartEvaluator() {
    evaluator_ = std::thread([this] { EvalLoop(); });
  }

  void StopEvaluator() {
    {
      std::lock_guard<std::mutex> lock(eval_mu_);
      eval_stop_ = true;
    }
    eval_cv_.notify_all();
    if (evaluator_.joinable()) evaluator_.join();
  }

  // Test-set evaluations every eval_period_s, and the policy's loss
  // evaluations (on the fixed training minibatches of loss_set_) as soon as
  // they are asked for.
  void EvalLoop() {
    const auto period = std::chrono::duration_cast<std::chrono::nanoseconds>(
        FromSeconds(job_.server().eval_period_s()));
    std::vector<float> params(store_.num_elements());
    auto next_test = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(eval_mu_);
    while (!eval_stop_) {
      if (loss_requested_) {
        loss_requested_ = false;
        lock.unlock();
        const Duration taken_at = clock_->Now();
        store_.Snapshot(params);
        const EvalResult result = eval_model_->Evaluate(params, loss_set_);
        lock.lock();
        loss_results_.emplace_back(result.loss, taken_at);
        continue;
      }
      if (std::chrono::steady_clock::now() >= next_test) {
        lock.unlock();
        const uint64_t commits = commits_.load();
        const uint64_t version = store_.Snapshot(params);
        const EvalResult result = eval_model_->Evaluate(params, test_set_);
        lock.lock();
        RecordEvalLocked(result, version, commits);
        next_test = std::chrono::steady_clock::now() + period;
        continue;
      }
      eval_cv_.wait_until(lock, next_test,
                          [this] { return eval_stop_ || loss_requested_; });
    }
  }

  // Event thread: asks the evaluator for one loss evaluation (requests made
  // while one is pending are merged).
  void RequestLossEvaluation() {
    if (loss_set_.size() == 0) return;
    {
      std::lock_guard<std::mutex> lock(eval_mu_);
      loss_requested_ = true;
    }
    eval_cv_.notify_all();
  }

  // Event thread: hands finished loss evaluations to the policy.
  void DeliverLossEvaluations() {
    std::vector<std::pair<double, Duration>> results;
    {
      std::lock_guard<std::mutex> lock(eval_mu_);
      results.swap(loss_results_);
    }
    for (const auto& [loss, taken_at] : results) {
      ++loss_evaluations_;
      policy_->OnLossEvaluation(loss, taken_at);
    }
  }

  // `version` and `commits`: the state the evaluated snapshot was taken at.
  void RecordEvalLocked(const EvalResult& result, uint64_t version,
                        uint64_t commits) {
    pb::EvalPoint point;
    point.set_t_s(finished_eval_time());
    point.set_accuracy(result.accuracy);
    point.set_loss(result.loss);
    point.set_model_version(version);
    point.set_commits(commits);
    timeline_.push_back(point);
    const double target = job_.target_accuracy();
    if (target > 0 && result.accuracy >= target && time_to_target_s_ < 0) {
      time_to_target_s_ = point.t_s();
      target_reached_.store(true);
      MLOG(INFO) << "target accuracy " << target << " reached at "
                 << point.t_s() << " s (accuracy " << result.accuracy << ")";
    }
  }

  // Evaluation timestamps: seconds of training, frozen once the job ended.
  double finished_eval_time() const {
    const double frozen = training_s_.load();
    return frozen > 0 ? frozen : Elapsed();
  }

  static std::string FormatSeconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f", s);
    return buf;
  }

  SiteServerOptions options_;
  const pb::JobConfig& job_;
  const int site_index_;
  const pb::SiteConfig& site_config_;
  const pb::Endpoint self_;
  Clock* clock_ = SystemClock();

  std::unique_ptr<Model> model_;       // layout and initial parameters
  std::unique_ptr<Model> eval_model_;  // used by the evaluator thread only
  Dataset test_set_;
  // Fixed training minibatches for the policy's loss evaluations (ADSP,
  // ADACOMM); empty for other policies.
  Dataset loss_set_;
  uint64_t loss_evaluations_ = 0;
  std::unique_ptr<IntraSitePolicy> policy_;
  ParameterStore store_;
  UpdateAccumulator aggregate_;
  std::vector<WorkerSlot> workers_;
  std::vector<std::vector<float>> scratch_;  // realigned payloads

  zmq::context_t context_;
  zmq::socket_t socket_;
  std::string endpoint_;
  uint64_t sequence_ = 0;
  std::unique_ptr<SyncEngine> sync_;  // null for a site that syncs with nobody

  // Event-loop state.
  bool training_ = false;
  WaitNotice waiting_notice_;  // for workers, then for peer sites
  bool all_peers_heard_ = false;
  bool finished_ = false;
  int64_t last_clock_ = 0;  // the clock the sync was last told about
  // Read by the evaluator thread too, hence atomic.
  std::atomic<double> start_s_{0};
  std::atomic<double> training_s_{0};
  std::atomic<uint64_t> commits_{0};
  std::string stop_reason_;
  uint64_t rejected_ = 0;
  std::deque<std::pair<double, uint64_t>> rate_samples_;
  uint64_t pulls_ = 0;
  StalenessWindow staleness_;
  double staleness_window_start_s_ = 0;

  // Metrics: the event loop publishes into the registry, the server's
  // thread renders it (declared in this order so the server stops first).
  MetricsRegistry metrics_registry_;
  SiteMetrics site_metrics_{&metrics_registry_, site_config_.name()};
  std::unique_ptr<MetricsServer> metrics_server_;
  double next_metrics_s_ = 0;

  // Evaluator state, guarded by eval_mu_.
  std::mutex eval_mu_;
  std::condition_variable eval_cv_;
  bool eval_stop_ = false;
  bool loss_requested_ = false;
  std::vector<std::pair<double, Duration>> loss_results_;  // loss, taken at
  std::vector<pb::EvalPoint> timeline_;
  double time_to_target_s_ = -1;
  std::atomic<bool> target_reached_{false};
  std::thread evaluator_;

  pb::SiteSummary summary_;
};

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
  Dataset test_set = MakeDataset(raw.test_images, raw.test_labels, {},
                                 job.data().normalization(), raw.stats);
  Dataset loss_set;
  const pb::PolicyKind kind = job.policy().kind();
  if (kind == pb::ADSP || kind == pb::ADACOMM) {
    const std::vector<uint32_t> sample = LossSampleIndices(
        raw.train_labels.size(),
        static_cast<uint64_t>(job.policy().loss_eval_batches()) *
            job.optimizer().batch_size(),
        job.seed());
    loss_set = MakeDataset(raw.train_images, raw.train_labels, sample,
                           job.data().normalization(), raw.stats);
  }
  const int input_dim = static_cast<int>(raw.test_images.dim());
  MERIDIAN_ASSIGN_OR_RETURN(auto model, MakeModel(job.model(), input_dim, 10));
  MERIDIAN_ASSIGN_OR_RETURN(auto eval_model,
                            MakeModel(job.model(), input_dim, 10));
  MERIDIAN_ASSIGN_OR_RETURN(auto policy, MakePolicy(job.policy()));
  auto impl = std::make_unique<Impl>(std::move(options), site_index,
                                     std::move(model), std::move(eval_model),
                                     std::move(test_set), std::move(loss_set),
                                     std::move(policy));
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
