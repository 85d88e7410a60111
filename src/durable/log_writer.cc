#include "durable/log_writer.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <vector>

#include "durable/file_util.h"
#include "durable/fingerprint.h"
#include "durable/log_reader.h"

namespace meridian {

using durable::ErrnoStatus;
using durable::Fd;
using durable::JoinPath;
using durable::Quoted;

Result<std::unique_ptr<LogWriter>> LogWriter::Open(std::string dir,
                                                   std::string fingerprint,
                                                   uint64_t segment,
                                                   LogWriterOptions options) {
  MERIDIAN_RETURN_IF_ERROR(
      durable::ValidateFingerprint(fingerprint).WithContext("log writer"));
  if (segment == kNoSegment) {
    return InvalidArgumentError("log segment number 2^64-1 is reserved");
  }
  MERIDIAN_RETURN_IF_ERROR(durable::EnsureDirectory(dir));
  std::unique_ptr<LogWriter> writer(
      new LogWriter(std::move(dir), std::move(fingerprint), options));
  MERIDIAN_ASSIGN_OR_RETURN(
      const durable::DirEntries entries,
      durable::ListNumbered(writer->dir_, durable::kLogPrefix));
  // Temporary files are segments whose creation a crash interrupted: they
  // never held a record.
  for (const std::string& stale : entries.temporaries) {
    MERIDIAN_RETURN_IF_ERROR(
        durable::RemoveFile(JoinPath(writer->dir_, stale)));
  }
  uint64_t previous = kNoSegment;
  if (!entries.numbers.empty()) {
    const uint64_t newest = entries.numbers.back();
    if (segment <= newest) {
      return FailedPreconditionError(
          "cannot start log segment " + std::to_string(segment) + " in " +
          Quoted(writer->dir_) + ": it already holds segment " +
          std::to_string(newest) + " (" +
          Quoted(JoinPath(writer->dir_, LogSegmentFileName(newest))) +
          "); continue above it");
    }
    MERIDIAN_RETURN_IF_ERROR(writer->RepairNewest(newest));
    previous = newest;
  }
  MERIDIAN_RETURN_IF_ERROR(writer->StartSegment(segment, previous));
  return writer;
}

LogWriter::~LogWriter() {
  if (fd_ >= 0) ::close(fd_);
}

Status LogWriter::RepairNewest(uint64_t newest) {
  // Once it is no longer the newest, a torn record in it would make the
  // whole log unreadable.
  const std::string path = JoinPath(dir_, LogSegmentFileName(newest));
  std::vector<std::byte> bytes;
  MERIDIAN_ASSIGN_OR_RETURN(
      const DecodedLogSegment decoded,
      durable::ReadLogSegmentFile(path, newest, fingerprint_,
                                  /*tolerate_torn_tail=*/true, &bytes));
  if (decoded.ignored_bytes == 0) return Status::Ok();
  Fd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "open " + Quoted(path));
  if (::ftruncate(fd.get(), static_cast<off_t>(decoded.valid_bytes)) != 0) {
    return ErrnoStatus(errno, "cut the torn tail off " + Quoted(path));
  }
  if (::fsync(fd.get()) != 0) {
    return ErrnoStatus(errno, "fsync " + Quoted(path));
  }
  MERIDIAN_RETURN_IF_ERROR(fd.Close(path));
  repair_note_ = "cut " + std::to_string(decoded.ignored_bytes) +
                 " torn bytes off " + decoded.ignored_note;
  return Status::Ok();
}

Status LogWriter::StartSegment(uint64_t segment, uint64_t previous) {
  const std::string path = JoinPath(dir_, LogSegmentFileName(segment));
  const std::string temp = path + std::string(durable::kTempSuffix);
  const std::vector<std::byte> header =
      durable::EncodeLogHeader(segment, previous, fingerprint_);
  Fd fd(::open(temp.c_str(),
               O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoStatus(errno, "create " + Quoted(temp));
  Status status = durable::WriteAll(fd.get(), header, temp);
  if (status.ok() && ::fsync(fd.get()) != 0) {
    status = ErrnoStatus(errno, "fsync " + Quoted(temp));
  }
  // link() never replaces an existing segment (rename() would).
  if (status.ok() && ::link(temp.c_str(), path.c_str()) != 0) {
    status = ErrnoStatus(errno, "create " + Quoted(path));
  }
  durable::RemoveFile(temp).IgnoreError();
  if (status.ok()) status = durable::FsyncDirectory(dir_);
  if (!status.ok()) return status;
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd.release();
  segment_ = segment;
  path_ = path;
  size_ = header.size();
  return Status::Ok();
}

Status LogWriter::CheckUsable() const {
  if (broken_.ok()) return Status::Ok();
  return FailedPreconditionError("log segment " + Quoted(path_) +
                                 " is unusable after: " + broken_.message());
}

Status LogWriter::Append(std::span<const std::byte> payload) {
  return AppendRecord(payload, options_.fsync_each_append);
}

Status LogWriter::AppendUnsynced(std::span<const std::byte> payload) {
  return AppendRecord(payload, /*sync=*/false);
}

Status LogWriter::AppendRecord(std::span<const std::byte> payload, bool sync) {
  MERIDIAN_RETURN_IF_ERROR(CheckUsable());
  if (payload.size() > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgumentError("log record of " +
                                std::to_string(payload.size()) +
                                " bytes, more than 2^32-1");
  }
  const auto length = static_cast<uint32_t>(payload.size());
  const uint32_t crc = durable::RecordChecksum(length, payload);
  std::byte header[durable::kRecordHeaderBytes];
  std::memcpy(header, &length, 4);
  std::memcpy(header + 4, &crc, 4);
  iovec iov[2] = {{header, sizeof(header)},
                  {const_cast<std::byte*>(payload.data()), payload.size()}};
  Status status = durable::WriteAllV(fd_, iov, path_);
  if (!status.ok()) {
    // Part of the record may be in the file: cut it off, or later records
    // would sit behind a torn one.
    if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      broken_ = status;
      return status.WithContext("and cannot cut the partial record off (" +
                                durable::ErrnoText(errno) + ")");
    }
    return status;
  }
  size_ += sizeof(header) + payload.size();
  if (sync && ::fdatasync(fd_) != 0) {
    // After a failed fsync the kernel may have dropped the dirty pages:
    // what is in the file is no longer known.
    broken_ = ErrnoStatus(errno, "fdatasync " + Quoted(path_));
    return broken_;
  }
  return Status::Ok();
}

Status LogWriter::Sync() {
  MERIDIAN_RETURN_IF_ERROR(CheckUsable());
  if (::fdatasync(fd_) != 0) {
    broken_ = ErrnoStatus(errno, "fdatasync " + Quoted(path_));
    return broken_;
  }
  return Status::Ok();
}

Status LogWriter::Rotate(uint64_t new_segment) {
  if (new_segment <= segment_ || new_segment == kNoSegment) {
    return InvalidArgumentError("log segment " + std::to_string(new_segment) +
                                " does not follow the current segment " +
                                std::to_string(segment_));
  }
  MERIDIAN_RETURN_IF_ERROR(Sync());
  return StartSegment(new_segment, segment_);
}

Status PruneLog(const std::string& dir, uint64_t keep_from_segment) {
  return durable::PruneNumbered(dir, durable::kLogPrefix, keep_from_segment,
                                /*temporaries=*/false);
}

}  // namespace meridian
