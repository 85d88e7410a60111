// Appending to the outgoing-update log (format: log_format.h; reading it
// back: log_reader.h).
#ifndef MERIDIAN_DURABLE_LOG_WRITER_H_
#define MERIDIAN_DURABLE_LOG_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "durable/log_format.h"
#include "meridian/core/status.h"

namespace meridian {

struct LogWriterOptions {
  // true: Append() returns once the record is on stable storage
  // (fdatasync per append): it survives a power loss.
  // false: Append() returns once write(2) has handed the record to the
  // kernel's page cache: it survives the death of this process (kill -9),
  // not a power loss or an OS crash; after one of those, records appended
  // since the last Sync() or Rotate() may be missing from the end of the
  // log (never from its middle).
  bool fsync_each_append = false;
};

// Appends records to the segments of one log directory. Thread-compatible:
// one thread at a time (the caller serialises). A record is either read
// back whole or not at all. Owns the open descriptor of the current
// segment; memory is constant (no record is buffered).
class LogWriter {
 public:
  // Starts segment `segment` in `dir` (created if missing). First repairs
  // the log: deletes stale temporary files and cuts a torn record (left by
  // a crash mid-append) off the end of the newest existing segment, so
  // that only the newest segment can ever end torn; see repair_note().
  // Fails if the newest existing segment belongs to another fingerprint or
  // is corrupt, or if `segment` is not above every existing segment (read
  // the log with ReadLog() first, then continue above its last_segment).
  // The new segment's header is durable (fsync'ed, directory too) on
  // return.
  static Result<std::unique_ptr<LogWriter>> Open(std::string dir,
                                                 std::string fingerprint,
                                                 uint64_t segment,
                                                 LogWriterOptions options = {});
  ~LogWriter();  // closes the segment; no fsync
  LogWriter(const LogWriter&) = delete;
  LogWriter& operator=(const LogWriter&) = delete;

  // Appends one record (payload up to 2^32-1 bytes) to the current segment
  // with a single write, durable as LogWriterOptions says. On failure
  // (ENOSPC...) the segment is cut back to its last complete record and
  // later appends may succeed; if even that cut fails, every later Append
  // and Rotate fails (FailedPrecondition with the original error).
  Status Append(std::span<const std::byte> payload);
  // The same, never fsync'ed on its own (whatever fsync_each_append says):
  // durable once a later Append, Sync() or Rotate() syncs the segment. For
  // records whose loss in a power failure costs only bookkeeping.
  Status AppendUnsynced(std::span<const std::byte> payload);

  // Makes every record appended so far durable (fdatasync).
  Status Sync();

  // Continues in a new segment numbered `new_segment` (above the current
  // one): syncs the current segment (so that after a power loss only the
  // newest segment can lose records), creates the new one durably, and
  // closes the old one.
  Status Rotate(uint64_t new_segment);

  uint64_t segment() const { return segment_; }
  // Bytes in the current segment, header included.
  uint64_t segment_bytes() const { return size_; }
  // What Open() repaired, e.g. "cut 17 torn bytes off <path>: record at
  // offset 4096: declares 900 bytes, 9 left"; empty if nothing.
  const std::string& repair_note() const { return repair_note_; }

 private:
  LogWriter(std::string dir, std::string fingerprint, LogWriterOptions options)
      : dir_(std::move(dir)),
        fingerprint_(std::move(fingerprint)),
        options_(options) {}
  // Cuts a torn tail off segment `newest` (the newest existing one), so
  // that a torn record never sits in an older segment.
  Status RepairNewest(uint64_t newest);
  // Append's body; `sync`: fdatasync after the write.
  Status AppendRecord(std::span<const std::byte> payload, bool sync);
  // FailedPrecondition (naming the original error) once broken_ is set.
  Status CheckUsable() const;
  // Creates segment `segment` (header written to a temporary file,
  // fsync'ed, linked under the segment's name, which it never replaces,
  // directory fsync'ed) and makes it current.
  Status StartSegment(uint64_t segment, uint64_t previous);

  std::string dir_;
  std::string fingerprint_;
  LogWriterOptions options_;
  int fd_ = -1;
  uint64_t segment_ = 0;
  std::string path_;   // of the current segment
  uint64_t size_ = 0;  // bytes of complete records + header in the segment
  Status broken_;      // non-OK once the segment may hold a torn record
  std::string repair_note_;
};

// Deletes the log segments below `keep_from_segment`, oldest first (a crash
// part-way leaves the newest ones), then fsyncs `dir` if it deleted
// anything. Never pass a value above a live writer's segment(). Missing
// directory: OK.
Status PruneLog(const std::string& dir, uint64_t keep_from_segment);

}  // namespace meridian

#endif  // MERIDIAN_DURABLE_LOG_WRITER_H_
