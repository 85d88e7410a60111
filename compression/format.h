// Byte layout of an encoded buffer's fixed header (documented in
// include/meridian/compression.h), shared by the encoder, the decoder and
// the tests and fuzz target that build buffers by hand.
#ifndef MERIDIAN_COMPRESSION_FORMAT_H_
#define MERIDIAN_COMPRESSION_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "checksum.h"

namespace meridian::compression {

inline constexpr std::byte kMagic0{'M'};
inline constexpr std::byte kMagic1{'C'};
inline constexpr size_t kVersionOffset = 2;
inline constexpr size_t kCodingsOffset = 3;
inline constexpr size_t kChecksumOffset = 4;
inline constexpr size_t kFixedHeaderBytes = 8;

inline constexpr uint8_t kValueCodingMask = 0x07;
inline constexpr uint8_t kIndexCodingShift = 3;
inline constexpr uint8_t kIndexCodingMask = 0x07;
inline constexpr uint8_t kZstdBit = 0x40;
inline constexpr uint8_t kReservedBit = 0x80;

// The checksum of `buffer` (at least kFixedHeaderBytes long): low 32 bits
// of XXH64 of the bytes after the fixed header, seeded with its first four.
inline uint32_t ComputeChecksum(std::span<const std::byte> buffer) {
  uint32_t seed;
  std::memcpy(&seed, buffer.data(), sizeof(seed));
  return static_cast<uint32_t>(
      Xxh64(buffer.subspan(kFixedHeaderBytes), uint64_t{seed}));
}

// Writes the checksum of `buffer` into its checksum field.
inline void SealChecksum(std::span<std::byte> buffer) {
  const uint32_t checksum = ComputeChecksum(buffer);
  std::memcpy(buffer.data() + kChecksumOffset, &checksum, sizeof(checksum));
}

}  // namespace meridian::compression

#endif  // MERIDIAN_COMPRESSION_FORMAT_H_
