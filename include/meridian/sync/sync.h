// Inter-site synchronisation building blocks (Gaia's approximate synchronous
// parallel): the significance filter and its threshold schedules, the
// bandwidth-adaptive threshold, mirror clocks with the DS bound, the
// selective barrier's blocked keys, and the topology (who sends to whom).
// Everything here is pure logic on values and virtual time; the site
// server's SyncEngine (src/sync) wires it to sockets and the store.
#ifndef MERIDIAN_SYNC_SYNC_H_
#define MERIDIAN_SYNC_SYNC_H_

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "meridian/job.pb.h"
#include "meridian/core/status.h"

namespace meridian {

// ---- significance filter --------------------------------------------------

// Moves the significant entries of `acc` out: for every i with acc[i] != 0
// and
//   RELATIVE: |acc[i]| > theta * |w[i]|, or w[i] == 0,
//   ABSOLUTE: |acc[i]| > theta,
// appends (base + i, acc[i]) to (indices, values) and sets acc[i] = 0.
// theta == 0 takes every non-zero entry (a flush). Returns how many were
// taken. `acc` and `w` have the same size.
size_t TakeSignificant(std::span<float> acc, std::span<const float> w,
                       double theta, pb::ThresholdMode mode, uint64_t base,
                       std::vector<uint64_t>* indices,
                       std::vector<float>* values);

// theta(t) of the schedule in `sync` at site clock t >= 1; 0 on a flush
// clock (every flush_every clocks). LR_COUPLED follows the workers'
// learning-rate schedule, taking a clock as `steps_per_clock` local steps.
class ThresholdSchedule {
 public:
  ThresholdSchedule(const pb::SyncConfig& sync,
                    const pb::OptimizerConfig& optimizer,
                    uint32_t steps_per_clock);
  double At(uint64_t clock) const;

 private:
  pb::SyncConfig sync_;
  pb::OptimizerConfig optimizer_;
  uint32_t steps_per_clock_;
};

// Gaia's bandwidth controller for one link, on what the link carries now:
// after each clock, the threshold rises by `step` while the link is
// saturated — it held back updates because as much as it delivers in a
// couple of seconds was still on the way (the channel's flow control), or
// the sender put more than 1.1 x the budget on it — and falls by `step`
// while it is not saturated and the sender stays below 0.9 x the budget;
// within [0, max_adjustment]. A budget of 0 (unknown) leaves only the
// saturation rule. So a link slowed at run time raises the threshold even
// when the job file's budget says it should not. Not thread-safe.
class AdaptiveThreshold {
 public:
  AdaptiveThreshold(double budget_bytes_per_s, double step,
                    double max_adjustment);
  // `bytes` were sent to the link during the last `seconds`; no delivery
  // information (the budget rule alone).
  void Observe(uint64_t bytes, double seconds);
  // During the last `seconds` the sender put `sent_bytes` on the link;
  // `saturated`: the link could not take all it had to send.
  void ObserveDelivery(uint64_t sent_bytes, double seconds, bool saturated);
  // Forgets what it learned (a link that went silent).
  void Reset() { adjustment_ = 0; }
  // What to add to the scheduled theta.
  double adjustment() const { return adjustment_; }
  double budget_bytes_per_s() const { return budget_; }

 private:
  double budget_;
  double step_;
  double max_adjustment_;
  double adjustment_ = 0;
};

// ---- clocks -----------------------------------------------------------------

// The clocks a site has heard from the sites it syncs with. A clock must go
// up each time (updates of a clock travel before it on the same ordered
// channel, so clock c means "everything up to c has arrived"); it may jump
// by more than one (a site that was cut off, frozen or restarted catches
// up in one step). Not thread-safe.
class MirrorClocks {
 public:
  // Peers start at clock 0.
  explicit MirrorClocks(std::vector<std::string> peers);

  // Records `clock` from `peer`. Errors: an unknown peer, or a clock that
  // is not above the previous one.
  Status Advance(const std::string& peer, int64_t clock);
  // Sets `peer`'s clock, also backwards (a peer restarted without its
  // state). Errors: an unknown peer.
  Status Reset(const std::string& peer, int64_t clock);
  // The slowest peer's clock (INT64_MAX with no peers).
  int64_t Min() const;
  // Whether a site at `local` clock may run on under the bound DS:
  // local - Min() <= max_skew.
  bool WithinBound(int64_t local, uint32_t max_skew) const;
  std::optional<int64_t> ClockOf(const std::string& peer) const;

 private:
  std::map<std::string, int64_t> clocks_;
};

// ---- selective barrier ----------------------------------------------------

// Parameters announced by a peer's MIRROR_INDICES whose values have not
// arrived yet: reads that touch them wait. Keys are flat element indices.
// Not thread-safe.
class BlockedKeys {
 public:
  // Blocks `keys` on behalf of (peer, clock).
  void Block(const std::string& peer, int64_t clock,
             std::span<const uint64_t> keys);
  // The values of (peer, clock) arrived: its keys are free again.
  void Release(const std::string& peer, int64_t clock);
  // Whether any key in [begin, end) is blocked.
  bool Intersects(uint64_t begin, uint64_t end) const;
  bool empty() const { return count_.empty(); }
  size_t blocked() const { return count_.size(); }

 private:
  std::map<std::pair<std::string, int64_t>, std::vector<uint64_t>> by_update_;
  std::map<uint64_t, uint32_t> count_;  // key -> announcements holding it
};

// ---- topology -------------------------------------------------------------

// What one site does in the sync topology. Site indices refer to
// JobConfig.site; only sites that run a server take part.
struct SyncRole {
  enum class Kind { kMesh, kHub, kMember };
  Kind kind = Kind::kMesh;
  int hub = -1;              // kMember: its hub
  std::vector<int> members;  // kHub: the other sites of its group
  std::vector<int> hubs;     // kHub: the other hubs
  std::vector<int> mesh;     // kMesh: every other site
  // Every site this one exchanges messages with (connects to).
  std::vector<int> Peers() const;
};

// The role of `site_index` under config.sync(): FULL_MESH makes every site a
// mesh node; STAR makes the hub the only hub; GROUPS follows the groups.
// Precondition: a validated config and a site that runs a server.
SyncRole RoleOf(const pb::JobConfig& config, int site_index);

// WAN messages per clock (updates and clocks, every site counted) under the
// topology of `config`: S(S-1) x 2 for a mesh of S sites; for hubs, members
// send 2 to their hub, hubs 2 to each other hub and 2 to each member.
uint64_t MessagesPerClock(const pb::JobConfig& config);

}  // namespace meridian

#endif  // MERIDIAN_SYNC_SYNC_H_
