// The site's clock as the inter-site sync knows it: the intra-site
// policy's rounds, plus an offset when the site jumped forward (it resumed
// from a checkpoint, or it was more than DS clocks behind the reachable
// peers after a freeze or a partition: SyncEngine::ClockFloor).
//
// Ownership and threads: owned by SiteServer::Impl, driven by its event
// loop alone. Size: fixed.
#ifndef MERIDIAN_SITE_SITE_CLOCK_H_
#define MERIDIAN_SITE_SITE_CLOCK_H_

#include <cstdint>

#include "sync/sync_engine.h"

namespace meridian {

class SiteClock {
 public:
  // `sync` (not owned; null for a site that syncs with nobody) is told
  // every clock the site completes.
  explicit SiteClock(SyncEngine* sync) : sync_(sync) {}

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

 private:
  SyncEngine* const sync_;
  int64_t last_clock_ = 0;
  int64_t clock_offset_ = 0;  // site clock = policy clock + this
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_SITE_CLOCK_H_
