#include "value_coding.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "float_formats.h"

namespace meridian::compression {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the value sections are little-endian");

constexpr float kInt8Levels = 127.0f;
constexpr float kInt4Levels = 7.0f;
// INT2: four symmetric levels {-3, -1, 1, 3} * u, u the block's scale
// (the smallest float with 3u >= max |v|), i.e. {-s, -s/3, s/3, s} for
// s = 3u. Why these four: the values an INT2 message carries are a top-k
// selection's (the largest magnitudes, error feedback keeping the rest),
// rarely near zero, so a zero level would spend a quarter of the codes on
// values that are not sent; symmetric levels treat both signs alike and
// space evenly (2u apart), so stochastic rounding between neighbours is
// unbiased and nearest rounding is off by at most u = s/3. Stored as
// code c = (q + 3) / 2 in 0..3, four per byte, lowest bits first: every
// code is a level. A zero value (in a block with a non-zero scale)
// becomes +-u: HasZeroLevel.
constexpr float kInt2Levels = 3.0f;
// Adding and subtracting 1.5 * 2^23 rounds a float of magnitude < 2^22 to
// the nearest integer, ties to even (the default rounding mode), in two
// vectorisable instructions.
constexpr float kRoundMagic = 0x1.8p23f;

inline uint32_t AbsBits(float v) {
  return std::bit_cast<uint32_t>(v) & 0x7fffffffu;
}

// Largest |v| of values[0, n), via the integer order of non-negative floats
// (an integer max reduction vectorises; a float one does not without
// -ffast-math).
float MaxAbs(const float* values, size_t n) {
  int32_t max_bits = 0;
  for (size_t j = 0; j < n; ++j) {
    const int32_t a = static_cast<int32_t>(AbsBits(values[j]));
    max_bits = a > max_bits ? a : max_bits;
  }
  return std::bit_cast<float>(max_bits);
}

// The scale of a block whose largest magnitude is `max_abs` (finite): the
// smallest float s with levels * s >= max_abs, so that |v / s| <= levels
// for every value of the block; stepped down if levels * s overflows (then
// the largest values clamp, and the excess goes to the residual).
float ScaleFor(float max_abs, float levels) {
  if (max_abs == 0.0f) return 0.0f;
  float s = max_abs / levels;
  if (static_cast<double>(s) * levels < static_cast<double>(max_abs)) {
    s = std::nextafter(s, std::numeric_limits<float>::infinity());
  }
  while (!std::isfinite(s * levels)) s = std::nextafter(s, 0.0f);
  return s;
}

inline void StoreFloat(float v, std::byte* out) {
  std::memcpy(out, &v, sizeof(v));
}

inline float LoadFloat(const std::byte* in) {
  float v;
  std::memcpy(&v, in, sizeof(v));
  return v;
}

// Uniform in [0, 1) with 24 bits.
inline float Uniform(uint32_t random) {
  return static_cast<float>(random >> 8) * 0x1p-24f;
}

// Quantises values[0, n) (one block, scale s > 0) to integers in
// [-levels, levels], stored by `store(j, q)`; writes residuals when asked.
// `first` is the index of values[0] in the message (the stochastic stream).
template <bool kResidual, typename Store>
void QuantiseBlock(const float* values, size_t n, float s, float levels,
                   RoundingMode rounding, uint64_t first, float* residual,
                   Store store) {
  if (!rounding.stochastic) {
    for (size_t j = 0; j < n; ++j) {
      const float v = values[j];
      float r = (v / s + kRoundMagic) - kRoundMagic;
      r = std::min(std::max(r, -levels), levels);
      const int32_t q = static_cast<int32_t>(r);
      store(j, q);
      if constexpr (kResidual) residual[j] = v - static_cast<float>(q) * s;
    }
    return;
  }
  for (size_t j = 0; j < n; ++j) {
    const float v = values[j];
    const float x = v / s;
    // floor(x) exactly (|x| <= levels), then up with probability x - floor.
    float lower = static_cast<float>(static_cast<int32_t>(x));
    if (lower > x) lower -= 1.0f;
    const float fraction = x - lower;  // exact
    float r =
        lower +
        (Uniform(RandomAt(rounding.key, first + j)) < fraction ? 1.0f : 0.0f);
    r = std::min(std::max(r, -levels), levels);
    const int32_t q = static_cast<int32_t>(r);
    store(j, q);
    if constexpr (kResidual) residual[j] = v - static_cast<float>(q) * s;
  }
}

// INT8 / INT4: scales first, then the packed integers.
template <bool kResidual>
void EncodeScaled(bool int4, uint32_t block, RoundingMode rounding,
                  const float* values, size_t count, std::byte* out,
                  float* residual) {
  const float levels = int4 ? kInt4Levels : kInt8Levels;
  const size_t blocks = (count + block - 1) / block;
  std::byte* scales = out;
  int8_t* bytes = reinterpret_cast<int8_t*>(out + 4 * blocks);
  uint8_t* nibbles = reinterpret_cast<uint8_t*>(out + 4 * blocks);
  if (int4) std::memset(nibbles, 0, (count + 1) / 2);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t first = b * block;
    const size_t n = std::min<size_t>(block, count - first);
    const float* v = values + first;
    float* res = kResidual ? residual + first : nullptr;
    const float s = ScaleFor(MaxAbs(v, n), levels);
    StoreFloat(s, scales + 4 * b);
    if (s == 0.0f) {
      // An all-zero block: every code 0 (the int4 nibbles are zeroed).
      if (!int4) std::memset(bytes + first, 0, n);
      if constexpr (kResidual) {
        for (size_t j = 0; j < n; ++j) res[j] = v[j];
      }
      continue;
    }
    if (int4) {
      QuantiseBlock<kResidual>(
          v, n, s, levels, rounding, first, res, [&](size_t j, int32_t q) {
            const size_t at = first + j;
            nibbles[at >> 1] |=
                static_cast<uint8_t>((q & 0xf) << (4 * (at & 1)));
          });
    } else {
      int8_t* dst = bytes + first;
      QuantiseBlock<kResidual>(
          v, n, s, levels, rounding, first, res,
          [dst](size_t j, int32_t q) { dst[j] = static_cast<int8_t>(q); });
    }
  }
}

// INT2 (see kInt2Levels): in k = (q + 1) / 2 space the levels are the
// integers -1..2 and x = v / u maps to y = (x + 1) / 2, so rounding y to
// an integer (nearest: floor(y + 1/2); stochastic: up with probability
// y - floor(y), unbiased) picks a level q = 2k - 1. Code c = k + 1.
template <bool kResidual>
void EncodeInt2(uint32_t block, RoundingMode rounding, const float* values,
                size_t count, std::byte* out, float* residual) {
  const size_t blocks = (count + block - 1) / block;
  std::byte* scales = out;
  uint8_t* packed = reinterpret_cast<uint8_t*>(out + 4 * blocks);
  std::memset(packed, 0, (count + 3) / 4);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t first = b * block;
    const size_t n = std::min<size_t>(block, count - first);
    const float* v = values + first;
    const float u = ScaleFor(MaxAbs(v, n), kInt2Levels);
    StoreFloat(u, scales + 4 * b);
    if (u == 0.0f) {
      // An all-zero block: every code 0, and every level is 0.
      if constexpr (kResidual) {
        for (size_t j = 0; j < n; ++j) residual[first + j] = v[j];
      }
      continue;
    }
    for (size_t j = 0; j < n; ++j) {
      const float y = (v[j] / u + 1.0f) * 0.5f;
      float k;
      if (rounding.stochastic) {
        k = std::floor(y);
        k += Uniform(RandomAt(rounding.key, first + j)) < y - k ? 1.0f : 0.0f;
      } else {
        k = std::floor(y + 0.5f);
      }
      k = std::min(std::max(k, -1.0f), 2.0f);
      const uint32_t c = static_cast<uint32_t>(k + 1.0f);
      const size_t at = first + j;
      packed[at >> 2] |= static_cast<uint8_t>(c << (2 * (at & 3)));
      if constexpr (kResidual) {
        residual[at] = v[j] - (2.0f * k - 1.0f) * u;
      }
    }
  }
}

template <bool kResidual>
void EncodeHalf(bool bf16, RoundingMode rounding, const float* values,
                size_t count, std::byte* out, float* residual) {
  uint16_t* dst = reinterpret_cast<uint16_t*>(out);
  for (size_t j = 0; j < count; ++j) {
    const float v = values[j];
    uint16_t h;
    if (bf16) {
      h = rounding.stochastic
              ? FloatToBf16Stochastic(v, RandomAt(rounding.key, j))
              : FloatToBf16Nearest(v);
    } else {
      h = rounding.stochastic
              ? FloatToHalfStochastic(v, RandomAt(rounding.key, j))
              : FloatToHalfNearest(v);
    }
    std::memcpy(dst + j, &h, sizeof(h));
    if constexpr (kResidual) {
      residual[j] = v - (bf16 ? Bf16ToFloat(h) : HalfToFloat(h));
    }
  }
}

template <bool kResidual>
void EncodeAll(pb::ValueCoding coding, uint32_t block, RoundingMode rounding,
               const float* values, size_t count, std::byte* out,
               float* residual) {
  switch (coding) {
    case pb::VALUE_FP16:
    case pb::VALUE_BF16:
      EncodeHalf<kResidual>(coding == pb::VALUE_BF16, rounding, values, count,
                            out, residual);
      return;
    case pb::VALUE_INT8:
    case pb::VALUE_INT4:
      EncodeScaled<kResidual>(coding == pb::VALUE_INT4, block, rounding, values,
                              count, out, residual);
      return;
    case pb::VALUE_INT2:
      EncodeInt2<kResidual>(block, rounding, values, count, out, residual);
      return;
    default:  // VALUE_FP32 (the caller validated the coding)
      if (count > 0) std::memcpy(out, values, count * sizeof(float));
      if constexpr (kResidual) {
        std::fill(residual, residual + count, 0.0f);
      }
      return;
  }
}

Status Corrupt(const std::string& what) {
  return DataLossError("value section: " + what);
}

// Reads and checks the scales of an INT8/INT4 section.
Status ReadScale(const std::byte* at, float levels, size_t block_index,
                 float* scale) {
  const float s = LoadFloat(at);
  // Finite, not negative (nor -0), and levels * s finite so that every
  // decoded value is finite.
  if (!(s >= 0.0f) || std::signbit(s) || !std::isfinite(s * levels)) {
    return Corrupt("scale of block " + std::to_string(block_index) +
                   " is invalid (" + std::to_string(s) + ")");
  }
  *scale = s;
  return Status::Ok();
}

// The INT2 section of `count` values at `in` (its size checked).
Status DecodeInt2(uint32_t block, const std::byte* in, size_t count,
                  float* out) {
  if (block == 0) return Corrupt("block size 0");
  const size_t blocks = (count + block - 1) / block;
  const uint8_t* packed = reinterpret_cast<const uint8_t*>(in + 4 * blocks);
  for (size_t b = 0; b < blocks; ++b) {
    float u = 0.0f;
    MERIDIAN_RETURN_IF_ERROR(ReadScale(in + 4 * b, kInt2Levels, b, &u));
    const size_t first = b * block;
    const size_t n = std::min<size_t>(block, count - first);
    for (size_t j = 0; j < n; ++j) {
      const size_t at = first + j;
      const int32_t c = (packed[at >> 2] >> (2 * (at & 3))) & 3;
      out[at] = static_cast<float>(2 * c - 3) * u;
    }
  }
  if ((count & 3) != 0 && (packed[count >> 2] >> (2 * (count & 3))) != 0) {
    return Corrupt("int2 padding bits are not 0");
  }
  return Status::Ok();
}

}  // namespace

uint64_t ValueSectionBytes(pb::ValueCoding coding, uint64_t count,
                           uint32_t block) {
  switch (coding) {
    case pb::VALUE_FP16:
    case pb::VALUE_BF16:
      return 2 * count;
    case pb::VALUE_INT8:
      return 4 * ((count + block - 1) / block) + count;
    case pb::VALUE_INT4:
      return 4 * ((count + block - 1) / block) + (count + 1) / 2;
    case pb::VALUE_INT2:
      return 4 * ((count + block - 1) / block) + (count + 3) / 4;
    default:
      return 4 * count;
  }
}

void EncodeValues(pb::ValueCoding coding, uint32_t block, RoundingMode rounding,
                  const float* values, size_t count, std::byte* out,
                  float* residual) {
  if (residual != nullptr) {
    EncodeAll<true>(coding, block, rounding, values, count, out, residual);
  } else {
    EncodeAll<false>(coding, block, rounding, values, count, out, nullptr);
  }
}

Status DecodeValues(pb::ValueCoding coding, uint32_t block,
                    std::span<const std::byte> section, size_t count,
                    float* out) {
  if (section.size() != ValueSectionBytes(coding, count, block)) {
    return Corrupt("has " + std::to_string(section.size()) +
                   " bytes, expected " +
                   std::to_string(ValueSectionBytes(coding, count, block)));
  }
  const std::byte* in = section.data();
  switch (coding) {
    case pb::VALUE_FP32: {
      if (count > 0) std::memcpy(out, in, count * sizeof(float));
      uint32_t bad = 0;
      for (size_t j = 0; j < count; ++j) {
        bad |= AbsBits(out[j]) > 0x7f7fffffu;
      }
      if (bad != 0) return Corrupt("NaN or Inf value");
      return Status::Ok();
    }
    case pb::VALUE_FP16:
    case pb::VALUE_BF16: {
      const bool bf16 = coding == pb::VALUE_BF16;
      const uint16_t exponent = bf16 ? 0x7f80 : 0x7c00;
      uint32_t bad = 0;
      for (size_t j = 0; j < count; ++j) {
        uint16_t h;
        std::memcpy(&h, in + 2 * j, sizeof(h));
        bad |= (h & exponent) == exponent;
        out[j] = bf16 ? Bf16ToFloat(h) : HalfToFloat(h);
      }
      if (bad != 0) return Corrupt("NaN or Inf value");
      return Status::Ok();
    }
    case pb::VALUE_INT8:
    case pb::VALUE_INT4: {
      if (block == 0) return Corrupt("block size 0");
      const bool int4 = coding == pb::VALUE_INT4;
      const float levels = int4 ? kInt4Levels : kInt8Levels;
      const size_t blocks = (count + block - 1) / block;
      const std::byte* codes = in + 4 * blocks;
      uint32_t bad = 0;
      for (size_t b = 0; b < blocks; ++b) {
        float s = 0.0f;
        MERIDIAN_RETURN_IF_ERROR(ReadScale(in + 4 * b, levels, b, &s));
        const size_t first = b * block;
        const size_t n = std::min<size_t>(block, count - first);
        float* dst = out + first;
        if (int4) {
          const uint8_t* packed = reinterpret_cast<const uint8_t*>(codes);
          for (size_t j = 0; j < n; ++j) {
            const size_t at = first + j;
            const uint8_t nibble = (packed[at >> 1] >> (4 * (at & 1))) & 0xf;
            bad |= nibble == 0x8;
            const int32_t q = static_cast<int8_t>(nibble << 4) >> 4;
            dst[j] = static_cast<float>(q) * s;
          }
        } else {
          const int8_t* q = reinterpret_cast<const int8_t*>(codes) + first;
          for (size_t j = 0; j < n; ++j) {
            bad |= q[j] == -128;
            dst[j] = static_cast<float>(q[j]) * s;
          }
        }
      }
      if (bad != 0) {
        return Corrupt(int4 ? "int4 code -8 (never written)"
                            : "int8 code -128 (never written)");
      }
      if (int4 && (count & 1) != 0 &&
          (std::to_integer<uint8_t>(codes[count >> 1]) & 0xf0) != 0) {
        return Corrupt("int4 padding nibble is not 0");
      }
      return Status::Ok();
    }
    case pb::VALUE_INT2:
      return DecodeInt2(block, in, count, out);
    default:
      return Corrupt("unknown value coding " + std::to_string(coding));
  }
}

}  // namespace meridian::compression
