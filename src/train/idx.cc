// IDX files (the MNIST / Fashion-MNIST format) through zlib: gzread reads
// gzip-compressed and plain files alike; writes are always gzip.
//
// Layout: a big-endian header (magic 0x000008NN with NN = number of
// dimensions, then one uint32 per dimension) followed by the unsigned bytes.
// Every read is validated against the header: wrong magic, absurd
// dimensions, truncated or over-long data are DataLoss errors naming the
// path, and memory grows only with the bytes actually present, so a garbage
// header cannot trigger a huge allocation.

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "meridian/train/dataset.h"

namespace meridian {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;
// Largest accepted dimensions: generous for image data sets, small enough
// that no product overflows and no index exceeds 32 bits.
constexpr uint64_t kMaxSide = 1 << 16;                 // rows, cols
constexpr uint64_t kMaxImageDim = 1 << 24;             // rows * cols
constexpr uint64_t kMaxCount = uint64_t{1} << 31;      // samples
constexpr uint64_t kMaxDataBytes = uint64_t{1} << 34;  // 16 GiB
// Bytes per gzread call; also the largest up-front reservation step.
constexpr unsigned kChunk = 1 << 20;

std::string Hex32(uint32_t value) {
  char buffer[16];
  std::snprintf(buffer, sizeof(buffer), "0x%08X", value);
  return buffer;
}

uint32_t BigEndian32(const unsigned char* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) |
         (uint32_t{bytes[2]} << 8) | uint32_t{bytes[3]};
}

void AppendBigEndian32(uint32_t value, std::vector<unsigned char>* out) {
  out->push_back(static_cast<unsigned char>(value >> 24));
  out->push_back(static_cast<unsigned char>(value >> 16));
  out->push_back(static_cast<unsigned char>(value >> 8));
  out->push_back(static_cast<unsigned char>(value));
}

// " (...)" hint for a missing data file.
std::string MissingFileHint(const std::string& path) {
  const std::string& default_dir = pb::DataConfig::default_instance().dir();
  if (path.compare(0, default_dir.size(), default_dir) == 0 &&
      (path.size() == default_dir.size() || path[default_dir.size()] == '/')) {
    return "; the Fashion-MNIST data set is not installed: install the Debian "
           "package dataset-fashion-mnist (apt-get install "
           "dataset-fashion-mnist) or set data.dir in the job file";
  }
  return "; check data.dir and the file names in the job file";
}

// A gzFile that closes itself.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {}
  ~GzReader() {
    if (file_ != nullptr) gzclose(file_);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  Status Open() {
    struct stat info;
    if (stat(path_.c_str(), &info) != 0) {
      const int error = errno;
      const std::string reason = std::strerror(error);
      if (error == ENOENT || error == ENOTDIR) {
        return NotFoundError("cannot open " + path_ + ": " + reason +
                             MissingFileHint(path_));
      }
      return InvalidArgumentError("cannot open " + path_ + ": " + reason);
    }
    if (S_ISDIR(info.st_mode)) {
      return InvalidArgumentError("cannot read " + path_ +
                                  ": is a directory, not an IDX file");
    }
    errno = 0;
    file_ = gzopen(path_.c_str(), "rb");
    if (file_ == nullptr) {
      const std::string reason =
          errno != 0 ? std::strerror(errno) : "out of memory";
      return InvalidArgumentError("cannot open " + path_ + ": " + reason);
    }
    gzbuffer(file_, 1 << 17);
    return Status::Ok();
  }

  // Reads up to `size` bytes; returns how many were read (fewer only at the
  // end of the data) or DataLoss on a decompression or I/O error.
  Result<uint64_t> Read(unsigned char* data, uint64_t size) {
    uint64_t done = 0;
    while (done < size) {
      const unsigned want =
          static_cast<unsigned>(std::min<uint64_t>(kChunk, size - done));
      const int got = gzread(file_, data + done, want);
      if (got < 0) {
        int code = 0;
        const char* message = gzerror(file_, &code);
        return DataLossError(
            "cannot read " + path_ + ": " +
            (code == Z_ERRNO ? std::string(std::strerror(errno))
                             : std::string(message ? message : "zlib error")));
      }
      if (got == 0) break;
      done += static_cast<uint64_t>(got);
    }
    return done;
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

// Opens `reader` (on `path`) and reads the IDX header with `num_dims`
// dimensions after checking its magic number against `magic`.
Status OpenIdx(GzReader& reader, const std::string& path, uint32_t magic,
               const char* kind, int num_dims, std::vector<uint32_t>* dims) {
  MERIDIAN_RETURN_IF_ERROR(reader.Open());
  unsigned char header[16];
  const uint64_t header_bytes = 4 + 4 * static_cast<uint64_t>(num_dims);
  MERIDIAN_ASSIGN_OR_RETURN(const uint64_t got,
                            reader.Read(header, header_bytes));
  if (got < 4) {
    return DataLossError(path + ": truncated: " + std::to_string(got) +
                         " bytes, too short for an IDX header");
  }
  const uint32_t found = BigEndian32(header);
  if (found != magic) {
    std::string hint;
    if (found == kImagesMagic) hint = " (this is an IDX3 image file)";
    if (found == kLabelsMagic) hint = " (this is an IDX1 label file)";
    if ((found >> 16) == 0x1F8B) hint = " (gzip-compressed twice?)";
    return DataLossError(path + ": not an IDX " + std::string(kind) +
                         " file: magic number " + Hex32(found) + ", expected " +
                         Hex32(magic) + hint);
  }
  if (got < header_bytes) {
    return DataLossError(path + ": truncated: the IDX header needs " +
                         std::to_string(header_bytes) +
                         " bytes, the file has " + std::to_string(got));
  }
  dims->clear();
  for (int i = 0; i < num_dims; ++i) {
    dims->push_back(BigEndian32(header + 4 + 4 * i));
  }
  return Status::Ok();
}

// Reads exactly `size` data bytes after the header, growing the buffer only
// as bytes arrive; fails on fewer bytes (truncated) or more (not IDX).
Result<std::vector<uint8_t>> ReadBody(GzReader& reader, const std::string& path,
                                      uint64_t size) {
  std::vector<uint8_t> data;
  data.reserve(static_cast<size_t>(std::min<uint64_t>(size, 64 * kChunk)));
  while (data.size() < size) {
    const uint64_t offset = data.size();
    const uint64_t step = std::min<uint64_t>(kChunk, size - offset);
    data.resize(static_cast<size_t>(offset + step));
    MERIDIAN_ASSIGN_OR_RETURN(const uint64_t got,
                              reader.Read(data.data() + offset, step));
    if (got < step) {
      return DataLossError(path + ": truncated: the header announces " +
                           std::to_string(size) + " data bytes, the file has " +
                           std::to_string(offset + got));
    }
  }
  unsigned char extra;
  MERIDIAN_ASSIGN_OR_RETURN(const uint64_t more, reader.Read(&extra, 1));
  if (more != 0) {
    return DataLossError(path + ": longer than its IDX header says (" +
                         std::to_string(size) +
                         " data bytes announced, more follow)");
  }
  return data;
}

Status WriteGz(const std::string& path,
               const std::vector<unsigned char>& header,
               std::span<const uint8_t> body) {
  errno = 0;
  gzFile file = gzopen(path.c_str(), "wb");
  if (file == nullptr) {
    const int error = errno;
    const std::string reason = error != 0 ? std::strerror(error) : "zlib error";
    if (error == ENOENT || error == ENOTDIR) {
      return NotFoundError("cannot create " + path + ": " + reason);
    }
    return InvalidArgumentError("cannot create " + path + ": " + reason);
  }
  bool ok =
      gzwrite(file, header.data(), static_cast<unsigned>(header.size())) ==
      static_cast<int>(header.size());
  for (uint64_t done = 0; ok && done < body.size();) {
    const unsigned step =
        static_cast<unsigned>(std::min<uint64_t>(kChunk, body.size() - done));
    ok = gzwrite(file, body.data() + done, step) == static_cast<int>(step);
    done += step;
  }
  std::string reason;
  if (!ok) {
    int code = 0;
    const char* message = gzerror(file, &code);
    reason = code == Z_ERRNO ? std::strerror(errno)
                             : std::string(message ? message : "zlib error");
  }
  const int close_code = gzclose(file);
  if (ok && close_code != Z_OK) {
    ok = false;
    reason = close_code == Z_ERRNO ? std::strerror(errno) : "zlib error";
  }
  if (!ok) return DataLossError("cannot write " + path + ": " + reason);
  return Status::Ok();
}

}  // namespace

Result<IdxImages> ReadIdxImages(const std::string& path) {
  GzReader reader(path);
  std::vector<uint32_t> dims;
  MERIDIAN_RETURN_IF_ERROR(
      OpenIdx(reader, path, kImagesMagic, "image", 3, &dims));
  const uint64_t count = dims[0];
  const uint64_t rows = dims[1];
  const uint64_t cols = dims[2];
  if (rows == 0 || cols == 0 || rows > kMaxSide || cols > kMaxSide ||
      rows * cols > kMaxImageDim) {
    return DataLossError(path + ": implausible image size " +
                         std::to_string(rows) + " x " + std::to_string(cols) +
                         " in the IDX header");
  }
  if (count > kMaxCount || count * rows * cols > kMaxDataBytes) {
    return DataLossError(path + ": implausible image count " +
                         std::to_string(count) + " in the IDX header");
  }
  IdxImages images;
  MERIDIAN_ASSIGN_OR_RETURN(images.pixels,
                            ReadBody(reader, path, count * rows * cols));
  images.count = static_cast<uint32_t>(count);
  images.rows = static_cast<uint32_t>(rows);
  images.cols = static_cast<uint32_t>(cols);
  return images;
}

Result<std::vector<uint8_t>> ReadIdxLabels(const std::string& path) {
  GzReader reader(path);
  std::vector<uint32_t> dims;
  MERIDIAN_RETURN_IF_ERROR(
      OpenIdx(reader, path, kLabelsMagic, "label", 1, &dims));
  const uint64_t count = dims[0];
  if (count > kMaxCount) {
    return DataLossError(path + ": implausible label count " +
                         std::to_string(count) + " in the IDX header");
  }
  return ReadBody(reader, path, count);
}

Status WriteIdxImages(const std::string& path, const IdxImages& images) {
  const uint64_t expected = uint64_t{images.count} * images.rows * images.cols;
  if (images.pixels.size() != expected) {
    return InvalidArgumentError(
        "cannot write " + path + ": " + std::to_string(images.count) + " x " +
        std::to_string(images.rows) + " x " + std::to_string(images.cols) +
        " images need " + std::to_string(expected) + " pixels, got " +
        std::to_string(images.pixels.size()));
  }
  std::vector<unsigned char> header;
  AppendBigEndian32(kImagesMagic, &header);
  AppendBigEndian32(images.count, &header);
  AppendBigEndian32(images.rows, &header);
  AppendBigEndian32(images.cols, &header);
  return WriteGz(path, header, images.pixels);
}

Status WriteIdxLabels(const std::string& path,
                      std::span<const uint8_t> labels) {
  if (labels.size() > kMaxCount) {
    return InvalidArgumentError("cannot write " + path + ": too many labels");
  }
  std::vector<unsigned char> header;
  AppendBigEndian32(kLabelsMagic, &header);
  AppendBigEndian32(static_cast<uint32_t>(labels.size()), &header);
  return WriteGz(path, header, labels);
}

}  // namespace meridian
