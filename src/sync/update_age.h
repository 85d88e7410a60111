// How old remote changes are when a site applies them: the measurement
// behind the accuracy of multi-site training under label skew (README,
// "Non-IID data"). A site that applies its own changes at once and its
// peers' changes late trains on a model tilted towards its own classes;
// how late is what this records, per peer.
#ifndef MERIDIAN_SYNC_UPDATE_AGE_H_
#define MERIDIAN_SYNC_UPDATE_AGE_H_

#include <array>
#include <cstdint>
#include <string>

#include "meridian/report.pb.h"

namespace meridian {

// A distribution of durations in fixed logarithmic buckets (10 per decade
// from 100 us to 1000 s; shorter and longer ones land in the end buckets),
// so its size is fixed however long a job runs. Quantiles are read to the
// bucket (within ~12%; in an end bucket, the smallest or largest duration
// seen); count, mean, min and max are exact. Not thread-safe.
class DurationHistogram {
 public:
  void Add(double seconds);
  uint64_t count() const { return count_; }
  double mean() const { return count_ == 0 ? 0 : sum_ / count_; }
  double min() const { return min_; }
  double max() const { return max_; }
  // The q-quantile (q in [0, 1]); 0 when empty.
  double Quantile(double q) const;

 private:
  static constexpr int kBucketsPerDecade = 10;
  static constexpr double kLowestS = 1e-4;
  static constexpr int kBuckets = 7 * kBucketsPerDecade;  // 1e-4 .. 1e3 s
  std::array<uint64_t, kBuckets> buckets_{};
  uint64_t count_ = 0;
  double sum_ = 0;
  double min_ = 0;
  double max_ = 0;
};

// The age of one peer's changes as this site applies them. Sender and
// receiver wall clocks are assumed to agree (one machine, or NTP: an offset
// shifts every age by itself; negative ages count as 0).
class RemoteUpdateAge {
 public:
  // An update that carried changes made since `window_start_unix_s` at the
  // sender (when it took its previous update for this site), sent at
  // `sent_unix_s`, tagged with the sender's `clock`, applied now
  // (`now_unix_s`) while this site is at `local_clock`.
  void Record(double window_start_unix_s, double sent_unix_s, int64_t clock,
              double now_unix_s, int64_t local_clock);
  uint64_t updates() const { return oldest_.count(); }
  void Fill(const std::string& peer, pb::RemoteUpdateAge* out) const;

 private:
  DurationHistogram oldest_;   // now - window start: the oldest change
  DurationHistogram transit_;  // now - sent: queues, link, event loop
  double clocks_behind_sum_ = 0;
  int64_t clocks_behind_max_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_UPDATE_AGE_H_
