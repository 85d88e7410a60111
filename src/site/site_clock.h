// The site's clock as the inter-site sync knows it: the intra-site
// policy's rounds, plus an offset when the site jumped forward (it resumed
// from a checkpoint, or it was more than DS clocks behind the reachable
// peers after a freeze or a partition: SyncEngine::ClockFloor).
//
// With sync.own_changes WITH_PEERS it owns the site's held own changes
// (own_change_hold.h): each clock the site completes queues its changes,
// which reach the replica when the peers have announced that clock.
//
// Ownership and threads: owned by SiteServer::Impl, driven by its event
// loop alone. Size: fixed, and the hold's bound.
#ifndef MERIDIAN_SITE_SITE_CLOCK_H_
#define MERIDIAN_SITE_SITE_CLOCK_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "site/own_change_hold.h"
#include "sync/sync_engine.h"

namespace meridian {

class SiteClock {
 public:
  // `sync` (not owned; null for a site that syncs with nobody) is told
  // every clock the site completes.
  // `hold`: the site's own changes held back (null: applied at once).
  explicit SiteClock(SyncEngine* sync,
                     std::unique_ptr<OwnChangeHold> hold = nullptr)
      : sync_(sync), hold_(std::move(hold)) {}

  // The clock the sync was last told about.
  int64_t value() const { return last_clock_; }

  // Tells the sync about every clock the site has completed: the policy's
  // `policy_clock` rounds plus the offset, moved up to the sync's floor
  // while `running` (training, not finished). One clock at a time, a jump
  // in one step.
  void Advance(uint64_t policy_clock, bool running);

  // Continues from a checkpoint's `clock` (the policy starts again at 0).
  void Restore(int64_t clock) {
    last_clock_ = clock;
    clock_offset_ = clock;
  }

  // Applies the held own changes of every clock the peers have announced
  // (each turn of the event loop); ApplyAllOwnChanges applies all of them
  // (the end of training, before the final flush). No-ops without a hold.
  void ApplyOwnChanges() {
    if (hold_) hold_->Release(sync_->bounding_clock());
  }
  void ApplyAllOwnChanges() {
    if (hold_) hold_->ReleaseAll();
  }
  // The hold, null when own changes are applied at once (checkpoints,
  // metrics).
  OwnChangeHold* hold() { return hold_.get(); }
  const OwnChangeHold* hold() const { return hold_.get(); }

 private:
  // The clock `clock` is complete: the sync sends what it has for it,
  // then its held changes queue.
  void Complete(int64_t clock) {
    // The sync sends first: under AS_SENT the hold lets go of what it sent.
    sync_->OnLocalClock(clock);
    if (hold_) hold_->OnClock(clock, sync_->bounding_accumulators());
  }

  SyncEngine* const sync_;
  const std::unique_ptr<OwnChangeHold> hold_;
  int64_t last_clock_ = 0;
  int64_t clock_offset_ = 0;  // site clock = policy clock + this
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_SITE_CLOCK_H_
