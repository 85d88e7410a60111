#include "site/site_metrics.h"

#include <utility>

namespace meridian {

SiteMetrics::SiteMetrics(MetricsRegistry* registry, std::string site)
    : registry_(registry), site_(std::move(site)) {}

MetricCell* SiteMetrics::Cell(const std::string& name, const char* help,
                              bool counter, const MetricLabels& extra) {
  std::string key = name;
  for (const auto& [label, value] : extra) key += "\n" + label + "=" + value;
  auto it = cells_.find(key);
  if (it != cells_.end()) return it->second;
  MetricLabels labels = {{"site", site_}};
  labels.insert(labels.end(), extra.begin(), extra.end());
  MetricCell* cell = counter ? registry_->Counter(name, help, labels)
                             : registry_->Gauge(name, help, labels);
  cells_.emplace(std::move(key), cell);
  return cell;
}

void SiteMetrics::Gauge(const char* name, const char* help, double value,
                        const MetricLabels& extra) {
  Cell(name, help, false, extra)->Set(value);
}

void SiteMetrics::Counter(const char* name, const char* help, double value,
                          const MetricLabels& extra) {
  Cell(name, help, true, extra)->Set(value);
}

void SiteMetrics::Publish(const SiteMetricsSnapshot& s) {
  PublishJob(s);
  if (s.front) PublishFront(*s.front);
  PublishWorkers(s);
  if (s.sync != nullptr) PublishSync(*s.sync, s.clock);
}

void SiteMetrics::PublishFront(const wan::ConnectionFront::Stats& front) {
  Gauge("meridian_front_connections",
        "Connections the worker endpoint's front relays now",
        static_cast<double>(front.open));
  Gauge("meridian_front_trusted_connections",
        "Of them, connections of admitted workers",
        static_cast<double>(front.trusted));
  Gauge("meridian_front_held_bytes",
        "What peers sent that the server has not taken yet (bytes, plus 64 "
        "per frame)",
        static_cast<double>(front.held_bytes));
  Counter("meridian_front_refused_total",
          "Connections refused: the cap reached, every open one trusted",
          static_cast<double>(front.refused));
  Counter("meridian_front_evicted_total",
          "Untrusted connections closed to make room for a newer one",
          static_cast<double>(front.evicted));
  Counter("meridian_front_stalled_total",
          "Connections closed for sitting at their credit, or not reading, "
          "for server.limits.connection_stall_s",
          static_cast<double>(front.stalled));
  Counter("meridian_front_budget_waits_total",
          "Times a connection whose worker has not joined waited for the "
          "front's message budget (server.limits.untrusted_messages_per_s)",
          static_cast<double>(front.budget_waits));
}

void SiteMetrics::PublishJob(const SiteMetricsSnapshot& s) {
  Gauge("meridian_site_training",
        "1 while the site trains (every worker "
        "joined, the job not over), else 0",
        s.training && !s.finished);
  Gauge("meridian_site_finished", "1 once the site's job is over", s.finished);
  Gauge("meridian_site_training_seconds", "Seconds of training so far",
        s.training_s);
  Counter("meridian_site_commits_total", "Worker commits accepted",
          static_cast<double>(s.commits));
  Gauge("meridian_site_commits_per_second",
        "Commits per second over the last 5 s", s.commits_per_s);
  Counter("meridian_site_pulls_total", "Worker PULL requests accepted",
          static_cast<double>(s.pulls));
  Counter("meridian_site_rejected_total",
          "Worker requests refused (malformed, stale, unknown sender)",
          static_cast<double>(s.rejected));
  Counter("meridian_site_applied_updates_total",
          "Updates applied to the site's replica: worker commits (or barrier "
          "aggregates) and peer sites' updates; the model version",
          static_cast<double>(s.model_version));
  Gauge("meridian_site_clock", "The site's clock (the intra-site policy's)",
        static_cast<double>(s.clock));
  if (s.has_eval) {
    Gauge("meridian_site_accuracy",
          "Test accuracy of the last evaluation (fraction)", s.accuracy);
    Gauge("meridian_site_loss", "Test loss of the last evaluation", s.loss);
    Gauge("meridian_site_eval_training_seconds",
          "Training time of the last evaluation's snapshot", s.eval_t_s);
  }
  Gauge("meridian_site_barrier_commits",
        "Commits waiting in the open barrier aggregate (BSP)",
        static_cast<double>(s.barrier_commits));
  Gauge("meridian_site_commit_staleness_mean_versions",
        "Mean version lag of the last 5 s of commits (model version at "
        "arrival minus the version the commit started from)",
        s.staleness_mean);
  Gauge("meridian_site_commit_staleness_max_versions",
        "Largest version lag among the last 5 s of commits", s.staleness_max);
}

void SiteMetrics::PublishWorkers(const SiteMetricsSnapshot& s) {
  Gauge("meridian_site_workers_joined", "Workers that joined the site server",
        s.workers_joined);
  Gauge("meridian_site_workers_expected", "Workers the site server serves",
        s.workers_expected);
  Gauge("meridian_site_workers_dead",
        "Workers declared dead (silent past fault.worker_timeout_s) that have "
        "not come back",
        s.workers_dead);
  Counter("meridian_site_duplicate_commits_total",
          "Commits sent again after a reconnect whose id was already applied: "
          "answered with the model, not applied twice",
          static_cast<double>(s.duplicate_commits));
  Gauge("meridian_site_waiting_workers",
        "Workers whose commit or pull awaits its answer (barrier, bound or "
        "selective barrier): the site's queue of blocked requests",
        s.waiting_workers);
  Gauge("meridian_site_held_replies",
        "Answers ready but held by the inter-site sync (DS bound, averaging "
        "round, selective barrier)",
        s.held_replies);
  for (const SiteMetricsSnapshot::Worker& w : s.workers) {
    const MetricLabels worker = {{"worker", w.name}};
    Counter("meridian_site_worker_steps_total",
            "Local SGD steps of a worker, as it last reported",
            static_cast<double>(w.steps), worker);
    Counter("meridian_site_worker_commits_total",
            "Commits of a worker, as it last reported",
            static_cast<double>(w.commits), worker);
    Counter("meridian_site_worker_blocked_seconds_total",
            "Seconds a worker waited for commit and pull answers", w.blocked_s,
            worker);
  }
}

void SiteMetrics::PublishOwnChanges(const OwnChangeHold& hold) {
  Gauge("meridian_sync_own_changes_held_clocks",
        "Clocks of this site's own changes held until the peers announce "
        "them (sync.own_changes WITH_PEERS or AS_SENT)",
        static_cast<double>(hold.queued_clocks()));
  Counter("meridian_sync_own_changes_forced_total",
          "Clocks of own changes applied before the peers announced them, "
          "because max_clock_skew + 2 were held",
          static_cast<double>(hold.forced()));
}

void SiteMetrics::PublishSync(const SyncEngine& sync, int64_t clock) {
  Gauge("meridian_sync_theta", "Current significance threshold", sync.theta());
  Gauge("meridian_sync_slowest_peer_clock",
        "Clock of the slowest peer site this site syncs with",
        static_cast<double>(sync.slowest_peer_clock()));
  Gauge("meridian_sync_clock_lag",
        "The site's clock minus its slowest peer's (bounded by DS)",
        static_cast<double>(clock - sync.slowest_peer_clock()));
  Gauge("meridian_sync_peers_unreachable",
        "Peer sites declared unreachable right now (silent past "
        "fault.peer_timeout_s)",
        static_cast<double>(sync.unreachable_peers()));
  const pb::SyncSummary summary = sync.Summary();
  Counter("meridian_sync_updates_sent_total", "MIRROR_UPDATE messages sent",
          summary.updates_sent());
  Counter("meridian_sync_updates_received_total",
          "MIRROR_UPDATE messages received and applied",
          summary.updates_received());
  Counter("meridian_sync_entries_sent_total", "Significant elements sent",
          summary.entries_sent());
  Counter("meridian_sync_entries_received_total", "Elements received",
          summary.entries_received());
  Counter("meridian_sync_rejected_total", "Mirror messages refused",
          summary.rejected());
  Counter("meridian_sync_blocked_seconds_total",
          "Seconds worker answers were held by the sync", summary.blocked_s());
  Counter("meridian_sync_resent_total",
          "Mirror messages sent again after a gap or a reconnect",
          summary.resent());
  Counter("meridian_sync_duplicates_dropped_total",
          "Mirror messages received again (a resend) and dropped",
          summary.duplicates_dropped());
  for (const SyncEngine::PeerCounters& peer : sync.peer_counters()) {
    PublishPeer(peer);
  }
}

void SiteMetrics::PublishPeer(const SyncEngine::PeerCounters& peer) {
  const MetricLabels labels = {{"peer", peer.site}};
  Counter("meridian_sync_bytes_sent_total",
          "Bytes handed to the channel towards a peer site (header and "
          "payload frames)",
          static_cast<double>(peer.bytes_sent), labels);
  Counter("meridian_sync_bytes_received_total",
          "Bytes of the mirror messages received from a peer site",
          static_cast<double>(peer.bytes_received), labels);
  Counter("meridian_sync_messages_received_total",
          "Mirror messages received from a peer site",
          static_cast<double>(peer.messages_received), labels);
  Gauge("meridian_sync_peer_clock", "A peer site's last announced clock",
        static_cast<double>(peer.clock), labels);
  Gauge("meridian_sync_peer_connected",
        "1 once a peer site introduced itself (MIRROR_HELLO)", peer.connected,
        labels);
  Gauge("meridian_sync_peer_reachable",
        "1 while a peer site is heard from (0: silent past "
        "fault.peer_timeout_s)",
        peer.reachable, labels);
  Gauge("meridian_sync_retained_bytes",
        "Bytes of messages kept for a peer until its checkpoint holds them",
        static_cast<double>(peer.retained_bytes), labels);
  Gauge("meridian_sync_backlog_bytes",
        "Bytes sent to a peer and not yet acknowledged",
        static_cast<double>(peer.backlog_bytes), labels);
}

}  // namespace meridian
