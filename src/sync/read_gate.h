// Whether the site's workers may read the model now: the DS bound holds
// (this site is at most max_clock_skew clocks ahead of the slowest peer the
// bound counts), no outer round holds reads, and no parameter they read
// was announced by a peer (MIRROR_INDICES, the selective barrier) whose
// values are still on the way. Also accounts the time replies were held.
//
// Ownership and threads: owned by the SyncEngine; the Inbox blocks and
// releases keys; read and driven by the event loop only (not
// thread-safe). Size: the blocked keys, at most one entry per parameter
// per announcement not yet followed by its values.
#ifndef MERIDIAN_SYNC_READ_GATE_H_
#define MERIDIAN_SYNC_READ_GATE_H_

#include <cstdint>
#include <ostream>
#include <span>

#include "meridian/ps/param_store.h"
#include "meridian/sync/sync.h"
#include "sync/outer_rounds.h"
#include "sync/peer_table.h"
#include "sync/sync_context.h"

namespace meridian {

class ReadGate {
 public:
  // `outer`: the outer rounds (null when the sync kind has none); not
  // owned, outlives the gate.
  ReadGate(const SyncContext& context, const PeerTable& peers,
           const OuterRounds* outer)
      : context_(context), peers_(peers), outer_(outer) {}
  ReadGate(const ReadGate&) = delete;
  ReadGate& operator=(const ReadGate&) = delete;

  // See SyncEngine::ReadsAllowed.
  bool ReadsAllowed(int64_t local_clock,
                    std::span<const KeyRange> ranges) const;
  // The selective barrier's parameters awaiting values.
  BlockedKeys& blocked() { return blocked_; }

  // Time accounting of held replies (reported as blocked_s).
  void NoteHeld(double seconds) { held_s_ += seconds; }
  double held_s() const { return held_s_; }
  void set_held_s(double seconds) { held_s_ = seconds; }

  // "local clock 40, DS 3, bounding clock 36[, outer round deferred 0][,
  // ranges awaiting values]" (SyncEngine::DescribeWait).
  void Describe(int64_t local_clock, std::ostream& out) const;

 private:
  const SyncContext& context_;
  const PeerTable& peers_;
  const OuterRounds* const outer_;
  BlockedKeys blocked_;
  double held_s_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_READ_GATE_H_
