// Byte-level coding shared by the checkpoint and log formats: fixed-width
// little-endian integers, bounds-checked reading, the CRC-32 both formats
// frame their bytes with, and how bytes read from a file are quoted in
// errors. No I/O (file_util.h does that).
//
// All integers in files are little-endian; floats are IEEE-754 binary32,
// little-endian. The checksum is CRC-32 as zlib's crc32() computes it
// (ISO-HDLC: reflected polynomial 0xEDB88320, initial value 0, as in gzip
// and PNG); it detects every error burst of up to 32 bits, so every
// single-byte corruption.
#ifndef MERIDIAN_DURABLE_CODING_H_
#define MERIDIAN_DURABLE_CODING_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meridian::durable {

// Floats and integers are copied to and from files as they sit in memory.
static_assert(std::endian::native == std::endian::little,
              "checkpoint and log files are little-endian");
static_assert(std::numeric_limits<float>::is_iec559 && sizeof(float) == 4,
              "checkpoint arrays are IEEE-754 binary32");

// A CRC-32 as it is stored in a file.
inline constexpr size_t kChecksumBytes = 4;

// zlib's crc32 of `bytes` continuing from `crc`. (zlib returns 0 for a null
// buffer, whatever `crc`: an empty span never reaches it.)
uint32_t Crc32(uint32_t crc, std::span<const std::byte> bytes);

template <typename T>
std::span<const std::byte> BytesOf(const T& value) {
  return std::as_bytes(std::span<const T, 1>(&value, 1));
}

inline std::span<const std::byte> BytesOf(std::string_view text) {
  return std::as_bytes(std::span<const char>(text.data(), text.size()));
}

inline void AppendBytes(std::vector<std::byte>* out,
                        std::span<const std::byte> in) {
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

// `text` with bytes outside printable ASCII as \xNN, cut after 256 bytes:
// fingerprints and names read from a file may hold anything.
std::string Printable(std::string_view text);

// "0x0000abcd": a checksum in an error message.
std::string Hex32(uint32_t value);

}  // namespace meridian::durable

#endif  // MERIDIAN_DURABLE_CODING_H_
