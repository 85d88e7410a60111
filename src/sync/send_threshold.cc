#include "sync/send_threshold.h"

#include <algorithm>
#include <string>
#include <vector>

#include "meridian/wan/presets.h"
#include "meridian/wan/units.h"

namespace meridian {

uint64_t RetentionLimit(const SyncContext& context) {
  if (context.fault.has_retention_limit()) {
    Result<uint64_t> limit =
        wan::ParseByteSize(context.fault.retention_limit());
    if (limit.ok()) return *limit;
  }
  const uint64_t model_bytes = context.store->num_elements() * sizeof(float);
  return std::max<uint64_t>(uint64_t{4} << 20, 4 * model_bytes);
}

SendThreshold::SendThreshold(const SyncContext& context, PeerTable& peers)
    : context_(context),
      peers_(peers),
      schedule_(context.sync, context.job.optimizer(),
                context.job.policy().local_steps()) {}

double SendThreshold::Theta(int64_t clock) {
  if (context_.sync.kind() == pb::DENSE) return 0;
  double theta =
      schedule_.At(static_cast<uint64_t>(std::max<int64_t>(clock, 1)));
  // SkewScout's controller sets the threshold (a flush clock stays 0).
  if (skew_theta_ && theta > 0) theta = *skew_theta_;
  if (theta > 0) {
    double adjustment = 0;
    for (const auto& peer : peers_.all()) {
      // An unreachable or silent link says nothing about what the others
      // carry.
      if (peer->link.adaptive && peer->live.reachable &&
          !peers_.Silent(*peer)) {
        adjustment = std::max(adjustment, peer->link.adaptive->adjustment());
      }
    }
    theta += adjustment;
  }
  last_ = theta;
  return theta;
}

void SendThreshold::OpenLink(Peer& peer, double now) {
  const double budget = LinkBudget(peer.site);
  if (context_.sync.adaptive_threshold()) {
    peer.link.adaptive.emplace(
        budget, context_.sync.adaptive_step(),
        context_.sync.adaptive_max() - context_.sync.threshold());
  }
  peer.link.period_start_s = now;
}

void SendThreshold::ObserveBandwidth() {
  const double now = context_.Now();
  for (const auto& peer : peers_.all()) {
    PeerLink& link = peer->link;
    if (!link.adaptive) continue;
    const uint64_t sent = peer->out.bytes_sent();
    if (peers_.Silent(*peer)) {
      // Nothing is known of its link now; it starts afresh when heard.
      link.adaptive->Reset();
    } else if (peer->live.reachable) {
      link.adaptive->ObserveDelivery(
          sent - link.period_sent, now - link.period_start_s,
          link.period_congested || peer->out.Saturated(now));
    }
    link.period_sent = sent;
    link.period_start_s = now;
    link.period_congested = false;
  }
}

double SendThreshold::LinkBudget(int peer) const {
  if (context_.sync.has_bandwidth_budget()) {
    Result<double> budget =
        wan::ParseBandwidth(context_.sync.bandwidth_budget());
    return budget.ok() ? *budget / 8 : 0;
  }
  Result<std::vector<wan::LinkModel>> links =
      wan::ResolveJobLinks(context_.job);
  if (!links.ok()) return 0;
  const std::string& other = context_.job.site(peer).name();
  for (const wan::LinkModel& link : *links) {
    if (link.a == context_.name && link.b == other) {
      return link.a_to_b.bandwidth_bps / 8;
    }
    if (link.b == context_.name && link.a == other) {
      return link.b_to_a.bandwidth_bps / 8;
    }
  }
  return 0;
}

}  // namespace meridian
