// After a site server restarted from a checkpoint: which acknowledged
// commits the checkpoint lacks, per worker process, until the worker
// replays them (docs/worker-protocol.md §14) or can no longer.
//
// A commit the site answered after its newest durable checkpoint is lost
// with a crash — unless its worker process lives: the worker keeps the
// change of every answered commit above its durable point and replays it
// to the restarted site. What the site still needs to know is which
// commits a crash took: the checkpoint holds each slot's process and last
// applied id (the durable point), and every commit applied after it left a
// small record in the outgoing log (SiteCheckpointer::LogApplied). So for
// every process the restarted site knows the range durable + 1 .. last
// applied. When the process's first commit (or replay) after the restart
// arrives, the range is settled: what lies between the durable point and
// the first id it sends is lost, the rest comes back. A process that never
// returns (it died with the site; another process took its slot; the job
// ended) loses its whole range. Those counts are the summary's
// recovery.lost_commits.
//
// Ownership and threads: owned by SiteDurability, driven by the site's
// event loop alone. Size: per slot at most one entry per process seen in
// the log since the checkpoint (a slot changes process rarely; the worker
// table retires at most kMaxRetiredIncarnations); an entry is dropped once
// settled. Crash: the entries not settled yet go into the next checkpoint
// (WorkerSlotCheckpoint.unreplayed), so a second crash before the workers
// came back keeps them.
#ifndef MERIDIAN_SITE_COMMIT_RECOVERY_H_
#define MERIDIAN_SITE_COMMIT_RECOVERY_H_

#include <cstdint>
#include <span>
#include <vector>

#include "meridian/checkpoint.pb.h"
#include "site/worker_table.h"

namespace meridian {

class CommitRecovery {
 public:
  // After a restart: `records` are the checkpoint's slots (their process
  // and last applied id, in slot order), `saved` the checkpoint's slot
  // states (their entries an earlier restart left unsettled), `applied`
  // the log's records of the commits applied after the checkpoint.
  void Restore(std::span<const CommitRecord> records,
               const google::protobuf::RepeatedPtrField<
                   pb::WorkerSlotCheckpoint>& saved,
               std::span<const pb::AppliedCommit> applied);

  // What one settled process's range came to.
  struct Settled {
    uint64_t lost = 0;  // commits lost with the crash
  };
  // The first commit since the restart of process `incarnation` in `slot`
  // covers ids from `first_id` on (a commit: its id; a replay: its first):
  // the ids between the durable point and `first_id` are lost. Every other
  // process's range of the slot is settled as lost too (the slot has a new
  // process). Returns the commits lost.
  uint64_t OnFirstCommit(uint32_t slot, uint64_t incarnation,
                         uint64_t first_id);

  // Commits of unsettled ranges: lost unless their workers come back.
  uint64_t Unsettled() const;
  // The unsettled ranges of `slot`, for a checkpoint.
  void SaveTo(uint32_t slot, pb::WorkerSlotCheckpoint* out) const;

 private:
  struct Range {
    uint32_t slot = 0;
    uint64_t incarnation = 0;
    uint64_t durable_id = 0;       // the checkpoint holds ids up to this
    uint64_t last_applied_id = 0;  // the site had applied up to this
  };
  // The range of (slot, incarnation), added if missing.
  Range& RangeOf(uint32_t slot, uint64_t incarnation);

  std::vector<Range> ranges_;
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_COMMIT_RECOVERY_H_
