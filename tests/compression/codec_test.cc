// Unit tests of the stages behind include/meridian/compression.h: the
// checksum, varints, the 16-bit float formats, the selection passes and the
// index and value sections.

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "compression/checksum.h"
#include "compression/float_formats.h"
#include "compression/index_coding.h"
#include "compression/selection.h"
#include "compression/value_coding.h"
#include "compression/varint.h"
#include "testing/status_matchers.h"

namespace meridian::compression {
namespace {

std::vector<std::byte> Bytes(std::initializer_list<int> values) {
  std::vector<std::byte> bytes;
  for (int v : values) bytes.push_back(static_cast<std::byte>(v));
  return bytes;
}

float FromBits(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t ToBits(float f) { return std::bit_cast<uint32_t>(f); }

// ---- checksum
// -----------------------------------------------------------------

TEST(ChecksumTest, MatchesReferenceXxh64) {
  // Reference values from libxxhash 0.8.1 (XXH64).
  struct Case {
    std::vector<std::byte> input;
    uint64_t seed;
    uint64_t expected;
  };
  std::vector<std::byte> hundred(100), thirty_seven(37), thousand(1000);
  for (size_t i = 0; i < hundred.size(); ++i) {
    hundred[i] = static_cast<std::byte>(i);
  }
  for (size_t i = 0; i < thirty_seven.size(); ++i) {
    thirty_seven[i] = static_cast<std::byte>(i);
  }
  for (size_t i = 0; i < thousand.size(); ++i) {
    thousand[i] = static_cast<std::byte>((i * 7 + 3) % 256);
  }
  const std::vector<Case> cases = {
      {{}, 0, 0xef46db3751d8e999ull},
      {Bytes({'a', 'b', 'c'}), 0, 0x44bc2cf5ad770999ull},
      {Bytes({'a', 'b', 'c'}), 0x434d0001, 0x78d9ce8c394fa740ull},
      {hundred, 0, 0x6ac1e58032166597ull},
      {hundred, 12345, 0x028ba1ae2de4de27ull},
      {thirty_seven, 1, 0x31fe76eb4ff1cf74ull},
      {thousand, 0xdeadbeef, 0x91fc8da646ab47bbull},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Xxh64(c.input, c.seed), c.expected)
        << c.input.size() << " bytes, seed " << c.seed;
  }
}

// ---- varints ----------------------------------------------------------------

TEST(VarintTest, RoundTripsAcrossByteBoundaries) {
  const std::vector<uint64_t> values = {0,
                                        1,
                                        127,
                                        128,
                                        16383,
                                        16384,
                                        (1ull << 21) - 1,
                                        1ull << 21,
                                        (1ull << 28) - 1,
                                        1ull << 28,
                                        0xffffffffull,
                                        1ull << 32,
                                        (1ull << 63) + 5,
                                        std::numeric_limits<uint64_t>::max()};
  for (uint64_t v : values) {
    std::byte buffer[kMaxVarint64Bytes];
    const std::byte* end = WriteVarint(v, buffer);
    ASSERT_EQ(static_cast<size_t>(end - buffer), VarintSize(v)) << v;
    if (v <= 0xffffffffull) {
      EXPECT_EQ(VarintSize32(static_cast<uint32_t>(v)), VarintSize(v)) << v;
    }
    const std::byte* p = buffer;
    uint64_t read = 0;
    const size_t max_bytes =
        v <= 0xffffffffull ? kMaxVarint32Bytes : kMaxVarint64Bytes;
    ASSERT_TRUE(ReadVarint(&p, end, max_bytes, &read)) << v;
    EXPECT_EQ(read, v);
    EXPECT_EQ(p, end);
    // Every truncation fails.
    for (const std::byte* cut = buffer; cut < end; ++cut) {
      p = buffer;
      EXPECT_FALSE(ReadVarint(&p, cut, kMaxVarint64Bytes, &read)) << v;
    }
  }
}

TEST(VarintTest, RejectsNonCanonicalOverlongAndOverflowing) {
  uint64_t v = 0;
  auto read = [&v](const std::vector<std::byte>& bytes, size_t max_bytes) {
    const std::byte* p = bytes.data();
    return ReadVarint(&p, bytes.data() + bytes.size(), max_bytes, &v);
  };
  EXPECT_TRUE(read(Bytes({0x00}), kMaxVarint32Bytes));
  EXPECT_FALSE(read(Bytes({0x80, 0x00}), kMaxVarint32Bytes));  // redundant
  EXPECT_FALSE(read(Bytes({0x81, 0x80, 0x00}), kMaxVarint64Bytes));
  // 2^32 - 1 fits five bytes; 2^32 does not fit a 32-bit varint.
  EXPECT_TRUE(read(Bytes({0xff, 0xff, 0xff, 0xff, 0x0f}), kMaxVarint32Bytes));
  EXPECT_EQ(v, 0xffffffffull);
  EXPECT_FALSE(read(Bytes({0x80, 0x80, 0x80, 0x80, 0x10}), kMaxVarint32Bytes));
  EXPECT_FALSE(
      read(Bytes({0x80, 0x80, 0x80, 0x80, 0x80, 0x01}), kMaxVarint32Bytes));
  // 2^64 - 1 fits ten bytes; a tenth byte above 1 overflows.
  EXPECT_TRUE(
      read(Bytes({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}),
           kMaxVarint64Bytes));
  EXPECT_EQ(v, std::numeric_limits<uint64_t>::max());
  EXPECT_FALSE(
      read(Bytes({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}),
           kMaxVarint64Bytes));
  EXPECT_FALSE(read(
      Bytes({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x81, 0x00}),
      kMaxVarint64Bytes));
  EXPECT_FALSE(read({}, kMaxVarint32Bytes));
}

// ---- fp16 and bf16 ----------------------------------------------------------

TEST(HalfTest, DecodesEveryFinitePatternLikeTheCompiler) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    if (!IsFiniteHalf(bits)) continue;
    _Float16 reference;
    std::memcpy(&reference, &bits, sizeof(bits));
    ASSERT_EQ(ToBits(HalfToFloat(bits)), ToBits(static_cast<float>(reference)))
        << std::hex << h;
  }
}

TEST(HalfTest, NearestRoundingMatchesTheCompilerAndSaturates) {
  std::mt19937 rng(7);
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f,
                               -1.0f,
                               65504.0f,
                               65519.9f,
                               0x1p-14f,
                               0x1p-24f,
                               0x1p-25f,
                               0x1.8p-25f,
                               0x1p-26f,
                               1.0f + 0x1p-11f,
                               1.0f + 0x1p-11f + 0x1p-20f};
  std::uniform_int_distribution<int> exponent(-30, 16);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int i = 0; i < 200000; ++i) {
    float v = std::ldexp(mantissa(rng), exponent(rng));
    if (v > 65519.0f) v = 65519.0f;
    values.push_back(i % 2 == 0 ? v : -v);
  }
  for (float v : values) {
    const uint16_t mine = FloatToHalfNearest(v);
    const _Float16 reference = static_cast<_Float16>(v);
    uint16_t reference_bits;
    std::memcpy(&reference_bits, &reference, sizeof(reference_bits));
    ASSERT_EQ(mine, reference_bits) << v;
  }
  // Beyond the range: +-65504, never Inf.
  for (float v : {65520.0f, 1e10f, std::numeric_limits<float>::max()}) {
    EXPECT_EQ(FloatToHalfNearest(v), kHalfMaxFinite) << v;
    EXPECT_EQ(FloatToHalfNearest(-v), kHalfMaxFinite | 0x8000) << v;
  }
}

// Mean of `draws` stochastic roundings of v, and that each lands on a
// neighbour of v.
template <typename Round, typename Decode>
double StochasticMean(float v, int draws, Round round, Decode decode) {
  const float lower = std::min(decode(round(v, 0u)), decode(round(v, ~0u)));
  const float upper = std::max(decode(round(v, 0u)), decode(round(v, ~0u)));
  EXPECT_LE(lower, v);
  EXPECT_GE(upper, v);
  std::mt19937 rng(99);
  double sum = 0;
  for (int i = 0; i < draws; ++i) {
    const float d = decode(round(v, static_cast<uint32_t>(rng())));
    EXPECT_TRUE(d == lower || d == upper) << v << " -> " << d;
    sum += d;
  }
  return sum / draws;
}

TEST(HalfTest, StochasticRoundingIsUnbiased) {
  constexpr int kDraws = 40000;
  for (float v :
       {1.0f + 0x1p-12f, -3.3f, 1000.7f, 0x1.3p-20f, -0x1.7p-17f, 1e-3f}) {
    const double mean =
        StochasticMean(v, kDraws, FloatToHalfStochastic, HalfToFloat);
    const float up = HalfToFloat(FloatToHalfStochastic(v, ~0u));
    const float down = HalfToFloat(FloatToHalfStochastic(v, 0u));
    const double spacing = std::abs(static_cast<double>(up) - down);
    // Standard error of the mean <= spacing / (2 sqrt(draws)); allow 5.
    EXPECT_NEAR(mean, v, 5 * spacing / (2 * std::sqrt(kDraws)) + 1e-30) << v;
  }
  EXPECT_EQ(FloatToHalfStochastic(70000.0f, ~0u), kHalfMaxFinite);
  EXPECT_EQ(FloatToHalfStochastic(-1e30f, 0u), kHalfMaxFinite | 0x8000);
}

// Reference bf16 rounding: the nearer of the two truncation neighbours in
// double arithmetic, ties to the even one.
uint16_t ReferenceBf16(float v) {
  const uint32_t bits = ToBits(v);
  const uint32_t lower = bits & 0xffff0000u;
  const uint32_t upper = lower + 0x10000u;
  const double dl = std::abs(static_cast<double>(FromBits(lower)) - v);
  const double du = std::abs(static_cast<double>(FromBits(upper)) - v);
  uint32_t chosen = dl < du                    ? lower
                    : du < dl                  ? upper
                    : ((lower >> 16) & 1) == 0 ? lower
                                               : upper;
  return static_cast<uint16_t>(chosen >> 16);
}

TEST(Bf16Test, NearestRoundingMatchesReferenceAndSaturates) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> any(0, 0x7f7effffu);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = any(rng);
    if (i % 3 == 0) bits = (bits & 0xffff0000u) | 0x8000u;  // exact ties
    const float v = FromBits(bits | (i % 2 == 0 ? 0 : 0x80000000u));
    ASSERT_EQ(FloatToBf16Nearest(v), ReferenceBf16(v)) << v;
    ASSERT_EQ(ToBits(Bf16ToFloat(FloatToBf16Nearest(v))),
              static_cast<uint32_t>(ReferenceBf16(v)) << 16);
  }
  const float max = std::numeric_limits<float>::max();
  EXPECT_EQ(FloatToBf16Nearest(max), kBf16MaxFinite);
  EXPECT_EQ(FloatToBf16Nearest(-max), kBf16MaxFinite | 0x8000);
  EXPECT_EQ(FloatToBf16Stochastic(max, ~0u), kBf16MaxFinite);
}

TEST(Bf16Test, StochasticRoundingIsUnbiased) {
  constexpr int kDraws = 40000;
  for (float v : {1.0f + 0x1p-10f, -3.3f, 1e-20f, 123456.7f}) {
    const double mean =
        StochasticMean(v, kDraws, FloatToBf16Stochastic, Bf16ToFloat);
    const double spacing = std::abs(
        static_cast<double>(Bf16ToFloat(FloatToBf16Stochastic(v, ~0u))) -
        Bf16ToFloat(FloatToBf16Stochastic(v, 0u)));
    EXPECT_NEAR(mean, v, 5 * spacing / (2 * std::sqrt(kDraws))) << v;
  }
}

// ---- selection
// ------------------------------------------------------------------

std::vector<float> RandomSparse(size_t n, double density, uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution keep(density);
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::vector<float> x(n, 0.0f);
  for (float& v : x) {
    if (keep(rng)) v = value(rng);
  }
  return x;
}

TEST(SelectionTest, ScanCountsNonZerosAndFindsNonFiniteAnywhere) {
  for (size_t n : {0, 1, 7, 15, 16, 17, 33, 100, 1000}) {
    std::vector<float> x = RandomSparse(n, 0.3, static_cast<uint32_t>(n));
    if (n > 2) x[1] = -0.0f;  // negative zero counts as zero
    uint64_t expected = 0;
    for (float v : x) expected += v != 0.0f;
    const ScanResult scan = ScanValues(x.data(), n);
    EXPECT_EQ(scan.nonzero, expected) << n;
    EXPECT_TRUE(scan.finite) << n;
    for (size_t at = 0; at < n; ++at) {
      for (float bad : {std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN()}) {
        std::vector<float> y = x;
        y[at] = bad;
        ASSERT_FALSE(ScanValues(y.data(), n).finite) << n << " at " << at;
      }
    }
  }
}

TEST(SelectionTest, CompactionKeepsExactlyTheEntriesAtOrAboveInOrder) {
  for (size_t n : {0, 1, 16, 31, 64, 1000, 4097}) {
    for (double density : {0.0, 0.01, 0.5, 1.0}) {
      const std::vector<float> x =
          RandomSparse(n, density, static_cast<uint32_t>(n * 31 + 7));
      for (uint32_t min_bits : {0u, 1u, ToBits(0.5f)}) {
        std::vector<uint32_t> positions(n);
        std::vector<float> values(n);
        std::vector<uint32_t> abs_bits(n);
        const size_t k = CompactAtLeast(x.data(), n, min_bits, positions.data(),
                                        values.data());
        const size_t g = GatherAbsBits(x.data(), n, min_bits, abs_bits.data());
        size_t expected = 0;
        for (size_t i = 0; i < n; ++i) {
          if (AbsBitsOf(x[i]) < min_bits) continue;
          ASSERT_LT(expected, k);
          EXPECT_EQ(positions[expected], i);
          EXPECT_EQ(ToBits(values[expected]), ToBits(x[i]));
          EXPECT_EQ(abs_bits[expected], AbsBitsOf(x[i]));
          ++expected;
        }
        EXPECT_EQ(k, expected) << n << " " << density << " " << min_bits;
        EXPECT_EQ(g, expected);
      }
    }
  }
}

TEST(SelectionTest, ExactTopKSelectsTheLargestWithTiesInOrder) {
  std::mt19937 rng(5);
  for (size_t n : {1, 2, 17, 100, 5000}) {
    // Few distinct magnitudes, so that ties straddle the threshold.
    std::uniform_int_distribution<int> level(-4, 4);
    std::vector<float> x(n);
    for (float& v : x) v = static_cast<float>(level(rng));
    std::vector<uint32_t> all(n);
    const size_t candidates = GatherAbsBits(x.data(), n, 0, all.data());
    for (size_t k : {size_t{1}, n / 3 + 1, n}) {
      std::vector<uint32_t> mags = all;
      const TopKThreshold t = ExactTopKThreshold(mags.data(), candidates, k);
      std::vector<uint32_t> positions(n);
      std::vector<float> values(n);
      const size_t m =
          CompactTopK(x.data(), n, t, positions.data(), values.data());
      ASSERT_EQ(m, k) << n;
      // Selected magnitudes are >= every unselected one; ties taken first.
      std::vector<bool> selected(n, false);
      for (size_t j = 0; j < m; ++j) selected[positions[j]] = true;
      float min_selected = std::numeric_limits<float>::infinity();
      float max_unselected = -1.0f;
      size_t last_tie_selected = 0, first_tie_unselected = n;
      for (size_t i = 0; i < n; ++i) {
        const float a = std::abs(x[i]);
        if (selected[i]) {
          min_selected = std::min(min_selected, a);
          if (AbsBitsOf(x[i]) == t.bits) last_tie_selected = i;
        } else {
          max_unselected = std::max(max_unselected, a);
          if (AbsBitsOf(x[i]) == t.bits) {
            first_tie_unselected = std::min(first_tie_unselected, i);
          }
        }
      }
      EXPECT_GE(min_selected, max_unselected) << n << " k=" << k;
      if (first_tie_unselected < n) {
        EXPECT_LT(last_tie_selected, first_tie_unselected);
      }
    }
  }
}

// ---- index sections
// -------------------------------------------------------------

std::vector<uint32_t> RandomIndices(uint64_t size, double density,
                                    uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution keep(density);
  std::vector<uint32_t> indices;
  for (uint64_t i = 0; i < size; ++i) {
    if (keep(rng)) indices.push_back(static_cast<uint32_t>(i));
  }
  return indices;
}

TEST(IndexCodingTest, DeltaVarintAndBitmapRoundTrip) {
  for (uint64_t size : {1, 7, 8, 9, 64, 65, 1000, 100000}) {
    for (double density : {0.0, 0.001, 0.1, 1.0}) {
      const std::vector<uint32_t> idx =
          RandomIndices(size, density, static_cast<uint32_t>(size + 3));
      const size_t count = idx.size();
      std::vector<uint32_t> back(count + 1, 0xdeadbeef);

      std::vector<std::byte> delta(DeltaVarintBytes(idx.data(), count));
      ASSERT_EQ(WriteDeltaVarint(idx.data(), count, delta.data()),
                delta.data() + delta.size());
      ASSERT_OK(ReadDeltaVarint(delta, size, count, back.data()));
      EXPECT_TRUE(std::equal(idx.begin(), idx.end(), back.begin()));
      EXPECT_EQ(back[count], 0xdeadbeef);  // nothing written past count

      std::vector<std::byte> bitmap(BitmapBytes(size));
      WriteBitmap(idx.data(), count, size, bitmap.data());
      std::fill(back.begin(), back.end(), 0xdeadbeef);
      ASSERT_OK(ReadBitmap(bitmap, size, count, back.data()));
      EXPECT_TRUE(std::equal(idx.begin(), idx.end(), back.begin()));
      EXPECT_EQ(back[count], 0xdeadbeef);
    }
  }
  // The largest index of the largest slice.
  const uint32_t top = 0xfffffffeu;
  std::vector<std::byte> delta(DeltaVarintBytes(&top, 1));
  WriteDeltaVarint(&top, 1, delta.data());
  uint32_t back = 0;
  EXPECT_OK(ReadDeltaVarint(delta, 0xffffffffull, 1, &back));
  EXPECT_EQ(back, top);
  EXPECT_FALSE(ReadDeltaVarint(delta, top, 1, &back).ok());  // == size
}

TEST(IndexCodingTest, DeltaVarintRejectsCorruptSections) {
  uint32_t out[4];
  // Index 10 in a slice of 10.
  EXPECT_EQ(ReadDeltaVarint(Bytes({10}), 10, 1, out).code(),
            StatusCode::kDataLoss);
  // 3, then 3 + 1 + 200 = 204 >= 100.
  EXPECT_FALSE(ReadDeltaVarint(Bytes({3, 0xc8, 0x01}), 100, 2, out).ok());
  // Too few bytes for the count, bytes left over, a truncated varint.
  EXPECT_FALSE(ReadDeltaVarint(Bytes({1}), 100, 2, out).ok());
  EXPECT_FALSE(ReadDeltaVarint(Bytes({1, 2, 3}), 100, 2, out).ok());
  EXPECT_FALSE(ReadDeltaVarint(Bytes({1, 0x80}), 100, 2, out).ok());
  // Gaps that overflow 32 bits add up without wrapping around.
  EXPECT_FALSE(ReadDeltaVarint(Bytes({0xff, 0xff, 0xff, 0xff, 0x0f, 0xff, 0xff,
                                      0xff, 0xff, 0x0f}),
                               0xffffffffull, 2, out)
                   .ok());
}

TEST(IndexCodingTest, BitmapRejectsWrongCountsAndPadding) {
  uint32_t out[16];
  EXPECT_OK(ReadBitmap(Bytes({0x05}), 3, 2, out));
  EXPECT_EQ(out[0], 0u);
  EXPECT_EQ(out[1], 2u);
  EXPECT_FALSE(ReadBitmap(Bytes({0x05}), 3, 1, out).ok());        // count
  EXPECT_FALSE(ReadBitmap(Bytes({0x05}), 3, 3, out).ok());        // count
  EXPECT_FALSE(ReadBitmap(Bytes({0x0d}), 3, 3, out).ok());        // bit 3 >= 3
  EXPECT_FALSE(ReadBitmap(Bytes({0x05, 0x00}), 3, 2, out).ok());  // length
  EXPECT_FALSE(ReadBitmap(Bytes({}), 3, 0, out).ok());
}

// ---- value sections
// -------------------------------------------------------------

TEST(ValueCodingTest, SectionSizes) {
  EXPECT_EQ(ValueSectionBytes(pb::VALUE_FP32, 10, 4), 40u);
  EXPECT_EQ(ValueSectionBytes(pb::VALUE_FP16, 10, 4), 20u);
  EXPECT_EQ(ValueSectionBytes(pb::VALUE_BF16, 10, 4), 20u);
  EXPECT_EQ(ValueSectionBytes(pb::VALUE_INT8, 10, 4), 3 * 4 + 10u);
  EXPECT_EQ(ValueSectionBytes(pb::VALUE_INT4, 10, 4), 3 * 4 + 5u);
  EXPECT_EQ(ValueSectionBytes(pb::VALUE_INT4, 11, 4), 3 * 4 + 6u);
  EXPECT_EQ(ValueSectionBytes(pb::VALUE_INT2, 10, 4), 3 * 4 + 3u);
  EXPECT_EQ(ValueSectionBytes(pb::VALUE_INT2, 12, 4), 3 * 4 + 3u);
  EXPECT_EQ(ValueSectionBytes(pb::VALUE_INT2, 13, 4), 4 * 4 + 4u);
  EXPECT_EQ(ValueSectionBytes(pb::VALUE_INT8, 0, 4), 0u);
  EXPECT_EQ(ValueSectionBytes(pb::VALUE_INT8, 0xffffffffull, 1),
            5 * 0xffffffffull);
}

TEST(ValueCodingTest, ExtremeBlocksStayFiniteAndConserve) {
  const float max = std::numeric_limits<float>::max();
  const float tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<std::vector<float>> blocks = {
      {max, -max, 1.0f, 0.0f},
      {tiny, -tiny, 0.0f, tiny},
      {1e-40f, -3e-41f, 0.0f, 2e-45f},
      {0.0f, -0.0f, 0.0f, 0.0f},
      {3.0f, 3.0f, -3.0f, 3.0f}};
  for (pb::ValueCoding coding :
       {pb::VALUE_FP16, pb::VALUE_BF16, pb::VALUE_INT8, pb::VALUE_INT4}) {
    for (bool stochastic : {false, true}) {
      for (const std::vector<float>& values : blocks) {
        const size_t n = values.size();
        std::vector<std::byte> section(ValueSectionBytes(coding, n, 4));
        std::vector<float> residual(n), decoded(n);
        EncodeValues(coding, 4, RoundingMode{stochastic, 17}, values.data(), n,
                     section.data(), residual.data());
        ASSERT_OK(DecodeValues(coding, 4, section, n, decoded.data()));
        for (size_t j = 0; j < n; ++j) {
          ASSERT_TRUE(std::isfinite(decoded[j])) << coding << " " << values[j];
          ASSERT_TRUE(std::isfinite(residual[j]));
          EXPECT_EQ(residual[j], values[j] - decoded[j]);
          // Saturated or clamped, the value is kept: decoded + residual.
          EXPECT_EQ(decoded[j] + residual[j], values[j])
              << coding << " " << values[j];
        }
      }
    }
  }
}

TEST(ValueCodingTest, ResidualMayAliasTheValues) {
  for (pb::ValueCoding coding :
       {pb::VALUE_FP32, pb::VALUE_FP16, pb::VALUE_BF16, pb::VALUE_INT8,
        pb::VALUE_INT4, pb::VALUE_INT2}) {
    std::vector<float> values = RandomSparse(1000, 1.0, 3);
    std::vector<std::byte> a(ValueSectionBytes(coding, values.size(), 64));
    std::vector<std::byte> b(a.size());
    std::vector<float> separate(values.size());
    EncodeValues(coding, 64, RoundingMode{}, values.data(), values.size(),
                 a.data(), separate.data());
    EncodeValues(coding, 64, RoundingMode{}, values.data(), values.size(),
                 b.data(), values.data());
    EXPECT_EQ(a, b) << coding;
    EXPECT_EQ(values, separate) << coding;
  }
}

// INT2's levels {-3u, -u, u, 3u}: nearest within u, stochastic within 2u
// and unbiased, the largest value of a block exact, a zero as +-u.
TEST(ValueCodingTest, Int2LevelsBoundsAndUnbiasedRounding) {
  const std::vector<float> values = {3.0f, -3.0f, 1.2f, -0.9f, 0.0f, 2.1f,
                                     1.9f, -2.5f};
  const size_t n = values.size();
  std::vector<std::byte> section(ValueSectionBytes(pb::VALUE_INT2, n, 8));
  EXPECT_EQ(section.size(), 4u + 2u);
  std::vector<float> residual(n), decoded(n);
  EncodeValues(pb::VALUE_INT2, 8, RoundingMode{}, values.data(), n,
               section.data(), residual.data());
  ASSERT_OK(DecodeValues(pb::VALUE_INT2, 8, section, n, decoded.data()));
  const std::vector<float> nearest = {3, -3, 1, -1, 1, 3, 1, -3};
  EXPECT_EQ(decoded, nearest);  // u = 1
  for (size_t j = 0; j < n; ++j) {
    EXPECT_EQ(residual[j], values[j] - decoded[j]);
    EXPECT_LE(std::abs(residual[j]), 1.0f);
  }
  // Stochastic: each value of many messages lands on one of its two
  // neighbouring levels, and their mean is the value.
  std::vector<double> mean(n, 0.0);
  const int trials = 4000;
  for (int t = 0; t < trials; ++t) {
    EncodeValues(pb::VALUE_INT2, 8, RoundingMode{true, uint64_t(t) + 1},
                 values.data(), n, section.data(), residual.data());
    ASSERT_OK(DecodeValues(pb::VALUE_INT2, 8, section, n, decoded.data()));
    for (size_t j = 0; j < n; ++j) {
      ASSERT_LT(std::abs(values[j] - decoded[j]), 2.0f) << values[j];
      ASSERT_EQ(residual[j], values[j] - decoded[j]);
      mean[j] += decoded[j];
    }
  }
  for (size_t j = 0; j < n; ++j) {
    // Standard deviation of one draw <= 1: 5 sigma of the mean.
    EXPECT_NEAR(mean[j] / trials, values[j], 5.0 / std::sqrt(trials))
        << values[j];
  }
}

TEST(ValueCodingTest, DecodeRejectsCodesNoEncoderWrites) {
  float out[4];
  auto scale = [](float s) {
    std::vector<std::byte> bytes(4);
    std::memcpy(bytes.data(), &s, 4);
    return bytes;
  };
  auto concat = [](std::vector<std::byte> a, const std::vector<std::byte>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  // INT8: -128, NaN / Inf / negative / oversized scale.
  EXPECT_OK(DecodeValues(pb::VALUE_INT8, 4,
                           concat(scale(1), Bytes({1, 2, 0x81, 0})), 4, out));
  EXPECT_EQ(out[2], -127.0f);
  EXPECT_FALSE(DecodeValues(pb::VALUE_INT8, 4,
                            concat(scale(1), Bytes({1, 2, 0x80, 0})), 4, out)
                   .ok());
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(), -1.0f, -0.0f,
                    std::numeric_limits<float>::max() / 100}) {
    EXPECT_FALSE(DecodeValues(pb::VALUE_INT8, 4,
                              concat(scale(bad), Bytes({1, 2, 3, 4})), 4, out)
                     .ok())
        << bad;
  }
  // INT4: -8 and a non-zero padding nibble.
  EXPECT_OK(DecodeValues(pb::VALUE_INT4, 4,
                           concat(scale(2), Bytes({0x97, 0x01})), 3, out));
  EXPECT_EQ(out[0], 14.0f);   // 7 * 2
  EXPECT_EQ(out[1], -14.0f);  // 0x9 = -7
  EXPECT_EQ(out[2], 2.0f);
  EXPECT_FALSE(DecodeValues(pb::VALUE_INT4, 4,
                            concat(scale(2), Bytes({0x87, 0x01})), 3, out)
                   .ok());
  EXPECT_FALSE(DecodeValues(pb::VALUE_INT4, 4,
                            concat(scale(2), Bytes({0x77, 0x11})), 3, out)
                   .ok());
  // INT2: every code is a level (-3u, -u, u, 3u); bad scales and
  // non-zero padding bits are refused.
  EXPECT_OK(DecodeValues(pb::VALUE_INT2, 4,
                           concat(scale(2), Bytes({0x1b})), 3, out));
  EXPECT_EQ(out[0], 6.0f);   // code 3: 3u
  EXPECT_EQ(out[1], 2.0f);   // code 2: u
  EXPECT_EQ(out[2], -2.0f);  // code 1: -u
  EXPECT_FALSE(DecodeValues(pb::VALUE_INT2, 4,
                            concat(scale(2), Bytes({0x5b})), 3, out)
                   .ok());
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(), -1.0f, -0.0f,
                    std::numeric_limits<float>::max() / 2}) {
    EXPECT_FALSE(DecodeValues(pb::VALUE_INT2, 4,
                              concat(scale(bad), Bytes({0x1b})), 3, out)
                     .ok())
        << bad;
  }
  // A section of the wrong size.
  EXPECT_FALSE(DecodeValues(pb::VALUE_INT2, 4,
                            concat(scale(2), Bytes({0x1b, 0})), 3, out)
                   .ok());
  EXPECT_FALSE(DecodeValues(pb::VALUE_INT2, 4, scale(2), 3, out).ok());
  // FP32 / FP16 / BF16 NaN and Inf.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(DecodeValues(pb::VALUE_FP32, 1, scale(nan), 1, out).ok());
  EXPECT_FALSE(
      DecodeValues(pb::VALUE_FP16, 1, Bytes({0x00, 0x7c}), 1, out).ok());
  EXPECT_FALSE(
      DecodeValues(pb::VALUE_BF16, 1, Bytes({0x80, 0xff}), 1, out).ok());
  EXPECT_OK(DecodeValues(pb::VALUE_BF16, 1, Bytes({0x80, 0x3f}), 1, out));
  EXPECT_EQ(out[0], 1.0f);
  // Wrong section sizes.
  EXPECT_FALSE(DecodeValues(pb::VALUE_FP32, 1, Bytes({0, 0, 0}), 1, out).ok());
  EXPECT_FALSE(
      DecodeValues(pb::VALUE_INT8, 2, Bytes({0, 0, 0, 0, 1}), 2, out).ok());
}

}  // namespace
}  // namespace meridian::compression
