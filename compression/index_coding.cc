#include "index_coding.h"

#include <bit>
#include <cstring>
#include <string>

#include "varint.h"

namespace meridian::compression {
namespace {

Status Corrupt(const std::string& what) {
  return DataLossError("index section: " + what);
}

}  // namespace

uint64_t DeltaVarintBytes(const uint32_t* indices, size_t count) {
  if (count == 0) return 0;
  uint64_t bytes = VarintSize32(indices[0]);
  for (size_t j = 1; j < count; ++j) {
    bytes += VarintSize32(indices[j] - indices[j - 1] - 1);
  }
  return bytes;
}

std::byte* WriteDeltaVarint(const uint32_t* indices, size_t count,
                            std::byte* out) {
  uint32_t previous_plus_one = 0;  // the first index is written as is
  for (size_t j = 0; j < count; ++j) {
    uint32_t v = indices[j] - previous_plus_one;
    previous_plus_one = indices[j] + 1;
    // Most gaps of a sparse update take one or two bytes.
    if (v < 0x80) {
      *out++ = static_cast<std::byte>(v);
      continue;
    }
    while (v >= 0x80) {
      *out++ = static_cast<std::byte>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    *out++ = static_cast<std::byte>(v);
  }
  return out;
}

Status ReadDeltaVarint(std::span<const std::byte> section, uint64_t size,
                       size_t count, uint32_t* indices) {
  const std::byte* p = section.data();
  const std::byte* const end = p + section.size();
  uint64_t next = 0;  // the smallest index allowed next
  for (size_t j = 0; j < count; ++j) {
    uint64_t v;
    if (p != end && std::to_integer<uint8_t>(*p) < 0x80) {
      v = std::to_integer<uint8_t>(*p++);
    } else if (!ReadVarint(&p, end, kMaxVarint32Bytes, &v)) {
      return Corrupt("bad varint at entry " + std::to_string(j));
    }
    const uint64_t index = next + v;  // < 2^33: no overflow
    if (index >= size) {
      return Corrupt("index " + std::to_string(index) + " at entry " +
                     std::to_string(j) + " is outside the slice of " +
                     std::to_string(size));
    }
    indices[j] = static_cast<uint32_t>(index);
    next = index + 1;
  }
  if (p != end) {
    return Corrupt(std::to_string(end - p) + " bytes left after " +
                   std::to_string(count) + " indices");
  }
  return Status::Ok();
}

void WriteBitmap(const uint32_t* indices, size_t count, uint64_t size,
                 std::byte* out) {
  uint8_t* bits = reinterpret_cast<uint8_t*>(out);
  std::memset(bits, 0, BitmapBytes(size));
  for (size_t j = 0; j < count; ++j) {
    bits[indices[j] >> 3] |= static_cast<uint8_t>(1u << (indices[j] & 7));
  }
}

Status ReadBitmap(std::span<const std::byte> section, uint64_t size,
                  size_t count, uint32_t* indices) {
  if (section.size() != BitmapBytes(size)) {
    return Corrupt("bitmap has " + std::to_string(section.size()) +
                   " bytes, expected " + std::to_string(BitmapBytes(size)));
  }
  const uint8_t* bits = reinterpret_cast<const uint8_t*>(section.data());
  const size_t bytes = section.size();
  if (size % 8 != 0 && (bits[bytes - 1] >> (size % 8)) != 0) {
    return Corrupt("bit set past the end of the slice");
  }
  // Count first, so that extracting never writes past `count` entries.
  uint64_t set = 0;
  const size_t words = bytes / 8;
  for (size_t w = 0; w < words; ++w) {
    uint64_t word;
    std::memcpy(&word, bits + 8 * w, sizeof(word));
    set += static_cast<uint64_t>(std::popcount(word));
  }
  for (size_t b = 8 * words; b < bytes; ++b) {
    set += static_cast<uint64_t>(std::popcount(bits[b]));
  }
  if (set != count) {
    return Corrupt("bitmap has " + std::to_string(set) +
                   " bits set, the header says " + std::to_string(count));
  }
  size_t k = 0;
  for (size_t w = 0; w < words; ++w) {
    uint64_t word;
    std::memcpy(&word, bits + 8 * w, sizeof(word));
    while (word != 0) {
      indices[k++] = static_cast<uint32_t>(64 * w + std::countr_zero(word));
      word &= word - 1;
    }
  }
  for (size_t b = 8 * words; b < bytes; ++b) {
    uint32_t byte = bits[b];
    while (byte != 0) {
      indices[k++] = static_cast<uint32_t>(8 * b + std::countr_zero(byte));
      byte &= byte - 1;
    }
  }
  return Status::Ok();
}

}  // namespace meridian::compression
