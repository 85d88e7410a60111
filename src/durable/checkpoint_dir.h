// A directory of checkpoint files (format: checkpoint_codec.h): written
// atomically and durably, the newest two kept, loaded newest first with a
// fallback to the older one when the newest is refused.
//
// Temporary files (`ckpt-<hex>.tmp`) are left only by a crash mid-write;
// readers ignore them and the next writer deletes them. Other files in the
// directory are ignored and left alone.
#ifndef MERIDIAN_DURABLE_CHECKPOINT_DIR_H_
#define MERIDIAN_DURABLE_CHECKPOINT_DIR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "durable/checkpoint_codec.h"
#include "meridian/core/status.h"

namespace meridian {

// "ckpt-000000000000000c" for 12.
std::string CheckpointFileName(uint64_t sequence);

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

}  // namespace meridian

#endif  // MERIDIAN_DURABLE_CHECKPOINT_DIR_H_
