// The engine is its parts, each in its own file under src/sync/:
//   sync_context.h     the job, this site and its role (read-only)
//   peer_table.h       the peers: channels, liveness, clocks
//   mirror_socket.h    the ROUTER peers connect to (CURVE, ERROR, acks)
//   send_threshold.h   θ: schedule, SkewScout's knob, adaptive links
//   outbox.h           channels out: open, log, number, frame updates
//   change_sender.h    Gaia's filter, selective barrier, clocks, final flush
//   skewscout_travel.h SkewScout: models travel, scores come back
//   outer_rounds.h     DILOCO / MODEL_AVERAGING rounds on the wire
//   read_gate.h        DS bound, selective barrier and rounds against reads
//   inbox.h            mirror messages in: sender check, parse, policy, apply
//   mirror_messages.h  the typed parse functions of the mirror protocol
//   saved_state.h      checkpoints, the outgoing log's replay, durability
// This file builds them and drives them from the site server's calls.
#include "sync/sync_engine.h"

#include <algorithm>
#include <sstream>

#include "meridian/compression/compression.h"
#include "meridian/config/config.h"
#include "meridian/core/format.h"
#include "meridian/core/log.h"
#include "meridian/net/message.h"
#include "meridian/sync/addresses.h"
#include "sync/change_sender.h"
#include "sync/final_flush.h"
#include "sync/inbox.h"
#include "sync/mirror_socket.h"
#include "sync/outbox.h"
#include "sync/outer_rounds.h"
#include "sync/peer_table.h"
#include "sync/read_gate.h"
#include "sync/saved_state.h"
#include "sync/send_threshold.h"
#include "sync/skewscout_travel.h"
#include "sync/sync_context.h"
#include "sync/update_codec.h"

namespace meridian {
namespace {

constexpr auto kFinishPoll = std::chrono::milliseconds(20);

// The largest frame a peer may send (ZMQ_MAXMSGSIZE of the mirror socket):
// a header, or one tensor's CODEC_PIPELINE buffer, which is at most twice
// its dense bytes (index + value per element) plus the buffer's own
// header. A bigger frame drops the connection before ZeroMQ allocates it.
int64_t MaxMirrorFrameBytes(const ModelLayout& layout) {
  constexpr uint64_t kPipelineHeaderSlack = 64 << 10;
  const uint64_t largest = layout.LargestTensorSize() * sizeof(float);
  return static_cast<int64_t>(
      std::max<uint64_t>(2 * largest + kPipelineHeaderSlack, kMaxHeaderBytes));
}

// What a peer's connection to the mirror socket may have sent that this
// site has not taken (its front's credit, wan/front.h): a sender keeps at
// most `retention_limit` bytes unacknowledged, and a message is at most a
// header and frames within `max_frame`; twice that, and slack for its
// heartbeats and acknowledgements.
uint64_t MirrorPeerCredit(uint64_t retention_limit, int64_t max_frame) {
  constexpr uint64_t kSlack = 1 << 20;
  return 2 * retention_limit + 2 * static_cast<uint64_t>(max_frame) + kSlack;
}

}  // namespace

// Owns the engine's parts and drives them on the site server's event-loop
// thread (not thread-safe). Size: fixed; the parts' own bounds apply.
class SyncEngine::Impl {
 public:
  explicit Impl(const SyncEngineOptions& options) : context_(options) {}

  // Builds the parts in their dependency order; configuration errors
  // (compression, outer rounds, SkewScout) come before the mirror socket
  // binds.
  Status Init(const SyncEngineOptions& options);

  const std::string& mirror_endpoint() const { return mirror_->endpoint(); }
  PeerTable& peers() { return *peers_; }
  const PeerTable& peers() const { return *peers_; }
  Status SetPeerEndpoints(const std::map<std::string, std::string>& endpoints);
  Status Connect();
  void AddPollItems(std::vector<zmq::pollitem_t>* items);
  void HandleReadable(std::span<const zmq::pollitem_t> items);
  void OnLocalClock(int64_t clock);
  void OnTravelScored(const std::string& site, uint64_t travel_id,
                      int64_t clock, const TravelScores& scores) {
    skew_->OnTravelScored(site, travel_id, clock, scores);
  }
  bool ReadsAllowed(int64_t local_clock,
                    std::span<const KeyRange> ranges) const {
    return gate_->ReadsAllowed(local_clock, ranges);
  }
  void NoteHeld(double seconds) { gate_->NoteHeld(seconds); }
  std::string DescribeWait(int64_t local_clock) const;
  const std::string& finished_peer() const { return inbox_->finished_peer(); }
  bool Finish(const std::function<Status()>& poll);
  SyncEngine::FlushProgress flush_progress() const;
  double theta() const { return threshold_->last(); }
  std::optional<double> skew_knob() const;
  uint64_t bytes_sent() const { return outbox_->bytes_sent(); }
  pb::SyncSummary Summary() const;
  void SetOutgoingLog(SyncEngine::OutgoingLog log) {
    outbox_->SetLog(std::move(log));
  }
  SavedState& saved() { return *saved_; }
  const SavedState& saved() const { return *saved_; }

 private:
  // Every turn of the event loop: liveness, the channels' sending and
  // heartbeats, and acknowledgements that are due.
  void Service();
  void PollOnce();
  void LogStart() const;
  // Final flushes to `targets`, timed by flush_.
  void SendFinal(const std::vector<Peer*>& targets);

  SyncContext context_;
  std::unique_ptr<PeerTable> peers_;
  std::unique_ptr<MirrorSocket> mirror_;
  std::unique_ptr<SendThreshold> threshold_;
  std::unique_ptr<Outbox> outbox_;
  std::unique_ptr<SkewScoutTravel> skew_;
  std::unique_ptr<ChangeSender> sender_;
  std::unique_ptr<OuterRounds> outer_;  // null without outer rounds
  std::unique_ptr<ReadGate> gate_;
  std::unique_ptr<Inbox> inbox_;
  std::unique_ptr<SavedState> saved_;
  std::unique_ptr<FinalFlush> flush_;
};

Status SyncEngine::Impl::Init(const SyncEngineOptions& options) {
  MERIDIAN_ASSIGN_OR_RETURN(UpdateCodec codec,
                            UpdateCodec::Create(context_.sync));
  DeliveryOptions delivery;
  delivery.heartbeat_interval_s = context_.fault.heartbeat_interval_s();
  delivery.retention_limit_bytes = RetentionLimit(context_);
  peers_ = std::make_unique<PeerTable>(context_, delivery);
  std::optional<OuterSteps> steps;
  if (HasOuterRounds(context_.sync.kind())) {
    MERIDIAN_ASSIGN_OR_RETURN(
        OuterSteps created,
        OuterSteps::Create(
            OuterStepOptionsFrom(context_.sync,
                                 static_cast<uint32_t>(peers_->size())),
            context_.store->num_elements()));
    steps.emplace(std::move(created));
  }
  std::optional<SkewController> controller;
  if (context_.sync.skewscout().enabled()) {
    MERIDIAN_ASSIGN_OR_RETURN(
        SkewController created,
        SkewController::Create(SkewControlOptionsFrom(context_.sync),
                               InitialKnob(context_.sync)));
    controller.emplace(std::move(created));
  }
  const std::string bind =
      options.mirror_bind.empty()
          ? BindEndpointFor(
                context_.job.site(context_.site_index).mirror_address())
          : options.mirror_bind;
  MERIDIAN_ASSIGN_OR_RETURN(
      mirror_,
      MirrorSocket::Open(
          context_, bind, options.secret_key_file,
          MaxMirrorFrameBytes(context_.store->layout()),
          MirrorPeerCredit(delivery.retention_limit_bytes,
                           MaxMirrorFrameBytes(context_.store->layout()))));
  threshold_ = std::make_unique<SendThreshold>(context_, *peers_);
  outbox_ = std::make_unique<Outbox>(context_, *peers_, *threshold_,
                                     mirror_->curve(), std::move(codec));
  skew_ = std::make_unique<SkewScoutTravel>(
      context_, *peers_, *outbox_, *threshold_, options.score_travelled,
      std::move(controller));
  sender_ =
      std::make_unique<ChangeSender>(context_, *peers_, *outbox_, *threshold_);
  if (steps) {
    outer_ = std::make_unique<OuterRounds>(context_, *peers_, *outbox_, *skew_,
                                           std::move(*steps));
  }
  gate_ = std::make_unique<ReadGate>(context_, *peers_, outer_.get());
  inbox_ = std::make_unique<Inbox>(context_, *peers_, *mirror_, *sender_,
                                   *skew_, outer_.get(), *gate_);
  flush_ = std::make_unique<FinalFlush>(context_, *peers_);
  saved_ = std::make_unique<SavedState>(
      context_,
      SyncParts{peers_.get(), mirror_.get(), outbox_.get(), inbox_.get(),
                gate_.get(), skew_.get(), outer_.get()});
  LogStart();
  return Status::Ok();
}

void SyncEngine::Impl::LogStart() const {
  const pb::SyncConfig& sync = context_.sync;
  const pb::FaultConfig& fault = context_.fault;
  MLOG(INFO) << "sync " << pb::SyncKind_Name(sync.kind()) << " as "
             << context_.RoleName() << " with " << context_.PeerList()
             << "; mirror socket " << mirror_->endpoint() << "; theta0 "
             << sync.threshold() << " ("
             << pb::ThresholdMode_Name(sync.threshold_mode()) << ", "
             << pb::ThresholdSchedule_Name(sync.threshold_schedule())
             << "), DS " << sync.max_clock_skew() << ", "
             << DescribeCompressionConfig(sync.compression())
             << "; unreachable after " << fault.peer_timeout_s() << " s ("
             << pb::PartitionPolicy_Name(fault.partition_policy()) << ")";
}

Status SyncEngine::Impl::SetPeerEndpoints(
    const std::map<std::string, std::string>& endpoints) {
  for (const auto& [site, endpoint] : endpoints) {
    Peer* peer = peers_->Find(site);
    if (peer == nullptr) {
      return InvalidArgumentError("site '" + context_.name +
                                  "' does not sync with a site named '" + site +
                                  "' (its peers: " + context_.PeerList() + ")");
    }
    if (peer->out.attached() && peer->endpoint != endpoint) {
      return FailedPreconditionError("the channel to site '" + site +
                                     "' is already connected to " +
                                     peer->endpoint);
    }
    peer->endpoint = endpoint;
  }
  return Status::Ok();
}

Status SyncEngine::Impl::Connect() {
  for (const auto& peer : peers_->all()) {
    MERIDIAN_RETURN_IF_ERROR(outbox_->Open(*peer));
  }
  // Peers not heard from within peer_timeout_s from now are unreachable.
  peers_->StartLiveness(context_.Now());
  const double now = context_.UnixNow();
  for (const auto& peer : peers_->all()) {
    peer->sending.window_start_unix_s = now;
  }
  skew_->Start(context_.Now());
  if (outer_) outer_->Start();
  return Status::Ok();
}

void SyncEngine::Impl::AddPollItems(std::vector<zmq::pollitem_t>* items) {
  items->push_back(mirror_->PollItem());
  for (const auto& peer : peers_->all()) {
    zmq::socket_t* socket = peer->out.socket();
    items->push_back({socket ? socket->handle() : nullptr, -1,
                      socket ? short(ZMQ_POLLIN) : short(0), 0});
  }
}

void SyncEngine::Impl::HandleReadable(std::span<const zmq::pollitem_t> items) {
  if (!items.empty() && (items[0].revents & ZMQ_POLLIN)) {
    inbox_->DrainMirror();
  }
  const auto& all = peers_->all();
  for (size_t i = 0; i < all.size() && i + 1 < items.size(); ++i) {
    if (items[i + 1].revents & ZMQ_POLLIN) inbox_->DrainChannel(*all[i]);
  }
  Service();
}

void SyncEngine::Impl::Service() {
  const double now = context_.Now();
  peers_->NoteServiceTurn(now);
  sender_->SendIfPeriodDue(now);
  for (const auto& peer : peers_->all()) {
    peers_->CheckLiveness(*peer, now);
    // Announcements are level-triggered, not only sent at a local clock:
    // one a channel missed while its peer was unreachable, or one that
    // came due without a local clock (a hub's slowest member went
    // silent), goes out as soon as the peer can take it. Sites whose DS
    // bounds wait on each other's clocks would otherwise wait for good
    // (each held at the clock it last reached).
    if (peers_->training()) {
      sender_->AnnounceClock(*peer, /*changes_first=*/true);
    }
    peer->out.Pump(now);
    inbox_->AcknowledgeIfDue(*peer, now);
  }
}

void SyncEngine::Impl::OnLocalClock(int64_t clock) {
  peers_->set_local_clock(clock);
  sender_->SampleUnsent();
  if (outer_) {
    outer_->StartIfDue(clock);
  } else {
    sender_->SendAtClock(clock);
  }
  skew_->OnLocalClock(clock);
  sender_->AnnounceClocks();
  if (outer_) outer_->CloseReady();
}

std::string SyncEngine::Impl::DescribeWait(int64_t local_clock) const {
  std::ostringstream out;
  gate_->Describe(local_clock, out);
  peers_->Describe(out);
  return out.str();
}

void SyncEngine::Impl::PollOnce() {
  std::vector<zmq::pollitem_t> items;
  AddPollItems(&items);
  try {
    zmq::poll(items.data(), items.size(), kFinishPoll);
  } catch (const zmq::error_t& error) {
    if (error.num() != EINTR) MLOG(WARNING) << "poll: " << error.what();
    return;
  }
  HandleReadable(items);
}

void SyncEngine::Impl::SendFinal(const std::vector<Peer*>& targets) {
  sender_->FlushAndSendFinal(targets);
  flush_->Sent(targets, context_.Now());
}

bool SyncEngine::Impl::Finish(const std::function<Status()>& poll) {
  inbox_->SetFinishing();
  const double started = context_.Now();
  flush_->Start(started);
  auto turn = [&] {
    if (!poll) return PollOnce();
    if (Status status = poll(); !status.ok()) {
      MLOG(WARNING) << "final flush: " << status;
      PollOnce();
    }
  };
  auto wait_for = [&](const std::vector<int>& sites) {
    while (!peers_->Done(sites) && flush_->Waiting(sites, context_.Now())) {
      turn();
    }
    return peers_->Done(sites);
  };
  const SyncRole& role = context_.role;
  bool complete = true;
  switch (role.kind) {
    case SyncRole::Kind::kMesh:
      SendFinal(peers_->Select(role.mesh));
      complete = wait_for(role.mesh);
      break;
    case SyncRole::Kind::kMember:
      SendFinal(peers_->Select({role.hub}));
      complete = wait_for({role.hub});
      break;
    case SyncRole::Kind::kHub: {
      // Members first: their last changes must reach the other hubs.
      complete = wait_for(role.members);
      SendFinal(peers_->Select(role.hubs));
      complete = wait_for(role.hubs) && complete;
      SendFinal(peers_->Select(role.members));
      complete = wait_for(role.members) && complete;
      break;
    }
  }
  // Stay while a peer may still need our acknowledgement of its final.
  while (flush_->Lingering(context_.Now())) turn();
  // Acknowledge what arrived last; the mirror socket lingers long enough
  // to deliver it.
  Service();
  flush_->End(context_.Now());
  const bool flushed = complete && peers_->AllFlushed();
  if (!flushed) {
    std::string missing;
    for (const auto& peer : peers_->all()) {
      if (!peers_->Flushed(*peer)) {
        missing += (missing.empty() ? "" : ", ") + peer->name +
                   (peer->live.reachable ? "" : " (unreachable)");
      }
    }
    MLOG(WARNING) << "final flush incomplete with [" << missing << "] after "
                  << FormatSeconds(context_.Now() - started)
                  << " s: their last changes or ours are missing there, "
                     "so the replicas differ; `meridian run --resume DIR` "
                     "(or `meridian site ... --resume`) completes it once "
                     "they can reach each other";
  }
  return flushed;
}

SyncEngine::FlushProgress SyncEngine::Impl::flush_progress() const {
  SyncEngine::FlushProgress progress;
  progress.active = flush_->active();
  if (!progress.active) return progress;
  progress.bytes_left = flush_->bytes_left();
  for (const auto& peer : peers_->all()) {
    if (peer->live.reachable && !peers_->Exchanged(*peer)) {
      ++progress.peers_left;
    }
  }
  return progress;
}

std::optional<double> SyncEngine::Impl::skew_knob() const {
  if (!skew_->enabled()) return std::nullopt;
  // The period a site proposes is its own; the one in effect is agreed.
  if (skew_->knob_kind() == SkewKnob::kAveragingPeriod) {
    return static_cast<double>(outer_->period());
  }
  return skew_->knob();
}

pb::SyncSummary SyncEngine::Impl::Summary() const {
  pb::SyncSummary summary;
  summary.set_clock(static_cast<uint32_t>(peers_->local_clock()));
  summary.set_final_theta(threshold_->last());
  outbox_->FillSummary(&summary, mirror_->acks_sent());
  sender_->FillSummary(&summary);
  inbox_->FillSummary(&summary);
  summary.set_rejected(static_cast<double>(mirror_->rejected()));
  summary.set_blocked_s(gate_->held_s());
  summary.set_flushed(peers_->AllFlushed());
  for (const std::string& peer : peers_->Unflushed()) {
    summary.add_unflushed_peers(peer);
  }
  flush_->FillSummary(&summary);
  peers_->FillSummary(&summary);
  skew_->FillSummary(&summary);
  if (outer_) outer_->FillSummary(&summary);
  return summary;
}

// ---- SyncEngine -------------------------------------------------------------

Result<std::unique_ptr<SyncEngine>> SyncEngine::Create(
    SyncEngineOptions options) {
  auto impl = std::make_unique<Impl>(options);
  MERIDIAN_RETURN_IF_ERROR(impl->Init(options));
  return std::unique_ptr<SyncEngine>(new SyncEngine(std::move(impl)));
}

SyncEngine::SyncEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SyncEngine::~SyncEngine() = default;

const std::string& SyncEngine::mirror_endpoint() const {
  return impl_->mirror_endpoint();
}
std::vector<std::string> SyncEngine::silent_peers() const {
  return impl_->peers().SilentPeers();
}
Status SyncEngine::SetPeerEndpoints(
    const std::map<std::string, std::string>& endpoints) {
  return impl_->SetPeerEndpoints(endpoints);
}
Status SyncEngine::Connect() { return impl_->Connect(); }
void SyncEngine::AddPollItems(std::vector<zmq::pollitem_t>* items) {
  impl_->AddPollItems(items);
}
void SyncEngine::HandleReadable(std::span<const zmq::pollitem_t> items) {
  impl_->HandleReadable(items);
}
void SyncEngine::OnLocalClock(int64_t clock) { impl_->OnLocalClock(clock); }
void SyncEngine::OnTravelScored(const std::string& peer, uint64_t travel_id,
                                int64_t clock, const TravelScores& scores) {
  impl_->OnTravelScored(peer, travel_id, clock, scores);
}
bool SyncEngine::ReadsAllowed(int64_t local_clock,
                              std::span<const KeyRange> ranges) const {
  return impl_->ReadsAllowed(local_clock, ranges);
}
void SyncEngine::NoteHeld(double seconds) { impl_->NoteHeld(seconds); }
std::string SyncEngine::DescribeWait(int64_t local_clock) const {
  return impl_->DescribeWait(local_clock);
}
bool SyncEngine::peer_finished() const {
  return !impl_->finished_peer().empty();
}
const std::string& SyncEngine::finished_peer() const {
  return impl_->finished_peer();
}
bool SyncEngine::Finish(const std::function<Status()>& poll) {
  return impl_->Finish(poll);
}
bool SyncEngine::flush_complete() const { return impl_->peers().AllFlushed(); }
SyncEngine::FlushProgress SyncEngine::flush_progress() const {
  return impl_->flush_progress();
}
double SyncEngine::theta() const { return impl_->theta(); }
std::optional<double> SyncEngine::skew_knob() const {
  return impl_->skew_knob();
}
uint64_t SyncEngine::bytes_sent() const { return impl_->bytes_sent(); }
int64_t SyncEngine::slowest_peer_clock() const {
  return impl_->peers().SlowestClock();
}
int64_t SyncEngine::bounding_clock() const {
  return impl_->peers().BoundingClock();
}
std::vector<size_t> SyncEngine::bounding_accumulators() const {
  return impl_->peers().BoundingAccumulators();
}
pb::SyncSummary SyncEngine::Summary() const { return impl_->Summary(); }
std::vector<SyncEngine::PeerCounters> SyncEngine::peer_counters() const {
  return impl_->peers().Counters();
}
int64_t SyncEngine::ClockFloor() const { return impl_->peers().ClockFloor(); }
uint32_t SyncEngine::unreachable_peers() const {
  return impl_->peers().unreachable();
}
const FaultEventLog& SyncEngine::events() const {
  return impl_->peers().events();
}
void SyncEngine::SetOutgoingLog(OutgoingLog log) {
  impl_->SetOutgoingLog(std::move(log));
}
void SyncEngine::EnableCheckpoints() { impl_->peers().EnableCheckpoints(); }
void SyncEngine::SaveState(pb::SyncCheckpoint* out) const {
  impl_->saved().Save(out);
}
std::vector<std::pair<std::string, size_t>> SyncEngine::Accumulators() const {
  return impl_->saved().Accumulators();
}
Result<uint64_t> SyncEngine::RestoreState(
    const pb::SyncCheckpoint& state, std::span<const pb::LoggedMessage> logged,
    const Checkpoint* arrays) {
  return impl_->saved().Restore(state, logged, arrays);
}
void SyncEngine::AppendArrays(std::vector<NamedArray>* arrays) const {
  impl_->saved().AppendArrays(arrays);
}
void SyncEngine::NoteDurable(const pb::SyncCheckpoint& saved) {
  impl_->saved().NoteDurable(saved);
}
bool SyncEngine::CheckpointWanted() const {
  return impl_->saved().CheckpointWanted();
}

}  // namespace meridian
