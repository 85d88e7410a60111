#include "sync/outbox.h"

#include <cstdio>
#include <memory>
#include <utility>

#include "meridian/core/log.h"
#include "meridian/core/socket_close.h"
#include "meridian/net/message.h"

namespace meridian {
namespace {

// ZeroMQ's queue towards a peer, in messages: what does not fit waits in
// the channel's retention (bounded in bytes) instead.
constexpr int kChannelHighWaterMark = 100;

}  // namespace

Outbox::Outbox(const SyncContext& context, PeerTable& peers,
               SendThreshold& threshold, const SiteCurveKeys* curve,
               UpdateCodec codec)
    : context_(context),
      peers_(peers),
      threshold_(threshold),
      curve_(curve),
      codec_(std::move(codec)) {}

Status Outbox::Open(Peer& peer) {
  if (peer.out.attached()) return Status::Ok();
  auto socket =
      std::make_unique<zmq::socket_t>(*context_.zmq, zmq::socket_type::dealer);
  try {
    socket->set(zmq::sockopt::linger, kSocketCloseLingerMs);
    socket->set(zmq::sockopt::sndhwm, kChannelHighWaterMark);
    // The same id after every reconnect of this process: the peer keeps
    // the channel's state across broken connections.
    char id[64];
    std::snprintf(id, sizeof(id), "%s#%016llx", context_.name.c_str(),
                  static_cast<unsigned long long>(context_.incarnation));
    socket->set(zmq::sockopt::routing_id, std::string(id));
    if (curve_ != nullptr) {
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
  threshold_.OpenLink(peer, context_.Now());
  pb::Header hello = MakeHeader(pb::MIRROR_HELLO, context_.self, 0);
  LayoutToSpecs(context_.store->layout(),
                hello.mutable_mirror_hello()->mutable_layout());
  hello.mutable_mirror_hello()->set_clock(peers_.local_clock());
  peer.out.Attach(std::move(socket), std::move(hello), context_.Now());
  MLOG(INFO) << "connected to site '" << peer.name << "' at " << peer.endpoint;
  return Status::Ok();
}

void Outbox::Send(Peer& peer, pb::Header header,
                  std::vector<std::string> frames) {
  if (!peer.out.attached()) {
    if (Status status = Open(peer); !status.ok()) {
      // Kept: the channel retains it and sends it once it can connect.
      MLOG(ERROR) << status << "; the update waits";
    }
  }
  if (log_) Log(peer, &header, frames);
  ++messages_sent_[header.type()];
  peer.out.Enqueue(std::move(header), std::move(frames), context_.Now());
}

void Outbox::Log(const Peer& peer, pb::Header* header,
                 const std::vector<std::string>& frames) {
  header->set_sequence(peer.out.last_sequence() + 1);
  pb::LoggedMessage record;
  record.set_peer(peer.name);
  record.set_sequence(header->sequence());
  header->SerializeToString(record.mutable_header());
  for (const std::string& frame : frames) record.add_frames(frame);
  if (Status status = log_(record); !status.ok()) {
    ++log_failures_;
    if (log_failures_ == 1 || log_failures_ % 1000 == 0) {
      MLOG(ERROR) << "cannot log the outgoing update (" << log_failures_
                  << " so far): " << status
                  << "; sent anyway: should this site crash before its "
                     "next checkpoint, replicas may differ";
    }
  }
}

void Outbox::SendUpdate(const EncodedSlices& update, pb::MessageType type,
                        bool average, Peer& peer, int64_t outer_round,
                        uint32_t next_period) {
  if (update.empty() || peer.sending.final_sent) return;
  pb::Header header = MakeHeader(type, context_.self, 0);
  header.set_clock(peer.sending.announced + 1);
  for (const pb::TensorSlice& slice : update.slices) {
    *header.add_slices() = slice;
  }
  pb::MirrorUpdate* body = header.mutable_mirror_update();
  body->set_origin_site(context_.name);
  body->set_entries(update.entries);
  body->set_average(average);
  if (outer_round != 0) body->set_outer_round(outer_round);
  if (next_period != 0) body->set_next_period(next_period);
  if (type == pb::MIRROR_UPDATE) {
    const double now = context_.UnixNow();
    body->set_sent_unix_us(static_cast<int64_t>(now * 1e6));
    body->set_window_start_unix_us(
        static_cast<int64_t>(peer.sending.window_start_unix_s * 1e6));
    peer.sending.window_start_unix_s = now;
  }
  Send(peer, std::move(header), update.frames);
  if (type == pb::MIRROR_UPDATE) {
    ++updates_sent_;
    entries_sent_ += update.entries;
  }
}

void Outbox::SendParts(const std::vector<EncodedSlices>& parts,
                       bool indices_first, Peer& peer) {
  const double window_start = peer.sending.window_start_unix_s;
  for (const EncodedSlices& part : parts) {
    if (indices_first) {
      SendUpdate(codec_.IndicesOnly(part), pb::MIRROR_INDICES,
                 /*average=*/false, peer);
    }
    peer.sending.window_start_unix_s = window_start;
    SendUpdate(part, pb::MIRROR_UPDATE, /*average=*/false, peer);
  }
}

uint64_t Outbox::bytes_sent() const {
  uint64_t total = 0;
  for (const auto& peer : peers_.all()) total += peer->out.bytes_sent();
  return total;
}

void Outbox::FillSummary(pb::SyncSummary* summary, uint64_t acks_sent) const {
  summary->set_bytes_sent(static_cast<double>(bytes_sent()));
  summary->set_updates_sent(static_cast<double>(updates_sent_));
  summary->set_entries_sent(static_cast<double>(entries_sent_));
  std::map<pb::MessageType, uint64_t> sent = messages_sent_;
  sent[pb::MIRROR_ACK] += acks_sent;
  for (const auto& peer : peers_.all()) {
    sent[pb::HEARTBEAT] += peer->out.heartbeats_sent();
  }
  for (const auto& [type, count] : sent) {
    if (count == 0) continue;
    pb::MessageCount* out = summary->add_messages_sent();
    out->set_type(pb::MessageType_Name(type));
    out->set_count(count);
  }
}

void Outbox::SaveTo(pb::SyncCheckpoint* out) const {
  out->set_updates_sent(updates_sent_);
  out->set_entries_sent(entries_sent_);
}

void Outbox::RestoreFrom(const pb::SyncCheckpoint& state) {
  updates_sent_ = state.updates_sent();
  entries_sent_ = state.entries_sent();
}

}  // namespace meridian
