// A site server's durable point: periodic checkpoints of its state and the
// log of the updates it sent since the last one (src/durable/checkpoint.h
// holds the file formats; this class decides what goes in and when).
//
// The guarantee (docs/operations.md, "Failures"): a site server killed at any moment
// and restarted with --resume continues from its newest durable
// checkpoint. Updates its workers committed after that point are lost
// compute, counted in the report; those of them that had already left for
// the peers are taken back from the peers (the outgoing log says what
// left), so after the final flush every replica is identical. Everything
// it had received since the checkpoint is sent to it again by the peers,
// which keep every message until this site's checkpoint holds it.
//
// Ownership and threads: owned by the site server, driven by its event
// loop (not thread-safe), except the CheckpointWriter's own thread, which
// writes the snapshots the loop hands it. Disk use: the two newest
// checkpoints and the log segments from the older of them on.
#ifndef MERIDIAN_SITE_SITE_CHECKPOINT_H_
#define MERIDIAN_SITE_SITE_CHECKPOINT_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meridian/checkpoint.pb.h"
#include "meridian/ps/param_store.h"
#include "meridian/core/status.h"
#include "durable/checkpoint.h"
#include "sync/sync_engine.h"

namespace meridian {

struct SiteCheckpointOptions {
  std::string dir;          // checkpoints and log; created if missing
  std::string fingerprint;  // CheckpointFingerprint of the job and site
  double period_s = 10;     // between checkpoints (seconds of the loop)
  bool fsync_log = false;   // LogWriterOptions::fsync_each_append
};

class SiteCheckpointer {
 public:
  // What a restarted site continues from.
  struct Recovered {
    Checkpoint checkpoint;  // its arrays; meta parsed below
    pb::SiteCheckpoint meta;
    std::vector<pb::LoggedMessage> logged;  // sent after the checkpoint
    // Commits applied after the checkpoint (LogApplied), in order.
    std::vector<pb::AppliedCommit> applied;
    // Restarts from this checkpoint before this one (LogRestart).
    uint32_t restarts_logged = 0;
    std::string path;
    std::vector<std::string> notes;  // refused newer files, torn log tail
  };

  // Opens `options.dir`. With `resume`, loads the newest intact checkpoint
  // of this fingerprint and the log written after it (recovered() then has
  // them; none is fine: a fresh start). Without, refuses a directory that
  // holds checkpoints (they belong to an earlier run; --resume continues
  // it). Then starts a new log segment. Errors name the directory and the
  // file at fault (corrupt everywhere, another job's, unwritable).
  static Result<std::unique_ptr<SiteCheckpointer>> Open(
      SiteCheckpointOptions options, bool resume);
  ~SiteCheckpointer();
  SiteCheckpointer(const SiteCheckpointer&) = delete;
  SiteCheckpointer& operator=(const SiteCheckpointer&) = delete;

  const std::string& dir() const { return options_.dir; }
  const std::optional<Recovered>& recovered() const { return recovered_; }
  // Frees what recovered() holds once it was applied.
  void ForgetRecovered() { recovered_.reset(); }

  // Appends one sent message to the log (SyncEngine::SetOutgoingLog).
  Status Log(const pb::LoggedMessage& message);
  // Appends the record of an applied commit (a few bytes, never fsync'ed
  // on its own: a power loss may lose the newest ones, which costs only
  // the count of lost commits). A restart reads them back (Recovered).
  Status LogApplied(const pb::AppliedCommit& commit);
  // Appends that the site restarted (unsynced, as LogApplied): the next
  // restart counts it even when no checkpoint came between.
  Status LogRestart();

  // Whether to take a checkpoint at `now` (seconds on the loop's clock): a
  // period has passed since the last one, or `wanted` (a peer's messages
  // since the last durable checkpoint fill half of what it keeps), the
  // previous checkpoint is durable and EarlyCheckpointSpacing has passed.
  // Heavy sync (a dense update every clock) fills a peer's retention
  // several times a second; a fixed spacing of a second stalled it.
  bool Due(double now, bool wanted) const;

  // Takes the checkpoint whose state the caller collected on the event
  // loop (a consistent snapshot): `meta` (log_segment is filled here) and
  // `arrays`. Rotates the log, so the records after this snapshot start a
  // new segment, and hands the checkpoint to the background writer.
  // Returns its sequence number (0: skipped, the log could not rotate).
  uint64_t Submit(pb::SiteCheckpoint meta, std::vector<NamedArray> arrays,
                  double now);
  // The newest checkpoint on disk (0: none), and the submitted ones that
  // may still get there, ascending: the one being written and the one
  // waiting (at most two; a checkpoint replaced by a newer submission, or
  // whose write failed, never will).
  uint64_t durable_sequence() const { return writer_->durable_sequence(); }
  std::vector<uint64_t> Pending() const;

  // The sync state of the newest checkpoint that became durable since the
  // last call (for SyncEngine::NoteDurable); nullopt when none did. Also
  // prunes the log segments no checkpoint needs any more. Call every turn
  // of the event loop.
  std::optional<pb::SyncCheckpoint> TakeDurable();

  // Waits for the checkpoint being written (at the end of the job).
  Status Flush() { return writer_->Flush(); }

  uint64_t checkpoints_written() const { return writer_->stats().written; }
  // Seconds the last checkpoint write took (0 before any).
  double last_write_s() const { return writer_->stats().last_write_s; }
  // The last write's error (OK when it succeeded).
  Status last_error() const { return writer_->last_error(); }

 private:
  explicit SiteCheckpointer(SiteCheckpointOptions options)
      : options_(std::move(options)) {}
  // Appends a bookkeeping record, never fsync'ed on its own.
  Status LogUnsynced(const pb::LoggedMessage& record);

  SiteCheckpointOptions options_;
  std::optional<Recovered> recovered_;
  std::unique_ptr<LogWriter> log_;
  std::unique_ptr<CheckpointWriter> writer_;
  // Checkpoints and log segments share one numbering: checkpoint k's
  // records after its snapshot go to segment k.
  uint64_t next_number_ = 1;
  double last_checkpoint_s_ = -1;
  uint64_t write_errors_seen_ = 0;  // to log one in a hundred
  // Submitted, not yet known durable: (sequence, log segment, sync state;
  // replaced: a newer submission took its place before it was written).
  struct InFlight {
    uint64_t sequence = 0;
    uint64_t log_segment = 0;
    pb::SyncCheckpoint sync;
    bool replaced = false;
  };
  std::deque<InFlight> in_flight_;
  // Log segments of the two newest durable checkpoints (the newest and its
  // fallback): segments below the older one may go.
  std::deque<uint64_t> durable_segments_;
};

// How long an early checkpoint (Due's `wanted`) waits after the previous
// one, in seconds: at least 0.1 s and 5 × the last write's duration
// `last_write_s`, at most `period_s` (when > 0).
double EarlyCheckpointSpacing(double last_write_s, double period_s);

// The array of a checkpoint that holds the site's own changes not yet
// applied to its model (sync.own_changes WITH_PEERS: own_change_hold.h).
inline constexpr char kHeldOwnChanges[] = "held_own_changes";

// The store's arrays for a checkpoint: "model", "velocity" (when server
// momentum ran) and "acc/<peer>" for each peer of `sync` (null: none).
// Call from the thread that applies updates (a consistent snapshot).
std::vector<NamedArray> StoreArrays(const ParameterStore& store,
                                    const SyncEngine* sync);

// Puts them back, at `version`. Errors name a missing or wrong-sized array
// (a checkpoint of another model or topology).
Status RestoreStoreArrays(const Checkpoint& checkpoint, uint64_t version,
                          ParameterStore* store, const SyncEngine* sync);

}  // namespace meridian

#endif  // MERIDIAN_SITE_SITE_CHECKPOINT_H_
