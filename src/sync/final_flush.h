// How long the end of the job waits for the final exchange with each peer
// (SyncEngine::Finish), what is left of it, and what the summary says.
//
// The bound. A site waits for a peer's final flush, and for the peer to
// acknowledge its own, while the peer is reachable — liveness counts
// every message and acknowledgement, and a channel keeps its messages
// small (mirror_delivery.h), so a link that delivers at all keeps the peer
// reachable — for
//     kMarginS + B / r
// after its final flush went to the peer (B: the flush's bytes to it, r:
// the link's delivery rate the acknowledgements measured then; the B / r
// term is 0 before any was measured, e.g. after a --resume), and beyond
// that as long as the exchange still moves: the peer acknowledged more of
// this site's messages, or more of its own arrived, within the last
// fault.peer_timeout_s. So a flush completes on any link that delivers,
// however slowly; it ends incomplete only when a peer is unreachable
// (nothing heard for peer_timeout_s) or stalls for peer_timeout_s past
// the bound. kMarginS covers the peer's own end (its workers leave, its
// final evaluation) before its flush starts.
//
// After the exchange. The peer whose flush completes last cannot know it
// did until this site acknowledges its final, and an acknowledgement
// sent as the process ends can be lost with it (a peer then reported an
// incomplete flush the replicas did not show; after a --resume, a site
// whose own flush was complete ended at once and the peer's never
// could). So a site whose flush with a peer is complete stays and
// answers until the peer says its own is complete too (MirrorAck.flushed),
// or goes silent for fault.peer_timeout_s, or kLingerS pass.
//
// Ownership and threads: owned by the SyncEngine, driven by its Finish on
// the event-loop thread (not thread-safe). Size: one entry per peer.
#ifndef MERIDIAN_SYNC_FINAL_FLUSH_H_
#define MERIDIAN_SYNC_FINAL_FLUSH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "meridian/report.pb.h"
#include "sync/peer_table.h"
#include "sync/sync_context.h"

namespace meridian {

class FinalFlush {
 public:
  static constexpr double kMarginS = 60.0;
  static constexpr double kLingerS = 60.0;

  FinalFlush(const SyncContext& context, PeerTable& peers);
  FinalFlush(const FinalFlush&) = delete;
  FinalFlush& operator=(const FinalFlush&) = delete;

  // Finish starts at `now`. Peers whose final flush went out before (a
  // resumed site's) are timed from now.
  void Start(double now);
  // This site's final flush to each of `targets` was just queued.
  void Sent(const std::vector<Peer*>& targets, double now);
  // Whether Finish keeps waiting for any of `sites` at `now` (see the
  // bound above); logs the peers it stops waiting for.
  bool Waiting(const std::vector<int>& sites, double now);
  // Whether Finish stays after the exchange at `now`, for a peer whose
  // flush with this site is complete here but not, as far as this site
  // heard, there (see above); logs the peers it stops staying for.
  bool Lingering(double now);
  // Finish ended at `now`.
  void End(double now);

  // Finish is under way.
  bool active() const { return started_ && !ended_; }
  // Bytes of this site's final flushes not acknowledged yet.
  uint64_t bytes_left() const;
  // The flush's time, bytes, bound and the peers it did not complete
  // with.
  void FillSummary(pb::SyncSummary* summary) const;

 private:
  struct PeerWait {
    bool sent = false;        // our final flush went out (this process)
    double deadline_s = 0;    // kMarginS + B / r after it went out
    uint64_t bytes = 0;       // B
    double rate = 0;          // r (bytes/s; 0: not measured)
    uint64_t acked = 0;       // its acknowledgement of our messages
    uint64_t applied = 0;     // its messages applied here
    double progress_s = 0;    // when either last moved
    bool gave_up = false;
    bool stayed = false;  // no longer staying for it after the exchange
  };
  PeerWait& WaitFor(const Peer& peer);
  // Notes progress of `peer` at `now`; whether Finish still waits for it.
  bool StillWaiting(const Peer& peer, PeerWait& wait, double now);

  const SyncContext& context_;
  PeerTable& peers_;
  std::vector<PeerWait> waits_;  // by the peer's position in the table
  bool started_ = false;
  bool ended_ = false;
  double start_s_ = 0;
  double end_s_ = 0;
  double linger_start_s_ = -1;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_FINAL_FLUSH_H_
