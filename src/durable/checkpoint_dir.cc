#include "durable/checkpoint_dir.h"

#include <cerrno>
#include <new>
#include <utility>

#include "durable/coding.h"
#include "durable/file_util.h"
#include "meridian/core/log.h"

namespace meridian {
namespace {

using durable::DirEntries;
using durable::Quoted;

constexpr std::string_view kCheckpointPrefix = "ckpt-";

// Buffer of the streaming checkpoint writer: small pieces are gathered,
// arrays are written straight from the caller's memory.
constexpr size_t kWriteBufferBytes = 256 * 1024;

// Buffered writes to a file; large pieces bypass the buffer.
class FileOutput final : public durable::Output {
 public:
  FileOutput(int fd, const std::string* path) : fd_(fd), path_(path) {
    buffer_.reserve(kWriteBufferBytes);
  }
  Status Write(std::span<const std::byte> bytes) override {
    if (buffer_.size() + bytes.size() <= kWriteBufferBytes) {
      durable::AppendBytes(&buffer_, bytes);
      return Status::Ok();
    }
    MERIDIAN_RETURN_IF_ERROR(Flush());
    if (bytes.size() < kWriteBufferBytes) {
      durable::AppendBytes(&buffer_, bytes);
      return Status::Ok();
    }
    return durable::WriteAll(fd_, bytes, *path_);
  }
  Status Flush() {
    if (buffer_.empty()) return Status::Ok();
    Status status = durable::WriteAll(fd_, buffer_, *path_);
    buffer_.clear();
    return status;
  }

 private:
  int fd_;
  const std::string* path_;
  std::vector<std::byte> buffer_;
};

// ReadCheckpointFile; `*foreign` tells an intact checkpoint of another
// fingerprint from every other refusal.
Result<Checkpoint> LoadCheckpointFile(const std::string& path,
                                      std::string_view fingerprint,
                                      bool* foreign) {
  *foreign = false;
  const std::string name = "checkpoint " + Quoted(path);
  MERIDIAN_ASSIGN_OR_RETURN(
      const std::vector<std::byte> bytes,
      durable::ReadWholeFile(
          path, durable::kCheckpointHeadBytes,
          [&](std::span<const std::byte> head, uint64_t size) {
            return durable::CheckCheckpointHead(head, size, name);
          }));
  Result<Checkpoint> checkpoint = [&]() -> Result<Checkpoint> {
    try {
      return DecodeCheckpoint(bytes, path);
    } catch (const std::bad_alloc&) {
      return UnavailableError("cannot load " + name + ": out of memory");
    }
  }();
  if (checkpoint.ok() && checkpoint->fingerprint != fingerprint) {
    *foreign = true;
    return FailedPreconditionError(
        name + " belongs to " + durable::Printable(checkpoint->fingerprint) +
        ", not to " + durable::Printable(fingerprint));
  }
  return checkpoint;
}

// Retention after `written` was written into `dir` (as `path`): it and the
// newest checkpoint below it stay; every other checkpoint and stale
// temporary file goes.
Status KeepNewestTwo(const std::string& dir, uint64_t written,
                     const std::string& path) {
  MERIDIAN_ASSIGN_OR_RETURN(const DirEntries entries,
                            durable::ListNumbered(dir, kCheckpointPrefix));
  std::optional<uint64_t> fallback;
  for (uint64_t sequence : entries.numbers) {
    if (sequence < written) fallback = sequence;
  }
  bool deleted = false;
  for (uint64_t sequence : entries.numbers) {
    if (sequence == written || sequence == fallback) continue;
    const std::string old =
        durable::JoinPath(dir, CheckpointFileName(sequence));
    const Status status = durable::RemoveFile(old);
    if (!status.ok() && sequence > written) {
      // It would be loaded instead of the checkpoint just written.
      return status.WithContext("checkpoint " + Quoted(path) +
                                " is written, but a newer one remains");
    }
    if (!status.ok()) {
      MLOG(WARNING) << "keeping old checkpoint: " << status.message();
    }
    deleted = deleted || status.ok();
  }
  for (const std::string& stale : entries.temporaries) {
    const Status status = durable::RemoveFile(durable::JoinPath(dir, stale));
    if (!status.ok()) {
      MLOG(WARNING) << "keeping a stale temporary file: " << status.message();
    }
    deleted = deleted || status.ok();
  }
  if (deleted) {
    // A newer checkpoint's deletion must not be undone by a power loss.
    MERIDIAN_RETURN_IF_ERROR(durable::FsyncDirectory(dir));
  }
  return Status::Ok();
}

}  // namespace

std::string CheckpointFileName(uint64_t sequence) {
  return durable::NumberedFileName(kCheckpointPrefix, sequence);
}

Result<Checkpoint> ReadCheckpointFile(const std::string& path,
                                      std::string_view fingerprint) {
  bool foreign = false;
  return LoadCheckpointFile(path, fingerprint, &foreign);
}

Status WriteCheckpoint(const std::string& dir, const Checkpoint& checkpoint) {
  MERIDIAN_ASSIGN_OR_RETURN(const uint64_t total,
                            durable::CheckpointEncodedBytes(checkpoint));
  MERIDIAN_RETURN_IF_ERROR(durable::EnsureDirectory(dir));
  const std::string path =
      durable::JoinPath(dir, CheckpointFileName(checkpoint.sequence));
  MERIDIAN_RETURN_IF_ERROR(durable::WriteFileAtomically(
      dir, path, [&](int fd, const std::string& temp) {
        FileOutput out(fd, &temp);
        MERIDIAN_RETURN_IF_ERROR(
            durable::EmitCheckpoint(checkpoint, total, &out));
        return out.Flush();
      }));
  return KeepNewestTwo(dir, checkpoint.sequence, path);
}

Result<LoadedCheckpoint> LoadLatest(const std::string& dir,
                                    std::string_view fingerprint) {
  MERIDIAN_RETURN_IF_ERROR(
      durable::ValidateFingerprint(fingerprint).WithContext("LoadLatest"));
  MERIDIAN_ASSIGN_OR_RETURN(const DirEntries entries,
                            durable::ListNumbered(dir, kCheckpointPrefix));
  LoadedCheckpoint loaded;
  bool all_foreign = true;
  for (auto it = entries.numbers.rbegin(); it != entries.numbers.rend(); ++it) {
    const std::string path = durable::JoinPath(dir, CheckpointFileName(*it));
    bool foreign = false;
    Result<Checkpoint> checkpoint =
        LoadCheckpointFile(path, fingerprint, &foreign);
    if (checkpoint.ok() && checkpoint->sequence != *it) {
      checkpoint =
          DataLossError("checkpoint " + Quoted(path) + " holds sequence " +
                        std::to_string(checkpoint->sequence) +
                        ", its name says " + std::to_string(*it));
    }
    if (checkpoint.ok()) {
      loaded.checkpoint = std::move(checkpoint).value();
      loaded.path = path;
      return loaded;
    }
    all_foreign = all_foreign && foreign;
    loaded.refused.push_back(checkpoint.status().message());
  }
  if (loaded.refused.empty()) return loaded;  // no checkpoint
  std::string message = "no usable checkpoint in " + Quoted(dir) + " (" +
                        std::to_string(loaded.refused.size()) + " refused)";
  for (const std::string& why : loaded.refused) message += "; " + why;
  return all_foreign ? FailedPreconditionError(std::move(message))
                     : DataLossError(std::move(message));
}

Result<std::vector<uint64_t>> ListCheckpoints(const std::string& dir) {
  MERIDIAN_ASSIGN_OR_RETURN(DirEntries entries,
                            durable::ListNumbered(dir, kCheckpointPrefix));
  return std::move(entries.numbers);
}

Status PruneCheckpoints(const std::string& dir, uint64_t keep_from_sequence) {
  return durable::PruneNumbered(dir, kCheckpointPrefix, keep_from_sequence,
                                /*temporaries=*/true);
}

}  // namespace meridian
