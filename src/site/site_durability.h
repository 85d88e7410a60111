// The site server's durable point, seen from the server: where its
// checkpoints go and under which fingerprint, what a checkpoint holds
// (collected from the parts on the event loop: a consistent snapshot) and
// when one is taken, how a restart with --resume puts it back, and which
// commits a restart lost. SiteCheckpointer (site_checkpoint.h) writes and
// reads the files; durable/checkpoint.h holds their format.
//
// The workers' side of the durable point: every WELCOME and MODEL tells a
// worker the highest of its commit ids the newest durable checkpoint holds
// and those the checkpoints being written hold (WorkerSlot's
// durable_commit_id and pending_durable, set here); the worker keeps the
// changes above it and replays them after a restart (CommitPath applies a
// replay; CommitRecovery counts what no worker replayed).
//
// Ownership and threads: owned by SiteServer::Impl, driven by its event
// loop alone (the checkpoint writer's thread lives inside the
// SiteCheckpointer and only writes the snapshots it is handed). Size: per
// checkpoint submitted and not yet superseded by a durable one (at most
// three: the durable one, the one being written, the one waiting) one
// position per worker slot; CommitRecovery's; checkpoints on disk as
// SiteCheckpointer says.
#ifndef MERIDIAN_SITE_SITE_DURABILITY_H_
#define MERIDIAN_SITE_SITE_DURABILITY_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "meridian/core/status.h"
#include "meridian/ps/param_store.h"
#include "meridian/report.pb.h"
#include "meridian/site/site_server.h"
#include "report/fault_events.h"
#include "site/commit_recovery.h"
#include "site/evaluation.h"
#include "site/policy_driver.h"
#include "site/site_checkpoint.h"
#include "site/site_clock.h"
#include "site/site_context.h"
#include "site/site_state.h"
#include "site/worker_table.h"
#include "sync/sync_engine.h"

namespace meridian {

class SiteDurability {
 public:
  // What a checkpoint is collected from and restored into; not owned, all
  // outliving this. `sync` is null for a site that syncs with nobody.
  struct Parts {
    ParameterStore* store = nullptr;
    SyncEngine* sync = nullptr;
    WorkerTable* workers = nullptr;
    FaultEventLog* events = nullptr;
    PolicyDriver* policy = nullptr;  // the barrier aggregate
    SiteClock* clock = nullptr;
    TrainingPhase* phase = nullptr;
    SiteCounters* counters = nullptr;
    Evaluation* evaluator = nullptr;
  };
  // `options`: checkpoint_dir, out_dir and resume (SiteServerOptions).
  SiteDurability(const SiteContext& site, const SiteServerOptions& options,
                 Parts parts);
  SiteDurability(const SiteDurability&) = delete;
  SiteDurability& operator=(const SiteDurability&) = delete;

  // Opens the checkpoint directory (when the site keeps checkpoints) and,
  // with --resume, continues from its newest checkpoint. Call once, after
  // the sync engine exists and before training.
  Status Open();

  // Resumed a job this site had finished: Run reports it again.
  bool resumed_finished() const { return resumed_finished_; }
  // The summary's recovery section (restarts 0: never restarted); its
  // lost_commits include the commits no worker has replayed (yet).
  pb::SiteRecovery recovery() const;

  // A commit of `worker` was applied: its id goes to the log (when the
  // site keeps checkpoints), so that a restart knows what it lost.
  void NoteApplied(uint32_t worker, uint64_t commit_id);
  // After a restart from a checkpoint, the first commit of a worker process
  // covers ids from `first_id` on (a commit: its id; a replay: the first it
  // replays): the commits it was answered before the crash and does not
  // send again are lost (CommitRecovery).
  void NoteFirstCommit(uint32_t worker, uint64_t first_id);
  // A replay of `worker`'s commits `first_id` .. `last_id` was applied.
  void NoteReplayed(uint32_t worker, uint64_t first_id, uint64_t last_id);

  // Training starts: a durable point before the first update leaves this
  // site, unless the site restarted (a crash at any moment from now on
  // finds a checkpoint and the log after it; without one, a restart would
  // begin from the initial model while its peers kept what it had sent).
  void CheckpointBeforeTraining();
  // Every turn of the event loop: acknowledges durable checkpoints to the
  // peers, and takes a checkpoint when one is due.
  void MaybeCheckpoint();
  // After the final flush: the job's end is durable too, so a --resume of
  // it reports the end instead of training on.
  void FinalCheckpoint();

 private:
  // Identifies this job, site and model in checkpoint files.
  std::string Fingerprint() const;
  // Where this site keeps its checkpoints: --checkpoint-dir, else
  // fault.checkpoint_dir/<site>, else <out>/checkpoints/<site>; empty: none.
  std::string CheckpointDir() const;
  // Continues from a checkpoint: the store's arrays, the sync's channels
  // (and the updates it sent after the checkpoint, taken back), the worker
  // table, counters, timeline and events.
  Status Recover(const SiteCheckpointer::Recovered& recovered);
  // The worker table's commit records, and what CommitRecovery watches
  // (the log's `applied` commits after the checkpoint `sequence`).
  void RestoreWorkers(const pb::SiteCheckpoint& meta, uint64_t sequence,
                      std::span<const pb::AppliedCommit> applied);
  // The site's state now, handed to the background writer.
  void TakeCheckpoint(bool finished);
  // Sets every slot's durable point from the checkpoints durable and being
  // written, when those changed.
  void PublishDurablePoints();

  const SiteContext& site_;
  const SiteServerOptions& options_;
  const Parts parts_;
  std::unique_ptr<SiteCheckpointer> checkpointer_;  // null: no checkpoints
  // Per checkpoint submitted (ascending sequence) from the durable one on:
  // each slot's process and last applied commit id at its snapshot.
  struct SlotPosition {
    uint64_t incarnation = 0;
    uint64_t commit_id = 0;
  };
  struct Positions {
    uint64_t sequence = 0;
    std::vector<SlotPosition> slots;
  };
  std::deque<Positions> positions_;
  // What PublishDurablePoints last published from.
  uint64_t published_durable_ = 0;
  std::vector<uint64_t> published_pending_;
  CommitRecovery lost_;
  uint64_t log_errors_ = 0;  // to log one in a hundred
  pb::SiteRecovery recovery_;
  bool resumed_finished_ = false;  // resumed a job that had ended here
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_SITE_DURABILITY_H_
