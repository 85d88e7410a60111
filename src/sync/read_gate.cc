#include "sync/read_gate.h"

namespace meridian {

bool ReadGate::ReadsAllowed(int64_t local_clock,
                            std::span<const KeyRange> ranges) const {
  if (ranges.empty()) {
    if (!blocked_.empty()) return false;
  } else {
    for (const KeyRange& range : ranges) {
      if (blocked_.Intersects(range.begin, range.end)) return false;
    }
  }
  if (outer_ != nullptr) return !outer_->HoldsReads();
  return local_clock - peers_.BoundingClock() <=
         static_cast<int64_t>(context_.sync.max_clock_skew());
}

void ReadGate::Describe(int64_t local_clock, std::ostream& out) const {
  out << "local clock " << local_clock << ", DS "
      << context_.sync.max_clock_skew() << ", bounding clock "
      << peers_.BoundingClock();
  if (outer_ != nullptr) {
    out << ", outer round deferred " << outer_->deferred();
  }
  if (!blocked_.empty()) out << ", ranges awaiting values";
}

}  // namespace meridian
