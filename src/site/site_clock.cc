#include "site/site_clock.h"

#include "meridian/core/log.h"

namespace meridian {

void SiteClock::Advance(uint64_t policy_clock, bool running) {
  int64_t clock = static_cast<int64_t>(policy_clock) + clock_offset_;
  if (sync_ != nullptr && running) {
    const int64_t floor = sync_->ClockFloor();
    if (floor > clock) {
      MLOG(INFO) << "clock " << clock << " -> " << floor
                 << ": more than DS clocks behind the reachable peers";
      clock_offset_ += floor - clock;
      clock = floor;
    }
  }
  if (clock <= last_clock_) return;
  if (sync_ == nullptr) {
    last_clock_ = clock;
    return;
  }
  if (clock - last_clock_ > 2) {
    last_clock_ = clock;
    Complete(last_clock_);
    return;
  }
  while (last_clock_ < clock) {
    ++last_clock_;
    Complete(last_clock_);
  }
}

}  // namespace meridian
