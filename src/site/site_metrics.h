// The metrics a site server exports (names, help texts, labels), kept out
// of the event loop's code: the site server gathers a snapshot of what it
// already counts and Publish() copies it into the registry's cells.
#ifndef MERIDIAN_SITE_SITE_METRICS_H_
#define MERIDIAN_SITE_SITE_METRICS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "meridian/metrics/metrics.h"
#include "meridian/wan/front.h"
#include "site/own_change_hold.h"
#include "sync/sync_engine.h"

namespace meridian {

// What the site server knows at one moment. Every series carries the
// label site="<name>".
struct SiteMetricsSnapshot {
  bool training = false;
  bool finished = false;
  double training_s = 0;
  uint32_t workers_joined = 0;
  uint32_t workers_expected = 0;
  uint32_t workers_dead = 0;  // declared dead and not back (yet)
  // Commits received again with an id already applied (not applied).
  uint64_t duplicate_commits = 0;
  uint64_t commits = 0;
  double commits_per_s = 0;
  uint64_t pulls = 0;
  uint64_t rejected = 0;
  uint64_t model_version = 0;  // updates applied to the replica
  int64_t clock = 0;
  bool has_eval = false;
  double accuracy = 0;
  double loss = 0;
  double eval_t_s = 0;
  // Workers whose COMMIT or PULL waits for its answer (the policy's
  // barrier or the sync), and those held by the sync alone.
  uint32_t waiting_workers = 0;
  uint32_t held_replies = 0;
  uint64_t barrier_commits = 0;  // commits in the open barrier aggregate
  // Version lag of the commits of the last window (the site's model version
  // when a commit arrived minus the version it was computed from).
  double staleness_mean = 0;
  double staleness_max = 0;
  struct Worker {
    std::string name;  // "site/index"
    uint64_t steps = 0;
    uint64_t commits = 0;
    double blocked_s = 0;
  };
  std::vector<Worker> workers;  // as each worker last reported
  // Inter-site sync; null for a site that syncs with nobody.
  const SyncEngine* sync = nullptr;
  // The worker endpoint's front (wan/front.h); none without one.
  std::optional<wan::ConnectionFront::Stats> front;
};

// Thread-compatible: the site server's event loop owns it and alone calls
// Publish (cells_ is not locked). The metrics server's threads read the
// same series through the registry, whose cells are atomic.
class SiteMetrics {
 public:
  SiteMetrics(MetricsRegistry* registry, std::string site);
  // Copies `snapshot` into the cells (relaxed atomic stores; the per-peer
  // and per-worker series are created on first sight).
  void Publish(const SiteMetricsSnapshot& snapshot);
  // sync.own_changes WITH_PEERS: the clocks of own changes held back and
  // those applied early because the hold was full.
  void PublishOwnChanges(const OwnChangeHold& hold);

 private:
  MetricCell* Cell(const std::string& name, const char* help, bool counter,
                   const MetricLabels& extra = {});
  void Gauge(const char* name, const char* help, double value,
             const MetricLabels& extra = {});
  void Counter(const char* name, const char* help, double value,
               const MetricLabels& extra = {});
  // The series of the job, of the workers, of the sync and of one peer.
  void PublishJob(const SiteMetricsSnapshot& snapshot);
  void PublishFront(const wan::ConnectionFront::Stats& front);
  void PublishWorkers(const SiteMetricsSnapshot& snapshot);
  void PublishSync(const SyncEngine& sync, int64_t clock);
  void PublishPeer(const SyncEngine::PeerCounters& peer);

  MetricsRegistry* registry_;
  const std::string site_;
  // name + extra labels -> cell, so that Publish() does not lock the
  // registry for series it has seen.
  std::map<std::string, MetricCell*> cells_;
};

// Windowed statistics of commit staleness: Add() per commit; Roll() at
// the end of each window makes its mean and max current. Thread-compatible:
// used by the site server's event loop alone.
class StalenessWindow {
 public:
  void Add(uint64_t lag) {
    sum_ += lag;
    ++count_;
    if (lag > max_) max_ = lag;
  }
  void Roll() {
    mean_ = count_ > 0 ? static_cast<double>(sum_) / count_ : 0;
    last_max_ = static_cast<double>(max_);
    sum_ = count_ = max_ = 0;
  }
  double mean() const { return mean_; }
  double max() const { return last_max_; }

 private:
  uint64_t sum_ = 0;
  uint64_t count_ = 0;
  uint64_t max_ = 0;
  double mean_ = 0;
  double last_max_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_SITE_METRICS_H_
