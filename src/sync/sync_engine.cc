#include "sync/sync_engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sstream>

#include "meridian/sync/addresses.h"
#include "meridian/compression/compression.h"
#include "meridian/config/config.h"
#include "meridian/core/log.h"
#include "meridian/net/message.h"
#include "meridian/net/security.h"
#include "meridian/sync/skew_control.h"
#include "meridian/sync/sync.h"
#include "meridian/net/transport.h"
#include "meridian/wan/presets.h"
#include "meridian/wan/units.h"
#include "sync/mirror_delivery.h"
#include "sync/outer_steps.h"
#include "sync/update_age.h"
#include "sync/update_codec.h"

namespace meridian {
namespace {

// SkewScout's decisions as report.json and checkpoints record them.
void ToRecord(const SkewDecision& d, pb::SkewDecisionRecord* record) {
  record->set_t_s(d.t_s);
  record->set_clock(d.clock);
  record->set_peer(d.peer);
  record->set_samples(d.samples);
  record->set_own_accuracy(d.own_accuracy);
  record->set_travelled_accuracy(d.travelled_accuracy);
  record->set_estimate(d.estimate);
  record->set_smoothed(d.smoothed);
  record->set_theta_before(d.knob_before);
  record->set_theta_after(d.knob_after);
  record->set_action(SkewActionName(d.action));
  record->set_discordant(d.discordant);
  record->set_standard_error(d.standard_error);
  record->set_travel_period(d.travel_period);
}

SkewDecision FromRecord(const pb::SkewDecisionRecord& record) {
  SkewDecision d;
  d.t_s = record.t_s();
  d.clock = record.clock();
  d.peer = record.peer();
  d.samples = record.samples();
  d.own_accuracy = record.own_accuracy();
  d.travelled_accuracy = record.travelled_accuracy();
  d.estimate = record.estimate();
  d.smoothed = record.smoothed();
  d.knob_before = record.theta_before();
  d.knob_after = record.theta_after();
  d.action = SkewActionFromName(record.action());
  d.discordant = record.discordant();
  d.standard_error = record.standard_error();
  d.travel_period = record.travel_period();
  return d;
}

constexpr auto kFinishPoll = std::chrono::milliseconds(20);
// How long the mirror socket keeps unsent acknowledgements when the server
// shuts down (a peer's final flush waits for ours).
constexpr int kMirrorLingerMs = 1000;
// ZeroMQ's queue towards a peer, in messages: what does not fit waits in
// the channel's retention (bounded in bytes) instead.
constexpr int kChannelHighWaterMark = 100;
// Heartbeat intervals without a word after which a peer counts as silent
// (SyncEngine::Impl::Silent).
constexpr double kSilentHeartbeats = 2.5;

std::span<const std::byte> AsBytes(const std::string& bytes) {
  return {reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()};
}
std::span<const std::byte> FrameBytes(const std::string& frame) {
  return AsBytes(frame);
}
std::span<const std::byte> FrameBytes(const zmq::message_t& frame) {
  return BytesOf(frame);
}

uint64_t NewIncarnation() {
  std::random_device device;
  std::mt19937_64 rng((uint64_t{device()} << 32) ^ device());
  uint64_t incarnation = 0;
  while (incarnation == 0) incarnation = rng();
  return incarnation;
}

// Everything this site knows about one peer it syncs with. Owned by the
// engine, touched by the event loop only.
struct Peer {
  Peer(int site_index, std::string site_name, const pb::Endpoint& self,
       uint64_t incarnation, const DeliveryOptions& delivery)
      : site(site_index),
        name(std::move(site_name)),
        out(name, self, incarnation, delivery),
        in(delivery) {}

  const int site;
  const std::string name;
  std::string endpoint;  // where this site connects to reach it
  DeliveryOptions delivery;
  OutboundChannel out;  // this site's messages to it
  InboundChannel in;    // its messages to this site
  // Its channel's connection to our mirror socket (acks go back on it).
  std::string routing_id;
  // Changes not sent to it yet (a ParameterStore accumulator); unused
  // under MODEL_AVERAGING and DILOCO.
  size_t acc = 0;
  int64_t announced = 0;  // last clock sent to it
  bool final_sent = false;
  uint64_t final_sequence = 0;
  bool final_received = false;

  // Liveness: declared unreachable after peer_timeout_s of silence; back
  // when heard again, and (PARTITION_CONTINUE) outside the DS bound until
  // its clock is within DS of this site's.
  bool reachable = true;
  bool catching_up = false;
  double unreachable_since_s = 0;
  double unreachable_total_s = 0;

  // Bandwidth-adaptive threshold of the link towards it (when enabled),
  // fed with what the channel sent and the peer acknowledged per period.
  std::optional<AdaptiveThreshold> adaptive;
  uint64_t period_sent = 0;  // the channel's bytes_sent at the period start
  double period_start_s = 0;
  // The channel held changes back in this period (flow control).
  bool period_congested = false;

  uint64_t bytes_received = 0;  // of its mirror messages (metrics)
  // When this site took its last update for it out of `acc` (Unix s): the
  // next update carries the changes made since.
  double window_start_unix_s = 0;
  // How old its changes were when applied here.
  RemoteUpdateAge age;
  // SkewScout: the id of the travel to it that has not been answered (0:
  // none); a new travel waits until it is, or until the next period.
  uint64_t travel_outstanding = 0;
  int64_t travel_sent_clock = 0;
  // ||acc|| / ||w|| of its accumulator, sampled (SampleUnsent).
  uint64_t unsent_samples = 0;
  double unsent_sum = 0;
  double unsent_max = 0;
  uint64_t messages_received = 0;
  // When this site last asked it to introduce itself (it spoke without a
  // MIRROR_HELLO this run of the site knows of).
  double hello_requested_s = -1;
};

}  // namespace

class SyncEngine::Impl {
 public:
  explicit Impl(SyncEngineOptions options)
      : options_(std::move(options)),
        job_(*options_.job),
        sync_(job_.sync()),
        fault_(job_.fault()),
        site_index_(options_.site_index),
        name_(job_.site(site_index_).name()),
        store_(options_.store),
        clock_(options_.clock),
        role_(RoleOf(job_, site_index_)),
        schedule_(sync_, job_.optimizer(), job_.policy().local_steps()),
        clocks_(PeerNames()),
        incarnation_(NewIncarnation()),
        mirror_(*options_.context, zmq::socket_type::router),
        events_(name_, options_.wall_clock) {
    self_.set_site(name_);
    self_.set_role(pb::ROLE_SITE_SERVER);
  }

  Status Init() {
    MERIDIAN_ASSIGN_OR_RETURN(UpdateCodec codec, UpdateCodec::Create(sync_));
    codec_.emplace(std::move(codec));

    DeliveryOptions delivery;
    delivery.heartbeat_interval_s = fault_.heartbeat_interval_s();
    delivery.retention_limit_bytes = RetentionLimit();

    // Local changes feed every accumulator: each peer has its own, so a
    // peer that is unreachable (or whose channel is full) keeps what it has
    // not been sent while the others go on. A hub also adds to a peer's
    // accumulator what it receives from others that the peer should get
    // (RelayTargets).
    for (int site : role_.Peers()) {
      auto peer = std::make_unique<Peer>(site, job_.site(site).name(), self_,
                                         incarnation_, delivery);
      peer->delivery = delivery;
      peer->endpoint = PeerMirrorEndpoint(job_, site_index_, site);
      if (UsesAccumulators()) peer->acc = store_->AddAccumulator();
      peers_.push_back(std::move(peer));
    }
    if (HasOuterRounds(sync_.kind())) {
      MERIDIAN_ASSIGN_OR_RETURN(
          OuterSteps steps,
          OuterSteps::Create(
              OuterStepOptionsFrom(sync_, static_cast<uint32_t>(peers_.size())),
              store_->num_elements()));
      outer_.emplace(std::move(steps));
    }

    if (sync_.skewscout().enabled()) {
      Result<SkewController> controller = SkewController::Create(
          SkewControlOptionsFrom(sync_), InitialKnob(sync_));
      if (!controller.ok()) return controller.status();
      skew_.emplace(std::move(*controller));
      skew_knob_ = SkewKnobOf(sync_);
    }

    const std::string bind =
        options_.mirror_bind.empty()
            ? BindEndpointFor(job_.site(site_index_).mirror_address())
            : options_.mirror_bind;
    MERIDIAN_RETURN_IF_ERROR(SecureMirror());
    try {
      mirror_.set(zmq::sockopt::linger, kMirrorLingerMs);
      mirror_.set(zmq::sockopt::router_mandatory, 1);
      // A peer's channel reconnects with the same routing id (its site and
      // incarnation): the new connection takes the id over.
      mirror_.set(zmq::sockopt::router_handover, 1);
      // Acknowledgements and errors never block the event loop: one that
      // cannot be queued now is sent again later.
      mirror_.set(zmq::sockopt::sndtimeo, 0);
      mirror_.set(zmq::sockopt::maxmsgsize, MaxMirrorFrameBytes());
      mirror_.bind(bind);
    } catch (const zmq::error_t& error) {
      return UnavailableError("site '" + name_ +
                              "' cannot listen for peers on '" + bind +
                              "': " + error.what());
    }
    MERIDIAN_ASSIGN_OR_RETURN(mirror_endpoint_, BoundEndpoint(mirror_));
    MLOG(INFO) << "sync " << pb::SyncKind_Name(sync_.kind()) << " as "
               << RoleName() << " with " << PeerList() << "; mirror socket "
               << mirror_endpoint_ << "; theta0 " << sync_.threshold() << " ("
               << pb::ThresholdMode_Name(sync_.threshold_mode()) << ", "
               << pb::ThresholdSchedule_Name(sync_.threshold_schedule())
               << "), DS " << sync_.max_clock_skew() << ", "
               << DescribeCompressionConfig(sync_.compression())
               << "; unreachable after " << fault_.peer_timeout_s() << " s ("
               << pb::PartitionPolicy_Name(fault_.partition_policy()) << ")";
    return Status::Ok();
  }

  const std::string& mirror_endpoint() const { return mirror_endpoint_; }

  // With security.curve: loads the keys, starts the ZAP handler (before
  // the mirror socket binds, so no connection is ever admitted without
  // it) and makes the mirror socket a CURVE server. Channels become CURVE
  // clients as they open. Without: says the links are plaintext.
  Status SecureMirror() {
    if (!job_.security().curve()) {
      MLOG(WARNING) << "cross-site links are plaintext: security { curve: "
                       "false }";
      return Status::Ok();
    }
    const std::vector<int> peers = role_.Peers();
    MERIDIAN_ASSIGN_OR_RETURN(
        SiteCurveKeys keys,
        LoadSiteCurveKeys(job_, site_index_, peers, options_.secret_key_file));
    std::map<std::string, std::string> allowed;
    for (const auto& [site, key] : keys.peers) allowed[key] = site;
    MERIDIAN_ASSIGN_OR_RETURN(
        zap_, ZapHandler::Start(*options_.context, std::move(allowed),
                                "mirror socket of site '" + name_ + "'"));
    MERIDIAN_RETURN_IF_ERROR(
        MakeCurveServer(mirror_, keys.own)
            .WithContext("mirror socket of site '" + name_ + "'"));
    MLOG(INFO) << "CURVE on: links to and from " << PeerList()
               << " are encrypted; admitting only their keys; this site's "
                  "public key "
               << keys.own.public_key;
    curve_.emplace(std::move(keys));
    return Status::Ok();
  }

  std::vector<std::string> peers() const { return PeerNames(); }

  std::vector<std::string> silent_peers() const {
    std::vector<std::string> names;
    for (const auto& peer : peers_) {
      if (!peer->in.hello()) {
        names.push_back(peer->name + " (" + peer->endpoint + ")");
      }
    }
    return names;
  }

  Status SetPeerEndpoints(const std::map<std::string, std::string>& endpoints) {
    for (const auto& [site, endpoint] : endpoints) {
      Peer* peer = PeerNamed(site);
      if (peer == nullptr) {
        return InvalidArgumentError("site '" + name_ +
                                    "' does not sync with a site named '" +
                                    site + "' (its peers: " + PeerList() + ")");
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

  Status Connect() {
    for (auto& peer : peers_) MERIDIAN_RETURN_IF_ERROR(Open(*peer));
    // Peers not heard from within peer_timeout_s from now are unreachable.
    training_ = true;
    liveness_floor_s_ = Now();
    const double now = options_.wall_clock->UnixSeconds();
    for (auto& peer : peers_) peer->window_start_unix_s = now;
    connected_s_ = Now();
    if (outer_ && !outer_->started()) {
      // The replicas start from the same model: the first anchor.
      std::vector<float> model(store_->num_elements());
      store_->Snapshot(model);
      outer_->Start(model);
    }
    return Status::Ok();
  }

  void AddPollItems(std::vector<zmq::pollitem_t>* items) {
    items->push_back({mirror_.handle(), 0, ZMQ_POLLIN, 0});
    for (auto& peer : peers_) {
      zmq::socket_t* socket = peer->out.socket();
      items->push_back({socket ? socket->handle() : nullptr, -1,
                        socket ? short(ZMQ_POLLIN) : short(0), 0});
    }
  }

  void HandleReadable(std::span<const zmq::pollitem_t> items) {
    if (!items.empty() && (items[0].revents & ZMQ_POLLIN)) DrainMirror();
    for (size_t i = 0; i < peers_.size() && i + 1 < items.size(); ++i) {
      if (items[i + 1].revents & ZMQ_POLLIN) DrainChannel(*peers_[i]);
    }
    Service();
  }

  void OnLocalClock(int64_t clock) {
    local_clock_ = clock;
    SampleUnsent();
    if (outer_) {
      StartOuterRoundIfDue(clock);
    } else {
      SendLocalChanges(Theta(clock));
      last_send_s_ = Now();
    }
    if (skew_) {
      // The first travel after one period: before it the replicas have
      // had no time to drift apart.
      if (next_travel_clock_ < 0) {
        next_travel_clock_ = clock + skew_->travel_period();
      } else if (clock >= next_travel_clock_) {
        next_travel_clock_ = clock + skew_->travel_period();
        Travel(clock);
      }
    }
    AnnounceClocks();
    CloseOuterRounds();
  }

  void OnTravelScored(const std::string& site, uint64_t travel_id,
                      int64_t clock, const TravelScores& scores) {
    Peer* peer = PeerNamed(site);
    if (peer == nullptr || !Sendable(*peer)) return;
    pb::Header header = MakeHeader(pb::MIRROR_TRAVEL_RESULT, self_, 0);
    header.set_clock(clock);
    pb::MirrorTravelResult* result = header.mutable_mirror_travel_result();
    result->set_travel_id(travel_id);
    result->set_clock(clock);
    result->set_samples(scores.samples);
    result->set_own_accuracy(scores.own_accuracy);
    result->set_travelled_accuracy(scores.travelled_accuracy);
    result->set_discordant(scores.discordant);
    ++travels_scored_;
    Send(*peer, std::move(header), {});
  }

  // About once a second: how large each peer's unsent change is against
  // the model, from at most kUnsentSample elements per peer (every
  // stride-th, the offset moving on each time), so the event loop's cost
  // does not grow with the model.
  void SampleUnsent() {
    constexpr double kPeriodS = 1.0;
    constexpr uint64_t kUnsentSample = uint64_t{1} << 16;
    const double now = Now();
    if (now - last_unsent_sample_s_ < kPeriodS) return;
    last_unsent_sample_s_ = now;
    if (!UsesAccumulators()) return;
    const uint64_t stride =
        std::max<uint64_t>(1, store_->num_elements() / kUnsentSample);
    const uint64_t offset = unsent_offset_++ % stride;
    for (auto& peer : peers_) {
      double acc_squares = 0, w_squares = 0;
      store_->VisitAccumulator(
          peer->acc, [&](const KeyRange& range, std::span<const float> w,
                         std::span<float> acc) {
            // The first index of this shard that is offset modulo stride.
            uint64_t i = (offset + stride - range.begin % stride) % stride;
            for (; i < w.size(); i += stride) {
              acc_squares += static_cast<double>(acc[i]) * acc[i];
              w_squares += static_cast<double>(w[i]) * w[i];
            }
          });
      const double ratio =
          w_squares > 0 ? std::sqrt(acc_squares / w_squares) : 0.0;
      ++peer->unsent_samples;
      peer->unsent_sum += ratio;
      peer->unsent_max = std::max(peer->unsent_max, ratio);
    }
  }

  bool ReadsAllowed(int64_t local_clock,
                    std::span<const KeyRange> ranges) const {
    if (ranges.empty()) {
      if (!blocked_.empty()) return false;
    } else {
      for (const KeyRange& range : ranges) {
        if (blocked_.Intersects(range.begin, range.end)) return false;
      }
    }
    if (outer_) {
      // A round that waits for the previous one of its fragment holds
      // training either way; without overlap (MODEL_AVERAGING never
      // overlaps) so does every open round.
      if (outer_deferred_ != 0) return false;
      return (sync_.kind() == pb::DILOCO && sync_.diloco().overlap()) ||
             !outer_->AnyOpen();
    }
    return local_clock - BoundingClock() <=
           static_cast<int64_t>(sync_.max_clock_skew());
  }

  void NoteHeld(double seconds) { blocked_s_ += seconds; }

  std::string DescribeWait(int64_t local_clock) const {
    std::ostringstream out;
    out << "local clock " << local_clock << ", DS " << sync_.max_clock_skew()
        << ", bounding clock " << BoundingClock();
    if (outer_) out << ", outer round deferred " << outer_deferred_;
    if (!blocked_.empty()) out << ", ranges awaiting values";
    for (const auto& peer : peers_) {
      const Peer& p = *peer;
      out << "; " << p.name << ": clock " << clocks_.ClockOf(p.name).value_or(0)
          << (Bounding(p) ? ", counted" : ", not counted")
          << (p.reachable ? "" : ", unreachable")
          << (p.catching_up ? ", catching up" : "") << ", heard "
          << SilentFor(p) << " s ago, in " << p.in.applied() << " applied, out "
          << p.out.last_sequence() << " made / " << p.out.applied_sequence()
          << " applied, announced " << p.announced
          << (p.out.full() ? ", retention full" : "")
          << (p.out.congested() ? ", congested" : "");
    }
    return out.str();
  }

  bool peer_finished() const { return !finished_peer_.empty(); }
  const std::string& finished_peer() const { return finished_peer_; }

  bool Finish(double timeout_s) {
    finishing_ = true;
    const double deadline = Now() + timeout_s;
    auto wait_for = [&](const std::vector<int>& sites) {
      while (!Done(sites) && Now() < deadline) PollOnce();
      return Done(sites);
    };
    bool complete = true;
    switch (role_.kind) {
      case SyncRole::Kind::kMesh:
        FlushAndSendFinal(PeersOf(role_.mesh));
        complete = wait_for(role_.mesh);
        break;
      case SyncRole::Kind::kMember:
        FlushAndSendFinal(PeersOf({role_.hub}));
        complete = wait_for({role_.hub});
        break;
      case SyncRole::Kind::kHub: {
        // Members first: their last changes must reach the other hubs.
        complete = wait_for(role_.members);
        FlushAndSendFinal(PeersOf(role_.hubs));
        complete = wait_for(role_.hubs) && complete;
        FlushAndSendFinal(PeersOf(role_.members));
        complete = wait_for(role_.members) && complete;
        break;
      }
    }
    // Acknowledge what arrived last (peers wait for it); the mirror socket
    // lingers long enough to deliver it.
    Service();
    flushed_ = complete && AllFlushed();
    if (!flushed_) {
      std::string missing;
      for (const auto& peer : peers_) {
        if (!PeerFlushed(*peer)) {
          missing += (missing.empty() ? "" : ", ") + peer->name +
                     (peer->reachable ? "" : " (unreachable)");
        }
      }
      MLOG(WARNING) << "final flush incomplete with [" << missing
                    << "] after up to " << timeout_s
                    << " s: their last changes or ours may be missing there";
    }
    return flushed_;
  }

  double theta() const { return last_theta_; }
  std::optional<double> skew_knob() const {
    if (!skew_) return std::nullopt;
    // The period a site proposes is its own; the one in effect is agreed.
    if (skew_knob_ == SkewKnob::kAveragingPeriod) {
      return static_cast<double>(outer_->period());
    }
    return skew_->knob();
  }
  uint64_t bytes_sent() const {
    uint64_t total = 0;
    for (const auto& peer : peers_) total += peer->out.bytes_sent();
    return total;
  }
  int64_t slowest_peer_clock() const {
    return peers_.empty() ? local_clock_ : clocks_.Min();
  }

  int64_t ClockFloor() const {
    if (fault_.partition_policy() != pb::PARTITION_CONTINUE) return 0;
    int64_t slowest = std::numeric_limits<int64_t>::max();
    for (const auto& peer : peers_) {
      if (!peer->reachable || !peer->in.hello()) continue;
      slowest = std::min(slowest, clocks_.ClockOf(peer->name).value_or(0));
    }
    if (slowest == std::numeric_limits<int64_t>::max()) return 0;
    return std::max<int64_t>(
        0, slowest - static_cast<int64_t>(sync_.max_clock_skew()));
  }

  uint32_t unreachable_peers() const {
    return static_cast<uint32_t>(
        std::count_if(peers_.begin(), peers_.end(),
                      [](const auto& peer) { return !peer->reachable; }));
  }

  const FaultEventLog& events() const { return events_; }

  std::vector<SyncEngine::PeerCounters> peer_counters() const {
    std::vector<SyncEngine::PeerCounters> out;
    for (const auto& peer : peers_) {
      SyncEngine::PeerCounters counters;
      counters.site = peer->name;
      counters.bytes_sent = peer->out.bytes_sent();
      counters.bytes_received = peer->bytes_received;
      counters.messages_received = peer->messages_received;
      counters.connected = peer->in.hello();
      counters.clock = clocks_.ClockOf(peer->name).value_or(0);
      counters.reachable = peer->reachable;
      counters.retained_bytes = peer->out.retained_bytes();
      counters.backlog_bytes = peer->out.backlog_bytes();
      out.push_back(std::move(counters));
    }
    std::sort(out.begin(), out.end(),
              [](const auto& a, const auto& b) { return a.site < b.site; });
    return out;
  }

  pb::SyncSummary Summary() const {
    pb::SyncSummary summary;
    summary.set_clock(static_cast<uint32_t>(local_clock_));
    summary.set_final_theta(last_theta_);
    summary.set_bytes_sent(static_cast<double>(bytes_sent()));
    summary.set_updates_sent(static_cast<double>(updates_sent_));
    summary.set_updates_sent_between_clocks(
        static_cast<double>(updates_between_clocks_));
    summary.set_entries_sent(static_cast<double>(entries_sent_));
    summary.set_entries_received(static_cast<double>(entries_received_));
    summary.set_updates_received(static_cast<double>(updates_received_));
    summary.set_rejected(static_cast<double>(rejected_));
    summary.set_blocked_s(blocked_s_);
    summary.set_flushed(flushed_);
    double resent = 0, duplicates = 0, gaps = 0, unreachable = 0;
    for (const auto& peer : peers_) {
      resent += static_cast<double>(peer->out.messages_resent());
      duplicates += static_cast<double>(peer->in.duplicates());
      gaps += static_cast<double>(peer->in.gaps());
      unreachable += peer->unreachable_total_s +
                     (peer->reachable ? 0 : Now() - peer->unreachable_since_s);
    }
    summary.set_resent(resent);
    summary.set_duplicates_dropped(duplicates);
    summary.set_gaps(gaps);
    summary.set_unreachable_s(unreachable);
    for (const auto& peer : peers_) {
      if (peer->age.updates() > 0) {
        peer->age.Fill(peer->name, summary.add_remote_update_age());
      }
      if (peer->unsent_samples > 0) {
        pb::UnsentChange* unsent = summary.add_unsent_change();
        unsent->set_peer(peer->name);
        unsent->set_samples(peer->unsent_samples);
        unsent->set_mean_relative_norm(
            peer->unsent_sum / static_cast<double>(peer->unsent_samples));
        unsent->set_max_relative_norm(peer->unsent_max);
      }
    }
    FillSkewScout(&summary);
    std::map<pb::MessageType, uint64_t> sent = messages_sent_;
    for (const auto& peer : peers_)
      sent[pb::HEARTBEAT] += peer->out.heartbeats_sent();
    for (const auto& [type, count] : sent) {
      if (count == 0) continue;
      pb::MessageCount* out = summary.add_messages_sent();
      out->set_type(pb::MessageType_Name(type));
      out->set_count(count);
    }
    if (outer_) {
      pb::OuterStepSummary* diloco = summary.mutable_diloco();
      diloco->set_steps(outer_->steps());
      diloco->set_open_at_end(outer_->open_rounds());
      diloco->set_deferred(outer_deferred_count_);
      const OuterStepOptions& options = outer_->options();
      diloco->set_outer_lr(options.lr);
      diloco->set_outer_momentum(options.momentum);
      diloco->set_fragments(options.fragments);
      diloco->set_period(outer_->period());
      if (outer_->adaptive()) {
        diloco->set_adaptive_period(true);
        for (const OuterSteps::PeriodChange& change :
             outer_->period_changes()) {
          pb::OuterPeriodChange* out = diloco->add_period_changes();
          out->set_round(change.round);
          out->set_period(change.period);
        }
        diloco->set_rounds_dropped(outer_->rounds_dropped());
      }
      double squares = 0;
      for (float value : outer_->anchor()) {
        squares += static_cast<double>(value) * value;
      }
      diloco->set_anchor_norm(std::sqrt(squares));
    }
    return summary;
  }

  // ---- checkpoints ----------------------------------------------------------
  void SetOutgoingLog(SyncEngine::OutgoingLog log) {
    outgoing_log_ = std::move(log);
  }

  void EnableCheckpoints() {
    for (auto& peer : peers_) {
      peer->delivery.checkpointed = true;
      peer->in.SetCheckpointed(true);
    }
  }

  void SaveState(pb::SyncCheckpoint* out) const {
    out->Clear();
    out->set_local_clock(local_clock_);
    out->set_updates_sent(updates_sent_);
    out->set_entries_sent(entries_sent_);
    out->set_updates_received(updates_received_);
    out->set_entries_received(entries_received_);
    out->set_rejected(rejected_);
    out->set_blocked_s(blocked_s_);
    events_.CopyTo(out->mutable_events());
    SaveSkewScout(out);
    if (outer_) {
      outer_->SaveTo(out->mutable_outer());
      out->set_outer_deferred(outer_deferred_);
    }
    for (const auto& peer : peers_) {
      pb::PeerCheckpoint* saved = out->add_peers();
      saved->set_site(peer->name);
      OutboundChannel::State state = peer->out.Save();
      saved->set_next_sequence(state.next_sequence);
      saved->set_applied_sequence(state.applied_sequence);
      saved->set_durable_sequence(state.durable_sequence);
      for (RetainedMessage& message : state.retained) {
        pb::LoggedMessage* kept = saved->add_retained();
        kept->set_sequence(message.sequence);
        kept->set_header(std::move(message.header));
        for (std::string& frame : message.frames) {
          kept->add_frames(std::move(frame));
        }
      }
      saved->set_announced(peer->announced);
      saved->set_in_incarnation(peer->in.incarnation());
      saved->set_in_applied(peer->in.applied());
      saved->set_clock(clocks_.ClockOf(peer->name).value_or(0));
      saved->set_unreachable_s(peer->unreachable_total_s);
    }
  }

  std::vector<std::pair<std::string, size_t>> Accumulators() const {
    std::vector<std::pair<std::string, size_t>> out;
    if (!UsesAccumulators()) return out;
    for (const auto& peer : peers_) out.emplace_back(peer->name, peer->acc);
    return out;
  }

  void AppendArrays(std::vector<NamedArray>* arrays) const {
    if (outer_) outer_->AppendArrays(arrays);
  }

  Result<uint64_t> RestoreState(const pb::SyncCheckpoint& state,
                                std::span<const pb::LoggedMessage> logged,
                                const Checkpoint* arrays) {
    if (outer_ && state.has_outer()) {
      if (arrays == nullptr) {
        return DataLossError(
            "the outer rounds' state (DILOCO, "
            "MODEL_AVERAGING) needs the checkpoint's arrays");
      }
      MERIDIAN_RETURN_IF_ERROR(outer_->RestoreFrom(state.outer(), *arrays));
      outer_deferred_ = state.outer_deferred();
    }
    local_clock_ = state.local_clock();
    updates_sent_ = state.updates_sent();
    entries_sent_ = state.entries_sent();
    updates_received_ = state.updates_received();
    entries_received_ = state.entries_received();
    rejected_ = state.rejected();
    blocked_s_ = state.blocked_s();
    events_.Restore(state.events());
    RestoreSkewScout(state);
    for (const pb::PeerCheckpoint& saved : state.peers()) {
      Peer* peer = PeerNamed(saved.site());
      if (peer == nullptr) {
        return FailedPreconditionError(
            "the checkpoint has state of site '" + saved.site() +
            "', which this site does not sync with (its peers: " + PeerList() +
            "): was the job file's topology changed?");
      }
      OutboundChannel::State channel;
      channel.next_sequence = saved.next_sequence();
      channel.applied_sequence = saved.applied_sequence();
      channel.durable_sequence = saved.durable_sequence();
      for (const pb::LoggedMessage& kept : saved.retained()) {
        channel.retained.push_back(Retained(kept));
      }
      peer->out.Restore(std::move(channel));
      peer->announced = saved.announced();
      if (saved.in_incarnation() != 0) {
        peer->in.Restore(saved.in_incarnation(), saved.in_applied());
      }
      MERIDIAN_RETURN_IF_ERROR(clocks_.Reset(peer->name, saved.clock()));
      peer->unreachable_total_s = saved.unreachable_s();
    }
    uint64_t retracted = 0;
    for (const pb::LoggedMessage& record : logged) {
      Peer* peer = PeerNamed(record.peer());
      if (peer == nullptr) {
        return DataLossError("the outgoing log has a message for site '" +
                             record.peer() +
                             "', which this site does not sync with");
      }
      pb::Header header;
      if (!header.ParseFromString(record.header())) {
        return DataLossError("the outgoing log has a message for site '" +
                             record.peer() + "' whose header does not parse");
      }
      if (record.sequence() < peer->out.last_sequence() + 1) continue;
      peer->out.RestoreLogged(Retained(record));
      if (header.type() == pb::MIRROR_CLOCK) {
        peer->announced = std::max(peer->announced, header.clock());
        local_clock_ = std::max(local_clock_, header.mirror_clock().clock());
      } else if (outer_ && header.type() == pb::MIRROR_UPDATE &&
                 header.mirror_update().average()) {
        // This site's outer gradient left after the checkpoint: the peers
        // add it to their round, so it must be in ours too. The workers'
        // commits from now on are measured from the restored model.
        MERIDIAN_RETURN_IF_ERROR(RecoverOuterGradient(header, record));
      } else if (header.type() == pb::MIRROR_UPDATE &&
                 !header.mirror_update().average()) {
        MERIDIAN_RETURN_IF_ERROR(
            DecodeUpdate(header, record.frames())
                .WithContext("the outgoing log's message " +
                             std::to_string(record.sequence()) + " for site '" +
                             record.peer() + "'"));
        DecodedUpdate& taken_back = codec_->decoded();
        for (float& value : taken_back.values) value = -value;
        store_->AddToAccumulator(peer->acc, taken_back.indices,
                                 taken_back.values);
        ++retracted;
      }
    }
    return retracted;
  }

  Status RecoverOuterGradient(const pb::Header& header,
                              const pb::LoggedMessage& record) {
    const int64_t round = header.mirror_update().outer_round();
    if (outer_->HasOwn(round)) return Status::Ok();  // sent to every peer
    std::optional<uint32_t> fragment = outer_->FragmentOfTag(round);
    const std::string where = "the outgoing log's outer gradient " +
                              std::to_string(record.sequence()) +
                              " for site '" + record.peer() + "'";
    if (!fragment) {
      return DataLossError(where + " names round " + std::to_string(round) +
                           ", at which no round starts");
    }
    MERIDIAN_RETURN_IF_ERROR(
        DecodeUpdate(header, record.frames()).WithContext(where));
    const KeyRange range = outer_->RangeOf(*fragment);
    std::vector<float> decoded;
    MERIDIAN_RETURN_IF_ERROR(ScatterRange(range, &decoded).WithContext(where));
    std::vector<float> model(store_->num_elements());
    store_->Snapshot(model);
    // The site had reached the round's clock (it may have died before
    // announcing it).
    local_clock_ = std::max(local_clock_, round);
    return outer_
        ->AddOwn(round, decoded,
                 std::span<const float>(model).subspan(range.begin,
                                                       range.end - range.begin),
                 header.mirror_update().next_period())
        .WithContext(where);
  }

  void NoteDurable(const pb::SyncCheckpoint& saved) {
    for (const pb::PeerCheckpoint& state : saved.peers()) {
      Peer* peer = PeerNamed(state.site());
      if (peer == nullptr) continue;
      // What arrived since the snapshot is not in that checkpoint.
      peer->in.NoteDurable(state.in_applied(),
                           BytesAppliedAfter(*peer, state.in_applied()));
    }
  }

  bool CheckpointWanted() const {
    for (const auto& peer : peers_) {
      if (2 * peer->in.bytes_since_durable() >
          peer->delivery.retention_limit_bytes) {
        return true;
      }
    }
    return false;
  }

 private:
  double Now() const { return clock_->NowSeconds(); }

  static RetainedMessage Retained(const pb::LoggedMessage& kept) {
    RetainedMessage message;
    message.sequence = kept.sequence();
    message.header = kept.header();
    message.bytes = message.header.size();
    for (const std::string& frame : kept.frames()) {
      message.frames.push_back(frame);
      message.bytes += frame.size();
    }
    return message;
  }

  // Bytes the site applied from `peer` after its message `sequence` (what
  // a checkpoint holding messages up to `sequence` does not hold). The
  // engine does not keep per-message sizes: it counts everything applied
  // since as after, erring towards an earlier checkpoint.
  uint64_t BytesAppliedAfter(const Peer& peer, uint64_t sequence) const {
    return peer.in.applied() > sequence ? peer.in.bytes_since_durable() : 0;
  }

  // ---- naming ---------------------------------------------------------------
  std::vector<std::string> PeerNames() const {
    std::vector<std::string> names;
    for (int peer : role_.Peers()) names.push_back(job_.site(peer).name());
    return names;
  }

  std::string PeerList() const {
    std::string out;
    for (const std::string& name : PeerNames()) {
      out += (out.empty() ? "" : ", ") + name;
    }
    return out.empty() ? "nobody" : out;
  }

  // The largest frame a peer may send (ZMQ_MAXMSGSIZE of the mirror
  // socket): a header, or one tensor's CODEC_PIPELINE buffer, which is at
  // most twice its dense bytes (index + value per element) plus the
  // buffer's own header. A bigger frame drops the connection before
  // ZeroMQ allocates it.
  int64_t MaxMirrorFrameBytes() const {
    constexpr uint64_t kPipelineHeaderSlack = 64 << 10;
    const uint64_t largest =
        store_->layout().LargestTensorSize() * sizeof(float);
    return static_cast<int64_t>(std::max<uint64_t>(
        2 * largest + kPipelineHeaderSlack, kMaxHeaderBytes));
  }

  std::string RoleName() const {
    switch (role_.kind) {
      case SyncRole::Kind::kMesh:
        return "mesh node";
      case SyncRole::Kind::kHub:
        return "hub";
      case SyncRole::Kind::kMember:
        return "member of hub '" + job_.site(role_.hub).name() + "'";
    }
    return "?";
  }

  Peer* PeerNamed(const std::string& site) {
    for (auto& peer : peers_) {
      if (peer->name == site) return peer.get();
    }
    return nullptr;
  }

  std::vector<Peer*> PeersOf(const std::vector<int>& sites) {
    std::vector<Peer*> selected;
    for (auto& peer : peers_) {
      if (std::find(sites.begin(), sites.end(), peer->site) != sites.end()) {
        selected.push_back(peer.get());
      }
    }
    return selected;
  }

  bool IsMember(int site) const {
    return std::find(role_.members.begin(), role_.members.end(), site) !=
           role_.members.end();
  }
  bool IsHub(int site) const {
    return std::find(role_.hubs.begin(), role_.hubs.end(), site) !=
           role_.hubs.end();
  }

  // The peers whose accumulators a change received from `from` goes into:
  // a hub passes a member's changes on to the other hubs and the other
  // members, and a hub's changes to its members. Mesh nodes and members
  // relay nothing.
  std::vector<size_t> RelayTargets(int from) const {
    std::vector<size_t> targets;
    if (role_.kind != SyncRole::Kind::kHub) return targets;
    for (const auto& peer : peers_) {
      if (peer->site == from) continue;
      if (IsMember(from) || IsMember(peer->site)) targets.push_back(peer->acc);
    }
    return targets;
  }

  // ---- liveness -----------------------------------------------------------
  // Whether the DS bound waits for `peer`.
  bool Bounding(const Peer& peer) const {
    if (fault_.partition_policy() == pb::PARTITION_BLOCK) return true;
    return peer.reachable && !peer.catching_up && !Silent(peer);
  }

  // Seconds since anything was heard from `peer` (its messages, its
  // acknowledgements), counted from no earlier than the liveness floor.
  double SilentFor(const Peer& peer) const {
    return Now() - std::max({peer.in.last_heard_s(), peer.out.last_ack_s(),
                             liveness_floor_s_});
  }

  // Silent for more than a few heartbeat intervals: a live peer is heard
  // at least every interval (it acknowledges that often). Under
  // PARTITION_CONTINUE the DS bound stops waiting for it right away — the
  // site does not stall for peer_timeout_s before the peer is declared
  // unreachable — and its link no longer steers the threshold.
  bool Silent(const Peer& peer) const {
    return training_ &&
           SilentFor(peer) >
               std::max(kSilentHeartbeats * fault_.heartbeat_interval_s(), 1.0);
  }

  // The slowest clock the DS bound counts (this site's own when none).
  int64_t BoundingClock() const {
    int64_t slowest = std::numeric_limits<int64_t>::max();
    for (const auto& peer : peers_) {
      if (Bounding(*peer)) {
        slowest = std::min(slowest, clocks_.ClockOf(peer->name).value_or(0));
      }
    }
    return slowest == std::numeric_limits<int64_t>::max() ? local_clock_
                                                          : slowest;
  }

  // Whether changes and clocks are created for `peer` now.
  bool Sendable(const Peer& peer) const {
    return peer.reachable && !peer.final_sent;
  }

  void RecordEvent(pb::FaultKind kind, const std::string& subject,
                   const std::string& detail, double duration_s = 0) {
    events_.Record(kind, subject, detail, duration_s);
  }

  // Anything from `peer` (a message on the mirror socket, an ack on the
  // channel) proves it is there.
  void HeardFrom(Peer& peer) {
    if (peer.reachable) return;
    const double now = Now();
    const double out_s = now - peer.unreachable_since_s;
    peer.reachable = true;
    peer.unreachable_total_s += out_s;
    peer.catching_up = fault_.partition_policy() == pb::PARTITION_CONTINUE;
    MLOG(INFO) << "site '" << peer.name << "' is reachable again after "
               << out_s << " s"
               << (peer.catching_up ? "; outside the DS bound until it has "
                                      "caught up"
                                    : "");
    RecordEvent(pb::PEER_REACHABLE, "site '" + peer.name + "'",
                "unreachable for " + std::to_string(out_s) + " s", out_s);
    UpdateCatchingUp(peer);
  }

  void UpdateCatchingUp(Peer& peer) {
    if (!peer.catching_up) return;
    if (clocks_.ClockOf(peer.name).value_or(0) >=
        local_clock_ - static_cast<int64_t>(sync_.max_clock_skew())) {
      peer.catching_up = false;
      MLOG(INFO) << "site '" << peer.name << "' caught up (clock "
                 << clocks_.ClockOf(peer.name).value_or(0)
                 << "): within the DS bound again";
    }
  }

  void CheckLiveness(Peer& peer, double now) {
    // Also while finishing: the final flush stops waiting for a peer that
    // went silent.
    if (!peer.reachable || !training_) return;
    const double silent_s = SilentFor(peer);
    if (silent_s <= fault_.peer_timeout_s()) return;
    peer.reachable = false;
    peer.catching_up = false;
    peer.unreachable_since_s = now;
    const char* policy =
        fault_.partition_policy() == pb::PARTITION_CONTINUE
            ? "training goes on; its changes wait until it is back"
            : "the DS bound still waits for it (PARTITION_BLOCK)";
    MLOG(WARNING) << "site '" << peer.name << "' is unreachable: nothing "
                  << "heard for " << silent_s << " s; " << policy;
    RecordEvent(pb::PEER_UNREACHABLE, "site '" + peer.name + "'",
                std::string("silent for more than ") +
                    std::to_string(fault_.peer_timeout_s()) + " s; " + policy);
  }

  // Every turn of the event loop: liveness, the channels' sending and
  // heartbeats, and acknowledgements that are due.
  void Service() {
    const double now = Now();
    // A stalled event loop (the process was stopped, or starved) heard
    // nothing meanwhile: give every peer a fresh window rather than declare
    // them all unreachable at once.
    const double stall = std::max(1.0, fault_.peer_timeout_s() / 2);
    if (last_service_s_ >= 0 && now - last_service_s_ > stall) {
      MLOG(WARNING) << "the event loop did not run for "
                    << now - last_service_s_
                    << " s: peers get a fresh liveness window";
      liveness_floor_s_ = now;
    }
    last_service_s_ = now;
    if (training_ && !outer_ && sync_.send_period_s() > 0 &&
        now - last_send_s_ >= sync_.send_period_s()) {
      last_send_s_ = now;
      const uint64_t before = updates_sent_;
      SendSignificantToPeers(Theta(local_clock_));
      updates_between_clocks_ += updates_sent_ - before;
    }
    for (auto& peer : peers_) {
      CheckLiveness(*peer, now);
      // Announcements are level-triggered, not only sent at a local
      // clock: one a channel missed while its peer was unreachable, or
      // one that came due without a local clock (a hub's slowest member
      // went silent), goes out as soon as the peer can take it. Sites
      // whose DS bounds wait on each other's clocks would otherwise wait
      // for good (each held at the clock it last reached).
      if (training_) AnnounceClock(*peer, /*changes_first=*/true);
      peer->out.Pump(now);
      if (std::optional<pb::MirrorAck> ack =
              peer->in.AckDue(now, clocks_.ClockOf(peer->name).value_or(0))) {
        SendAck(*peer, *ack);
      }
    }
  }

  void SendAck(Peer& peer, const pb::MirrorAck& ack) {
    if (peer.routing_id.empty()) return;  // no connection to answer on
    pb::Header header = MakeHeader(pb::MIRROR_ACK, self_, 0);
    *header.mutable_mirror_ack() = ack;
    // Best effort: a lost or unroutable ack is sent again later.
    if (SendMessage(mirror_, header, {}, peer.routing_id).ok()) {
      ++messages_sent_[pb::MIRROR_ACK];
    }
  }

  // ---- thresholds and budgets -------------------------------------------
  uint64_t RetentionLimit() const {
    if (fault_.has_retention_limit()) {
      Result<uint64_t> limit = wan::ParseByteSize(fault_.retention_limit());
      if (limit.ok()) return *limit;
    }
    const uint64_t model_bytes = store_->num_elements() * sizeof(float);
    return std::max<uint64_t>(uint64_t{4} << 20, 4 * model_bytes);
  }

  // The link budget in bytes/s: sync.bandwidth_budget, else the emulated
  // bandwidth of the direction towards `peer`; 0 when neither is known.
  double LinkBudget(int peer) const {
    if (sync_.has_bandwidth_budget()) {
      Result<double> budget = wan::ParseBandwidth(sync_.bandwidth_budget());
      return budget.ok() ? *budget / 8 : 0;
    }
    Result<std::vector<wan::LinkModel>> links = wan::ResolveJobLinks(job_);
    if (!links.ok()) return 0;
    const std::string& other = job_.site(peer).name();
    for (const wan::LinkModel& link : *links) {
      if (link.a == name_ && link.b == other) {
        return link.a_to_b.bandwidth_bps / 8;
      }
      if (link.b == name_ && link.a == other) {
        return link.b_to_a.bandwidth_bps / 8;
      }
    }
    return 0;
  }

  double Theta(int64_t clock) {
    if (sync_.kind() == pb::DENSE) return 0;
    double theta =
        schedule_.At(static_cast<uint64_t>(std::max<int64_t>(clock, 1)));
    // SkewScout's controller sets the threshold (a flush clock stays 0).
    if (skew_ && skew_knob_ == SkewKnob::kTheta && theta > 0) {
      theta = skew_->knob();
    }
    if (theta > 0) {
      double adjustment = 0;
      for (const auto& peer : peers_) {
        // An unreachable or silent link says nothing about what the
        // others carry.
        if (peer->adaptive && peer->reachable && !Silent(*peer)) {
          adjustment = std::max(adjustment, peer->adaptive->adjustment());
        }
      }
      theta += adjustment;
    }
    last_theta_ = theta;
    return theta;
  }

  // Feeds each link's controller with what its channel sent, what the
  // peer acknowledged and what is still on the way since the last clock.
  void ObserveBandwidth() {
    const double now = Now();
    for (auto& peer : peers_) {
      if (!peer->adaptive) continue;
      const uint64_t sent = peer->out.bytes_sent();
      if (Silent(*peer)) {
        // Nothing is known of its link now; it starts afresh when heard.
        peer->adaptive->Reset();
      } else if (peer->reachable) {
        peer->adaptive->ObserveDelivery(
            sent - peer->period_sent, now - peer->period_start_s,
            peer->period_congested || peer->out.Saturated(now));
      }
      peer->period_sent = sent;
      peer->period_start_s = now;
      peer->period_congested = false;
    }
  }

  // ---- sending ------------------------------------------------------------
  // Connects the channel and introduces this site on it, once. Channels
  // open when training starts, or earlier when a hub must relay a member's
  // update before its own workers have joined.
  Status Open(Peer& peer) {
    if (peer.out.attached()) return Status::Ok();
    auto socket = std::make_unique<zmq::socket_t>(*options_.context,
                                                  zmq::socket_type::dealer);
    try {
      socket->set(zmq::sockopt::linger, 0);
      socket->set(zmq::sockopt::sndhwm, kChannelHighWaterMark);
      // The same id after every reconnect of this process: the peer keeps
      // the channel's state across broken connections.
      char id[64];
      std::snprintf(id, sizeof(id), "%s#%016llx", name_.c_str(),
                    static_cast<unsigned long long>(incarnation_));
      socket->set(zmq::sockopt::routing_id, std::string(id));
      if (curve_) {
        const std::string& peer_key = curve_->peers.at(peer.name);
        MERIDIAN_RETURN_IF_ERROR(
            MakeCurveClient(*socket, curve_->own, peer_key)
                .WithContext("channel to site '" + peer.name + "'"));
      }
      socket->connect(peer.endpoint);
    } catch (const zmq::error_t& error) {
      return InvalidArgumentError("cannot connect to site '" + peer.name +
                                  "' at '" + peer.endpoint +
                                  "': " + error.what());
    }
    const double budget = LinkBudget(peer.site);
    if (sync_.adaptive_threshold()) {
      peer.adaptive.emplace(budget, sync_.adaptive_step(),
                            sync_.adaptive_max() - sync_.threshold());
    }
    peer.period_start_s = Now();
    pb::Header hello = MakeHeader(pb::MIRROR_HELLO, self_, 0);
    LayoutToSpecs(store_->layout(), hello.mutable_mirror_hello()->mutable_layout());
    hello.mutable_mirror_hello()->set_clock(local_clock_);
    peer.out.Attach(std::move(socket), std::move(hello), Now());
    MLOG(INFO) << "connected to site '" << peer.name << "' at "
               << peer.endpoint;
    return Status::Ok();
  }

  void Send(Peer& peer, pb::Header header, std::vector<std::string> frames) {
    if (!peer.out.attached()) {
      if (Status status = Open(peer); !status.ok()) {
        // Kept: the channel retains it and sends it once it can connect.
        MLOG(ERROR) << status << "; the update waits";
      }
    }
    if (outgoing_log_) LogOutgoing(peer, &header, frames);
    ++messages_sent_[header.type()];
    peer.out.Enqueue(std::move(header), std::move(frames), Now());
  }

  // Writes the message about to be sent to the outgoing log, numbered as
  // the channel will number it.
  void LogOutgoing(const Peer& peer, pb::Header* header,
                   const std::vector<std::string>& frames) {
    header->set_sequence(peer.out.last_sequence() + 1);
    pb::LoggedMessage record;
    record.set_peer(peer.name);
    record.set_sequence(header->sequence());
    header->SerializeToString(record.mutable_header());
    for (const std::string& frame : frames) record.add_frames(frame);
    if (Status status = outgoing_log_(record); !status.ok()) {
      ++log_failures_;
      if (log_failures_ == 1 || log_failures_ % 1000 == 0) {
        MLOG(ERROR) << "cannot log the outgoing update (" << log_failures_
                    << " so far): " << status
                    << "; sent anyway: should this site crash before its "
                       "next checkpoint, replicas may differ";
      }
    }
  }

  // Sends `update` to `peer` as a MIRROR_UPDATE (or MIRROR_INDICES), tagged
  // with the clock it belongs to (the one after the last announced);
  // `outer_round`: the round of an outer gradient (DILOCO, MODEL_AVERAGING;
  // 0: none); `next_period`: the averaging period this site proposes with
  // it (an adaptive period; 0: none).
  void SendUpdate(const EncodedSlices& update, pb::MessageType type,
                  const std::string& origin, bool average, Peer& peer,
                  int64_t outer_round = 0, uint32_t next_period = 0) {
    if (update.empty() || peer.final_sent) return;
    pb::Header header = MakeHeader(type, self_, 0);
    header.set_clock(peer.announced + 1);
    for (const pb::TensorSlice& slice : update.slices) {
      *header.add_slices() = slice;
    }
    pb::MirrorUpdate* body = header.mutable_mirror_update();
    body->set_origin_site(origin);
    body->set_entries(update.entries);
    body->set_average(average);
    if (outer_round != 0) body->set_outer_round(outer_round);
    if (next_period != 0) body->set_next_period(next_period);
    if (type == pb::MIRROR_UPDATE) {
      const double now = options_.wall_clock->UnixSeconds();
      body->set_sent_unix_us(static_cast<int64_t>(now * 1e6));
      body->set_window_start_unix_us(
          static_cast<int64_t>(peer.window_start_unix_s * 1e6));
      peer.window_start_unix_s = now;
    }
    Send(peer, std::move(header), update.frames);
    if (type == pb::MIRROR_UPDATE) {
      ++updates_sent_;
      entries_sent_ += update.entries;
    }
  }

  // What passes the threshold for each peer that can take it now, out of
  // its accumulator. A hub's members get theirs when their channel's clock
  // advances (AnnounceClocks), which may wait for the slowest site.
  void SendLocalChanges(double theta) {
    ObserveBandwidth();
    SendSignificantToPeers(theta);
  }

  // A hub's members get their share of the group's sum with each clock
  // announcement (AnnounceClock), not here.
  void SendSignificantToPeers(double theta) {
    for (auto& peer : peers_) {
      if (role_.kind == SyncRole::Kind::kHub && IsMember(peer->site)) continue;
      SendSignificant(*peer, theta);
    }
  }

  void SendSignificant(Peer& peer, double theta) {
    // An unreachable peer, one whose channel holds all it may, or whose
    // link has as much on the way as it delivers in a couple of seconds,
    // gets its changes later: they stay (and merge) in its accumulator.
    if (!Sendable(peer) || peer.out.full()) return;
    if (peer.out.congested()) {
      peer.period_congested = true;
      return;
    }
    SendWithBarrier(
        codec_->Take(*store_, peer.acc, theta, sync_.threshold_mode(),
                     UpdateCodec::Fidelity::kConfigured),
        peer);
  }

  void SendWithBarrier(const EncodedSlices& update, Peer& peer) {
    if (update.empty()) return;
    if (sync_.selective_barrier_fraction() > 0 &&
        static_cast<double>(update.entries) >
            sync_.selective_barrier_fraction() *
                static_cast<double>(store_->num_elements())) {
      SendUpdate(codec_->IndicesOnly(update), pb::MIRROR_INDICES, name_, false,
                 peer);
    }
    SendUpdate(update, pb::MIRROR_UPDATE, name_, false, peer);
  }

  // Sends the clock announcement that became due on each channel (one
  // message, however far the clock moved). A hub first sends a member what
  // of its sum is significant, so the clock still follows the updates it
  // covers.
  void AnnounceClocks() {
    for (auto& peer : peers_) AnnounceClock(*peer, /*changes_first=*/false);
  }

  // Sends `peer` the clock announcement due on its channel, if any.
  // `changes_first`: what of its accumulator is significant goes before
  // it, as at a local clock (whose changes were just sent otherwise); a
  // hub's member always gets its share of the sum first.
  void AnnounceClock(Peer& peer, bool changes_first) {
    const int64_t due = DueClock(peer);
    if (peer.announced >= due || !Sendable(peer)) return;
    const bool member =
        role_.kind == SyncRole::Kind::kHub && IsMember(peer.site);
    if (member || (changes_first && !outer_)) {
      SendSignificant(peer, Theta(local_clock_));
    }
    peer.announced = due;
    pb::Header header = MakeHeader(pb::MIRROR_CLOCK, self_, 0);
    header.set_clock(due);
    header.mutable_mirror_clock()->set_clock(due);
    header.mutable_mirror_clock()->set_relayed(role_.kind ==
                                               SyncRole::Kind::kHub);
    Send(peer, std::move(header), {});
  }

  // The clock a channel should have announced by now: the local clock for
  // a mesh node or member; for a hub, the slowest of its group towards
  // other hubs, and the slowest of everyone towards its members (sites the
  // DS bound does not wait for do not hold the announcements back).
  int64_t DueClock(const Peer& peer) const {
    if (role_.kind != SyncRole::Kind::kHub) return local_clock_;
    auto slowest = [&](const std::vector<int>& sites, int64_t start) {
      int64_t clock = start;
      for (int site : sites) {
        const Peer* other = ConstPeerAt(site);
        if (other != nullptr && !Bounding(*other)) continue;
        clock = std::min(clock,
                         clocks_.ClockOf(job_.site(site).name()).value_or(0));
      }
      return clock;
    };
    const int64_t group = slowest(role_.members, local_clock_);
    if (IsHub(peer.site)) return group;
    return slowest(role_.hubs, group);
  }

  const Peer* ConstPeerAt(int site) const {
    for (const auto& peer : peers_) {
      if (peer->site == site) return peer.get();
    }
    return nullptr;
  }

  // The end of the job towards `targets`: everything left in their
  // accumulators losslessly, then the final clock. Sent even to an
  // unreachable peer or a full channel: it waits in the retention.
  void FlushAndSendFinal(const std::vector<Peer*>& targets) {
    for (Peer* peer : targets) {
      if (peer->final_sent) continue;
      if (UsesAccumulators()) {
        const EncodedSlices update =
            codec_->Take(*store_, peer->acc, 0.0, sync_.threshold_mode(),
                         UpdateCodec::Fidelity::kLossless);
        SendUpdate(update, pb::MIRROR_UPDATE, name_, false, *peer);
      }
      ++peer->announced;
      pb::Header header = MakeHeader(pb::MIRROR_CLOCK, self_, 0);
      header.set_clock(peer->announced);
      header.mutable_mirror_clock()->set_clock(peer->announced);
      header.mutable_mirror_clock()->set_final(true);
      Send(*peer, std::move(header), {});
      peer->final_sent = true;
      peer->final_sequence = peer->out.last_sequence();
    }
  }

  // Whether the final exchange with `peer` is complete: its final flush
  // arrived and ours was acknowledged.
  bool PeerFlushed(const Peer& peer) const {
    return peer.final_received && peer.final_sent &&
           peer.out.Delivered(peer.final_sequence);
  }

  bool AllFlushed() const {
    return std::all_of(peers_.begin(), peers_.end(),
                       [&](const auto& peer) { return PeerFlushed(*peer); });
  }

  // Whether Finish may stop waiting for `sites`: each is flushed (for the
  // sites this one has sent its final to) or has sent its final, or is
  // unreachable (waiting would only hold everyone else's results).
  bool Done(const std::vector<int>& sites) const {
    for (int site : sites) {
      const Peer* peer = ConstPeerAt(site);
      if (peer == nullptr || !peer->reachable) continue;
      if (!peer->final_received) return false;
      if (peer->final_sent && !peer->out.Delivered(peer->final_sequence)) {
        return false;
      }
    }
    return true;
  }

  // ---- receiving ----------------------------------------------------------
  void PollOnce() {
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

  void DrainMirror() {
    while (true) {
      Result<Received> received =
          ReceiveMessage(mirror_, true, std::chrono::milliseconds(0));
      if (!received.ok() || received->timed_out()) return;
      if (received->refused) {
        Refuse(received->refused->routing_id, received->refused->header,
               received->refused->rejection);
        continue;
      }
      HandleMirror(*received->message);
    }
  }

  // What comes back on our outgoing channel: acknowledgements, and errors
  // about what we sent.
  void DrainChannel(Peer& peer) {
    while (true) {
      Result<Received> received = ReceiveMessage(*peer.out.socket(), false,
                                                 std::chrono::milliseconds(0));
      if (!received.ok() || received->timed_out()) return;
      if (!received->message) continue;
      const pb::Header& header = received->message->header;
      if (header.sender().site() != peer.name) continue;
      if (header.type() == pb::MIRROR_ACK) {
        HeardFrom(peer);
        const uint64_t resends = peer.out.resend_requests();
        peer.out.OnAck(header.mirror_ack(), Now());
        if (peer.out.resend_requests() > resends) {
          MLOG(WARNING) << "site '" << peer.name << "' missed messages after "
                        << header.mirror_ack().applied_sequence()
                        << ": sending them again";
          RecordEvent(
              pb::MESSAGES_RESENT, "site '" + peer.name + "'",
              "resend from sequence " +
                  std::to_string(header.mirror_ack().applied_sequence() + 1));
        }
      } else if (header.type() == pb::ERROR) {
        MLOG(ERROR) << "site '" << peer.name << "' refused our message: "
                    << pb::ErrorCode_Name(header.error().code()) << ": "
                    << header.error().message();
      }
    }
  }

  void Refuse(const std::string& routing_id, const pb::Header& header,
              const Rejection& rejection) {
    ++rejected_;
    RefuseMessage(mirror_, self_, ++error_sequence_, routing_id, header,
                  rejection);
  }

  void SendRefusal(const std::string& routing_id, const pb::Header& header,
                   const Rejection& rejection) {
    if (Status status = SendError(mirror_, self_, ++error_sequence_, rejection,
                                  header.sequence(), routing_id);
        !status.ok()) {
      MLOG(WARNING) << "cannot send the error reply: " << status;
    }
  }

  void HandleMirror(Envelope& message) {
    const pb::Header& header = message.header;
    const std::string& site = header.sender().site();
    Peer* found = header.sender().role() == pb::ROLE_SITE_SERVER
                      ? PeerNamed(site)
                      : nullptr;
    if (found == nullptr) {
      return Refuse(
          message.routing_id, header,
          {pb::ERROR_UNKNOWN_SENDER,
           "'" + Sanitized(site, 64) + "' is not a site that '" + name_ +
               "' syncs with (its peers: " + PeerList() + ")"});
    }
    if (curve_ && message.user_id != site) {
      // Any listed key is admitted; a peer may speak only for its own site.
      return Refuse(
          message.routing_id, header,
          {pb::ERROR_UNKNOWN_SENDER,
           "a connection authenticated as site '" + message.user_id +
               "' sent a message as site '" + Sanitized(site, 64) + "'"});
    }
    Peer& peer = *found;
    peer.bytes_received += header.ByteSizeLong();
    for (const zmq::message_t& frame : message.payload) {
      peer.bytes_received += frame.size();
    }
    ++peer.messages_received;
    HeardFrom(peer);
    const double now = Now();
    switch (header.type()) {
      case pb::MIRROR_HELLO:
        return HandleHello(message, peer);
      case pb::HEARTBEAT:
        if (!Introduced(message, peer)) return;
        peer.in.OnHeartbeat(header.heartbeat().last_sequence(), now);
        return;
      case pb::MIRROR_CLOCK:
      case pb::MIRROR_UPDATE:
      case pb::MIRROR_INDICES:
      case pb::MIRROR_TRAVEL:
      case pb::MIRROR_TRAVEL_RESULT:
        break;
      default:
        return Refuse(
            message.routing_id, header,
            {pb::ERROR_UNEXPECTED, pb::MessageType_Name(header.type()) +
                                       " is not served on the mirror socket"});
    }
    if (!Introduced(message, peer)) return;
    switch (peer.in.Admit(header.sequence(), now)) {
      case InboundChannel::Admission::kDuplicate:
      case InboundChannel::Admission::kGap:
        return;  // applied before / asked for again (mirror_delivery.h)
      case InboundChannel::Admission::kApply:
        break;
    }
    // Applied or refused, the message is done: a refused one would be
    // refused again.
    uint64_t bytes = header.ByteSizeLong();
    for (const zmq::message_t& frame : message.payload) bytes += frame.size();
    peer.in.Applied(header.sequence(), bytes);
    if (peer.final_received) {
      return Refuse(message.routing_id, header,
                    {pb::ERROR_UNEXPECTED,
                     "site '" + site + "' already sent its final flush"});
    }
    switch (header.type()) {
      case pb::MIRROR_CLOCK:
        return HandleClock(message, peer);
      case pb::MIRROR_TRAVEL:
        return HandleTravel(message, peer);
      case pb::MIRROR_TRAVEL_RESULT:
        return HandleTravelResult(message, peer);
      default:
        return HandleUpdate(message, peer);
    }
  }

  // ---- SkewScout: model travelling --------------------------------------
  // Sends the model to the next peer in turn that can take it and has
  // answered the last travel (or not for two periods: that one is given
  // up). Coded with skewscout.travel_value_coding; on the numbered
  // channel, so it is counted, logged and delivered once like any update,
  // and never applied by the receiver.
  void Travel(int64_t clock) {
    const int64_t period = skew_->travel_period();
    for (size_t tried = 0; tried < peers_.size(); ++tried) {
      Peer& peer = *peers_[next_travel_peer_++ % peers_.size()];
      if (!Sendable(peer) || peer.out.full() || !peer.in.hello()) continue;
      if (peer.travel_outstanding != 0 &&
          clock - peer.travel_sent_clock < 2 * period) {
        continue;
      }
      if (peer.travel_outstanding != 0) ++travels_unanswered_;
      travel_model_.resize(store_->num_elements());
      store_->Snapshot(travel_model_);
      const EncodedSlices encoded =
          codec_->EncodeTravel(*store_, travel_model_);
      pb::Header header = MakeHeader(pb::MIRROR_TRAVEL, self_, 0);
      header.set_clock(clock);
      for (const pb::TensorSlice& slice : encoded.slices) {
        *header.add_slices() = slice;
      }
      const uint64_t id = (incarnation_ << 32) + ++travels_sent_;
      header.mutable_mirror_travel()->set_travel_id(id);
      header.mutable_mirror_travel()->set_clock(clock);
      travel_bytes_ +=
          static_cast<double>(header.ByteSizeLong() + encoded.bytes);
      peer.travel_outstanding = id;
      peer.travel_sent_clock = clock;
      Send(peer, std::move(header), encoded.frames);
      return;
    }
  }

  // A peer's model to score: checked like an update that must carry every
  // element, decoded into a model-sized copy that only the evaluator sees.
  void HandleTravel(Envelope& message, Peer& peer) {
    const pb::Header& header = message.header;
    if (!options_.score_travelled || !sync_.skewscout().enabled()) {
      return Refuse(
          message.routing_id, header,
          {pb::ERROR_UNEXPECTED, "site '" + name_ +
                                     "' does not score travelled models "
                                     "(sync.skewscout is off)"});
    }
    if (Check check = CheckAndDecode(message, /*whole_model=*/true);
        !check.ok()) {
      return Refuse(message.routing_id, header, check.rejection());
    }
    const DecodedUpdate& received = codec_->decoded();
    const uint64_t n = store_->num_elements();
    bool whole = received.indices.size() == n;
    for (uint64_t i = 0; whole && i < n; ++i) whole = received.indices[i] == i;
    if (!whole) {
      return Refuse(message.routing_id, header,
                    {pb::ERROR_MALFORMED,
                     "a travelled model must carry every element once (got " +
                         std::to_string(received.indices.size()) + " of " +
                         std::to_string(n) + ")"});
    }
    std::vector<float> model(received.values.begin(), received.values.end());
    if (options_.score_travelled(peer.name, header.mirror_travel().travel_id(),
                                 header.mirror_travel().clock(),
                                 std::move(model))) {
      ++travels_accepted_;
    } else {
      ++travels_dropped_;
    }
  }

  void HandleTravelResult(const Envelope& message, Peer& peer) {
    const pb::MirrorTravelResult& result =
        message.header.mirror_travel_result();
    if (!skew_) {
      return Refuse(message.routing_id, message.header,
                    {pb::ERROR_UNEXPECTED, "site '" + name_ +
                                               "' sent no model to travel "
                                               "(sync.skewscout is off)"});
    }
    if (result.travel_id() != peer.travel_outstanding ||
        result.travel_id() == 0) {
      return;  // an answer given up on, or to an earlier incarnation
    }
    peer.travel_outstanding = 0;
    ++results_received_;
    TravelScores scores;
    scores.samples = result.samples();
    scores.own_accuracy = result.own_accuracy();
    scores.travelled_accuracy = result.travelled_accuracy();
    scores.discordant = result.discordant();
    const SkewDecision& decision =
        skew_->Observe(Now() - connected_s_, result.clock(), peer.name, scores);
    ApplySkewKnob();
    MLOG(INFO) << "skewscout: '" << peer.name << "' scored this site's model "
               << "of clock " << decision.clock << " "
               << decision.travelled_accuracy << " against its own "
               << decision.own_accuracy << " on " << decision.samples
               << " samples: estimated loss " << decision.estimate
               << " (smoothed " << decision.smoothed << " ± "
               << decision.standard_error << "), "
               << SkewActionName(decision.action) << ", "
               << SkewKnobName(skew_knob_) << " " << decision.knob_before
               << " -> " << decision.knob_after << ", next travel in "
               << decision.travel_period << " clocks";
  }

  // A density knob is the configured pipeline's top-k fraction (θ is read
  // where it is used: Theta()).
  void ApplySkewKnob() {
    if (skew_knob_ != SkewKnob::kTopKDensity) return;
    if (Status set = codec_->SetTopKFraction(skew_->knob()); !set.ok()) {
      MLOG(ERROR) << "skewscout: " << set;  // bounded by the controller
    }
  }

  void SaveSkewScout(pb::SyncCheckpoint* out) const {
    if (!skew_) return;
    pb::SkewScoutCheckpoint* saved = out->mutable_skewscout();
    SkewController::State state = skew_->Save();
    saved->set_theta(state.knob);
    saved->set_travel_period(state.travel_period);
    saved->set_smoothed(state.smoothed);
    saved->set_smoothed_variance(state.smoothed_variance);
    saved->set_estimates(state.estimates);
    saved->set_low_in_a_row(state.low_in_a_row);
    saved->set_tightened(state.tightened);
    saved->set_loosened(state.loosened);
    for (const SkewDecision& d : state.decisions) {
      ToRecord(d, saved->add_decisions());
    }
    saved->set_travels_sent(travels_sent_);
    saved->set_travel_bytes(travel_bytes_);
    saved->set_results_received(results_received_);
    saved->set_travels_scored(travels_scored_);
    saved->set_travels_dropped(travels_dropped_);
    saved->set_travels_accepted(travels_accepted_);
    saved->set_travels_unanswered(travels_unanswered_);
  }

  // A restarted site continues with the θ its controller had reached
  // (SkewController::Restore bounds what the file says).
  void RestoreSkewScout(const pb::SyncCheckpoint& state) {
    if (!skew_ || !state.has_skewscout()) return;
    const pb::SkewScoutCheckpoint& saved = state.skewscout();
    SkewController::State restored;
    restored.knob = saved.theta();
    restored.travel_period = saved.travel_period();
    restored.smoothed = saved.smoothed();
    restored.smoothed_variance = saved.smoothed_variance();
    restored.estimates = saved.estimates();
    restored.low_in_a_row = saved.low_in_a_row();
    restored.tightened = saved.tightened();
    restored.loosened = saved.loosened();
    for (const pb::SkewDecisionRecord& record : saved.decisions()) {
      restored.decisions.push_back(FromRecord(record));
    }
    skew_->Restore(std::move(restored));
    ApplySkewKnob();
    travels_sent_ = saved.travels_sent();
    travel_bytes_ = saved.travel_bytes();
    results_received_ = saved.results_received();
    travels_scored_ = saved.travels_scored();
    travels_dropped_ = saved.travels_dropped();
    travels_accepted_ = saved.travels_accepted();
    travels_unanswered_ = saved.travels_unanswered();
  }

  void FillSkewScout(pb::SyncSummary* summary) const {
    if (!skew_ && travels_scored_ == 0 && travels_accepted_ == 0) return;
    pb::SkewScoutSummary* out = summary->mutable_skewscout();
    out->set_travels_sent(travels_sent_);
    out->set_travel_bytes(travel_bytes_);
    out->set_results_received(results_received_);
    out->set_travels_scored(travels_scored_);
    out->set_travels_dropped(travels_dropped_);
    if (!skew_) return;
    out->set_final_theta(skew_->knob());
    out->set_knob(SkewKnobName(skew_knob_));
    for (const SkewDecision& d : skew_->decisions()) {
      ToRecord(d, out->add_decisions());
    }
  }

  // Whether `peer` introduced itself on the connection `message` came
  // over; otherwise asks it to (an acknowledgement with a resend request
  // for an unknown incarnation makes it send MIRROR_HELLO and what
  // follows) and drops the message.
  bool Introduced(const Envelope& message, Peer& peer) {
    if (peer.in.hello() && peer.routing_id == message.routing_id) return true;
    if (peer.in.hello() && peer.routing_id.empty()) {
      // This site restarted from a checkpoint that knows the peer's
      // channel (its incarnation, what was applied): the peer's connection
      // is its own; what it missed it finds out from the gaps.
      peer.routing_id = message.routing_id;
      return true;
    }
    if (!peer.in.hello()) {
      const double now = Now();
      if (peer.hello_requested_s < 0 ||
          now - peer.hello_requested_s >= fault_.heartbeat_interval_s()) {
        peer.hello_requested_s = now;
        peer.routing_id = message.routing_id;
        pb::MirrorAck ask;
        ask.set_resend(true);
        ask.set_incarnation(0);  // "whoever you are"
        SendAck(peer, ask);
      }
      // Also say why, for a peer that does not speak this protocol; not
      // counted as a rejection: after a restart it is how peers find out.
      // Heartbeats are never answered.
      if (message.header.type() == pb::HEARTBEAT) return false;
      SendRefusal(message.routing_id, message.header,
                  {pb::ERROR_UNKNOWN_SENDER,
                   "site '" + peer.name +
                       "' must introduce itself (MIRROR_HELLO) first"});
      return false;
    }
    Refuse(message.routing_id, message.header,
           {pb::ERROR_UNKNOWN_SENDER,
            "site '" + peer.name +
                "' must introduce itself (MIRROR_HELLO) on this "
                "connection first"});
    return false;
  }

  void HandleHello(const Envelope& message, Peer& peer) {
    const pb::Header& header = message.header;
    Result<ModelLayout> layout =
        LayoutFromSpecs(header.mirror_hello().layout());
    if (!layout.ok() || !(*layout == store_->layout())) {
      return Refuse(
          message.routing_id, header,
          {pb::ERROR_LAYOUT_MISMATCH,
           "site '" + peer.name + "' has model [" +
               (layout.ok() ? layout->DebugString()
                            : layout.status().message()) +
               "], this site [" + store_->layout().DebugString() + "]"});
    }
    const pb::MirrorHello& hello = header.mirror_hello();
    const bool first = !peer.in.hello();
    const uint64_t before = peer.in.incarnation();
    const std::string note = peer.in.OnHello(
        hello.incarnation(), hello.first_sequence(), hello.resumed(), Now());
    peer.routing_id = message.routing_id;
    if (first) {
      MLOG(INFO) << "site '" << peer.name << "' connected";
    } else if (before != peer.in.incarnation()) {
      MLOG(WARNING) << "site '" << peer.name << "' " << note;
      RecordEvent(pb::PEER_RESTARTED, "site '" + peer.name + "'", note);
      if (!hello.resumed()) {
        // Its clocks start again as well.
        (void)clocks_.Reset(peer.name, hello.clock());
        peer.final_received = false;
      }
    } else if (!note.empty()) {
      MLOG(ERROR) << "site '" << peer.name << "': " << note;
    }
  }

  void HandleClock(const Envelope& message, Peer& peer) {
    const pb::Header& header = message.header;
    if (Status status =
            clocks_.Advance(peer.name, header.mirror_clock().clock());
        !status.ok()) {
      return Refuse(message.routing_id, header,
                    {pb::ERROR_STALE, status.message()});
    }
    if (header.mirror_clock().final()) {
      peer.final_received = true;
      peer.in.AckSoon();
      if (!finishing_ && finished_peer_.empty()) finished_peer_ = peer.name;
    }
    UpdateCatchingUp(peer);
    // A hub's announcements depend on what it hears.
    if (role_.kind == SyncRole::Kind::kHub) AnnounceClocks();
  }

  void HandleUpdate(Envelope& message, Peer& peer) {
    const pb::Header& header = message.header;
    const std::string& site = peer.name;
    const int64_t expected = clocks_.ClockOf(site).value_or(0) + 1;
    if (header.clock() != expected) {
      return Refuse(
          message.routing_id, header,
          {pb::ERROR_STALE,
           "update tagged with clock " + std::to_string(header.clock()) +
               " from '" + site + "', expected " + std::to_string(expected) +
               " (updates of a clock come before it)"});
    }
    if (Check check = CheckAndDecode(message, /*whole_model=*/false);
        !check.ok()) {
      return Refuse(message.routing_id, header, check.rejection());
    }
    if (header.type() == pb::MIRROR_INDICES) {
      blocked_.Block(site, header.clock(), codec_->decoded().indices);
      return;
    }
    const pb::MirrorUpdate& body = header.mirror_update();
    if (body.average() || outer_) {
      // An outer gradient, or (under DILOCO and MODEL_AVERAGING) anything
      // else where only outer gradients belong: AddToOuterRound refuses
      // it.
      AddToOuterRound(message, peer);
      return;
    }
    const DecodedUpdate& received = codec_->decoded();
    store_->ApplyExternalSparse(received.indices, received.values,
                                RelayTargets(peer.site));
    if (body.sent_unix_us() > 0) {  // 0: a sender that does not stamp
      peer.age.Record(static_cast<double>(body.window_start_unix_us()) * 1e-6,
                      static_cast<double>(body.sent_unix_us()) * 1e-6,
                      header.clock(), options_.wall_clock->UnixSeconds(),
                      local_clock_);
    }
    ++updates_received_;
    entries_received_ += received.indices.size();
    blocked_.Release(site, header.clock());
  }

  // Checks the slices of an update-shaped message against the layout
  // (covering the whole model when `whole_model`) and its codec, then
  // decodes them into codec_->decoded(); what to refuse it with otherwise.
  // Nothing is applied.
  Check CheckAndDecode(const Envelope& message, bool whole_model) {
    const pb::Header& header = message.header;
    MERIDIAN_RETURN_IF_REJECTED(
        CheckSlicesAgainstLayout(header, store_->layout(), whole_model));
    MERIDIAN_RETURN_IF_REJECTED(CheckCodec(header, pb::CODEC_PIPELINE));
    if (Status decoded = DecodeUpdate(header, message.payload); !decoded.ok()) {
      return Rejection{pb::ERROR_MALFORMED, decoded.message()};
    }
    return Check();
  }

  // Decodes the slices of an update (header validated against the layout
  // and codec) into codec_->decoded(). Nothing is applied: a bad slice
  // leaves the model untouched. `frames`: zmq::message_t or std::string,
  // one per slice.
  template <typename Frames>
  Status DecodeUpdate(const pb::Header& header, const Frames& frames) {
    std::vector<std::span<const std::byte>> bytes;
    bytes.reserve(std::size(frames));
    for (const auto& frame : frames) bytes.push_back(FrameBytes(frame));
    return codec_->Decode(store_->layout(), header, bytes);
  }

  // Whether peers have accumulators of unsent changes (not so when whole
  // models or outer gradients are exchanged).
  bool UsesAccumulators() const { return !HasOuterRounds(sync_.kind()); }

  // DILOCO and MODEL_AVERAGING: at a clock that starts a round, sends this
  // site's outer gradient of the round's fragment to every peer, unless the
  // previous round of that fragment is still open: then the round waits (and so
  // do reads) until it closes.
  void StartOuterRoundIfDue(int64_t clock) {
    if (outer_->adaptive()) {
      // The round's clock is the agreed one; this site may have passed it
      // while the previous round was open (commits already under way).
      const int64_t due = outer_->NextRoundClock();
      if (!outer_->AnyOpen() && clock >= due) StartOuterRound(due, 0);
      return;
    }
    std::optional<uint32_t> fragment = outer_->FragmentDueAt(clock);
    if (!fragment) return;
    if (outer_->Open(*fragment) || outer_deferred_ != 0) {
      if (outer_deferred_ == 0) {
        outer_deferred_ = clock;
        ++outer_deferred_count_;
      }
      return;
    }
    StartOuterRound(clock, *fragment);
  }

  void StartOuterRound(int64_t clock, uint32_t fragment) {
    const KeyRange range = outer_->RangeOf(fragment);
    std::vector<float> model(store_->num_elements());
    store_->Snapshot(model);
    std::vector<float> delta;
    outer_->OuterGradient(fragment,
                          std::span<const float>(model).subspan(
                              range.begin, range.end - range.begin),
                          &delta);
    const EncodedSlices encoded =
        codec_->EncodeRange(store_->layout(), range.begin, delta);
    // What the peers will add is the decoded Δ: use the same here, so that
    // every site's anchor stays the same.
    pb::Header header;
    for (const pb::TensorSlice& slice : encoded.slices) {
      *header.add_slices() = slice;
    }
    std::vector<float> decoded;
    const uint32_t proposal = ProposedOuterPeriod();
    Status status = DecodeUpdate(header, encoded.frames);
    if (status.ok()) status = ScatterRange(range, &decoded);
    if (status.ok()) status = outer_->AddOwn(clock, decoded, {}, proposal);
    if (!status.ok()) {
      // Our own encoding does not decode: a bug, not a peer's fault.
      MLOG(ERROR) << "outer round " << clock
                  << ": this site's outer gradient does not decode: " << status;
      return;
    }
    for (auto& peer : peers_) {
      SendUpdate(encoded, pb::MIRROR_UPDATE, name_, /*average=*/true, *peer,
                 clock, proposal);
    }
  }

  // The averaging period this site proposes with its outer gradient: its
  // SkewScout controller's (0: the period is fixed).
  uint32_t ProposedOuterPeriod() const {
    if (!outer_->adaptive()) return 0;
    if (!skew_) return outer_->period();
    return ProposedPeriod(skew_->knob(), sync_.skewscout());
  }

  // codec_->decoded() as the dense values of `range` (missing elements
  // zero); an error when it has an element outside the range.
  Status ScatterRange(const KeyRange& range, std::vector<float>* out) {
    const DecodedUpdate& decoded = codec_->decoded();
    out->assign(range.end - range.begin, 0.0f);
    for (size_t j = 0; j < decoded.indices.size(); ++j) {
      const uint64_t index = decoded.indices[j];
      if (index < range.begin || index >= range.end) {
        return InvalidArgumentError(
            "outer gradient has parameter " + std::to_string(index) +
            " outside its fragment [" + std::to_string(range.begin) + ", " +
            std::to_string(range.end) + ")");
      }
      (*out)[index - range.begin] = decoded.values[j];
    }
    return Status::Ok();
  }

  void AddToOuterRound(const Envelope& message, Peer& peer) {
    const pb::Header& header = message.header;
    const int64_t round = header.mirror_update().outer_round();
    std::optional<uint32_t> fragment = outer_->FragmentOfTag(round);
    if (!fragment) {
      return Refuse(message.routing_id, header,
                    {pb::ERROR_MALFORMED, "outer gradient tagged with round " +
                                              std::to_string(round) +
                                              ", at which no round starts"});
    }
    std::vector<float> values;
    if (Status status = ScatterRange(outer_->RangeOf(*fragment), &values);
        !status.ok()) {
      return Refuse(message.routing_id, header,
                    {pb::ERROR_MALFORMED, status.message()});
    }
    uint32_t position = 0;
    while (position < peers_.size() && peers_[position].get() != &peer) {
      ++position;
    }
    if (Status status = outer_->AddPeer(round, position, values, local_clock_,
                                        header.mirror_update().next_period());
        !status.ok()) {
      // What no sender may send (a wrong size, a clock off the agreed
      // schedule, a proposal outside the bounds) against what arrives at
      // the wrong time.
      const pb::ErrorCode code = status.code() == StatusCode::kInvalidArgument
                                     ? pb::ERROR_MALFORMED
                                     : pb::ERROR_STALE;
      return Refuse(message.routing_id, header, {code, status.message()});
    }
    ++updates_received_;
    entries_received_ += codec_->decoded().indices.size();
    CloseOuterRounds();
  }

  // Takes every outer step whose round is complete, then starts the round
  // that waited for one of them.
  void CloseOuterRounds() {
    if (!outer_) return;
    bool closed = false;
    uint64_t dropped_before = outer_->rounds_dropped();
    while (std::optional<OuterSteps::Step> step = outer_->CloseReady()) {
      std::vector<uint64_t> indices(step->correction.size());
      for (size_t i = 0; i < indices.size(); ++i) {
        indices[i] = step->range.begin + i;
      }
      store_->ApplyExternalSparse(indices, step->correction);
      closed = true;
      if (outer_->adaptive()) {
        if (outer_->rounds_dropped() != dropped_before) {
          MLOG(ERROR) << "outer round " << step->clock << " agreed a period of "
                      << outer_->period() << " clocks; "
                      << outer_->rounds_dropped() - dropped_before
                      << " outer gradient round(s) tagged with another clock "
                         "were dropped (a peer computed another period)";
          dropped_before = outer_->rounds_dropped();
        }
        // The next round may be due already (a short agreed period).
        StartOuterRoundIfDue(local_clock_);
      }
    }
    if (closed && outer_deferred_ != 0) {
      const int64_t clock = outer_deferred_;
      const uint32_t fragment = *outer_->FragmentDueAt(clock);
      if (!outer_->Open(fragment)) {
        outer_deferred_ = 0;
        StartOuterRound(clock, fragment);
        CloseOuterRounds();
      }
    }
  }

  SyncEngineOptions options_;
  const pb::JobConfig& job_;
  const pb::SyncConfig& sync_;
  const pb::FaultConfig& fault_;
  const int site_index_;
  const std::string name_;
  ParameterStore* store_;
  Clock* clock_;
  const SyncRole role_;
  ThresholdSchedule schedule_;
  MirrorClocks clocks_;
  BlockedKeys blocked_;
  pb::Endpoint self_;
  // This run of the site server (its channels' routing ids and hellos).
  const uint64_t incarnation_;

  // CURVE (security.curve): this site's keys and its peers' public keys,
  // and the ZAP handler of the context that admits only those peers. The
  // handler is declared before mirror_ so that it outlives the socket.
  std::optional<SiteCurveKeys> curve_;
  std::unique_ptr<ZapHandler> zap_;
  zmq::socket_t mirror_;
  std::string mirror_endpoint_;
  std::vector<std::unique_ptr<Peer>> peers_;
  uint64_t error_sequence_ = 0;

  std::optional<UpdateCodec> codec_;  // set by Init

  int64_t local_clock_ = 0;
  uint64_t unsent_offset_ = 0;  // SampleUnsent's rotating offset
  double last_unsent_sample_s_ = -1e9;
  // SkewScout (sync.skewscout.enabled): the controller of theta, and the
  // travels this site sent and scored.
  std::optional<SkewController> skew_;
  SkewKnob skew_knob_ = SkewKnob::kTheta;  // what skew_ moves
  size_t next_travel_peer_ = 0;
  // The first clock at or after which the model travels again (-1: set
  // one period after the first local clock).
  int64_t next_travel_clock_ = -1;
  std::vector<float> travel_model_;  // scratch: the snapshot that travels
  uint64_t travels_sent_ = 0;
  uint64_t travels_unanswered_ = 0;
  double travel_bytes_ = 0;
  uint64_t results_received_ = 0;
  uint64_t travels_accepted_ = 0;
  uint64_t travels_scored_ = 0;
  uint64_t travels_dropped_ = 0;
  double connected_s_ = 0;
  double last_theta_ = 0;
  bool training_ = false;  // Connect() was called
  bool finishing_ = false;
  bool flushed_ = false;
  std::string finished_peer_;
  // Liveness: silence is counted from no earlier than this (training's
  // start, the end of a stall of the event loop).
  double liveness_floor_s_ = 0;
  double last_service_s_ = -1;
  // When local changes last went out (sync.send_period_s).
  double last_send_s_ = -1e9;
  FaultEventLog events_;
  SyncEngine::OutgoingLog outgoing_log_;  // empty: no log
  uint64_t log_failures_ = 0;

  // The outer rounds' state (DILOCO, MODEL_AVERAGING); the round waiting
  // for its fragment's previous one (0: none) and how many rounds waited.
  std::optional<OuterSteps> outer_;
  // Mirror messages sent by kind (Summary's messages_sent); heartbeats
  // are counted by the channels.
  std::map<pb::MessageType, uint64_t> messages_sent_;
  int64_t outer_deferred_ = 0;
  uint64_t outer_deferred_count_ = 0;

  // Counters.
  uint64_t updates_sent_ = 0;
  uint64_t updates_between_clocks_ = 0;  // not checkpointed: this process's
  uint64_t entries_sent_ = 0;
  uint64_t updates_received_ = 0;
  uint64_t entries_received_ = 0;
  uint64_t rejected_ = 0;
  double blocked_s_ = 0;
};

Result<std::unique_ptr<SyncEngine>> SyncEngine::Create(
    SyncEngineOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  MERIDIAN_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<SyncEngine>(new SyncEngine(std::move(impl)));
}

SyncEngine::SyncEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SyncEngine::~SyncEngine() = default;

const std::string& SyncEngine::mirror_endpoint() const {
  return impl_->mirror_endpoint();
}
std::vector<std::string> SyncEngine::peers() const { return impl_->peers(); }
std::vector<std::string> SyncEngine::silent_peers() const {
  return impl_->silent_peers();
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
bool SyncEngine::peer_finished() const { return impl_->peer_finished(); }
const std::string& SyncEngine::finished_peer() const {
  return impl_->finished_peer();
}
bool SyncEngine::Finish(double timeout_s) { return impl_->Finish(timeout_s); }
double SyncEngine::theta() const { return impl_->theta(); }
std::optional<double> SyncEngine::skew_knob() const {
  return impl_->skew_knob();
}
uint64_t SyncEngine::bytes_sent() const { return impl_->bytes_sent(); }
int64_t SyncEngine::slowest_peer_clock() const {
  return impl_->slowest_peer_clock();
}
pb::SyncSummary SyncEngine::Summary() const { return impl_->Summary(); }
std::vector<SyncEngine::PeerCounters> SyncEngine::peer_counters() const {
  return impl_->peer_counters();
}
int64_t SyncEngine::ClockFloor() const { return impl_->ClockFloor(); }
uint32_t SyncEngine::unreachable_peers() const {
  return impl_->unreachable_peers();
}
const FaultEventLog& SyncEngine::events() const { return impl_->events(); }
void SyncEngine::SetOutgoingLog(OutgoingLog log) {
  impl_->SetOutgoingLog(std::move(log));
}
void SyncEngine::EnableCheckpoints() { impl_->EnableCheckpoints(); }
void SyncEngine::SaveState(pb::SyncCheckpoint* out) const {
  impl_->SaveState(out);
}
std::vector<std::pair<std::string, size_t>> SyncEngine::Accumulators() const {
  return impl_->Accumulators();
}
Result<uint64_t> SyncEngine::RestoreState(
    const pb::SyncCheckpoint& state, std::span<const pb::LoggedMessage> logged,
    const Checkpoint* arrays) {
  return impl_->RestoreState(state, logged, arrays);
}
void SyncEngine::AppendArrays(std::vector<NamedArray>* arrays) const {
  impl_->AppendArrays(arrays);
}
void SyncEngine::NoteDurable(const pb::SyncCheckpoint& saved) {
  impl_->NoteDurable(saved);
}
bool SyncEngine::CheckpointWanted() const { return impl_->CheckpointWanted(); }

}  // namespace meridian
