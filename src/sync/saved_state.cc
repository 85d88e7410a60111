#include "sync/saved_state.h"

#include <algorithm>

#include "meridian/compression/compression.h"
#include "sync/update_codec.h"

namespace meridian {
namespace {

RetainedMessage Retained(const pb::LoggedMessage& kept) {
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

}  // namespace

void SavedState::Save(pb::SyncCheckpoint* out) const {
  out->Clear();
  out->set_local_clock(parts_.peers->local_clock());
  parts_.outbox->SaveTo(out);
  parts_.inbox->SaveTo(out);
  out->set_rejected(parts_.mirror->rejected());
  out->set_blocked_s(parts_.gate->held_s());
  parts_.peers->events().CopyTo(out->mutable_events());
  parts_.skew->SaveTo(out);
  if (parts_.outer != nullptr) parts_.outer->SaveTo(out);
  for (const auto& peer : parts_.peers->all()) {
    SavePeer(*peer, out->add_peers());
  }
}

void SavedState::SavePeer(const Peer& peer, pb::PeerCheckpoint* saved) const {
  saved->set_site(peer.name);
  OutboundChannel::State state = peer.out.Save();
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
  saved->set_announced(peer.sending.announced);
  saved->set_in_incarnation(peer.in.incarnation());
  saved->set_in_applied(peer.in.applied());
  saved->set_clock(parts_.peers->ClockOf(peer));
  saved->set_unreachable_s(peer.live.unreachable_total_s);
  saved->set_final_sent(peer.sending.final_sent);
  saved->set_final_sequence(peer.sending.final_sequence);
  saved->set_final_received(peer.receiving.final_received);
}

Result<uint64_t> SavedState::Restore(const pb::SyncCheckpoint& state,
                                     std::span<const pb::LoggedMessage> logged,
                                     const Checkpoint* arrays) {
  if (parts_.outer != nullptr) {
    MERIDIAN_RETURN_IF_ERROR(parts_.outer->RestoreFrom(state, arrays));
  }
  parts_.peers->set_local_clock(state.local_clock());
  parts_.outbox->RestoreFrom(state);
  parts_.inbox->RestoreFrom(state);
  parts_.mirror->set_rejected(state.rejected());
  parts_.gate->set_held_s(state.blocked_s());
  parts_.peers->events().Restore(state.events());
  parts_.skew->RestoreFrom(state);
  for (const pb::PeerCheckpoint& saved : state.peers()) {
    MERIDIAN_RETURN_IF_ERROR(RestorePeer(saved));
  }
  return Replay(logged);
}

Status SavedState::RestorePeer(const pb::PeerCheckpoint& saved) {
  PeerTable& peers = *parts_.peers;
  Peer* peer = peers.Find(saved.site());
  if (peer == nullptr) {
    return FailedPreconditionError(
        "the checkpoint has state of site '" + saved.site() +
        "', which this site does not sync with (its peers: " +
        context_.PeerList() + "): was the job file's topology changed?");
  }
  OutboundChannel::State channel;
  channel.next_sequence = saved.next_sequence();
  channel.applied_sequence = saved.applied_sequence();
  channel.durable_sequence = saved.durable_sequence();
  for (const pb::LoggedMessage& kept : saved.retained()) {
    channel.retained.push_back(Retained(kept));
  }
  peer->out.Restore(std::move(channel));
  peer->sending.announced = saved.announced();
  if (saved.in_incarnation() != 0) {
    peer->in.Restore(saved.in_incarnation(), saved.in_applied());
  }
  MERIDIAN_RETURN_IF_ERROR(peers.clocks().Reset(peer->name, saved.clock()));
  peer->live.unreachable_total_s = saved.unreachable_s();
  peer->sending.final_sent = saved.final_sent();
  peer->sending.final_sequence = saved.final_sequence();
  peer->receiving.final_received = saved.final_received();
  return Status::Ok();
}

Result<uint64_t> SavedState::Replay(std::span<const pb::LoggedMessage> logged) {
  PeerTable& peers = *parts_.peers;
  UpdateDecoder decoder;
  uint64_t retracted = 0;
  for (const pb::LoggedMessage& record : logged) {
    Peer* peer = peers.Find(record.peer());
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
    const bool update = header.type() == pb::MIRROR_UPDATE;
    if (header.type() == pb::MIRROR_CLOCK) {
      peer->sending.announced =
          std::max(peer->sending.announced, header.clock());
      peers.set_local_clock(
          std::max(peers.local_clock(), header.mirror_clock().clock()));
    } else if (parts_.outer != nullptr && update &&
               header.mirror_update().average()) {
      // This site's outer gradient left after the checkpoint: the peers
      // add it to their round, so it must be in ours too. The workers'
      // commits from now on are measured from the restored model.
      MERIDIAN_RETURN_IF_ERROR(parts_.outer->Recover(header, record));
    } else if (update && !header.mirror_update().average()) {
      Result<DecodedUpdate> taken_back =
          DecodeUpdate(context_.store->layout(), header,
                       FrameSpans(record.frames()), decoder);
      if (!taken_back.ok()) {
        return taken_back.status().WithContext(
            "the outgoing log's message " + std::to_string(record.sequence()) +
            " for site '" + record.peer() + "'");
      }
      for (float& value : taken_back->values) value = -value;
      context_.store->AddToAccumulator(peer->acc, taken_back->indices,
                                       taken_back->values);
      ++retracted;
    }
  }
  return retracted;
}

void SavedState::AppendArrays(std::vector<NamedArray>* arrays) const {
  if (parts_.outer != nullptr) parts_.outer->AppendArrays(arrays);
}

std::vector<std::pair<std::string, size_t>> SavedState::Accumulators() const {
  std::vector<std::pair<std::string, size_t>> out;
  if (!context_.UsesAccumulators()) return out;
  for (const auto& peer : parts_.peers->all()) {
    out.emplace_back(peer->name, peer->acc);
  }
  return out;
}

void SavedState::NoteDurable(const pb::SyncCheckpoint& saved) {
  for (const pb::PeerCheckpoint& state : saved.peers()) {
    Peer* peer = parts_.peers->Find(state.site());
    if (peer == nullptr) continue;
    // What arrived since the snapshot is not in that checkpoint.
    peer->in.NoteDurable(state.in_applied(),
                         BytesAppliedAfter(*peer, state.in_applied()));
  }
}

bool SavedState::CheckpointWanted() const {
  const uint64_t limit = parts_.peers->delivery().retention_limit_bytes;
  for (const auto& peer : parts_.peers->all()) {
    if (2 * peer->in.bytes_since_durable() > limit) return true;
  }
  return false;
}

uint64_t SavedState::BytesAppliedAfter(const Peer& peer, uint64_t sequence) {
  return peer.in.applied() > sequence ? peer.in.bytes_since_durable() : 0;
}

}  // namespace meridian
