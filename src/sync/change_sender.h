// Gaia's sending side (and DENSE's): what of each peer's accumulator of
// local changes passes the significance threshold goes out as an update
// (preceded by its indices when it is large: the selective barrier), the
// clock announcement follows the updates it covers, and the end of the job
// flushes everything left losslessly with the final clock. A hub relays:
// its members get their share of the group's sum with each announcement,
// and its announcements wait for the slowest site the DS bound counts.
// Not used by the outer rounds (DILOCO, MODEL_AVERAGING), which send
// outer gradients instead, except for the clock announcements.
//
// Ownership and threads: owned by the SyncEngine; driven by its event loop
// (not thread-safe). Size: fixed; the changes wait in the store's
// accumulators (bounded by the model), the messages in the channels.
#ifndef MERIDIAN_SYNC_CHANGE_SENDER_H_
#define MERIDIAN_SYNC_CHANGE_SENDER_H_

#include <cstdint>
#include <vector>

#include "meridian/report.pb.h"
#include "sync/outbox.h"
#include "sync/peer_table.h"
#include "sync/send_threshold.h"
#include "sync/sync_context.h"

namespace meridian {

class ChangeSender {
 public:
  ChangeSender(const SyncContext& context, PeerTable& peers, Outbox& outbox,
               SendThreshold& threshold);
  ChangeSender(const ChangeSender&) = delete;
  ChangeSender& operator=(const ChangeSender&) = delete;

  // The site reached `clock`: what passes θ(clock) for each peer that can
  // take it now, out of its accumulator (the links' controllers observe
  // the last period first). A hub's members get theirs when their
  // channel's clock advances (AnnounceClocks), which may wait for the
  // slowest site.
  void SendAtClock(int64_t clock);
  // Every turn of the event loop (sync.send_period_s > 0): local changes
  // go out between clocks too, once a period.
  void SendIfPeriodDue(double now);
  // Sends the clock announcement that became due on each channel (one
  // message, however far the clock moved). A hub first sends a member
  // what of its sum is significant, so the clock still follows the
  // updates it covers.
  void AnnounceClocks();
  // Sends `peer` the clock announcement due on its channel, if any.
  // `changes_first`: what of its accumulator is significant goes before
  // it, as at a local clock (whose changes were just sent otherwise); a
  // hub's member always gets its share of the sum first.
  void AnnounceClock(Peer& peer, bool changes_first);
  // The end of the job towards `targets`: everything left in their
  // accumulators losslessly, then the final clock. Sent even to an
  // unreachable peer or a full channel: it waits in the retention.
  void FlushAndSendFinal(const std::vector<Peer*>& targets);

  // About once a second: how large each peer's unsent change is against
  // the model, sampled (see change_sender.cc).
  void SampleUnsent();
  // Updates sent between clocks and each peer's unsent change.
  void FillSummary(pb::SyncSummary* summary) const;

 private:
  void SendSignificantToPeers(double theta);
  void SendSignificant(Peer& peer, double theta);
  // The messages of one update (UpdateCodec::Take), with the selective
  // barrier's indices before each when the update is large enough.
  void SendWithBarrier(const std::vector<EncodedSlices>& update, Peer& peer);
  // The clock a channel should have announced by now (see .cc).
  int64_t DueClock(const Peer& peer) const;

  const SyncContext& context_;
  PeerTable& peers_;
  Outbox& outbox_;
  SendThreshold& threshold_;
  // When local changes last went out (sync.send_period_s).
  double last_send_s_ = -1e9;
  uint64_t updates_between_clocks_ = 0;  // not checkpointed: this process's
  uint64_t unsent_offset_ = 0;           // SampleUnsent's rotating offset
  double last_unsent_sample_s_ = -1e9;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_CHANGE_SENDER_H_
