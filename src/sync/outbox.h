// The sending end of every channel to a peer: opens the channel (a DEALER
// socket, a CURVE client under security.curve, introduced with
// MIRROR_HELLO), writes each numbered message to the outgoing-update log
// before ZeroMQ gets it, and puts it on the channel (mirror_delivery.h);
// frames MIRROR_UPDATE / MIRROR_INDICES from encoded slices, with the
// update codec that encodes them.
//
// Ownership and threads: owned by the SyncEngine; driven by its event loop
// (not thread-safe). Size: the counters are fixed; what waits to be sent
// is the channels' (bounded by their retention), the codec's scratch is
// bounded by the model.
#ifndef MERIDIAN_SYNC_OUTBOX_H_
#define MERIDIAN_SYNC_OUTBOX_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "meridian/net/security.h"
#include "meridian/report.pb.h"
#include "meridian/wire.pb.h"
#include "sync/peer_table.h"
#include "sync/send_threshold.h"
#include "sync/sync_context.h"
#include "sync/sync_engine.h"
#include "sync/update_codec.h"

namespace meridian {

class Outbox {
 public:
  // `curve`: this site's and its peers' keys (null: plaintext); not owned,
  // outlives the outbox.
  Outbox(const SyncContext& context, PeerTable& peers, SendThreshold& threshold,
         const SiteCurveKeys* curve, UpdateCodec codec);
  Outbox(const Outbox&) = delete;
  Outbox& operator=(const Outbox&) = delete;

  // Connects the channel and introduces this site on it, once. Channels
  // open when training starts, or earlier when a hub must relay a member's
  // update before its own workers have joined.
  Status Open(Peer& peer);
  // Logs `header` with `frames` (when a log is set) and puts it on the
  // channel to `peer` (opened first if need be).
  void Send(Peer& peer, pb::Header header, std::vector<std::string> frames);
  // Sends `update` to `peer` as a MIRROR_UPDATE (or MIRROR_INDICES),
  // tagged with the clock it belongs to (the one after the last
  // announced); `average`: an outer gradient, of the round `outer_round`
  // (DILOCO, MODEL_AVERAGING; 0: none); `next_period`: the averaging
  // period this site proposes with it (an adaptive period; 0: none).
  // Nothing once the final flush went to `peer`.
  void SendUpdate(const EncodedSlices& update, pb::MessageType type,
                  bool average, Peer& peer, int64_t outer_round = 0,
                  uint32_t next_period = 0);

  // The messages of one update to `peer` (UpdateCodec::Take), each a
  // MIRROR_UPDATE preceded by its MIRROR_INDICES when `indices_first` (the
  // selective barrier: the indices of a part are released by its values).
  // Every part carries the same window of changes (update ages).
  void SendParts(const std::vector<EncodedSlices>& parts, bool indices_first,
                 Peer& peer);

  UpdateCodec& codec() { return codec_; }
  // See SyncEngine::SetOutgoingLog.
  void SetLog(SyncEngine::OutgoingLog log) { log_ = std::move(log); }

  // Bytes handed to every channel.
  uint64_t bytes_sent() const;
  uint64_t updates_sent() const { return updates_sent_; }
  // Counters into a summary or a checkpoint, and back.
  void FillSummary(pb::SyncSummary* summary, uint64_t acks_sent) const;
  void SaveTo(pb::SyncCheckpoint* out) const;
  void RestoreFrom(const pb::SyncCheckpoint& state);

 private:
  // Writes the message about to be sent to the outgoing log, numbered as
  // the channel will number it.
  void Log(const Peer& peer, pb::Header* header,
           const std::vector<std::string>& frames);

  const SyncContext& context_;
  PeerTable& peers_;
  SendThreshold& threshold_;
  const SiteCurveKeys* const curve_;
  UpdateCodec codec_;
  SyncEngine::OutgoingLog log_;  // empty: no log
  uint64_t log_failures_ = 0;
  // Mirror messages sent by kind (the summary's messages_sent); heartbeats
  // are counted by the channels, acknowledgements by the mirror socket.
  std::map<pb::MessageType, uint64_t> messages_sent_;
  uint64_t updates_sent_ = 0;
  uint64_t entries_sent_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_OUTBOX_H_
