#include "site/site_monitor.h"

#include <optional>

namespace meridian {
namespace {

// Window of the commits-per-second figure, and of the staleness metrics.
constexpr double kRateWindowS = 5.0;
// How often the event loop copies its counters into the metrics registry.
constexpr double kMetricsPeriodS = 0.25;

}  // namespace

SiteMonitor::SiteMonitor(const SiteContext& site, Sources sources)
    : site_(site), sources_(sources), metrics_(&registry_, site.name()) {}

void SiteMonitor::StartServer(const std::string& address) {
  server_ = StartMetricsServerOrWarn(&registry_, address,
                                     "site '" + site_.name() + "'");
}

std::string SiteMonitor::address() const {
  return server_ ? server_->address() : std::string();
}

void SiteMonitor::Publish(bool force) {
  if (!server_) return;
  const double now = site_.Now();
  if (!force && now < next_publish_s_) return;
  next_publish_s_ = now + kMetricsPeriodS;
  StalenessWindow& staleness = sources_.counters->staleness;
  if (now - staleness_window_start_s_ >= kRateWindowS) {
    staleness.Roll();
    staleness_window_start_s_ = now;
  }
  const TrainingPhase& phase = *sources_.phase;
  const WorkerTable& workers = *sources_.workers;
  SiteMetricsSnapshot s;
  s.training = phase.training();
  s.finished = phase.finished();
  s.training_s = phase.ReportedSeconds();
  s.workers_joined = workers.JoinedCount();
  s.workers_expected = workers.size();
  s.workers_dead = workers.Count(SlotState::kDead);
  s.duplicate_commits = workers.duplicate_commits();
  s.commits = sources_.counters->commits.load();
  s.commits_per_s = CommitRate();
  s.pulls = sources_.counters->pulls;
  s.rejected = sources_.counters->rejected;
  s.model_version = sources_.store->version();
  s.clock = sources_.clock->value();
  if (std::optional<pb::EvalPoint> last = sources_.evaluator->timeline().Last()) {
    s.has_eval = true;
    s.accuracy = last->accuracy();
    s.loss = last->loss();
    s.eval_t_s = last->t_s();
  }
  for (const WorkerSlot& slot : workers.slots()) {
    s.waiting_workers +=
        slot.awaiting_reply() && slot.state == SlotState::kLive;
    s.held_replies += slot.held;
    const pb::WorkerStats stats = WorkerTable::TotalStats(slot);
    s.workers.push_back(
        {slot.Name(), stats.steps(), stats.commits(), stats.blocked_s()});
  }
  s.barrier_commits = sources_.policy->aggregate().count();
  s.staleness_mean = staleness.mean();
  s.staleness_max = staleness.max();
  s.sync = sources_.sync;
  if (sources_.front != nullptr) s.front = sources_.front->stats();
  metrics_.Publish(s);
  if (const OwnChangeHold* hold = sources_.clock->hold()) {
    metrics_.PublishOwnChanges(*hold);
  }
}

void SiteMonitor::FillStatus(pb::SiteStatus* status) const {
  const TrainingPhase& phase = *sources_.phase;
  const WorkerTable& workers = *sources_.workers;
  status->set_site(site_.name());
  status->set_elapsed_s(phase.ReportedSeconds());
  status->set_model_version(sources_.store->version());
  status->set_commits(sources_.counters->commits.load());
  status->set_commits_per_s(CommitRate());
  status->set_workers_joined(workers.JoinedCount());
  status->set_workers_expected(workers.size());
  status->set_workers_dead(workers.Count(SlotState::kDead));
  status->set_finished(phase.finished());
  status->set_rejected(sources_.counters->rejected);
  if (const SyncEngine* sync = sources_.sync) {
    status->set_theta(sync->theta());
    status->set_wan_bytes_sent(sync->bytes_sent());
    status->set_slowest_peer_clock(sync->slowest_peer_clock());
    status->set_peers_unreachable(sync->unreachable_peers());
    const SyncEngine::FlushProgress flush = sync->flush_progress();
    if (flush.active) {
      status->set_flushing(true);
      status->set_flush_bytes_left(flush.bytes_left);
      status->set_flush_peers_left(flush.peers_left);
    }
  }
  if (std::optional<pb::EvalPoint> last = sources_.evaluator->timeline().Last()) {
    *status->mutable_last_eval() = *last;
  }
  if (const wan::ConnectionFront* front = sources_.front) {
    const wan::ConnectionFront::Stats stats = front->stats();
    pb::FrontStatus* out = status->mutable_front();
    out->set_connections(stats.open);
    out->set_trusted(stats.trusted);
    out->set_held_bytes(stats.held_bytes);
    out->set_accepted(stats.accepted);
    out->set_refused(stats.refused);
    out->set_evicted(stats.evicted);
    out->set_stalled(stats.stalled);
    out->set_max_connections(stats.max_connections);
    out->set_memory_bound(front->MemoryBound());
    out->set_untrusted_credit(stats.untrusted_credit);
    out->set_trusted_credit(stats.trusted_credit);
    out->set_budget_waits(stats.budget_waits);
  }
}

void SiteMonitor::SampleRate() {
  const double now = site_.Now();
  if (!rate_samples_.empty() && now - rate_samples_.back().first < 0.5) {
    return;
  }
  rate_samples_.emplace_back(now, sources_.counters->commits.load());
  while (rate_samples_.size() > 2 &&
         now - rate_samples_.front().first > kRateWindowS) {
    rate_samples_.pop_front();
  }
}

void SiteMonitor::NoteWaiting(const std::string& endpoint) {
  // One comparison until a line is due, nothing at all once every peer has
  // been heard from (a peer that said MIRROR_HELLO stays heard).
  const TrainingPhase& phase = *sources_.phase;
  if (all_peers_heard_ || phase.finished() ||
      !waiting_notice_.Due(site_.Now())) {
    return;
  }
  const WorkerTable& workers = *sources_.workers;
  if (!phase.training()) {
    if (workers.LiveCount() < workers.size()) {
      MLOG(INFO) << "waiting for workers: " << workers.LiveCount() << " of "
                 << workers.size() << " joined (listening on " << endpoint
                 << ")";
    }
    return;
  }
  const std::vector<std::string> silent = sources_.sync != nullptr
                                              ? sources_.sync->silent_peers()
                                              : std::vector<std::string>();
  if (silent.empty()) {
    all_peers_heard_ = true;
    return;
  }
  std::string names;
  for (const std::string& peer : silent) {
    names += (names.empty() ? "" : ", ") + peer;
  }
  MLOG(INFO) << "waiting for peer sites " << names
             << ": not heard from yet; updates for them are queued";
}

double SiteMonitor::CommitRate() const {
  if (rate_samples_.size() < 2) return 0;
  const auto& [t0, c0] = rate_samples_.front();
  const double dt = site_.Now() - t0;
  return dt > 0 ? static_cast<double>(sources_.counters->commits - c0) / dt : 0;
}

}  // namespace meridian
