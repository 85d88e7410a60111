// The passes over an update's values that decide what a message carries:
// one scan (non-zero count and finiteness), compaction of the entries at
// or above a magnitude, and exact top-k thresholds. Magnitudes are compared
// as the bits of |v| (for non-negative floats the integer order is the
// numeric order), which keeps every pass a tight integer loop.
#ifndef MERIDIAN_COMPRESSION_SELECTION_H_
#define MERIDIAN_COMPRESSION_SELECTION_H_

#include <bit>
#include <cstddef>
#include <cstdint>

namespace meridian::compression {

inline uint32_t AbsBitsOf(float v) {
  return std::bit_cast<uint32_t>(v) & 0x7fffffffu;
}

// Largest |v| bits of a finite float.
inline constexpr uint32_t kMaxFiniteAbsBits = 0x7f7fffffu;

struct ScanResult {
  uint64_t nonzero = 0;  // entries with v != 0 (+0 and -0 are zero)
  bool finite = true;    // no NaN or Inf
};

// One pass over x[0, n).
ScanResult ScanValues(const float* x, size_t n);

// Writes the position i and value x[i] of every entry of x[0, n) whose
// |x[i]| bits are >= min_abs_bits, in order, to positions/values (room for
// all of them); returns how many. min_abs_bits 1: the non-zero entries;
// 0: all entries. Entries of x must be finite.
size_t CompactAtLeast(const float* x, size_t n, uint32_t min_abs_bits,
                      uint32_t* positions, float* values);

// Like CompactAtLeast, but writes |x[i]| bits instead of (position, value).
size_t GatherAbsBits(const float* x, size_t n, uint32_t min_abs_bits,
                     uint32_t* abs_bits);

// The threshold of the exact top-k: every entry with |v| bits > `bits` is
// among the k largest, and so are the first `ties` entries (in position
// order) with |v| bits == `bits`.
struct TopKThreshold {
  uint32_t bits = 0;
  size_t ties = 0;
};

// The threshold of the k largest of abs_bits[0, count), 1 <= k <= count.
// Reorders abs_bits. O(count) on average.
TopKThreshold ExactTopKThreshold(uint32_t* abs_bits, size_t count, size_t k);

// Writes the entries of x[0, n) selected by `threshold` (see above), in
// order; returns how many (the k of the threshold when it was computed
// over the same entries).
size_t CompactTopK(const float* x, size_t n, TopKThreshold threshold,
                   uint32_t* positions, float* values);

}  // namespace meridian::compression

#endif  // MERIDIAN_COMPRESSION_SELECTION_H_
