// Conversions between float and the 16-bit formats IEEE binary16 (fp16)
// and bfloat16 (bf16), in portable bit arithmetic (the build targets
// baseline x86-64, which has no F16C). Encoders saturate instead of
// producing infinities; decoders assume the caller rejected the encodings
// of Inf and NaN (see IsFiniteHalf / IsFiniteBf16).
#ifndef MERIDIAN_COMPRESSION_FLOAT_FORMATS_H_
#define MERIDIAN_COMPRESSION_FLOAT_FORMATS_H_

#include <bit>
#include <cstdint>

namespace meridian::compression {

inline constexpr uint16_t kHalfMaxFinite = 0x7bff;  // 65504
inline constexpr uint16_t kBf16MaxFinite = 0x7f7f;  // ~3.39e38

inline bool IsFiniteHalf(uint16_t h) { return (h & 0x7c00) != 0x7c00; }
inline bool IsFiniteBf16(uint16_t b) { return (b & 0x7f80) != 0x7f80; }

// Exact: every fp16 value is a float.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t bits = static_cast<uint32_t>(h & 0x7fff) << 13;
  if ((h & 0x7c00) == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    const float magnitude = static_cast<float>(h & 0x03ff) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(magnitude) | sign);
  }
  bits += static_cast<uint32_t>(127 - 15) << 23;  // rebias the exponent
  return std::bit_cast<float>(bits | sign);
}

// Round to nearest, ties to even; |f| beyond 65504 saturates to +-65504.
// `f` must be finite.
inline uint16_t FloatToHalfNearest(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint16_t h;
  if (x >= 0x477ff000u) {
    // >= 65520 rounds to infinity under RNE: saturate. [65504, 65520)
    // rounds to 65504 below as well.
    h = kHalfMaxFinite;
  } else if (x < (113u << 23)) {
    // Below 2^-14: the fp16 result is subnormal or zero. Adding 0.5 aligns
    // the 10 result bits at the bottom of the float's mantissa, and the
    // float addition rounds them to nearest even.
    constexpr uint32_t kMagic = ((127 - 15) + (23 - 10) + 1) << 23;  // 0.5
    const float aligned =
        std::bit_cast<float>(x) + std::bit_cast<float>(kMagic);
    h = static_cast<uint16_t>(std::bit_cast<uint32_t>(aligned) - kMagic);
  } else {
    const uint32_t odd = (x >> 13) & 1;
    x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfff + odd;
    h = static_cast<uint16_t>(x >> 13);
  }
  return static_cast<uint16_t>(h | (sign >> 16));
}

// Unbiased stochastic rounding to one of the two fp16 neighbours of `f`,
// given `random` uniform in [0, 2^32); saturates at +-65504.
inline uint16_t FloatToHalfStochastic(float f, uint32_t random) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint32_t h;
  if (x < (113u << 23)) {
    // Subnormal range: spacing 2^-24; scaling by 2^24 is exact.
    const float scaled = std::bit_cast<float>(x) * 0x1p24f;  // < 1024
    const float u = static_cast<float>(random >> 8) * 0x1p-24f;
    h = static_cast<uint32_t>(scaled + u);        // 1024 is the smallest normal
    if (static_cast<float>(h) > scaled + u) --h;  // float sum rounded up
  } else {
    // Normal range: the fp16 value is the float's bits truncated to 10
    // mantissa bits; adding uniform noise below the cut first rounds up
    // with probability equal to the dropped fraction.
    x += random >> 19;  // 13 random bits
    h = (x >> 13) - (static_cast<uint32_t>(127 - 15) << 10);
  }
  if (h > kHalfMaxFinite) h = kHalfMaxFinite;
  return static_cast<uint16_t>(h | (sign >> 16));
}

inline float Bf16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

// Round to nearest, ties to even; saturates at the largest finite bf16.
// `f` must be finite.
inline uint16_t FloatToBf16Nearest(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = x + 0x7fff + ((x >> 16) & 1);
  uint16_t b = static_cast<uint16_t>(rounded >> 16);
  if (!IsFiniteBf16(b))
    b = static_cast<uint16_t>((x >> 16 & 0x8000) | kBf16MaxFinite);
  return b;
}

// Unbiased stochastic rounding; `random` uniform in [0, 2^32).
inline uint16_t FloatToBf16Stochastic(float f, uint32_t random) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = x & 0x80000000u;
  const uint32_t magnitude = (x ^ sign) + (random >> 16);
  uint16_t b = static_cast<uint16_t>(magnitude >> 16);
  if (!IsFiniteBf16(b)) b = kBf16MaxFinite;
  return static_cast<uint16_t>(b | (sign >> 16));
}

}  // namespace meridian::compression

#endif  // MERIDIAN_COMPRESSION_FLOAT_FORMATS_H_
