// Background checkpoint writer: writes the checkpoints a site submits on a
// thread of its own, so that the site's loop only pays for the snapshot.
#ifndef MERIDIAN_DURABLE_CHECKPOINT_WRITER_H_
#define MERIDIAN_DURABLE_CHECKPOINT_WRITER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "durable/checkpoint_codec.h"
#include "meridian/core/mutex.h"
#include "meridian/core/status.h"
#include "meridian/core/thread_annotations.h"

namespace meridian {

struct CheckpointWriterOptions {
  std::string dir;  // passed to WriteCheckpoint
  // Initial durable_sequence(): the checkpoint already on disk (e.g. the
  // one resumed from), or 0 for none.
  uint64_t durable_sequence = 0;
  // How a checkpoint is written; default (empty): WriteCheckpoint. Tests
  // replace it to block or fail on cue. Called on the writer's thread.
  std::function<Status(const std::string& dir, const Checkpoint&)> write = {};
};

// Writes submitted checkpoints on its own thread, so that the caller's
// loop only pays for taking the snapshot. At most one checkpoint waits: a
// newer submission replaces a pending one the thread has not started, so
// memory is bounded by two snapshots (the one being written and the
// pending one). Thread-safe: every method may be called from any thread,
// except the destructor (no call may race with it).
class CheckpointWriter {
 public:
  explicit CheckpointWriter(CheckpointWriterOptions options);
  // Finishes the write in progress, drops a pending checkpoint (call
  // Flush() first to keep it), joins the thread.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Queues `checkpoint` (takes ownership). Never blocks on I/O. Returns
  // true when it replaced a pending checkpoint, which is then never
  // written.
  bool Submit(Checkpoint&& checkpoint) EXCLUDES(mu_);

  // Blocks until every checkpoint submitted before the call has been
  // written, has failed, or was replaced by one that has; returns
  // last_error() then.
  Status Flush() EXCLUDES(mu_);

  // The sequence of the last checkpoint this writer put on disk (or the
  // initial one). Lock-free; a checkpoint counts once WriteCheckpoint has
  // returned OK for it, i.e. once it survives a power loss.
  uint64_t durable_sequence() const {
    return durable_sequence_.load(std::memory_order_acquire);
  }
  // The sequence of the last checkpoint whose write ended, written or
  // failed (0: none yet). Lock-free. A submitted checkpoint at or below it
  // that is not durable never will be (failed, or replaced by a newer).
  uint64_t settled_sequence() const {
    return settled_sequence_.load(std::memory_order_acquire);
  }

  // The error of the most recent write if it failed; OK if it succeeded or
  // nothing was written yet.
  Status last_error() const EXCLUDES(mu_);

  struct Stats {
    uint64_t written = 0;   // checkpoints written
    uint64_t failed = 0;    // writes that failed
    uint64_t replaced = 0;  // pending checkpoints replaced, never written
    // Wall seconds the most recent write took (steady clock; failed writes
    // too): what another checkpoint costs the writer's thread and the disk.
    double last_write_s = 0;
  };
  Stats stats() const EXCLUDES(mu_);

 private:
  void Run() EXCLUDES(mu_);

  const std::string dir_;
  const std::function<Status(const std::string&, const Checkpoint&)> write_;
  std::atomic<uint64_t> durable_sequence_;
  std::atomic<uint64_t> settled_sequence_{0};

  mutable Mutex mu_;
  // Signalled when a checkpoint is submitted, a write ends, or stop_ is set.
  std::condition_variable_any cv_;
  std::optional<Checkpoint> pending_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  // Submissions are numbered from 1; a write finished or failed covers its
  // own ticket and every ticket before it (those it replaced).
  uint64_t next_ticket_ GUARDED_BY(mu_) = 1;
  uint64_t pending_ticket_ GUARDED_BY(mu_) = 0;
  uint64_t done_ticket_ GUARDED_BY(mu_) = 0;
  Status last_error_ GUARDED_BY(mu_);
  Stats stats_ GUARDED_BY(mu_);
  std::thread thread_;  // last: starts once every field above exists
};

}  // namespace meridian

#endif  // MERIDIAN_DURABLE_CHECKPOINT_WRITER_H_
