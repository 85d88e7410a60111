// The significance threshold θ in force and the budgets behind it: the
// configured schedule (sync.threshold, its mode and schedule), SkewScout's
// knob when it sets θ, and each link's bandwidth-adaptive adjustment
// (sync.adaptive_threshold), fed with what the link's channel sent and the
// peer acknowledged per period against the link budget
// (sync.bandwidth_budget, else the emulated bandwidth towards the peer).
//
// Ownership and threads: owned by the SyncEngine; driven by its event loop
// (not thread-safe). Size: fixed; the per-link state lives in each Peer
// (PeerLink).
#ifndef MERIDIAN_SYNC_SEND_THRESHOLD_H_
#define MERIDIAN_SYNC_SEND_THRESHOLD_H_

#include <cstdint>
#include <optional>

#include "meridian/sync/sync.h"
#include "sync/peer_table.h"
#include "sync/sync_context.h"

namespace meridian {

// Bytes a channel keeps for a resend: fault.retention_limit, else 4 x the
// model (at least 4 MiB).
uint64_t RetentionLimit(const SyncContext& context);

class SendThreshold {
 public:
  SendThreshold(const SyncContext& context, PeerTable& peers);

  // θ at `clock` (0 under DENSE and on a flush clock), remembered as
  // last().
  double Theta(int64_t clock);
  double last() const { return last_; }
  // SkewScout's knob sets θ from now on (except on flush clocks).
  void SetSkewTheta(double theta) { skew_theta_ = theta; }

  // The channel to `peer` opened at `now`: its link's controller starts.
  void OpenLink(Peer& peer, double now);
  // Feeds each link's controller with what its channel sent, what the
  // peer acknowledged and what is still on the way since the last clock.
  void ObserveBandwidth();

 private:
  // The link budget in bytes/s: sync.bandwidth_budget, else the emulated
  // bandwidth of the direction towards `peer`; 0 when neither is known.
  double LinkBudget(int peer) const;

  const SyncContext& context_;
  PeerTable& peers_;
  ThresholdSchedule schedule_;
  std::optional<double> skew_theta_;
  double last_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_SEND_THRESHOLD_H_
