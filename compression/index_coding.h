// Index sections: which entries of a slice a message carries, as sorted
// slice indices (see include/meridian/compression.h for the layouts).
#ifndef MERIDIAN_COMPRESSION_INDEX_CODING_H_
#define MERIDIAN_COMPRESSION_INDEX_CODING_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "meridian/core/status.h"

namespace meridian::compression {

// Bytes of the delta-varint section of indices[0, count) (strictly
// increasing).
uint64_t DeltaVarintBytes(const uint32_t* indices, size_t count);

// Writes the delta-varint section (DeltaVarintBytes bytes) at `out`;
// returns the byte after it.
std::byte* WriteDeltaVarint(const uint32_t* indices, size_t count,
                            std::byte* out);

// Decodes exactly `count` indices from `section`, which they must fill
// exactly, into indices[0, count). DataLoss unless every varint is
// canonical and the indices are strictly increasing and < size.
Status ReadDeltaVarint(std::span<const std::byte> section, uint64_t size,
                       size_t count, uint32_t* indices);

inline uint64_t BitmapBytes(uint64_t size) { return (size + 7) / 8; }

// Writes the bitmap of a slice of `size` elements (BitmapBytes(size) bytes)
// with the bits of indices[0, count) set (all < size).
void WriteBitmap(const uint32_t* indices, size_t count, uint64_t size,
                 std::byte* out);

// Decodes a bitmap section into its `count` set positions. DataLoss unless
// the section has BitmapBytes(size) bytes, exactly `count` bits set and
// no bit set at or past `size`.
Status ReadBitmap(std::span<const std::byte> section, uint64_t size,
                  size_t count, uint32_t* indices);

}  // namespace meridian::compression

#endif  // MERIDIAN_COMPRESSION_INDEX_CODING_H_
