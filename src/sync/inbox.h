// The receiving end: takes the peers' messages off the mirror socket and
// what comes back on this site's channels (acknowledgements, errors), and
// acknowledges what it applied. Every mirror message goes
//   sender check (a peer of this site, authenticated as itself under
//   CURVE, introduced on this connection, next on its channel)
//   -> parse (mirror_messages.h: a typed value or a refusal)
//   -> policy (clocks go up, updates belong to the next clock, outer
//      gradients to a round this site can take)
//   -> apply (the model, the clocks, the selective barrier, the rounds).
// Whatever is refused is answered with an ERROR carrying its code and
// reason, and leaves the model untouched.
//
// Ownership and threads: owned by the SyncEngine; driven by its event loop
// (not thread-safe). Size: fixed; a message is decoded into a value the
// size of its update (at most the model) and dropped once applied.
#ifndef MERIDIAN_SYNC_INBOX_H_
#define MERIDIAN_SYNC_INBOX_H_

#include <cstdint>
#include <string>

#include "meridian/checkpoint.pb.h"
#include "meridian/compression/compression.h"
#include "meridian/net/transport.h"
#include "meridian/report.pb.h"
#include "sync/change_sender.h"
#include "sync/mirror_messages.h"
#include "sync/mirror_socket.h"
#include "sync/outer_rounds.h"
#include "sync/peer_table.h"
#include "sync/read_gate.h"
#include "sync/skewscout_travel.h"
#include "sync/sync_context.h"

namespace meridian {

class Inbox {
 public:
  // `outer`: null when the sync kind has no outer rounds. Nothing is
  // owned; everything outlives the inbox.
  Inbox(const SyncContext& context, PeerTable& peers, MirrorSocket& mirror,
        ChangeSender& sender, SkewScoutTravel& skew, OuterRounds* outer,
        ReadGate& gate);
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  // Handles every message waiting on the mirror socket.
  void DrainMirror();
  // What comes back on our channel to `peer`: acknowledgements, and
  // errors about what we sent.
  void DrainChannel(Peer& peer);
  // Sends `peer` the acknowledgement due now, if any.
  void AcknowledgeIfDue(Peer& peer, double now);

  // This site is finishing: a peer's final flush no longer finishes it.
  void SetFinishing() { finishing_ = true; }
  // The first peer whose final flush arrived before this site finished
  // (empty: none).
  const std::string& finished_peer() const { return finished_peer_; }

  void FillSummary(pb::SyncSummary* summary) const;
  void SaveTo(pb::SyncCheckpoint* out) const;
  void RestoreFrom(const pb::SyncCheckpoint& state);

 private:
  // The sender check of a mirror message: the peer it comes from, or null
  // when it was refused (an unknown site, or one speaking for another).
  Peer* KnownSender(const Envelope& message);
  // Whether `peer` introduced itself on the connection `message` came
  // over; otherwise asks it to and drops the message.
  bool Introduced(const Envelope& message, Peer& peer, double now);
  // A numbered message: introduced, the next on its channel, and not after
  // the peer's final flush. Marks it applied (a refused one would be
  // refused again).
  bool Admitted(const Envelope& message, Peer& peer, double now);
  void HandleMirror(const Envelope& message);
  void HandleHello(const Envelope& message, Peer& peer, double now);
  void HandleHeartbeat(const Envelope& message, Peer& peer, double now);
  void HandleClock(const Envelope& message, Peer& peer);
  void HandleUpdate(const Envelope& message, Peer& peer);
  void ApplyUpdate(const MirrorUpdate& update, Peer& peer);
  void HandleTravel(const Envelope& message, Peer& peer);
  void HandleTravelResult(const Envelope& message, Peer& peer);
  void HandleAck(const Envelope& message, Peer& peer);
  void Refuse(const Envelope& message, const Rejection& rejection) {
    mirror_.Refuse(message.routing_id, message.header, rejection);
  }
  void SendAck(const Peer& peer, const pb::MirrorAck& ack);

  const SyncContext& context_;
  PeerTable& peers_;
  MirrorSocket& mirror_;
  ChangeSender& sender_;
  SkewScoutTravel& skew_;
  OuterRounds* const outer_;
  ReadGate& gate_;
  UpdateDecoder decoder_;
  bool finishing_ = false;
  std::string finished_peer_;
  uint64_t updates_received_ = 0;
  uint64_t entries_received_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_INBOX_H_
