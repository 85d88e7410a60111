// Durable state of a site server, so that it survives a crash: checkpoints
// (a snapshot of everything the site needs to continue), an append-only log
// of records written between checkpoints (the outgoing-update log), and a
// background thread that writes checkpoints while training goes on.
//
// Failure model. Any process may die at any moment (kill -9 mid-write), and
// files may be truncated or corrupt. Nothing here crashes or allocates
// without bound on bad bytes: every length read from a file is checked
// against the bytes actually there before anything is allocated, and every
// refusal is a Status naming the file and what is wrong with it.
//
// One directory, one writer. A checkpoint directory and a log directory
// (they may be the same) belong to one site of one job, written by one
// process at a time; files of another job or site in it are refused on
// load (the fingerprint), never silently used. Readers may run while no
// writer does (at start-up, before the writer is created).
//
// All integers in files are little-endian; floats are IEEE-754 binary32,
// little-endian. The checksum is CRC-32 as zlib's crc32() computes it
// (ISO-HDLC: reflected polynomial 0xEDB88320, initial value 0, as in gzip
// and PNG); it detects every error burst of up to 32 bits, so every
// single-byte corruption.
//
// Checkpoint file `ckpt-<16 lowercase hex digits of the sequence>`, format
// version 1 (F, M, L, E: the lengths declared just before):
//
//   offset   bytes  field
//   0        8      magic "MRDNCKPT" (4D 52 44 4E 43 4B 50 54)
//   8        4      u32 format version = 1
//   12       8      u64 total file length in bytes, this header and the
//                   trailing checksum included
//   20       8      u64 sequence (equals the one in the file name)
//   28       4      u32 fingerprint length F, 1..kMaxFingerprintBytes
//   32       F      fingerprint bytes
//   32+F     8      u64 meta length M
//   40+F     M      meta bytes (opaque: the caller's serialized message)
//   40+F+M   4      u32 array count N
//   then N arrays, each:
//            4      u32 name length L, 1..kMaxArrayNameBytes
//            L      name bytes (names are unique within a checkpoint)
//            8      u64 element count E
//            4*E    E floats
//   end-4    4      u32 CRC-32 of every byte before it
//
// Log segment file `log-<16 lowercase hex digits of the segment number>`,
// format version 1. A segment appears under its name only complete with
// its header (written as a temporary file, then renamed):
//
//   offset   bytes  field
//   0        8      magic "MRDNULOG" (4D 52 44 4E 55 4C 4F 47)
//   8        4      u32 format version = 1
//   12       8      u64 segment number (equals the one in the file name)
//   20       8      u64 number of the segment written before this one, or
//                   2^64-1 (kNoSegment) for the first segment of a log
//   28       4      u32 fingerprint length F, 1..kMaxFingerprintBytes
//   32       F      fingerprint bytes
//   32+F     4      u32 CRC-32 of bytes [0, 32+F)
//   then records up to the end of the file, each:
//   0        4      u32 payload length P
//   4        4      u32 CRC-32 of the 4 length bytes followed by the payload
//   8        P      payload bytes
//
// Temporary files (`ckpt-<hex>.tmp`, `log-<hex>.tmp`) are left only by a
// crash mid-write; readers ignore them and the next writer deletes them.
// Other files in the directories are ignored and left alone.
#ifndef MERIDIAN_DURABLE_CHECKPOINT_H_
#define MERIDIAN_DURABLE_CHECKPOINT_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "meridian/core/mutex.h"
#include "meridian/core/status.h"
#include "meridian/core/thread_annotations.h"

namespace meridian {

inline constexpr uint32_t kCheckpointFormatVersion = 1;
inline constexpr uint32_t kLogFormatVersion = 1;
// Bounds of the fingerprint and of an array's name (bytes). They keep
// error messages, which quote both, readable.
inline constexpr size_t kMaxFingerprintBytes = 4096;
inline constexpr size_t kMaxArrayNameBytes = 4096;
// "No segment": the previous segment of a log's first segment.
inline constexpr uint64_t kNoSegment = ~uint64_t{0};

// One named array of floats (a tensor, an optimizer slot, an accumulator).
struct NamedArray {
  std::string name;
  std::vector<float> values;

  friend bool operator==(const NamedArray&, const NamedArray&) = default;
};

// Everything one checkpoint holds. The fields' meaning is the caller's;
// float values are stored bit for bit (NaN and infinities included).
struct Checkpoint {
  // Orders checkpoints: the newest is the highest. Numbered by the caller,
  // typically the resumed checkpoint's sequence + 1 (so that a new write
  // replaces a newer file that was refused on load).
  uint64_t sequence = 0;
  // Identifies the job and site the state belongs to (non-empty, at most
  // kMaxFingerprintBytes); loading with another fingerprint is refused.
  // Quoted in errors, so make it readable: see CheckpointFingerprint().
  std::string fingerprint;
  // Opaque bytes, e.g. a serialized Protobuf message the caller owns
  // (clocks, what was received from each peer, policy state).
  std::string meta;
  // Unique, non-empty names (at most kMaxArrayNameBytes each).
  std::vector<NamedArray> arrays;

  // The array called `name`, or null. Linear in the number of arrays.
  const NamedArray* Find(std::string_view name) const;

  // Field by field; floats compare as floats (a NaN differs from itself).
  friend bool operator==(const Checkpoint&, const Checkpoint&) = default;
};

// A readable fingerprint: "job 'x' site 'us' seed 7 layout 3f2a9c" (the
// layout digest is whatever identifies the model's tensors and shapes).
std::string CheckpointFingerprint(std::string_view job, std::string_view site,
                                  uint64_t seed,
                                  std::string_view layout_digest);

// "ckpt-000000000000000c" and "log-000000000000000c" for 12.
std::string CheckpointFileName(uint64_t sequence);
std::string LogSegmentFileName(uint64_t segment);

// ---------------------------------------------------------------------------
// Checkpoints

// The file's bytes (see the format above). Fails (InvalidArgument) on an
// empty or too long fingerprint and on empty, too long or repeated array
// names: what is written can always be read back.
Result<std::vector<std::byte>> EncodeCheckpoint(const Checkpoint& checkpoint);

// Parses a checkpoint file's bytes; `source` names them in errors ("<file>
// ..."). Refuses (DataLoss; FailedPrecondition for another format version)
// wrong magic, other versions, truncated or extended files, checksum
// mismatches and malformed contents. Does not check the fingerprint.
// Every length is checked against the bytes left before anything is
// allocated: memory stays within a small multiple of bytes.size().
// Thread-safe.
Result<Checkpoint> DecodeCheckpoint(std::span<const std::byte> bytes,
                                    std::string_view source);

// Reads and decodes the checkpoint file at `path` and checks that it
// belongs to `fingerprint` (FailedPrecondition naming both otherwise).
// A file that is not a checkpoint of this format version, or whose size
// differs from the one its header declares, is refused from its first 20
// bytes, before its size is allocated. Peak memory: about twice the
// file's size.
Result<Checkpoint> ReadCheckpointFile(const std::string& path,
                                      std::string_view fingerprint);

// Writes `checkpoint` into `dir` (created if missing) as
// CheckpointFileName(sequence), atomically and durably: a temporary file in
// `dir`, written, fsync'ed, renamed over the final name, then `dir`
// fsync'ed. When it returns OK the checkpoint survives a power loss, and
// LoadLatest(dir) returns it. Then keeps the checkpoint just written and
// the newest one below it (the fallback) and deletes every other
// checkpoint — older ones, and newer ones, which a caller that numbers as
// advised only leaves behind when they were refused on load — and stale
// temporary files (a file it cannot delete is logged as a warning; a newer
// one it cannot delete is an error, since it would shadow this one).
// Errors are Statuses naming the path and the system's reason (ENOSPC,
// EACCES, EIO...). When writing the temporary file fails, it is removed
// and the directory holds what it held before; a failure after the rename
// (fsync of the directory) leaves the new file without the guarantee.
// Streams the file: no copy of the checkpoint in memory. Not for
// concurrent use on one directory.
Status WriteCheckpoint(const std::string& dir, const Checkpoint& checkpoint);

// The result of LoadLatest.
struct LoadedCheckpoint {
  // Empty when `dir` is missing or holds no checkpoint file.
  std::optional<Checkpoint> checkpoint;
  std::string path;  // of the checkpoint loaded
  // One message per newer checkpoint file refused on the way, naming the
  // file and why ("checkpoint '<path>': checksum mismatch ..."), newest
  // first: log them, they mean state was lost or misplaced.
  std::vector<std::string> refused;
};

// The newest checkpoint in `dir` that is intact and belongs to
// `fingerprint`, trying files from the newest down. A missing directory,
// or one without checkpoint files (temporary files do not count), is "no
// checkpoint": OK with an empty `checkpoint`. A directory whose every
// checkpoint is refused is an error that lists each file and why
// (FailedPrecondition when all belong to another job or site, else
// DataLoss). Reads only: nothing is repaired or deleted.
Result<LoadedCheckpoint> LoadLatest(const std::string& dir,
                                    std::string_view fingerprint);

// Sequences of the checkpoint files in `dir`, ascending (names only, the
// contents are not read). Missing directory: empty.
Result<std::vector<uint64_t>> ListCheckpoints(const std::string& dir);

// Deletes the checkpoints below `keep_from_sequence` and stale temporary
// checkpoint files, then fsyncs `dir` if it deleted anything. Missing
// directory: OK.
Status PruneCheckpoints(const std::string& dir, uint64_t keep_from_sequence);

// ---------------------------------------------------------------------------
// The append-only log

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
// back whole or not at all.
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

// One record read back, with the segment it was in.
struct LogRecord {
  uint64_t segment = 0;
  std::vector<std::byte> payload;
};

struct LogContents {
  std::vector<LogRecord> records;  // in append order
  // The newest segment found (kNoSegment when none): a new writer opens
  // above it.
  uint64_t last_segment = kNoSegment;
  // Bytes at the end of the newest segment that hold no complete record (a
  // crash mid-append), and why, e.g. "<path>: record at offset 120:
  // declares 4000 bytes, 31 left". 0 and empty when none.
  uint64_t ignored_bytes = 0;
  std::string ignored_note;
};

// Every complete record of the segments numbered >= `from_segment` in
// `dir`, in order. The newest segment may end with a torn or corrupt
// record: reading stops there and reports the bytes it ignored. Anything
// wrong anywhere else is an error naming the file and offset: a corrupt
// or foreign header, a corrupt record in an older segment, a segment
// missing from the chain (each segment names its predecessor). Missing
// directory or no segment: OK, empty. Peak memory: the records plus one
// segment's bytes.
Result<LogContents> ReadLog(const std::string& dir,
                            std::string_view fingerprint,
                            uint64_t from_segment);

// Segment numbers of the log segment files in `dir`, ascending (names
// only). Missing directory: empty.
Result<std::vector<uint64_t>> ListLogSegments(const std::string& dir);

// Deletes the log segments below `keep_from_segment`, oldest first (a crash
// part-way leaves the newest ones), then fsyncs `dir` if it deleted
// anything. Never pass a value above a live writer's segment(). Missing
// directory: OK.
Status PruneLog(const std::string& dir, uint64_t keep_from_segment);

// One log segment file's bytes, parsed. Exposed for the fuzz target and
// tests; ReadLog is the API.
struct DecodedLogSegment {
  uint64_t segment = 0;
  uint64_t previous = kNoSegment;
  std::string fingerprint;
  // Views into the decoded bytes: valid while they are.
  std::vector<std::span<const std::byte>> records;
  uint64_t valid_bytes = 0;    // header + complete records
  uint64_t ignored_bytes = 0;  // the torn tail, when tolerated
  std::string ignored_note;
};

// Parses a segment's bytes; `source` names them in errors. With
// `tolerate_torn_tail` (the newest segment) parsing stops at the first
// incomplete or corrupt record and reports the rest as ignored; without it
// such a record is an error (DataLoss). A bad header is always an error.
// Does not check the fingerprint or the segment number. Thread-safe.
Result<DecodedLogSegment> DecodeLogSegment(std::span<const std::byte> bytes,
                                           std::string_view source,
                                           bool tolerate_torn_tail);

// ---------------------------------------------------------------------------
// Background checkpoint writer

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

#endif  // MERIDIAN_DURABLE_CHECKPOINT_H_
