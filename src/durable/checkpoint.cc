#include "durable/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <new>
#include <set>
#include <system_error>
#include <utility>

#include "meridian/core/log.h"

namespace meridian {
namespace {

// Floats and integers are copied to and from files as they sit in memory.
static_assert(std::endian::native == std::endian::little,
              "checkpoint and log files are little-endian");
static_assert(std::numeric_limits<float>::is_iec559 && sizeof(float) == 4,
              "checkpoint arrays are IEEE-754 binary32");

constexpr char kCheckpointMagic[8] = {'M', 'R', 'D', 'N', 'C', 'K', 'P', 'T'};
constexpr char kLogMagic[8] = {'M', 'R', 'D', 'N', 'U', 'L', 'O', 'G'};
constexpr std::string_view kCheckpointPrefix = "ckpt-";
constexpr std::string_view kLogPrefix = "log-";
constexpr std::string_view kTempSuffix = ".tmp";

// Checkpoint: magic, version, total length, sequence, fingerprint length.
constexpr size_t kCheckpointFixedBytes = 32;
// What CheckCheckpointHead reads: magic, version, total length.
constexpr size_t kCheckpointHeadBytes = 20;
constexpr size_t kChecksumBytes = 4;
// The smallest checkpoint: one fingerprint byte, no meta, no array.
constexpr size_t kMinCheckpointBytes = kCheckpointFixedBytes + 1 + 8 + 4 + 4;
// Log segment: magic, version, segment, previous, fingerprint length.
constexpr size_t kLogFixedBytes = 32;
// What CheckLogHead reads: magic, version.
constexpr size_t kLogHeadBytes = 12;
constexpr size_t kRecordHeaderBytes = 8;

// Buffer of the streaming checkpoint writer: small pieces are gathered,
// arrays are written straight from the caller's memory.
constexpr size_t kWriteBufferBytes = 256 * 1024;

// ---------------------------------------------------------------------------
// Small helpers

std::string ErrnoText(int error) {
  return std::generic_category().message(error);
}

// "cannot <what>: <reason>", coded by what the error means to a caller.
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

// `text` with bytes outside printable ASCII as \xNN, cut after 256 bytes:
// fingerprints and names read from a file may hold anything.
std::string Printable(std::string_view text) {
  constexpr size_t kMax = 256;
  std::string out;
  for (size_t i = 0; i < text.size() && i < kMax; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buffer[8];
      std::snprintf(buffer, sizeof(buffer), "\\x%02x", c);
      out += buffer;
    }
  }
  if (text.size() > kMax) out += "...";
  return out;
}

std::string Hex16(uint64_t value) {
  char buffer[24];
  std::snprintf(buffer, sizeof(buffer), "%016" PRIx64, value);
  return buffer;
}

std::string Hex32(uint32_t value) {
  char buffer[16];
  std::snprintf(buffer, sizeof(buffer), "0x%08" PRIx32, value);
  return buffer;
}

std::string JoinPath(const std::string& dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return dir + std::string(name);
  return dir + "/" + std::string(name);
}

// zlib's crc32 of `bytes` continuing from `crc`. (zlib returns 0 for a null
// buffer, whatever `crc`: an empty span must not reach it.)
uint32_t Crc32(uint32_t crc, std::span<const std::byte> bytes) {
  if (bytes.empty()) return crc;
  return static_cast<uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

template <typename T>
std::span<const std::byte> BytesOf(const T& value) {
  return std::as_bytes(std::span<const T, 1>(&value, 1));
}

std::span<const std::byte> BytesOf(std::string_view text) {
  return std::as_bytes(std::span<const char>(text.data(), text.size()));
}

void AppendBytes(std::vector<std::byte>* out, std::span<const std::byte> in) {
  out->insert(out->end(), in.begin(), in.end());
}

template <typename T>
T LoadLe(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

// Bounds-checked reads from a byte span. Every length a caller reads is
// checked against remaining() before it allocates anything.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  size_t offset() const { return offset_; }
  size_t remaining() const { return bytes_.size() - offset_; }
  // Precondition: remaining() >= n (callers check first).
  std::span<const std::byte> Take(size_t n) {
    std::span<const std::byte> out = bytes_.subspan(offset_, n);
    offset_ += n;
    return out;
  }
  template <typename T>
  bool Read(T* value) {
    if (remaining() < sizeof(T)) return false;
    *value = LoadLe<T>(bytes_.data() + offset_);
    offset_ += sizeof(T);
    return true;
  }

 private:
  std::span<const std::byte> bytes_;
  size_t offset_ = 0;
};

// `name` is `prefix` + 16 lowercase hex digits + `suffix`; sets `*number`.
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

// Closes a file descriptor on scope exit unless released.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  // Closes now, reporting the error close() may return (delayed write
  // errors of some file systems).
  Status Close(const std::string& path) {
    const int fd = release();
    if (fd >= 0 && ::close(fd) != 0) {
      return ErrnoStatus(errno, "close " + Quoted(path));
    }
    return Status::Ok();
  }

 private:
  int fd_;
};

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

struct DirEntries {
  std::vector<uint64_t> numbers;  // ascending
  std::vector<std::string> temporaries;
};

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

// fsync of a directory: makes the creation, renaming and deletion of its
// entries durable.
Status FsyncDirectory(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "open directory " + Quoted(dir));
  if (::fsync(fd.get()) != 0) {
    return ErrnoStatus(errno, "fsync directory " + Quoted(dir));
  }
  return fd.Close(dir);
}

// Creates `dir` and missing parents; when it created `dir`, makes its
// entry durable (fsync of the parent).
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

// Deletes `path`; a file already gone is fine.
Status RemoveFile(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, "delete " + Quoted(path));
  }
  return Status::Ok();
}

// Writes all of `iov` (consumed), retrying short writes and EINTR.
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

// Sees the first min(file size, head size) bytes of a file and its size;
// an error refuses the file.
using HeadCheck =
    std::function<Status(std::span<const std::byte> head, uint64_t file_bytes)>;

// The whole regular file at `path`. `check_head` (if any) sees its first
// `head_bytes` bytes before the rest is read, so that a foreign file is
// refused before its size is allocated. Allocates the size stat reports,
// never a length read from the file; out of memory is an error.
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
// Checkpoint encoding

Status ValidateFingerprint(std::string_view fingerprint) {
  if (fingerprint.empty()) {
    return InvalidArgumentError("the fingerprint is empty");
  }
  if (fingerprint.size() > kMaxFingerprintBytes) {
    return InvalidArgumentError(
        "the fingerprint has " + std::to_string(fingerprint.size()) +
        " bytes, more than " + std::to_string(kMaxFingerprintBytes));
  }
  return Status::Ok();
}

// Checks what the decoder would refuse, and returns the file's size.
Result<uint64_t> CheckpointFileBytes(const Checkpoint& checkpoint) {
  MERIDIAN_RETURN_IF_ERROR(
      ValidateFingerprint(checkpoint.fingerprint)
          .WithContext("checkpoint " + std::to_string(checkpoint.sequence)));
  if (checkpoint.arrays.size() > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgumentError("too many arrays in a checkpoint");
  }
  uint64_t total = kCheckpointFixedBytes + checkpoint.fingerprint.size() + 8 +
                   checkpoint.meta.size() + 4;
  std::set<std::string_view> names;
  for (const NamedArray& array : checkpoint.arrays) {
    if (array.name.empty() || array.name.size() > kMaxArrayNameBytes) {
      return InvalidArgumentError(
          "checkpoint array name '" + Printable(array.name) + "' has " +
          std::to_string(array.name.size()) + " bytes, not 1.." +
          std::to_string(kMaxArrayNameBytes));
    }
    if (!names.insert(array.name).second) {
      return InvalidArgumentError("checkpoint array '" + Printable(array.name) +
                                  "' appears twice");
    }
    total += 4 + array.name.size() + 8 + 4 * uint64_t{array.values.size()};
  }
  return total + kChecksumBytes;
}

// Where encoded bytes go.
class Output {
 public:
  virtual ~Output() = default;
  virtual Status Write(std::span<const std::byte> bytes) = 0;
};

class VectorOutput final : public Output {
 public:
  explicit VectorOutput(std::vector<std::byte>* out) : out_(out) {}
  Status Write(std::span<const std::byte> bytes) override {
    AppendBytes(out_, bytes);
    return Status::Ok();
  }

 private:
  std::vector<std::byte>* out_;
};

// Buffered writes to a file; large pieces bypass the buffer.
class FileOutput final : public Output {
 public:
  FileOutput(int fd, const std::string* path) : fd_(fd), path_(path) {
    buffer_.reserve(kWriteBufferBytes);
  }
  Status Write(std::span<const std::byte> bytes) override {
    if (buffer_.size() + bytes.size() <= kWriteBufferBytes) {
      AppendBytes(&buffer_, bytes);
      return Status::Ok();
    }
    MERIDIAN_RETURN_IF_ERROR(Flush());
    if (bytes.size() < kWriteBufferBytes) {
      AppendBytes(&buffer_, bytes);
      return Status::Ok();
    }
    return WriteAll(fd_, bytes, *path_);
  }
  Status Flush() {
    if (buffer_.empty()) return Status::Ok();
    Status status = WriteAll(fd_, buffer_, *path_);
    buffer_.clear();
    return status;
  }

 private:
  int fd_;
  const std::string* path_;
  std::vector<std::byte> buffer_;
};

// Emits a checkpoint's bytes to `out`, checksumming as it goes. Precondition:
// `total` == CheckpointFileBytes(checkpoint).
Status EmitCheckpoint(const Checkpoint& checkpoint, uint64_t total,
                      Output* out) {
  uint32_t crc = 0;
  auto put = [&](std::span<const std::byte> bytes) {
    crc = Crc32(crc, bytes);
    return out->Write(bytes);
  };
  std::vector<std::byte> head;
  AppendBytes(&head, std::as_bytes(std::span(kCheckpointMagic)));
  AppendBytes(&head, BytesOf(kCheckpointFormatVersion));
  AppendBytes(&head, BytesOf(total));
  AppendBytes(&head, BytesOf(checkpoint.sequence));
  AppendBytes(&head,
              BytesOf(static_cast<uint32_t>(checkpoint.fingerprint.size())));
  AppendBytes(&head, BytesOf(std::string_view(checkpoint.fingerprint)));
  AppendBytes(&head, BytesOf(uint64_t{checkpoint.meta.size()}));
  MERIDIAN_RETURN_IF_ERROR(put(head));
  MERIDIAN_RETURN_IF_ERROR(put(BytesOf(std::string_view(checkpoint.meta))));
  MERIDIAN_RETURN_IF_ERROR(
      put(BytesOf(static_cast<uint32_t>(checkpoint.arrays.size()))));
  for (const NamedArray& array : checkpoint.arrays) {
    head.clear();
    AppendBytes(&head, BytesOf(static_cast<uint32_t>(array.name.size())));
    AppendBytes(&head, BytesOf(std::string_view(array.name)));
    AppendBytes(&head, BytesOf(uint64_t{array.values.size()}));
    MERIDIAN_RETURN_IF_ERROR(put(head));
    MERIDIAN_RETURN_IF_ERROR(put(std::as_bytes(std::span(array.values))));
  }
  return out->Write(BytesOf(crc));
}

// ---------------------------------------------------------------------------
// Log segments

// What a log segment's first 12 bytes say: magic and version (`head` may
// be shorter: the rest is checked later).
Status CheckLogHead(std::span<const std::byte> head, const std::string& name) {
  const std::span<const std::byte> magic = std::as_bytes(std::span(kLogMagic));
  const size_t magic_seen = std::min(head.size(), magic.size());
  if (!std::equal(head.begin(), head.begin() + magic_seen, magic.begin())) {
    return DataLossError(name +
                         ": not a Meridian log segment (the file does not "
                         "start with \"MRDNULOG\")");
  }
  if (head.size() < kLogHeadBytes) return Status::Ok();
  const uint32_t version = LoadLe<uint32_t>(head.data() + 8);
  if (version != kLogFormatVersion) {
    return FailedPreconditionError(
        name + ": format version " + std::to_string(version) +
        ", this build reads version " + std::to_string(kLogFormatVersion) +
        " (written by another Meridian version, or corrupt)");
  }
  return Status::Ok();
}

std::vector<std::byte> EncodeLogHeader(uint64_t segment, uint64_t previous,
                                       std::string_view fingerprint) {
  std::vector<std::byte> header;
  AppendBytes(&header, std::as_bytes(std::span(kLogMagic)));
  AppendBytes(&header, BytesOf(kLogFormatVersion));
  AppendBytes(&header, BytesOf(segment));
  AppendBytes(&header, BytesOf(previous));
  AppendBytes(&header, BytesOf(static_cast<uint32_t>(fingerprint.size())));
  AppendBytes(&header, BytesOf(fingerprint));
  AppendBytes(&header, BytesOf(Crc32(0, header)));
  return header;
}

std::string SegmentText(uint64_t segment) {
  return segment == kNoSegment ? std::string("none") : std::to_string(segment);
}

// Reads segment `segment` of `dir` and checks its header against the file
// name and `fingerprint`.
Result<DecodedLogSegment> ReadSegment(const std::string& path, uint64_t segment,
                                      std::string_view fingerprint,
                                      bool tolerate_torn_tail,
                                      std::vector<std::byte>* bytes) {
  const std::string name = "log segment " + Quoted(path);
  MERIDIAN_ASSIGN_OR_RETURN(
      *bytes, ReadWholeFile(path, kLogHeadBytes,
                            [&](std::span<const std::byte> head, uint64_t) {
                              return CheckLogHead(head, name);
                            }));
  MERIDIAN_ASSIGN_OR_RETURN(DecodedLogSegment decoded,
                            DecodeLogSegment(*bytes, path, tolerate_torn_tail));
  if (decoded.segment != segment) {
    return DataLossError("log segment " + Quoted(path) + ": its header says " +
                         "segment " + std::to_string(decoded.segment) +
                         ", its name " + std::to_string(segment));
  }
  if (decoded.fingerprint != fingerprint) {
    return FailedPreconditionError(
        "log segment " + Quoted(path) + " belongs to " +
        Printable(decoded.fingerprint) + ", not to " + Printable(fingerprint));
  }
  return decoded;
}

}  // namespace

// ---------------------------------------------------------------------------
// Names

const NamedArray* Checkpoint::Find(std::string_view name) const {
  for (const NamedArray& array : arrays) {
    if (array.name == name) return &array;
  }
  return nullptr;
}

std::string CheckpointFingerprint(std::string_view job, std::string_view site,
                                  uint64_t seed,
                                  std::string_view layout_digest) {
  return "job '" + std::string(job) + "' site '" + std::string(site) +
         "' seed " + std::to_string(seed) + " layout " +
         std::string(layout_digest);
}

std::string CheckpointFileName(uint64_t sequence) {
  return std::string(kCheckpointPrefix) + Hex16(sequence);
}

std::string LogSegmentFileName(uint64_t segment) {
  return std::string(kLogPrefix) + Hex16(segment);
}

// ---------------------------------------------------------------------------
// Checkpoints

Result<std::vector<std::byte>> EncodeCheckpoint(const Checkpoint& checkpoint) {
  MERIDIAN_ASSIGN_OR_RETURN(const uint64_t total,
                            CheckpointFileBytes(checkpoint));
  std::vector<std::byte> bytes;
  bytes.reserve(total);
  VectorOutput out(&bytes);
  MERIDIAN_RETURN_IF_ERROR(EmitCheckpoint(checkpoint, total, &out));
  return bytes;
}

namespace {

// Checks the first bytes of a checkpoint file of `file_bytes` bytes: magic,
// version, total length. `head` holds min(file_bytes, 20) bytes. Cheap: the
// file reader runs it before reading (and allocating for) the rest.
Status CheckCheckpointHead(std::span<const std::byte> head, uint64_t file_bytes,
                           const std::string& name) {
  auto refuse = [&](const std::string& why) {
    return DataLossError(name + ": " + why);
  };
  const std::span<const std::byte> magic =
      std::as_bytes(std::span(kCheckpointMagic));
  const size_t magic_seen = std::min(head.size(), magic.size());
  if (!std::equal(head.begin(), head.begin() + magic_seen, magic.begin())) {
    return refuse(
        "not a Meridian checkpoint (the file does not start with "
        "\"MRDNCKPT\")");
  }
  if (head.size() < kCheckpointHeadBytes) {
    return refuse("truncated: " + std::to_string(file_bytes) +
                  " bytes, shorter than the " +
                  std::to_string(kCheckpointHeadBytes) + "-byte header");
  }
  const uint32_t version = LoadLe<uint32_t>(head.data() + 8);
  if (version != kCheckpointFormatVersion) {
    return FailedPreconditionError(
        name + ": format version " + std::to_string(version) +
        ", this build reads version " +
        std::to_string(kCheckpointFormatVersion) +
        " (written by another Meridian version, or corrupt)");
  }
  const uint64_t total = LoadLe<uint64_t>(head.data() + 12);
  if (total != file_bytes) {
    return refuse((total > file_bytes ? "truncated: " : "wrong size: ") +
                  std::to_string(file_bytes) + " bytes, the header says " +
                  std::to_string(total));
  }
  return Status::Ok();
}

}  // namespace

Result<Checkpoint> DecodeCheckpoint(std::span<const std::byte> bytes,
                                    std::string_view source) {
  const std::string name = "checkpoint " + Quoted(source);
  auto refuse = [&](const std::string& why) {
    return DataLossError(name + ": " + why);
  };
  MERIDIAN_RETURN_IF_ERROR(CheckCheckpointHead(
      bytes.first(std::min(bytes.size(), kCheckpointHeadBytes)), bytes.size(),
      name));
  if (bytes.size() < kMinCheckpointBytes) {
    return refuse("truncated: " + std::to_string(bytes.size()) +
                  " bytes, shorter than the smallest checkpoint (" +
                  std::to_string(kMinCheckpointBytes) + ")");
  }
  const std::span<const std::byte> body =
      bytes.first(bytes.size() - kChecksumBytes);
  const uint32_t stored = LoadLe<uint32_t>(body.data() + body.size());
  const uint32_t computed = Crc32(0, body);
  if (stored != computed) {
    return refuse("checksum mismatch (stored " + Hex32(stored) + ", computed " +
                  Hex32(computed) + "): the file is corrupt");
  }

  // The checksum holds: what follows only fails on a file written wrong,
  // but is checked as carefully.
  Reader in(body);
  in.Take(kCheckpointHeadBytes);
  Checkpoint checkpoint;
  uint32_t fingerprint_bytes = 0;
  in.Read(&checkpoint.sequence);
  in.Read(&fingerprint_bytes);
  if (fingerprint_bytes == 0 || fingerprint_bytes > kMaxFingerprintBytes ||
      fingerprint_bytes > in.remaining()) {
    return refuse("fingerprint length " + std::to_string(fingerprint_bytes) +
                  " outside 1.." + std::to_string(kMaxFingerprintBytes) +
                  " or beyond the " + std::to_string(in.remaining()) +
                  " bytes left");
  }
  const auto text = [](std::span<const std::byte> b) {
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  };
  checkpoint.fingerprint = text(in.Take(fingerprint_bytes));
  uint64_t meta_bytes = 0;
  if (!in.Read(&meta_bytes) || meta_bytes > in.remaining()) {
    return refuse("meta length " + std::to_string(meta_bytes) + " beyond the " +
                  std::to_string(in.remaining()) + " bytes left");
  }
  checkpoint.meta = text(in.Take(static_cast<size_t>(meta_bytes)));
  uint32_t array_count = 0;
  // Each array takes at least 12 bytes (name length and element count).
  if (!in.Read(&array_count) || array_count > in.remaining() / 12) {
    return refuse(std::to_string(array_count) + " arrays cannot fit in the " +
                  std::to_string(in.remaining()) + " bytes left");
  }
  checkpoint.arrays.resize(array_count);
  std::set<std::string_view> names;
  for (uint32_t i = 0; i < array_count; ++i) {
    NamedArray& array = checkpoint.arrays[i];
    const std::string which = "array " + std::to_string(i);
    uint32_t name_bytes = 0;
    if (!in.Read(&name_bytes) || name_bytes == 0 ||
        name_bytes > kMaxArrayNameBytes || name_bytes > in.remaining()) {
      return refuse(which + ": name length " + std::to_string(name_bytes) +
                    " outside 1.." + std::to_string(kMaxArrayNameBytes) +
                    " or beyond the " + std::to_string(in.remaining()) +
                    " bytes left");
    }
    array.name = text(in.Take(name_bytes));
    if (!names.insert(array.name).second) {
      return refuse(which + ": the name '" + Printable(array.name) +
                    "' appears twice");
    }
    uint64_t count = 0;
    if (!in.Read(&count) || count > in.remaining() / sizeof(float)) {
      return refuse(which + " ('" + Printable(array.name) + "'): " +
                    std::to_string(count) + " elements cannot fit in the " +
                    std::to_string(in.remaining()) + " bytes left");
    }
    array.values.resize(static_cast<size_t>(count));
    const std::span<const std::byte> values =
        in.Take(static_cast<size_t>(count) * sizeof(float));
    if (!values.empty()) {
      std::memcpy(array.values.data(), values.data(), values.size());
    }
  }
  if (in.remaining() != 0) {
    return refuse(std::to_string(in.remaining()) +
                  " unexpected bytes after the last array");
  }
  return checkpoint;
}

namespace {

// ReadCheckpointFile; `*foreign` tells an intact checkpoint of another
// fingerprint from every other refusal.
Result<Checkpoint> LoadCheckpointFile(const std::string& path,
                                      std::string_view fingerprint,
                                      bool* foreign) {
  *foreign = false;
  const std::string name = "checkpoint " + Quoted(path);
  MERIDIAN_ASSIGN_OR_RETURN(
      const std::vector<std::byte> bytes,
      ReadWholeFile(path, kCheckpointHeadBytes,
                    [&](std::span<const std::byte> head, uint64_t size) {
                      return CheckCheckpointHead(head, size, name);
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
    return FailedPreconditionError(name + " belongs to " +
                                   Printable(checkpoint->fingerprint) +
                                   ", not to " + Printable(fingerprint));
  }
  return checkpoint;
}

}  // namespace

Result<Checkpoint> ReadCheckpointFile(const std::string& path,
                                      std::string_view fingerprint) {
  bool foreign = false;
  return LoadCheckpointFile(path, fingerprint, &foreign);
}

Status WriteCheckpoint(const std::string& dir, const Checkpoint& checkpoint) {
  MERIDIAN_ASSIGN_OR_RETURN(const uint64_t total,
                            CheckpointFileBytes(checkpoint));
  MERIDIAN_RETURN_IF_ERROR(EnsureDirectory(dir));
  const std::string name = CheckpointFileName(checkpoint.sequence);
  const std::string path = JoinPath(dir, name);
  const std::string temp = path + std::string(kTempSuffix);

  // The temporary file: written, flushed to stable storage, closed. Any
  // failure removes it, so the directory holds what it held before.
  {
    Fd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) return ErrnoStatus(errno, "create " + Quoted(temp));
    Status status = [&] {
      FileOutput out(fd.get(), &temp);
      MERIDIAN_RETURN_IF_ERROR(EmitCheckpoint(checkpoint, total, &out));
      MERIDIAN_RETURN_IF_ERROR(out.Flush());
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
  MERIDIAN_RETURN_IF_ERROR(FsyncDirectory(dir));

  // Retention: this checkpoint and the newest one below it.
  MERIDIAN_ASSIGN_OR_RETURN(const DirEntries entries,
                            ListNumbered(dir, kCheckpointPrefix));
  std::optional<uint64_t> fallback;
  for (uint64_t sequence : entries.numbers) {
    if (sequence < checkpoint.sequence) fallback = sequence;
  }
  bool deleted = false;
  for (uint64_t sequence : entries.numbers) {
    if (sequence == checkpoint.sequence || sequence == fallback) continue;
    const std::string old = JoinPath(dir, CheckpointFileName(sequence));
    const Status status = RemoveFile(old);
    if (!status.ok() && sequence > checkpoint.sequence) {
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
    const Status status = RemoveFile(JoinPath(dir, stale));
    if (!status.ok()) {
      MLOG(WARNING) << "keeping a stale temporary file: " << status.message();
    }
    deleted = deleted || status.ok();
  }
  if (deleted) {
    // A newer checkpoint's deletion must not be undone by a power loss.
    MERIDIAN_RETURN_IF_ERROR(FsyncDirectory(dir));
  }
  return Status::Ok();
}

Result<LoadedCheckpoint> LoadLatest(const std::string& dir,
                                    std::string_view fingerprint) {
  MERIDIAN_RETURN_IF_ERROR(
      ValidateFingerprint(fingerprint).WithContext("LoadLatest"));
  MERIDIAN_ASSIGN_OR_RETURN(const DirEntries entries,
                            ListNumbered(dir, kCheckpointPrefix));
  LoadedCheckpoint loaded;
  bool all_foreign = true;
  for (auto it = entries.numbers.rbegin(); it != entries.numbers.rend(); ++it) {
    const std::string path = JoinPath(dir, CheckpointFileName(*it));
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
                            ListNumbered(dir, kCheckpointPrefix));
  return std::move(entries.numbers);
}

namespace {

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
    remove(std::string(prefix) + Hex16(number));
  }
  if (temporaries) {
    for (const std::string& name : entries.temporaries) remove(name);
  }
  if (deleted) MERIDIAN_RETURN_IF_ERROR(FsyncDirectory(dir));
  return first_error;
}

}  // namespace

Status PruneCheckpoints(const std::string& dir, uint64_t keep_from_sequence) {
  return PruneNumbered(dir, kCheckpointPrefix, keep_from_sequence,
                       /*temporaries=*/true);
}

// ---------------------------------------------------------------------------
// Log

Result<DecodedLogSegment> DecodeLogSegment(std::span<const std::byte> bytes,
                                           std::string_view source,
                                           bool tolerate_torn_tail) {
  const std::string name = "log segment " + Quoted(source);
  auto refuse = [&](const std::string& why) {
    return DataLossError(name + ": " + why);
  };
  MERIDIAN_RETURN_IF_ERROR(
      CheckLogHead(bytes.first(std::min(bytes.size(), kLogHeadBytes)), name));
  if (bytes.size() < kLogHeadBytes) {
    return refuse("truncated header: " + std::to_string(bytes.size()) +
                  " bytes");
  }
  if (bytes.size() < kLogFixedBytes) {
    return refuse("truncated header: " + std::to_string(bytes.size()) +
                  " bytes");
  }
  const uint32_t fingerprint_bytes = LoadLe<uint32_t>(bytes.data() + 28);
  if (fingerprint_bytes == 0 || fingerprint_bytes > kMaxFingerprintBytes) {
    return refuse("corrupt header: fingerprint length " +
                  std::to_string(fingerprint_bytes) + " outside 1.." +
                  std::to_string(kMaxFingerprintBytes));
  }
  const size_t header_bytes = kLogFixedBytes + fingerprint_bytes;
  if (bytes.size() < header_bytes + kChecksumBytes) {
    return refuse("truncated header: " + std::to_string(bytes.size()) +
                  " bytes, the header needs " +
                  std::to_string(header_bytes + kChecksumBytes));
  }
  const uint32_t stored = LoadLe<uint32_t>(bytes.data() + header_bytes);
  const uint32_t computed = Crc32(0, bytes.first(header_bytes));
  if (stored != computed) {
    return refuse("header checksum mismatch (stored " + Hex32(stored) +
                  ", computed " + Hex32(computed) + "): corrupt");
  }
  DecodedLogSegment segment;
  segment.segment = LoadLe<uint64_t>(bytes.data() + 12);
  segment.previous = LoadLe<uint64_t>(bytes.data() + 20);
  segment.fingerprint.assign(
      reinterpret_cast<const char*>(bytes.data() + kLogFixedBytes),
      fingerprint_bytes);

  Reader in(bytes);
  in.Take(header_bytes + kChecksumBytes);
  while (in.remaining() > 0) {
    const size_t offset = in.offset();
    std::string problem;
    uint32_t length = 0;
    uint32_t crc = 0;
    if (in.remaining() < kRecordHeaderBytes) {
      problem = "only " + std::to_string(in.remaining()) +
                " bytes of its 8-byte header";
    } else {
      in.Read(&length);
      in.Read(&crc);
      if (length > in.remaining()) {
        problem = "declares " + std::to_string(length) + " bytes, " +
                  std::to_string(in.remaining()) + " left";
      } else {
        const std::span<const std::byte> payload = in.Take(length);
        const uint32_t actual = Crc32(Crc32(0, BytesOf(length)), payload);
        if (actual == crc) {
          segment.records.push_back(payload);
          continue;
        }
        problem = "checksum mismatch (stored " + Hex32(crc) + ", computed " +
                  Hex32(actual) + ")";
      }
    }
    const std::string why =
        "record at offset " + std::to_string(offset) + ": " + problem;
    if (!tolerate_torn_tail) return refuse(why + ": corrupt");
    segment.valid_bytes = offset;
    segment.ignored_bytes = bytes.size() - offset;
    segment.ignored_note = std::string(source) + ": " + why;
    return segment;
  }
  segment.valid_bytes = bytes.size();
  return segment;
}

Result<std::vector<uint64_t>> ListLogSegments(const std::string& dir) {
  MERIDIAN_ASSIGN_OR_RETURN(DirEntries entries, ListNumbered(dir, kLogPrefix));
  return std::move(entries.numbers);
}

Result<LogContents> ReadLog(const std::string& dir,
                            std::string_view fingerprint,
                            uint64_t from_segment) {
  MERIDIAN_RETURN_IF_ERROR(
      ValidateFingerprint(fingerprint).WithContext("ReadLog"));
  MERIDIAN_ASSIGN_OR_RETURN(const std::vector<uint64_t> segments,
                            ListLogSegments(dir));
  LogContents contents;
  if (segments.empty()) return contents;
  contents.last_segment = segments.back();
  uint64_t before = kNoSegment;  // the segment read before this one
  std::vector<std::byte> bytes;
  for (uint64_t number : segments) {
    if (number < from_segment) continue;
    const std::string path = JoinPath(dir, LogSegmentFileName(number));
    const bool last = number == segments.back();
    MERIDIAN_ASSIGN_OR_RETURN(
        DecodedLogSegment segment,
        ReadSegment(path, number, fingerprint, last, &bytes));
    // The chain: every segment names the one written before it.
    if (before == kNoSegment) {
      if (segment.previous != kNoSegment && segment.previous >= from_segment) {
        return DataLossError(
            "log segment " + Quoted(path) + " follows segment " +
            std::to_string(segment.previous) + ", which is missing");
      }
    } else if (segment.previous != before) {
      return DataLossError(
          "log segment " + Quoted(path) + " follows segment " +
          SegmentText(segment.previous) + ", but the segment before it is " +
          std::to_string(before) + ": segments are missing or misplaced");
    }
    before = number;
    for (std::span<const std::byte> record : segment.records) {
      contents.records.push_back(LogRecord{
          number, std::vector<std::byte>(record.begin(), record.end())});
    }
    if (last) {
      contents.ignored_bytes = segment.ignored_bytes;
      contents.ignored_note = std::move(segment.ignored_note);
    }
  }
  return contents;
}

Status PruneLog(const std::string& dir, uint64_t keep_from_segment) {
  return PruneNumbered(dir, kLogPrefix, keep_from_segment,
                       /*temporaries=*/false);
}

Result<std::unique_ptr<LogWriter>> LogWriter::Open(std::string dir,
                                                   std::string fingerprint,
                                                   uint64_t segment,
                                                   LogWriterOptions options) {
  MERIDIAN_RETURN_IF_ERROR(
      ValidateFingerprint(fingerprint).WithContext("log writer"));
  if (segment == kNoSegment) {
    return InvalidArgumentError("log segment number 2^64-1 is reserved");
  }
  MERIDIAN_RETURN_IF_ERROR(EnsureDirectory(dir));
  std::unique_ptr<LogWriter> writer(
      new LogWriter(std::move(dir), std::move(fingerprint), options));
  MERIDIAN_ASSIGN_OR_RETURN(const DirEntries entries,
                            ListNumbered(writer->dir_, kLogPrefix));
  // Temporary files are segments whose creation a crash interrupted: they
  // never held a record.
  for (const std::string& stale : entries.temporaries) {
    MERIDIAN_RETURN_IF_ERROR(RemoveFile(JoinPath(writer->dir_, stale)));
  }
  uint64_t previous = kNoSegment;
  if (!entries.numbers.empty()) {
    const uint64_t newest = entries.numbers.back();
    const std::string path = JoinPath(writer->dir_, LogSegmentFileName(newest));
    if (segment <= newest) {
      return FailedPreconditionError(
          "cannot start log segment " + std::to_string(segment) + " in " +
          Quoted(writer->dir_) + ": it already holds segment " +
          std::to_string(newest) + " (" + Quoted(path) +
          "); continue above it");
    }
    // Cut a torn tail off the newest segment: once it is no longer the
    // newest, a torn record in it would make the whole log unreadable.
    std::vector<std::byte> bytes;
    MERIDIAN_ASSIGN_OR_RETURN(const DecodedLogSegment decoded,
                              ReadSegment(path, newest, writer->fingerprint_,
                                          /*tolerate_torn_tail=*/true, &bytes));
    if (decoded.ignored_bytes > 0) {
      Fd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
      if (fd.get() < 0) return ErrnoStatus(errno, "open " + Quoted(path));
      if (::ftruncate(fd.get(), static_cast<off_t>(decoded.valid_bytes)) != 0) {
        return ErrnoStatus(errno, "cut the torn tail off " + Quoted(path));
      }
      if (::fsync(fd.get()) != 0) {
        return ErrnoStatus(errno, "fsync " + Quoted(path));
      }
      MERIDIAN_RETURN_IF_ERROR(fd.Close(path));
      writer->repair_note_ = "cut " + std::to_string(decoded.ignored_bytes) +
                             " torn bytes off " + decoded.ignored_note;
    }
    previous = newest;
  }
  MERIDIAN_RETURN_IF_ERROR(writer->StartSegment(segment, previous));
  return writer;
}

LogWriter::~LogWriter() {
  if (fd_ >= 0) ::close(fd_);
}

Status LogWriter::StartSegment(uint64_t segment, uint64_t previous) {
  const std::string path = JoinPath(dir_, LogSegmentFileName(segment));
  const std::string temp = path + std::string(kTempSuffix);
  const std::vector<std::byte> header =
      EncodeLogHeader(segment, previous, fingerprint_);
  Fd fd(::open(temp.c_str(),
               O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoStatus(errno, "create " + Quoted(temp));
  Status status = WriteAll(fd.get(), header, temp);
  if (status.ok() && ::fsync(fd.get()) != 0) {
    status = ErrnoStatus(errno, "fsync " + Quoted(temp));
  }
  // link() never replaces an existing segment (rename() would).
  if (status.ok() && ::link(temp.c_str(), path.c_str()) != 0) {
    status = ErrnoStatus(errno, "create " + Quoted(path));
  }
  RemoveFile(temp).IgnoreError();
  if (status.ok()) status = FsyncDirectory(dir_);
  if (!status.ok()) return status;
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd.release();
  segment_ = segment;
  path_ = path;
  size_ = header.size();
  return Status::Ok();
}

Status LogWriter::Append(std::span<const std::byte> payload) {
  if (!broken_.ok()) {
    return FailedPreconditionError("log segment " + Quoted(path_) +
                                   " is unusable after: " + broken_.message());
  }
  if (payload.size() > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgumentError("log record of " +
                                std::to_string(payload.size()) +
                                " bytes, more than 2^32-1");
  }
  const auto length = static_cast<uint32_t>(payload.size());
  const uint32_t crc = Crc32(Crc32(0, BytesOf(length)), payload);
  std::byte header[kRecordHeaderBytes];
  std::memcpy(header, &length, 4);
  std::memcpy(header + 4, &crc, 4);
  iovec iov[2] = {{header, sizeof(header)},
                  {const_cast<std::byte*>(payload.data()), payload.size()}};
  Status status = WriteAllV(fd_, iov, path_);
  if (!status.ok()) {
    // Part of the record may be in the file: cut it off, or later records
    // would sit behind a torn one.
    if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      broken_ = status;
      return status.WithContext("and cannot cut the partial record off (" +
                                ErrnoText(errno) + ")");
    }
    return status;
  }
  size_ += sizeof(header) + payload.size();
  if (options_.fsync_each_append && ::fdatasync(fd_) != 0) {
    // After a failed fsync the kernel may have dropped the dirty pages:
    // what is in the file is no longer known.
    broken_ = ErrnoStatus(errno, "fdatasync " + Quoted(path_));
    return broken_;
  }
  return Status::Ok();
}

Status LogWriter::Sync() {
  if (!broken_.ok()) {
    return FailedPreconditionError("log segment " + Quoted(path_) +
                                   " is unusable after: " + broken_.message());
  }
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

// ---------------------------------------------------------------------------
// CheckpointWriter

CheckpointWriter::CheckpointWriter(CheckpointWriterOptions options)
    : dir_(std::move(options.dir)),
      write_(options.write
                 ? std::move(options.write)
                 : std::function<Status(const std::string&, const Checkpoint&)>(
                       WriteCheckpoint)),
      durable_sequence_(options.durable_sequence) {
  thread_ = std::thread([this] { Run(); });
}

CheckpointWriter::~CheckpointWriter() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool CheckpointWriter::Submit(Checkpoint&& checkpoint) {
  std::optional<Checkpoint> replaced;  // freed outside the lock
  {
    MutexLock lock(&mu_);
    replaced = std::exchange(pending_, std::move(checkpoint));
    pending_ticket_ = next_ticket_++;
    if (replaced.has_value()) ++stats_.replaced;
  }
  cv_.notify_all();
  return replaced.has_value();
}

Status CheckpointWriter::Flush() {
  MutexLock lock(&mu_);
  const uint64_t ticket = next_ticket_ - 1;
  while (done_ticket_ < ticket && !stop_) cv_.wait(mu_);
  return last_error_;
}

Status CheckpointWriter::last_error() const {
  MutexLock lock(&mu_);
  return last_error_;
}

CheckpointWriter::Stats CheckpointWriter::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void CheckpointWriter::Run() {
  for (;;) {
    std::optional<Checkpoint> checkpoint;
    uint64_t ticket = 0;
    {
      MutexLock lock(&mu_);
      while (!stop_ && !pending_.has_value()) cv_.wait(mu_);
      if (stop_) return;  // a pending checkpoint is dropped
      checkpoint = std::exchange(pending_, std::nullopt);
      ticket = pending_ticket_;
    }
    Status status;
    const auto started = std::chrono::steady_clock::now();
    try {
      status = write_(dir_, *checkpoint);
    } catch (const std::exception& e) {
      status =
          InternalError("checkpoint " + std::to_string(checkpoint->sequence) +
                        " not written: " + e.what());
    }
    if (status.ok()) {
      durable_sequence_.store(checkpoint->sequence, std::memory_order_release);
    }
    const double took_s = std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - started)
                              .count();
    checkpoint.reset();  // at most two snapshots: free this one first
    {
      MutexLock lock(&mu_);
      done_ticket_ = ticket;
      stats_.last_write_s = took_s;
      last_error_ = status;
      if (status.ok()) {
        ++stats_.written;
      } else {
        ++stats_.failed;
      }
    }
    cv_.notify_all();
  }
}

}  // namespace meridian
