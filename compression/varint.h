// LEB128 varints: 7 bits per byte, least significant group first, the high
// bit set on every byte but the last.
#ifndef MERIDIAN_COMPRESSION_VARINT_H_
#define MERIDIAN_COMPRESSION_VARINT_H_

#include <cstddef>
#include <cstdint>

namespace meridian::compression {

inline constexpr size_t kMaxVarint32Bytes = 5;
inline constexpr size_t kMaxVarint64Bytes = 10;

// Bytes of the varint of `v`.
inline size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// Branch-light size of a 32-bit varint (1..5), for size estimates over
// many values.
inline size_t VarintSize32(uint32_t v) {
  return 1 + (v >= (1u << 7)) + (v >= (1u << 14)) + (v >= (1u << 21)) +
         (v >= (1u << 28));
}

// Writes the varint of `v` at `out` (room for kMaxVarint64Bytes); returns
// the byte after it.
inline std::byte* WriteVarint(uint64_t v, std::byte* out) {
  while (v >= 0x80) {
    *out++ = static_cast<std::byte>(static_cast<uint8_t>(v) | 0x80);
    v >>= 7;
  }
  *out++ = static_cast<std::byte>(v);
  return out;
}

// Reads a canonical varint of at most `max_bytes` bytes (5 or 10) from
// [*pos, end) whose value fits `max_bytes` (< 2^32 for 5, any u64 for 10).
// On success stores it in *value, advances *pos and returns true; returns
// false on a truncated, overlong, non-canonical (a redundant final 0 byte)
// or overflowing varint, leaving *pos unspecified. Never reads at or past
// `end`.
inline bool ReadVarint(const std::byte** pos, const std::byte* end,
                       size_t max_bytes, uint64_t* value) {
  const std::byte* p = *pos;
  uint64_t result = 0;
  for (size_t i = 0; i < max_bytes; ++i) {
    if (p == end) return false;
    const uint8_t byte = std::to_integer<uint8_t>(*p++);
    const uint64_t bits = byte & 0x7f;
    if (i == max_bytes - 1) {
      // The last possible byte: no continuation, and the value must fit.
      const unsigned shift = static_cast<unsigned>(7 * i);
      const unsigned room = (max_bytes == kMaxVarint32Bytes ? 32 : 64) - shift;
      if ((byte & 0x80) != 0 || (room < 7 && (bits >> room) != 0)) {
        return false;
      }
    }
    result |= bits << (7 * i);
    if ((byte & 0x80) == 0) {
      if (byte == 0 && i > 0) return false;  // non-canonical
      *value = result;
      *pos = p;
      return true;
    }
  }
  return false;
}

}  // namespace meridian::compression

#endif  // MERIDIAN_COMPRESSION_VARINT_H_
