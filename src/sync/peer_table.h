// The peers one site syncs with, and what it knows of each: their
// channels, whether they are reachable, and where the clocks stand (theirs
// and this site's).
//
// Liveness (job.fault): a peer silent for peer_timeout_s is unreachable:
// nothing new is created for it (its changes wait in its accumulator), and
// under PARTITION_CONTINUE the DS bound ignores it until it is back and has
// caught up.
//
// Ownership and threads: the PeerTable owns every Peer; it is owned by the
// SyncEngine and driven by the site server's event-loop thread only (not
// thread-safe). Size: one Peer per site of the role (fixed at creation);
// each peer's state is bounded by its channels (mirror_delivery.h) and its
// accumulator (the model's size, in the store).
#ifndef MERIDIAN_SYNC_PEER_TABLE_H_
#define MERIDIAN_SYNC_PEER_TABLE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "meridian/report.pb.h"
#include "meridian/sync/sync.h"
#include "report/fault_events.h"
#include "sync/mirror_delivery.h"
#include "sync/sync_context.h"
#include "sync/sync_engine.h"
#include "sync/update_age.h"

namespace meridian {

// Whether a peer is there (PeerTable): declared unreachable after
// peer_timeout_s of silence; back when heard again, and
// (PARTITION_CONTINUE) outside the DS bound until its clock is within DS
// of this site's.
struct PeerLiveness {
  bool reachable = true;
  bool catching_up = false;
  double unreachable_since_s = 0;
  double unreachable_total_s = 0;
};

// What the sending side (Outbox, ChangeSender) keeps per peer.
struct PeerSending {
  int64_t announced = 0;  // last clock sent to it
  bool final_sent = false;
  uint64_t final_sequence = 0;
  // When this site took its last update for it out of its accumulator
  // (Unix s): the next update carries the changes made since.
  double window_start_unix_s = 0;
  // ||acc|| / ||w|| of its accumulator, sampled (ChangeSender::SampleUnsent).
  uint64_t unsent_samples = 0;
  double unsent_sum = 0;
  double unsent_max = 0;
};

// Bandwidth-adaptive threshold of the link towards a peer (SendThreshold,
// when enabled), fed with what the channel sent and the peer acknowledged
// per period.
struct PeerLink {
  std::optional<AdaptiveThreshold> adaptive;
  uint64_t period_sent = 0;  // the channel's bytes_sent at the period start
  double period_start_s = 0;
  // The channel held changes back in this period (flow control).
  bool period_congested = false;
};

// What the receiving side (Inbox) keeps per peer.
struct PeerReceiving {
  // Its channel's connection to our mirror socket (acks go back on it).
  std::string routing_id;
  bool final_received = false;
  // An acknowledgement saying this site's flush with it is complete
  // (MirrorAck.flushed) went out; it said the same of its own.
  bool told_flushed = false;
  bool said_flushed = false;
  uint64_t bytes_received = 0;  // of its mirror messages (metrics)
  uint64_t messages_received = 0;
  // How old its changes were when applied here.
  RemoteUpdateAge age;
  // When this site last asked it to introduce itself (it spoke without a
  // MIRROR_HELLO this run of the site knows of).
  double hello_requested_s = -1;
};

// SkewScout (SkewScoutTravel): the id of the travel to a peer that has not
// been answered (0: none); a new travel waits until it is, or until the
// next period.
struct PeerTravel {
  uint64_t outstanding = 0;
  int64_t sent_clock = 0;
};

// Everything this site knows about one peer it syncs with, grouped by the
// part of the engine that drives it.
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
  OutboundChannel out;   // this site's messages to it
  InboundChannel in;     // its messages to this site
  // Changes not sent to it yet (a ParameterStore accumulator); unused
  // under MODEL_AVERAGING and DILOCO.
  size_t acc = 0;
  PeerLiveness live;
  PeerSending sending;
  PeerLink link;
  PeerReceiving receiving;
  PeerTravel travel;
};

class PeerTable {
 public:
  // One Peer per site of the role, each with its own accumulator when the
  // sync kind uses them: local changes feed every accumulator, so a peer
  // that is unreachable (or whose channel is full) keeps what it has not
  // been sent while the others go on. A hub also adds to a peer's
  // accumulator what it receives from others that the peer should get
  // (RelayTargets).
  PeerTable(const SyncContext& context, const DeliveryOptions& delivery);
  PeerTable(const PeerTable&) = delete;
  PeerTable& operator=(const PeerTable&) = delete;

  // ---- the peers ----------------------------------------------------------
  const std::vector<std::unique_ptr<Peer>>& all() const { return peers_; }
  size_t size() const { return peers_.size(); }
  bool empty() const { return peers_.empty(); }
  Peer* Find(const std::string& site);
  const Peer* At(int site) const;
  std::vector<Peer*> Select(const std::vector<int>& sites);
  // `peer`'s position in the table (the outer rounds' peer number).
  uint32_t PositionOf(const Peer& peer) const;
  // The peers whose accumulators a change received from `from` goes into:
  // a hub passes a member's changes on to the other hubs and the other
  // members, and a hub's changes to its members. Mesh nodes and members
  // relay nothing.
  std::vector<size_t> RelayTargets(int from) const;
  // What each checkpoint-writing peer keeps for a resend (the retention
  // limit of every channel).
  const DeliveryOptions& delivery() const { return delivery_; }
  void EnableCheckpoints();

  // ---- clocks -------------------------------------------------------------
  int64_t local_clock() const { return local_clock_; }
  void set_local_clock(int64_t clock) { local_clock_ = clock; }
  MirrorClocks& clocks() { return clocks_; }
  int64_t ClockOf(const Peer& peer) const;
  int64_t ClockOfSite(int site) const;
  // The slowest clock the DS bound counts (this site's own when none).
  int64_t BoundingClock() const;
  // The accumulators (ParameterStore ids) of the peers the DS bound
  // counts: what each of them has not been sent yet.
  std::vector<size_t> BoundingAccumulators() const;
  // Under PARTITION_CONTINUE, DS below the slowest reachable peer; 0
  // otherwise (SyncEngine::ClockFloor).
  int64_t ClockFloor() const;
  // The slowest peer's clock (this site's own without peers).
  int64_t SlowestClock() const;

  // ---- liveness -----------------------------------------------------------
  // Training started (Connect): peers not heard from within peer_timeout_s
  // from `now` are unreachable.
  void StartLiveness(double now);
  bool training() const { return training_; }
  // Whether the DS bound waits for `peer`.
  bool Bounding(const Peer& peer) const;
  // Seconds since anything was heard from `peer` (its messages, its
  // acknowledgements), counted from no earlier than the liveness floor.
  double SilentFor(const Peer& peer) const;
  // Silent for more than a few heartbeat intervals (see peer_table.cc).
  bool Silent(const Peer& peer) const;
  // Whether changes and clocks are created for `peer` now.
  bool Sendable(const Peer& peer) const {
    return peer.live.reachable && !peer.sending.final_sent;
  }
  // Anything from `peer` (a message on the mirror socket, an ack on the
  // channel) proves it is there.
  void HeardFrom(Peer& peer);
  // A peer that came back is within the DS bound again once its clock is
  // within DS of this site's.
  void UpdateCatchingUp(Peer& peer);
  // A turn of the event loop at `now`: after a stall of the loop every
  // peer gets a fresh liveness window.
  void NoteServiceTurn(double now);
  // `peer` is declared unreachable when silent for more than
  // peer_timeout_s.
  void CheckLiveness(Peer& peer, double now);
  uint32_t unreachable() const;
  // Peers that have not introduced themselves yet, as "name (endpoint)".
  std::vector<std::string> SilentPeers() const;

  // ---- the end of the job ---------------------------------------------------
  // Whether the final exchange with `peer` is complete: its final flush
  // arrived and ours was acknowledged.
  bool Flushed(const Peer& peer) const;
  bool AllFlushed() const;
  // Whether nothing is left to wait for from `peer`: its final flush
  // arrived, and ours, if sent, was acknowledged.
  bool Exchanged(const Peer& peer) const;
  // Whether Finish may stop waiting for `sites`: each has Exchanged(), or
  // is unreachable (waiting would only hold everyone else's results).
  bool Done(const std::vector<int>& sites) const;
  // The peers whose final exchange is not complete (Flushed), by name.
  std::vector<std::string> Unflushed() const;

  // ---- reporting ----------------------------------------------------------
  // Faults seen with peers (unreachable and back, restarted, resends).
  FaultEventLog& events() { return events_; }
  const FaultEventLog& events() const { return events_; }
  std::vector<SyncEngine::PeerCounters> Counters() const;
  // Resends, duplicates, gaps, time unreachable and each peer's update age.
  void FillSummary(pb::SyncSummary* summary) const;
  // Each peer's clock, liveness and channel positions (DescribeWait).
  void Describe(std::ostream& out) const;

 private:
  const SyncContext& context_;
  const DeliveryOptions delivery_;
  std::vector<std::unique_ptr<Peer>> peers_;
  MirrorClocks clocks_;
  int64_t local_clock_ = 0;
  bool training_ = false;  // Connect() was called
  // Liveness: silence is counted from no earlier than this (training's
  // start, the end of a stall of the event loop).
  double liveness_floor_s_ = 0;
  double last_service_s_ = -1;
  FaultEventLog events_;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_PEER_TABLE_H_
