#include "sync/update_age.h"

#include <algorithm>
#include <cmath>

namespace meridian {

void DurationHistogram::Add(double seconds) {
  if (!(seconds > 0)) seconds = 0;  // NaN and clock offsets count as 0
  min_ = count_ == 0 ? seconds : std::min(min_, seconds);
  ++count_;
  sum_ += seconds;
  max_ = std::max(max_, seconds);
  int bucket = 0;
  if (seconds > kLowestS) {
    bucket = static_cast<int>(
        std::floor(std::log10(seconds / kLowestS) * kBucketsPerDecade));
  }
  ++buckets_[std::clamp(bucket, 0, kBuckets - 1)];
}

double DurationHistogram::Quantile(double q) const {
  if (count_ == 0) return 0;
  const double rank = std::clamp(q, 0.0, 1.0) * static_cast<double>(count_);
  uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += buckets_[b];
    if (buckets_[b] > 0 && static_cast<double>(seen) >= rank) {
      // The end buckets hold everything beyond them: the extreme seen.
      if (b == 0) return min_;
      if (b == kBuckets - 1) return max_;
      // Else the bucket's geometric middle, within what was seen.
      const double middle =
          kLowestS * std::pow(10.0, (b + 0.5) / kBucketsPerDecade);
      return std::clamp(middle, min_, max_);
    }
  }
  return max_;
}

void RemoteUpdateAge::Record(double window_start_unix_s, double sent_unix_s,
                             int64_t clock, double now_unix_s,
                             int64_t local_clock) {
  oldest_.Add(now_unix_s - window_start_unix_s);
  transit_.Add(now_unix_s - sent_unix_s);
  const int64_t behind = std::max<int64_t>(0, local_clock - clock);
  clocks_behind_sum_ += static_cast<double>(behind);
  clocks_behind_max_ = std::max(clocks_behind_max_, behind);
}

void RemoteUpdateAge::Fill(const std::string& peer,
                           pb::RemoteUpdateAge* out) const {
  out->set_peer(peer);
  out->set_updates(oldest_.count());
  out->set_median_s(oldest_.Quantile(0.5));
  out->set_p90_s(oldest_.Quantile(0.9));
  out->set_max_s(oldest_.max());
  out->set_mean_s(oldest_.mean());
  out->set_median_transit_s(transit_.Quantile(0.5));
  out->set_mean_clocks_behind(
      oldest_.count() == 0 ? 0 : clocks_behind_sum_ / oldest_.count());
  out->set_max_clocks_behind(static_cast<double>(clocks_behind_max_));
}

}  // namespace meridian
