// This site's own changes held back until the peers' changes of the same
// clock are in (sync { own_changes: OWN_CHANGES_WITH_PEERS }).
//
// Without it a site applies its workers' commits to its replica at once
// and a peer's changes when they arrive, at least a clock and the link's
// latency later; under label skew every replica then leans towards its own
// data (docs/guide.md, "Own changes with the peers'"). With it the store
// holds the change of every commit (ParameterStore::HoldOwnChanges); at
// each local clock the held changes of that clock queue here, and they
// reach the replica when every peer the DS bound counts has announced that
// clock (its changes up to it are then applied here too). Every replica
// thus takes each site's clock-c changes at about the same time: the
// moment the last site's clock c is known.
//
// AS_SENT goes further: at each clock only the part of the held changes
// the sync has sent to every counted peer queues (ParameterStore::TakeHeld
// with their accumulators); what the significance filter holds back stays
// held, as it stays in the peers' accumulators. The replica is then the
// changes every site sent, the same model at every site one clock apart,
// whatever the threshold.
//
// Ownership and threads: owned by SiteServer::Impl, driven by its event
// loop alone (the thread that applies to the store). Size: at most
// max_clocks queued changes of one model each (DS + 2 by default); a clock
// beyond that releases the oldest at once (counted in forced()), so a peer
// that stops announcing without being declared unreachable costs memory
// only up to the bound. Crashes: the queued and held changes are part of
// every checkpoint (AddTo, one array); what came after it is replayed by
// the workers.
#ifndef MERIDIAN_SITE_OWN_CHANGE_HOLD_H_
#define MERIDIAN_SITE_OWN_CHANGE_HOLD_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "meridian/core/status.h"
#include "meridian/ps/param_store.h"

namespace meridian {

class OwnChangeHold {
 public:
  // `store` (not owned) must hold its own changes already; `max_clocks`
  // (at least 1) bounds the queue. `as_sent`: sync.own_changes AS_SENT.
  OwnChangeHold(ParameterStore* store, size_t max_clocks,
                bool as_sent = false);

  // The site completed `clock`: what the store holds is that clock's
  // change (a jump of several clocks queues them as one, at `clock`).
  // AS_SENT: only the part of it sent to every peer in `unsent_in` (the
  // accumulators of the peers the DS bound counts; call after the sync
  // sent what it sends at this clock); the rest stays held until it is.
  // Without AS_SENT `unsent_in` is ignored: all of it queues.
  void OnClock(int64_t clock, std::span<const size_t> unsent_in = {});
  // Applies every queued change of a clock at most `peers_clock` (the
  // slowest clock the DS bound counts: SyncEngine::bounding_clock()).
  void Release(int64_t peers_clock);
  // Applies everything queued and held (the end of training, before the
  // final flush and evaluation).
  void ReleaseAll();

  // out += everything queued and held (size num_elements()): a
  // checkpoint's array. A site that restarts from it queues it at its
  // clock (Restore).
  void AddTo(std::span<float> out) const;
  Status Restore(std::span<const float> change, int64_t clock);
  // The same array restored into a site that does not hold its own
  // changes: applied to `store` at once. Both refuse an array whose size
  // is not the model's (DataLoss: the checkpoint is not this model's).
  static Status ApplyHeld(ParameterStore* store,
                          std::span<const float> change);

  // Clocks queued now, and changes released before the peers' clocks
  // came because the queue was full.
  size_t queued_clocks() const { return queue_.size(); }
  uint64_t forced() const { return forced_; }

 private:
  struct Entry {
    int64_t clock = 0;
    std::vector<float> change;
  };
  // Moves what the store holds (AS_SENT: of it, what left every
  // accumulator in `unsent_in`) into the queue as `clock`'s change.
  void QueueHeld(int64_t clock, std::span<const size_t> unsent_in = {});
  void ApplyFront();

  ParameterStore* const store_;
  const size_t max_clocks_;
  const bool as_sent_;
  std::deque<Entry> queue_;
  // A released entry's buffer, reused by the next clock (no allocation
  // per clock in the steady state).
  std::vector<float> spare_;
  uint64_t forced_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_OWN_CHANGE_HOLD_H_
