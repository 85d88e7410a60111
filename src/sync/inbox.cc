#include "sync/inbox.h"

#include <utility>

#include "meridian/core/log.h"

namespace meridian {
namespace {

// Bytes of a message: its header and payload frames.
uint64_t MessageBytes(const Envelope& message) {
  return message.header.ByteSizeLong() + PayloadBytes(message);
}

}  // namespace

Inbox::Inbox(const SyncContext& context, PeerTable& peers, MirrorSocket& mirror,
             ChangeSender& sender, SkewScoutTravel& skew, OuterRounds* outer,
             ReadGate& gate)
    : context_(context),
      peers_(peers),
      mirror_(mirror),
      sender_(sender),
      skew_(skew),
      outer_(outer),
      gate_(gate) {}

void Inbox::DrainMirror() {
  while (true) {
    Result<Received> received = mirror_.Receive();
    if (!received.ok() || received->timed_out()) return;
    if (received->refused) {
      mirror_.Refuse(received->refused->routing_id, received->refused->header,
                     received->refused->rejection);
      continue;
    }
    HandleMirror(*received->message);
  }
}

// ---- the sender check -------------------------------------------------------

Peer* Inbox::KnownSender(const Envelope& message) {
  const pb::Header& header = message.header;
  const std::string& site = header.sender().site();
  Peer* peer = header.sender().role() == pb::ROLE_SITE_SERVER
                   ? peers_.Find(site)
                   : nullptr;
  if (peer == nullptr) {
    std::string reason = "'";
    reason += Sanitized(site, 64);
    reason += "' is not a site that '" + context_.name +
              "' syncs with (its peers: " + context_.PeerList() + ")";
    Refuse(message, {pb::ERROR_UNKNOWN_SENDER, std::move(reason)});
    return nullptr;
  }
  if (mirror_.curve() != nullptr && message.user_id != site) {
    // Any listed key is admitted; a peer may speak only for its own site.
    Refuse(message,
           {pb::ERROR_UNKNOWN_SENDER,
            "a connection authenticated as site '" + message.user_id +
                "' sent a message as site '" + Sanitized(site, 64) + "'"});
    return nullptr;
  }
  return peer;
}

// An acknowledgement with a resend request for an unknown incarnation
// makes a peer send MIRROR_HELLO and what follows.
bool Inbox::Introduced(const Envelope& message, Peer& peer, double now) {
  PeerReceiving& receiving = peer.receiving;
  if (peer.in.hello() && receiving.routing_id == message.routing_id) {
    return true;
  }
  if (peer.in.hello() && receiving.routing_id.empty()) {
    // This site restarted from a checkpoint that knows the peer's channel
    // (its incarnation, what was applied): the peer's connection is its
    // own; what it missed it finds out from the gaps.
    receiving.routing_id = message.routing_id;
    return true;
  }
  if (!peer.in.hello()) {
    if (receiving.hello_requested_s < 0 ||
        now - receiving.hello_requested_s >=
            context_.fault.heartbeat_interval_s()) {
      receiving.hello_requested_s = now;
      receiving.routing_id = message.routing_id;
      pb::MirrorAck ask;
      ask.set_resend(true);
      ask.set_incarnation(0);  // "whoever you are"
      SendAck(peer, ask);
    }
    // Also say why, for a peer that does not speak this protocol; not
    // counted as a rejection: after a restart it is how peers find out.
    // Heartbeats are never answered.
    if (message.header.type() == pb::HEARTBEAT) return false;
    mirror_.Explain(message.routing_id, message.header,
                    {pb::ERROR_UNKNOWN_SENDER,
                     "site '" + peer.name +
                         "' must introduce itself (MIRROR_HELLO) first"});
    return false;
  }
  Refuse(message, {pb::ERROR_UNKNOWN_SENDER,
                   "site '" + peer.name +
                       "' must introduce itself (MIRROR_HELLO) on this "
                       "connection first"});
  return false;
}

bool Inbox::Admitted(const Envelope& message, Peer& peer, double now) {
  if (!Introduced(message, peer, now)) return false;
  const pb::Header& header = message.header;
  switch (peer.in.Admit(header.sequence(), now)) {
    case InboundChannel::Admission::kDuplicate:
    case InboundChannel::Admission::kGap:
      return false;  // applied before / asked for again (mirror_delivery.h)
    case InboundChannel::Admission::kApply:
      break;
  }
  // Applied or refused, the message is done: a refused one would be
  // refused again.
  peer.in.Applied(header.sequence(), MessageBytes(message));
  if (peer.receiving.final_received) {
    Refuse(message, {pb::ERROR_UNEXPECTED,
                     "site '" + peer.name + "' already sent its final flush"});
    return false;
  }
  return true;
}

void Inbox::HandleMirror(const Envelope& message) {
  Peer* found = KnownSender(message);
  if (found == nullptr) return;
  // Its connection may now hold what a peer sends.
  mirror_.Trust(message, found->site);
  Peer& peer = *found;
  peer.receiving.bytes_received += MessageBytes(message);
  ++peer.receiving.messages_received;
  peers_.HeardFrom(peer);
  const double now = context_.Now();
  const pb::MessageType type = message.header.type();
  switch (type) {
    case pb::MIRROR_HELLO:
      return HandleHello(message, peer, now);
    case pb::HEARTBEAT:
      return HandleHeartbeat(message, peer, now);
    case pb::MIRROR_CLOCK:
    case pb::MIRROR_UPDATE:
    case pb::MIRROR_INDICES:
    case pb::MIRROR_TRAVEL:
    case pb::MIRROR_TRAVEL_RESULT:
      break;
    default:
      return Refuse(message, {pb::ERROR_UNEXPECTED,
                              pb::MessageType_Name(type) +
                                  " is not served on the mirror socket"});
  }
  if (!Admitted(message, peer, now)) return;
  switch (type) {
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

// ---- the messages -----------------------------------------------------------

void Inbox::HandleHello(const Envelope& message, Peer& peer, double now) {
  Parsed<MirrorHello> hello =
      ParseMirrorHello(message, context_.store->layout());
  if (!hello.ok()) return Refuse(message, hello.rejection());
  const bool first = !peer.in.hello();
  const uint64_t before = peer.in.incarnation();
  const std::string note = peer.in.OnHello(
      hello->incarnation, hello->first_sequence, hello->resumed, now);
  peer.receiving.routing_id = message.routing_id;
  if (first) {
    MLOG(INFO) << "site '" << peer.name << "' connected";
  } else if (before != peer.in.incarnation()) {
    MLOG(WARNING) << "site '" << peer.name << "' " << note;
    peers_.events().Record(pb::PEER_RESTARTED, "site '" + peer.name + "'",
                           note);
    if (!hello->resumed) {
      // Its clocks start again as well.
      (void)peers_.clocks().Reset(peer.name, hello->clock);
      peer.receiving.final_received = false;
    }
  } else if (!note.empty()) {
    MLOG(ERROR) << "site '" << peer.name << "': " << note;
  }
}

void Inbox::HandleHeartbeat(const Envelope& message, Peer& peer, double now) {
  if (!Introduced(message, peer, now)) return;
  Parsed<MirrorHeartbeat> heartbeat = ParseMirrorHeartbeat(message);
  if (!heartbeat.ok()) return Refuse(message, heartbeat.rejection());
  peer.in.OnHeartbeat(heartbeat->last_sequence, now);
}

void Inbox::HandleClock(const Envelope& message, Peer& peer) {
  Parsed<MirrorClock> clock = ParseMirrorClock(message);
  if (!clock.ok()) return Refuse(message, clock.rejection());
  if (Status status = peers_.clocks().Advance(peer.name, clock->clock);
      !status.ok()) {
    return Refuse(message, {pb::ERROR_STALE, status.message()});
  }
  if (clock->final) {
    peer.receiving.final_received = true;
    peer.in.AckSoon();
    if (!finishing_ && finished_peer_.empty()) finished_peer_ = peer.name;
  }
  peers_.UpdateCatchingUp(peer);
  // A hub's announcements depend on what it hears.
  if (context_.role.kind == SyncRole::Kind::kHub) sender_.AnnounceClocks();
}

void Inbox::HandleUpdate(const Envelope& message, Peer& peer) {
  Parsed<MirrorUpdate> update =
      ParseMirrorUpdate(message, context_.store->layout(), decoder_);
  if (!update.ok()) return Refuse(message, update.rejection());
  const int64_t expected = peers_.ClockOf(peer) + 1;
  if (update->clock != expected) {
    return Refuse(
        message,
        {pb::ERROR_STALE,
         "update tagged with clock " + std::to_string(update->clock) +
             " from '" + peer.name + "', expected " + std::to_string(expected) +
             " (updates of a clock come before it)"});
  }
  if (update->indices_only) {
    gate_.blocked().Block(peer.name, update->clock, update->decoded.indices);
    return;
  }
  if (update->average || outer_ != nullptr) {
    // An outer gradient, or (under DILOCO and MODEL_AVERAGING) anything
    // else where only outer gradients belong: the rounds refuse it.
    if (outer_ == nullptr) {
      return Refuse(message, {pb::ERROR_MALFORMED,
                              "outer gradient tagged with round " +
                                  std::to_string(update->outer_round) +
                                  ", at which no round starts"});
    }
    if (Check added = outer_->AddPeer(peer, *update); !added.ok()) {
      return Refuse(message, added.rejection());
    }
    ++updates_received_;
    entries_received_ += update->decoded.indices.size();
    outer_->CloseReady();
    return;
  }
  ApplyUpdate(*update, peer);
}

void Inbox::ApplyUpdate(const MirrorUpdate& update, Peer& peer) {
  context_.store->ApplyExternalSparse(update.decoded.indices,
                                      update.decoded.values,
                                      peers_.RelayTargets(peer.site));
  if (update.sent_unix_s > 0) {  // 0: a sender that does not stamp
    peer.receiving.age.Record(update.window_start_unix_s, update.sent_unix_s,
                              update.clock, context_.UnixNow(),
                              peers_.local_clock());
  }
  ++updates_received_;
  entries_received_ += update.decoded.indices.size();
  gate_.blocked().Release(peer.name, update.clock);
}

// A peer's model to score: checked like an update that must carry every
// element, decoded into a model-sized copy that only the evaluator sees.
void Inbox::HandleTravel(const Envelope& message, Peer& peer) {
  if (!skew_.scores_travels()) {
    return Refuse(
        message, {pb::ERROR_UNEXPECTED, "site '" + context_.name +
                                            "' does not score travelled models "
                                            "(sync.skewscout is off)"});
  }
  Parsed<MirrorTravel> travel =
      ParseMirrorTravel(message, context_.store->layout(), decoder_);
  if (!travel.ok()) return Refuse(message, travel.rejection());
  skew_.Score(peer, std::move(travel).value());
}

void Inbox::HandleTravelResult(const Envelope& message, Peer& peer) {
  if (!skew_.enabled()) {
    return Refuse(message,
                  {pb::ERROR_UNEXPECTED, "site '" + context_.name +
                                             "' sent no model to travel "
                                             "(sync.skewscout is off)"});
  }
  Parsed<MirrorTravelResult> result = ParseMirrorTravelResult(message);
  if (!result.ok()) return Refuse(message, result.rejection());
  skew_.OnResult(peer, *result);
}

// ---- this site's channels ---------------------------------------------------

void Inbox::DrainChannel(Peer& peer) {
  while (true) {
    Result<Received> received =
        ReceiveMessage(*peer.out.socket(), false, std::chrono::milliseconds(0));
    if (!received.ok() || received->timed_out()) return;
    if (!received->message) continue;
    const pb::Header& header = received->message->header;
    if (header.sender().site() != peer.name) continue;
    if (header.type() == pb::MIRROR_ACK) {
      HandleAck(*received->message, peer);
    } else if (header.type() == pb::ERROR) {
      MLOG(ERROR) << "site '" << peer.name << "' refused our message: "
                  << pb::ErrorCode_Name(header.error().code()) << ": "
                  << header.error().message();
    }
  }
}

void Inbox::HandleAck(const Envelope& message, Peer& peer) {
  Parsed<pb::MirrorAck> ack = ParseMirrorAck(message);
  if (!ack.ok()) return;  // nobody to answer on a channel
  peers_.HeardFrom(peer);
  const uint64_t resends = peer.out.resend_requests();
  if (peer.out.OnAck(*ack, context_.Now()) && ack->flushed()) {
    peer.receiving.said_flushed = true;
  }
  if (peer.out.resend_requests() > resends) {
    MLOG(WARNING) << "site '" << peer.name << "' missed messages after "
                  << ack->applied_sequence() << ": sending them again";
    peers_.events().Record(
        pb::MESSAGES_RESENT, "site '" + peer.name + "'",
        "resend from sequence " + std::to_string(ack->applied_sequence() + 1));
  }
}

void Inbox::AcknowledgeIfDue(Peer& peer, double now) {
  // The peer waits to hear that the flush is complete here too: say so
  // at once.
  const bool flushed = peers_.Flushed(peer);
  if (flushed && !peer.receiving.told_flushed) peer.in.AckSoon();
  if (std::optional<pb::MirrorAck> ack =
          peer.in.AckDue(now, peers_.ClockOf(peer))) {
    ack->set_flushed(flushed);
    if (flushed && !peer.receiving.routing_id.empty()) {
      peer.receiving.told_flushed = true;
    }
    SendAck(peer, *ack);
  }
}

void Inbox::SendAck(const Peer& peer, const pb::MirrorAck& ack) {
  if (peer.receiving.routing_id.empty()) return;  // no connection to answer
  mirror_.SendAck(peer.receiving.routing_id, ack);
}

// ---- counters ---------------------------------------------------------------

void Inbox::FillSummary(pb::SyncSummary* summary) const {
  summary->set_entries_received(static_cast<double>(entries_received_));
  summary->set_updates_received(static_cast<double>(updates_received_));
}

void Inbox::SaveTo(pb::SyncCheckpoint* out) const {
  out->set_updates_received(updates_received_);
  out->set_entries_received(entries_received_);
}

void Inbox::RestoreFrom(const pb::SyncCheckpoint& state) {
  updates_received_ = state.updates_received();
  entries_received_ = state.entries_received();
}

}  // namespace meridian
