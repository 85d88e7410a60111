// What a running site server tells about itself: the STATUS_REPLY a
// client asks for, the metrics endpoint (a registry, the HTTP server that
// renders it, the period the event loop publishes at), the commit rate
// both show, and the log lines that say what the site still waits for.
//
// Ownership and threads: owned by SiteServer::Impl, driven by its event
// loop alone; the metrics server's threads render the registry (atomic
// cells) and never touch this class. Declared so that the server stops
// before the registry goes. Size: the rate window holds a sample per half
// second of the last kRateWindowS; the registry a series per worker and
// per peer.
#ifndef MERIDIAN_SITE_SITE_MONITOR_H_
#define MERIDIAN_SITE_SITE_MONITOR_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "meridian/core/log.h"
#include "meridian/metrics/metrics.h"
#include "meridian/ps/param_store.h"
#include "meridian/wire.pb.h"
#include "site/evaluation.h"
#include "site/policy_driver.h"
#include "site/site_clock.h"
#include "site/site_context.h"
#include "site/site_metrics.h"
#include "site/site_state.h"
#include "site/worker_table.h"
#include "sync/sync_engine.h"

namespace meridian {

class SiteMonitor {
 public:
  // What the status and the metrics show; not owned, all outliving this.
  // `sync` is null for a site that syncs with nobody.
  struct Sources {
    const TrainingPhase* phase = nullptr;
    SiteCounters* counters = nullptr;  // its staleness window is rolled here
    const WorkerTable* workers = nullptr;
    const ParameterStore* store = nullptr;
    const SiteClock* clock = nullptr;
    const PolicyDriver* policy = nullptr;  // the barrier aggregate
    const Evaluation* evaluator = nullptr;
    const SyncEngine* sync = nullptr;
    // The worker endpoint's front; null without one.
    const wan::ConnectionFront* front = nullptr;
  };
  SiteMonitor(const SiteContext& site, Sources sources);
  SiteMonitor(const SiteMonitor&) = delete;
  SiteMonitor& operator=(const SiteMonitor&) = delete;

  // Starts the metrics endpoint on `address` ("HOST:PORT"; empty or
  // "none": none). A bind failure is logged and the site runs without one.
  void StartServer(const std::string& address);
  // Its bound "HOST:PORT"; empty without one.
  std::string address() const;

  // Copies the counters into the metrics registry, at most every
  // kMetricsPeriodS unless `force`.
  void Publish(bool force = false);
  // The body of a STATUS_REPLY.
  void FillStatus(pb::SiteStatus* status) const;
  // Takes a commit-count sample for the rate, at most every half second.
  void SampleRate();

  // Says, at growing intervals, what the site is still waiting for: its
  // workers before training (listening on `endpoint`), peers that have not
  // introduced themselves during it (their updates are queued meanwhile).
  // Every turn of the event loop.
  void NoteWaiting(const std::string& endpoint);
  // Training started: the wait for workers is over.
  void ResetWaiting() { waiting_notice_.Reset(); }

 private:
  // Commits per second over the last kRateWindowS.
  double CommitRate() const;

  const SiteContext& site_;
  const Sources sources_;
  // (seconds, commits) samples of the last kRateWindowS.
  std::deque<std::pair<double, uint64_t>> rate_samples_;
  double staleness_window_start_s_ = 0;
  double next_publish_s_ = 0;
  WaitNotice waiting_notice_;  // for workers, then for peer sites
  bool all_peers_heard_ = false;
  // The event loop publishes into the registry, the server's threads
  // render it (declared in this order so the server stops first).
  MetricsRegistry registry_;
  SiteMetrics metrics_;
  std::unique_ptr<MetricsServer> server_;
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_SITE_MONITOR_H_
