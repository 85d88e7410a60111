#include "durable/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <new>
#include <system_error>

namespace meridian::durable {
namespace {

// The names in `dir`; empty with *missing = true when it does not exist.
Result<std::vector<std::string>> ListDirectory(const std::string& dir,
                                               bool* missing) {
  *missing = false;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) {
      *missing = true;
      return std::vector<std::string>{};
    }
    return ErrnoStatus(errno, "list directory " + Quoted(dir));
  }
  std::vector<std::string> names;
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(d);
    if (entry == nullptr) break;
    names.emplace_back(entry->d_name);
  }
  const int error = errno;
  ::closedir(d);
  if (error != 0) return ErrnoStatus(error, "list directory " + Quoted(dir));
  return names;
}

// Reads until `out` is full or the file ends; returns the bytes read.
Result<size_t> ReadFully(int fd, std::span<std::byte> out,
                         const std::string& path) {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read " + Quoted(path));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

}  // namespace

// ---------------------------------------------------------------------------
// Errors and paths

std::string ErrnoText(int error) {
  return std::generic_category().message(error);
}

Status ErrnoStatus(int error, const std::string& what) {
  std::string message = "cannot " + what + ": " + ErrnoText(error);
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return NotFoundError(std::move(message));
    case EACCES:
    case EPERM:
    case EROFS:
    case EEXIST:
    case EISDIR:
    case ENOTEMPTY:
      return FailedPreconditionError(std::move(message));
    case EIO:
      return DataLossError(std::move(message));
    default:  // ENOSPC, EDQUOT, EFBIG, EMFILE, ENOMEM...: may pass
      return UnavailableError(std::move(message));
  }
}

std::string Quoted(std::string_view path) {
  return "'" + std::string(path) + "'";
}

std::string JoinPath(const std::string& dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return dir + std::string(name);
  return dir + "/" + std::string(name);
}

// ---------------------------------------------------------------------------
// Files

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Status Fd::Close(const std::string& path) {
  const int fd = release();
  if (fd >= 0 && ::close(fd) != 0) {
    return ErrnoStatus(errno, "close " + Quoted(path));
  }
  return Status::Ok();
}

Status FsyncDirectory(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "open directory " + Quoted(dir));
  if (::fsync(fd.get()) != 0) {
    return ErrnoStatus(errno, "fsync directory " + Quoted(dir));
  }
  return fd.Close(dir);
}

Status EnsureDirectory(const std::string& dir) {
  std::error_code error;
  const bool created = std::filesystem::create_directories(dir, error);
  if (error) {
    return ErrnoStatus(error.value(), "create directory " + Quoted(dir));
  }
  if (!std::filesystem::is_directory(dir, error)) {
    return FailedPreconditionError(Quoted(dir) + " is not a directory");
  }
  if (created) {
    std::string parent =
        std::filesystem::path(dir).lexically_normal().parent_path().string();
    if (parent.empty()) parent = ".";
    MERIDIAN_RETURN_IF_ERROR(FsyncDirectory(parent));
  }
  return Status::Ok();
}

Status RemoveFile(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, "delete " + Quoted(path));
  }
  return Status::Ok();
}

Status WriteAllV(int fd, std::span<iovec> iov, const std::string& path) {
  size_t first = 0;
  while (first < iov.size()) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    const size_t count = std::min<size_t>(iov.size() - first, IOV_MAX);
    const ssize_t written =
        ::writev(fd, iov.data() + first, static_cast<int>(count));
    if (written < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "write " + Quoted(path));
    }
    size_t left = static_cast<size_t>(written);
    while (left > 0) {
      const size_t step = std::min(left, iov[first].iov_len);
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + step;
      iov[first].iov_len -= step;
      left -= step;
      if (iov[first].iov_len == 0) ++first;
    }
  }
  return Status::Ok();
}

Status WriteAll(int fd, std::span<const std::byte> bytes,
                const std::string& path) {
  iovec iov{const_cast<std::byte*>(bytes.data()), bytes.size()};
  return WriteAllV(fd, std::span<iovec>(&iov, 1), path);
}

Status WriteFileAtomically(
    const std::string& dir, const std::string& path,
    const std::function<Status(int fd, const std::string& temp)>& fill) {
  const std::string temp = path + std::string(kTempSuffix);
  // The temporary file: written, flushed to stable storage, closed. Any
  // failure removes it, so the directory holds what it held before.
  {
    Fd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) return ErrnoStatus(errno, "create " + Quoted(temp));
    Status status = [&] {
      MERIDIAN_RETURN_IF_ERROR(fill(fd.get(), temp));
      if (::fsync(fd.get()) != 0) {
        return ErrnoStatus(errno, "fsync " + Quoted(temp));
      }
      return fd.Close(temp);
    }();
    if (!status.ok()) {
      RemoveFile(temp).IgnoreError();
      return status;
    }
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const Status status =
        ErrnoStatus(errno, "rename " + Quoted(temp) + " to " + Quoted(path));
    RemoveFile(temp).IgnoreError();
    return status;
  }
  return FsyncDirectory(dir);
}

Result<std::vector<std::byte>> ReadWholeFile(const std::string& path,
                                             size_t head_bytes,
                                             const HeadCheck& check_head) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "open " + Quoted(path));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return ErrnoStatus(errno, "stat " + Quoted(path));
  }
  if (!S_ISREG(st.st_mode)) {
    return FailedPreconditionError(Quoted(path) + " is not a regular file");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  std::vector<std::byte> head(std::min<uint64_t>(head_bytes, size));
  MERIDIAN_ASSIGN_OR_RETURN(const size_t head_read,
                            ReadFully(fd.get(), head, path));
  head.resize(head_read);
  MERIDIAN_RETURN_IF_ERROR(check_head(head, size));
  try {
    std::vector<std::byte> bytes(static_cast<size_t>(size));
    std::copy(head.begin(), head.end(), bytes.begin());
    MERIDIAN_ASSIGN_OR_RETURN(
        const size_t rest,
        ReadFully(fd.get(), std::span(bytes).subspan(head.size()), path));
    bytes.resize(head.size() + rest);  // shorter if it shrank since fstat
    return bytes;
  } catch (const std::bad_alloc&) {
    return UnavailableError("cannot read " + Quoted(path) + " (" +
                            std::to_string(size) + " bytes): out of memory");
  }
}

// ---------------------------------------------------------------------------
// Directories of numbered files

std::string NumberedFileName(std::string_view prefix, uint64_t number) {
  char buffer[24];
  std::snprintf(buffer, sizeof(buffer), "%016" PRIx64, number);
  return std::string(prefix) + buffer;
}

bool ParseNumberedName(std::string_view name, std::string_view prefix,
                       std::string_view suffix, uint64_t* number) {
  if (name.size() != prefix.size() + 16 + suffix.size()) return false;
  if (name.substr(0, prefix.size()) != prefix) return false;
  if (name.substr(prefix.size() + 16) != suffix) return false;
  uint64_t value = 0;
  for (char c : name.substr(prefix.size(), 16)) {
    uint64_t digit;
    if (c >= '0' && c <= '9') {
      digit = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<uint64_t>(c - 'a' + 10);
    } else {
      return false;
    }
    value = value << 4 | digit;
  }
  *number = value;
  return true;
}

Result<DirEntries> ListNumbered(const std::string& dir,
                                std::string_view prefix) {
  bool missing = false;
  MERIDIAN_ASSIGN_OR_RETURN(std::vector<std::string> names,
                            ListDirectory(dir, &missing));
  DirEntries entries;
  for (const std::string& name : names) {
    uint64_t number;
    if (ParseNumberedName(name, prefix, "", &number)) {
      entries.numbers.push_back(number);
    } else if (ParseNumberedName(name, prefix, kTempSuffix, &number)) {
      entries.temporaries.push_back(name);
    }
  }
  std::sort(entries.numbers.begin(), entries.numbers.end());
  return entries;
}

Status PruneNumbered(const std::string& dir, std::string_view prefix,
                     uint64_t keep_from, bool temporaries) {
  MERIDIAN_ASSIGN_OR_RETURN(const DirEntries entries,
                            ListNumbered(dir, prefix));
  Status first_error;
  bool deleted = false;
  auto remove = [&](const std::string& name) {
    const Status status = RemoveFile(JoinPath(dir, name));
    if (status.ok()) {
      deleted = true;
    } else if (first_error.ok()) {
      first_error = status;
    }
  };
  for (uint64_t number : entries.numbers) {  // ascending: oldest first
    if (number >= keep_from) break;
    remove(NumberedFileName(prefix, number));
  }
  if (temporaries) {
    for (const std::string& name : entries.temporaries) remove(name);
  }
  if (deleted) MERIDIAN_RETURN_IF_ERROR(FsyncDirectory(dir));
  return first_error;
}

}  // namespace meridian::durable
