// The outer rounds of DILOCO and MODEL_AVERAGING on the wire: at a clock
// that starts a round, this site sends its outer gradient of the round's
// fragment to every peer; peers' outer gradients are added to their round;
// a round that has every site's closes with an outer step on the local
// model (the arithmetic is OuterSteps', outer_steps.h). A round whose
// fragment's previous round is still open waits (and so do reads) until
// that one closes.
//
// Ownership and threads: owned by the SyncEngine when the sync kind has
// outer rounds (null otherwise); driven by its event loop (not
// thread-safe). Size: OuterSteps' (a few model-sized arrays), plus one
// model-sized snapshot while a round starts.
#ifndef MERIDIAN_SYNC_OUTER_ROUNDS_H_
#define MERIDIAN_SYNC_OUTER_ROUNDS_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "durable/checkpoint.h"
#include "meridian/checkpoint.pb.h"
#include "meridian/compression/compression.h"
#include "meridian/net/message.h"
#include "meridian/report.pb.h"
#include "sync/mirror_messages.h"
#include "sync/outbox.h"
#include "sync/outer_steps.h"
#include "sync/peer_table.h"
#include "sync/skewscout_travel.h"
#include "sync/sync_context.h"

namespace meridian {

class OuterRounds {
 public:
  OuterRounds(const SyncContext& context, PeerTable& peers, Outbox& outbox,
              const SkewScoutTravel& skew, OuterSteps steps);
  OuterRounds(const OuterRounds&) = delete;
  OuterRounds& operator=(const OuterRounds&) = delete;

  // Training starts: the replicas start from the same model, the first
  // anchor (unless a checkpoint restored one).
  void Start();
  // At a clock that starts a round, sends this site's outer gradient of
  // the round's fragment to every peer, unless the previous round of that
  // fragment is still open: then the round waits (deferred()).
  void StartIfDue(int64_t clock);
  // Takes every outer step whose round is complete, then starts the round
  // that waited for one of them.
  void CloseReady();

  // A peer's outer gradient (policy and apply): refused (nothing changes)
  // when its round starts at no clock, it carries a parameter outside the
  // round's fragment, or OuterSteps::AddPeer refuses it — as
  // ERROR_MALFORMED what no sender may send, as ERROR_STALE what arrives
  // at the wrong time. Call CloseReady() after one was added.
  Check AddPeer(const Peer& peer, const MirrorUpdate& update);
  // After a crash: this site's outer gradient of `header` (logged as
  // `record`) left after the checkpoint. The peers add it to their round,
  // so it goes into ours too, measured from the restored model.
  Status Recover(const pb::Header& header, const pb::LoggedMessage& record);

  // Whether the rounds hold reads now: a round waits for the previous one
  // of its fragment; without overlap (MODEL_AVERAGING never overlaps) so
  // does every open round.
  bool HoldsReads() const;
  // The round waiting for its fragment's previous one (0: none).
  int64_t deferred() const { return deferred_; }
  // The averaging period in effect (clocks).
  uint32_t period() const { return steps_.period(); }

  void FillSummary(pb::SyncSummary* summary) const;
  void SaveTo(pb::SyncCheckpoint* out) const;
  // Errors when the checkpoint has outer state but no `arrays`, or they do
  // not hold it (OuterSteps::RestoreFrom).
  Status RestoreFrom(const pb::SyncCheckpoint& state, const Checkpoint* arrays);
  void AppendArrays(std::vector<NamedArray>* arrays) const {
    steps_.AppendArrays(arrays);
  }

 private:
  void StartRound(int64_t clock, uint32_t fragment);
  // The averaging period this site proposes with its outer gradient: its
  // SkewScout controller's (0: the period is fixed).
  uint32_t ProposedPeriod() const;
  // Counts a round of this site's sent: its fragment's `range`, the
  // entries its message carried and the message's bytes.
  void CountSent(const KeyRange& range, uint64_t entries, uint64_t bytes);

  const SyncContext& context_;
  PeerTable& peers_;
  Outbox& outbox_;
  const SkewScoutTravel& skew_;
  OuterSteps steps_;
  // Decodes this site's own outer gradients (what the peers will add).
  UpdateDecoder decoder_;
  // The round waiting for its fragment's previous one (0: none) and how
  // many rounds waited.
  int64_t deferred_ = 0;
  uint64_t deferred_count_ = 0;
  // What this site's outer gradients carried (report.json's density and
  // bits; saved in the checkpoint).
  struct Sent {
    uint64_t rounds = 0;
    uint64_t parameters = 0;  // fragment sizes, summed
    uint64_t entries = 0;
    uint64_t bytes = 0;
  };
  Sent sent_;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_OUTER_ROUNDS_H_
