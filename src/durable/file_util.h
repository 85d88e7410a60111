// POSIX file helpers of the durable room: errors as Statuses naming the
// path and the system's reason, a file descriptor owner, writes and reads
// that retry short transfers and EINTR, durable creation (write, fsync,
// rename, fsync the directory), and directories of numbered files
// ("<prefix><16 lowercase hex digits>", and "<that>.tmp" while being
// written). Every function is safe to call from any thread; callers own
// the directories they touch (one writer per directory).
#ifndef MERIDIAN_DURABLE_FILE_UTIL_H_
#define MERIDIAN_DURABLE_FILE_UTIL_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "meridian/core/status.h"

namespace meridian::durable {

// ---------------------------------------------------------------------------
// Errors and paths

// strerror's text for `error`.
std::string ErrnoText(int error);

// "cannot <what>: <reason>", coded by what the error means to a caller:
// NotFound (ENOENT, ENOTDIR), FailedPrecondition (permissions, a read-only
// file system, an entry in the way), DataLoss (EIO), else Unavailable
// (ENOSPC, EDQUOT, EMFILE, ENOMEM...: may pass).
Status ErrnoStatus(int error, const std::string& what);

// "'<path>'".
std::string Quoted(std::string_view path);

// `dir`/`name`; `name` alone for an empty `dir`.
std::string JoinPath(const std::string& dir, std::string_view name);

// ---------------------------------------------------------------------------
// Files

// Closes a file descriptor on scope exit unless released.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd();
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  // Closes now, reporting the error close() may return (delayed write
  // errors of some file systems).
  Status Close(const std::string& path);

 private:
  int fd_;
};

// fsync of a directory: makes the creation, renaming and deletion of its
// entries durable.
Status FsyncDirectory(const std::string& dir);

// Creates `dir` and missing parents; when it created `dir`, makes its
// entry durable (fsync of the parent).
Status EnsureDirectory(const std::string& dir);

// Deletes `path`; a file already gone is fine.
Status RemoveFile(const std::string& path);

// Writes all of `iov` (consumed), retrying short writes and EINTR; `path`
// names the file in errors.
Status WriteAllV(int fd, std::span<iovec> iov, const std::string& path);
Status WriteAll(int fd, std::span<const std::byte> bytes,
                const std::string& path);

// Creates the file `path` in `dir` atomically and durably: `fill` writes
// its contents to the temporary file `path`.tmp (given its descriptor and
// path), which is then fsync'ed, closed, renamed over `path`, and `dir`
// fsync'ed. When it returns OK the file survives a power loss. When
// writing the temporary file fails, it is removed and the directory holds
// what it held before; a failure after the rename (fsync of the directory)
// leaves the new file without the guarantee.
Status WriteFileAtomically(
    const std::string& dir, const std::string& path,
    const std::function<Status(int fd, const std::string& temp)>& fill);

// Sees the first min(file size, head size) bytes of a file and its size;
// an error refuses the file.
using HeadCheck =
    std::function<Status(std::span<const std::byte> head, uint64_t file_bytes)>;

// The whole regular file at `path`. `check_head` sees its first
// `head_bytes` bytes before the rest is read, so that a foreign file is
// refused before its size is allocated. Allocates the size stat reports,
// never a length read from the file; out of memory is an error.
Result<std::vector<std::byte>> ReadWholeFile(const std::string& path,
                                             size_t head_bytes,
                                             const HeadCheck& check_head);

// ---------------------------------------------------------------------------
// Directories of numbered files

// The suffix of a file being written (left only by a crash mid-write).
inline constexpr std::string_view kTempSuffix = ".tmp";

// `prefix` + the 16 lowercase hex digits of `number`.
std::string NumberedFileName(std::string_view prefix, uint64_t number);

// `name` is `prefix` + 16 lowercase hex digits + `suffix`; sets `*number`.
bool ParseNumberedName(std::string_view name, std::string_view prefix,
                       std::string_view suffix, uint64_t* number);

struct DirEntries {
  std::vector<uint64_t> numbers;  // ascending
  std::vector<std::string> temporaries;
};

// The numbered files of `dir` with `prefix`, and its temporary ones (other
// files are ignored). A missing directory is empty.
Result<DirEntries> ListNumbered(const std::string& dir,
                                std::string_view prefix);

// Deletes the numbered files below `keep_from`, oldest first (a crash
// part-way leaves the newest ones), and with `temporaries` the temporary
// files too, then fsyncs `dir` if it deleted anything. Returns the first
// deletion error (after trying every file). Missing directory: OK.
Status PruneNumbered(const std::string& dir, std::string_view prefix,
                     uint64_t keep_from, bool temporaries);

}  // namespace meridian::durable

#endif  // MERIDIAN_DURABLE_FILE_UTIL_H_
