#include "selection.h"

#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace meridian::compression {
namespace {

#if defined(__SSE2__)

// The 16-bit mask of the entries of x[i, i + 16) with |x| bits > `below`
// (a signed comparison: |x| bits < 2^31, and below = -1 selects all).
inline uint32_t MaskAbove(const float* x, __m128i below) {
  const __m128i abs_mask = _mm_set1_epi32(0x7fffffff);
  uint32_t mask = 0;
  for (int q = 0; q < 4; ++q) {
    const __m128i v = _mm_and_si128(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 4 * q)), abs_mask);
    mask |= static_cast<uint32_t>(
                _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(v, below))))
            << (4 * q);
  }
  return mask;
}

#endif  // __SSE2__

// Calls emit(i) for every i in [0, n) with |x[i]| bits >= min_abs_bits,
// in order. Blocks of 16 without a hit cost a few instructions: the
// common case of a sparse update.
template <typename Emit>
inline void ForEachAtLeast(const float* x, size_t n, uint32_t min_abs_bits,
                           Emit emit) {
  size_t i = 0;
#if defined(__SSE2__)
  const __m128i below = _mm_set1_epi32(static_cast<int32_t>(min_abs_bits) - 1);
  for (; i + 16 <= n; i += 16) {
    uint32_t mask = MaskAbove(x + i, below);
    if (mask == 0xffff) {
      for (size_t j = 0; j < 16; ++j) emit(i + j);
      continue;
    }
    while (mask != 0) {
      emit(i + static_cast<size_t>(std::countr_zero(mask)));
      mask &= mask - 1;
    }
  }
#endif
  for (; i < n; ++i) {
    if (AbsBitsOf(x[i]) >= min_abs_bits) emit(i);
  }
}

}  // namespace

ScanResult ScanValues(const float* x, size_t n) {
  ScanResult result;
  size_t i = 0;
  uint64_t nonzero = 0;
  bool bad = false;
#if defined(__SSE2__)
  const __m128i abs_mask = _mm_set1_epi32(0x7fffffff);
  const __m128i zero = _mm_setzero_si128();
  const __m128i max_finite =
      _mm_set1_epi32(static_cast<int32_t>(kMaxFiniteAbsBits));
  // Per-lane counts (minus the -1 of each hit) and non-finite flags, in
  // chunks that cannot overflow an int32 lane.
  while (i + 16 <= n) {
    const size_t chunk_end =
        i + std::min<size_t>((n - i) & ~size_t{15}, size_t{1} << 30);
    __m128i count0 = zero, count1 = zero, nonfinite = zero;
    for (; i < chunk_end; i += 8) {
      const __m128i a = _mm_and_si128(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)), abs_mask);
      const __m128i b = _mm_and_si128(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i + 4)),
          abs_mask);
      count0 = _mm_sub_epi32(count0, _mm_cmpgt_epi32(a, zero));
      count1 = _mm_sub_epi32(count1, _mm_cmpgt_epi32(b, zero));
      nonfinite =
          _mm_or_si128(nonfinite, _mm_or_si128(_mm_cmpgt_epi32(a, max_finite),
                                               _mm_cmpgt_epi32(b, max_finite)));
    }
    alignas(16) uint32_t lanes[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes),
                    _mm_add_epi32(count0, count1));
    nonzero += uint64_t{lanes[0]} + lanes[1] + lanes[2] + lanes[3];
    bad |= _mm_movemask_epi8(nonfinite) != 0;
  }
#endif
  for (; i < n; ++i) {
    const uint32_t a = AbsBitsOf(x[i]);
    nonzero += a != 0;
    bad |= a > kMaxFiniteAbsBits;
  }
  result.nonzero = nonzero;
  result.finite = !bad;
  return result;
}

size_t CompactAtLeast(const float* x, size_t n, uint32_t min_abs_bits,
                      uint32_t* positions, float* values) {
  size_t k = 0;
  ForEachAtLeast(x, n, min_abs_bits, [&](size_t i) {
    positions[k] = static_cast<uint32_t>(i);
    values[k] = x[i];
    ++k;
  });
  return k;
}

size_t GatherAbsBits(const float* x, size_t n, uint32_t min_abs_bits,
                     uint32_t* abs_bits) {
  size_t k = 0;
  ForEachAtLeast(x, n, min_abs_bits,
                 [&](size_t i) { abs_bits[k++] = AbsBitsOf(x[i]); });
  return k;
}

TopKThreshold ExactTopKThreshold(uint32_t* abs_bits, size_t count, size_t k) {
  // After nth_element, [cut, count) holds the k largest, abs_bits[cut] the
  // smallest of them.
  const size_t cut = count - k;
  std::nth_element(abs_bits, abs_bits + cut, abs_bits + count);
  TopKThreshold threshold;
  threshold.bits = abs_bits[cut];
  size_t above = 0;
  for (size_t j = cut + 1; j < count; ++j)
    above += abs_bits[j] > threshold.bits;
  threshold.ties = k - above;
  return threshold;
}

size_t CompactTopK(const float* x, size_t n, TopKThreshold threshold,
                   uint32_t* positions, float* values) {
  size_t k = 0;
  size_t ties = threshold.ties;
  ForEachAtLeast(x, n, threshold.bits, [&](size_t i) {
    if (AbsBitsOf(x[i]) == threshold.bits) {
      if (ties == 0) return;
      --ties;
    }
    positions[k] = static_cast<uint32_t>(i);
    values[k] = x[i];
    ++k;
  });
  return k;
}

}  // namespace meridian::compression
