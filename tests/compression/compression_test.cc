// Tests of include/meridian/compression.h: every pipeline round-trips
// every kind of input within its stated bound, error feedback conserves
// the update, and corrupt buffers are refused without a crash.

#include "meridian/compression/compression.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "compression/format.h"
#include "compression/varint.h"
#include "tests/compression/test_util.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

using testing::Bytes;
using testing::Codings;
using testing::HandMade;
using testing::MakeConfig;
using testing::RandomUpdate;
using testing::ToSparse;
using testing::ToVector;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

UpdateEncoder MustCreate(const pb::CompressionConfig& config) {
  Result<UpdateEncoder> encoder = UpdateEncoder::Create(config);
  EXPECT_OK(encoder);
  return std::move(encoder).value();
}

const std::vector<pb::SelectionKind> kSelections = {pb::SELECT_ALL, pb::TOP_K,
                                                    pb::TOP_K_SAMPLED};
const std::vector<pb::IndexCoding> kIndexCodings = {
    pb::INDEX_AUTO, pb::INDEX_DELTA_VARINT, pb::INDEX_BITMAP, pb::INDEX_DENSE};
const std::vector<pb::ValueCoding> kValueCodings = {
    pb::VALUE_FP32, pb::VALUE_FP16, pb::VALUE_BF16, pb::VALUE_INT8,
    pb::VALUE_INT4, pb::VALUE_INT2};

// INT2 has no zero level: INDEX_DENSE with it is refused.
bool Compatible(pb::IndexCoding index, pb::ValueCoding value) {
  return !(index == pb::INDEX_DENSE && value == pb::VALUE_INT2);
}

// ---- configuration ----------------------------------------------------------

TEST(CompressionConfigTest, DefaultsAreValidAndDescribed) {
  const pb::CompressionConfig defaults;
  EXPECT_OK(ValidateCompressionConfig(defaults));
  EXPECT_EQ(DescribeCompressionConfig(defaults), "all + auto-index + fp32");
  EXPECT_EQ(DescribeCompressionConfig(MakeConfig(
                pb::TOP_K_SAMPLED, pb::INDEX_DELTA_VARINT, pb::VALUE_INT8, 1,
                pb::ROUND_STOCHASTIC, 256, 0.001)),
            "top-k 0.1% sampled + delta-varint + int8/256 stochastic + zstd 1");
  EXPECT_EQ(DescribeCompressionConfig(
                MakeConfig(pb::TOP_K, pb::INDEX_AUTO, pb::VALUE_INT2, 0,
                           pb::ROUND_NEAREST, 64, 0.015)),
            "top-k 1.5% exact + auto-index + int2/64");
}

// SparseLoCo's message: top-k of 1-3% with 2-bit values. AUTO never
// chooses the dense form for INT2 (no zero level), and the decoded update
// is zero off the selection; the body is about 2 bits per sent value plus
// the indices.
TEST(CompressionConfigTest, Int2TopKIsSparseAndSmall) {
  const size_t n = 20000;
  const std::vector<float> x = RandomUpdate(n, 1.0, 11);
  UpdateEncoder encoder = MustCreate(MakeConfig(
      pb::TOP_K, pb::INDEX_AUTO, pb::VALUE_INT2, 0, pb::ROUND_STOCHASTIC, 256,
      0.02));
  std::vector<float> residual(n);
  Result<EncodedUpdate> e = encoder.EncodeDense(x, residual);
  ASSERT_OK(e);
  EXPECT_EQ(e->summary.sent, 400u);
  EXPECT_NE(e->summary.index_coding, pb::INDEX_DENSE);
  // Two scales and 400 / 4 bytes of codes, then at most 2 bytes of index
  // per entry (delta-varint gaps of ~50).
  EXPECT_GT(e->summary.body_bytes, 2 * 4 + 100u);
  EXPECT_LT(e->summary.body_bytes, 2 * 4 + 100u + 2 * 400u);
  float max_abs = 0.0f;
  for (float v : x) max_abs = std::max(max_abs, std::abs(v));
  std::vector<float> decoded(n);
  UpdateDecoder decoder;
  ASSERT_OK(decoder.DecodeDense(e->bytes, decoded));
  size_t carried = 0;
  for (size_t i = 0; i < n; ++i) {
    carried += decoded[i] != 0.0f;
    EXPECT_NEAR(decoded[i] + residual[i], x[i], 1e-6 * max_abs);
  }
  EXPECT_EQ(carried, 400u);
  // All-zero: nothing sent, nothing decoded.
  const std::vector<float> zeros(n, 0.0f);
  Result<EncodedUpdate> none = encoder.EncodeDense(zeros, {});
  ASSERT_OK(none);
  EXPECT_EQ(none->summary.sent, 0u);
}

TEST(CompressionConfigTest, RejectsUnknownStagesAndBadParameters) {
  std::vector<pb::CompressionConfig> bad;
  auto add = [&bad](auto mutate) {
    pb::CompressionConfig c;
    mutate(c);
    bad.push_back(c);
  };
  add([](auto& c) { c.set_selection(pb::SELECTION_KIND_UNSPECIFIED); });
  add([](auto& c) {
    c.set_selection(pb::TOP_K);
    c.set_top_k_fraction(0);
  });
  add([](auto& c) {
    c.set_selection(pb::TOP_K_SAMPLED);
    c.set_top_k_fraction(1.5);
  });
  add([](auto& c) {
    c.set_selection(pb::TOP_K);
    c.set_top_k_fraction(std::nan(""));
  });
  add([](auto& c) { c.set_index_coding(pb::INDEX_CODING_UNSPECIFIED); });
  add([](auto& c) { c.set_value_coding(pb::VALUE_CODING_UNSPECIFIED); });
  add([](auto& c) { c.set_block_size(0); });
  add([](auto& c) { c.set_block_size(kMaxCompressionBlockSize + 1); });
  add([](auto& c) { c.set_rounding(pb::ROUNDING_UNSPECIFIED); });
  add([](auto& c) {
    c.set_index_coding(pb::INDEX_DENSE);
    c.set_value_coding(pb::VALUE_INT2);
  });
  add([](auto& c) { c.set_zstd_level(1000); });
  add([](auto& c) { c.set_zstd_level(-1000000); });
  for (const pb::CompressionConfig& config : bad) {
    const Status status = ValidateCompressionConfig(config);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument)
        << config.ShortDebugString();
    EXPECT_NE(status.message().find("compression."), std::string::npos);
    EXPECT_FALSE(UpdateEncoder::Create(config).ok());
  }
  // Fast (negative) zstd levels and the block size limits are fine.
  pb::CompressionConfig ok;
  ok.set_zstd_level(-5);
  ok.set_block_size(kMaxCompressionBlockSize);
  EXPECT_OK(ValidateCompressionConfig(ok));
  ok.set_block_size(1);
  EXPECT_OK(ValidateCompressionConfig(ok));
}

// ---- round trips ------------------------------------------------------------

// Largest scale of the INT8/INT4 blocks holding each sent value.
std::vector<double> BlockScales(const std::vector<float>& sent, uint32_t block,
                                double levels) {
  std::vector<double> scales(sent.size());
  for (size_t first = 0; first < sent.size(); first += block) {
    const size_t last = std::min<size_t>(sent.size(), first + block);
    double max = 0;
    for (size_t j = first; j < last; ++j) {
      max = std::max(max, std::abs(static_cast<double>(sent[j])));
    }
    for (size_t j = first; j < last; ++j) scales[j] = max / levels;
  }
  return scales;
}

// The stated bound (include/meridian/compression.h) on |v - decoded| of a
// sent value v, with `scale` its block's max|v| / levels.
double ErrorBound(pb::ValueCoding coding, bool stochastic, float v,
                  double scale) {
  const double a = std::abs(static_cast<double>(v));
  switch (coding) {
    case pb::VALUE_FP32:
      return 0;
    case pb::VALUE_FP16:
      return stochastic ? std::max(0x1p-10 * a, 0x1p-24)
                        : std::max(0x1p-11 * a, 0x1p-25);
    case pb::VALUE_BF16:
      return stochastic ? 0x1p-7 * a : 0x1p-8 * a;
    case pb::VALUE_INT2: {
      // scale: the unit u = max|v| / 3 (levels 2u apart): nearest <= u,
      // stochastic < 2u, plus float rounding.
      const double u = scale * (1 + 0x1p-22) + 0x1p-149;
      return (stochastic ? 2 * u : u) + 0x1p-15 * u + 0x1p-149;
    }
    default: {
      // s is rounded up by at most one float step; one more rounding in
      // q * s.
      const double s = scale * (1 + 0x1p-22) + 0x1p-149;
      // Rounding of v / s and of q * s: < 2 * 127 * 2^-24 s.
      return (stochastic ? s : 0.5 * s) + 0x1p-15 * s + 0x1p-149;
    }
  }
}

struct Input {
  size_t n = 0;
  std::vector<float> dense;       // the slice (zeros where nothing given)
  bool sparse = false;            // encode as a sparse set
  std::vector<uint32_t> indices;  // given entries (sparse)
  std::vector<float> values;
};

// Encodes `input` with `config`, decodes it every way, and checks the
// decoded update, the residual, the selection and the summary.
void CheckRoundTrip(const pb::CompressionConfig& config, const Input& input) {
  SCOPED_TRACE(DescribeCompressionConfig(config) + " n=" +
               std::to_string(input.n) + (input.sparse ? " sparse" : " dense"));
  const size_t n = input.n;
  const bool stochastic = config.rounding() == pb::ROUND_STOCHASTIC;

  UpdateEncoder encoder = MustCreate(config);
  // The same selection with exact values and explicit indices: its
  // decoded indices are the selected entries.
  pb::CompressionConfig twin_config = config;
  twin_config.set_value_coding(pb::VALUE_FP32);
  twin_config.set_index_coding(pb::INDEX_DELTA_VARINT);
  UpdateEncoder twin = MustCreate(twin_config);

  std::vector<float> residual;
  Result<EncodedUpdate> encoded = Status(StatusCode::kInternal, "unset");
  Result<EncodedUpdate> twin_encoded = Status(StatusCode::kInternal, "unset");
  if (input.sparse) {
    residual.assign(input.values.size(), kNaN);
    encoded = encoder.EncodeSparse(n, input.indices, input.values, residual);
    twin_encoded = twin.EncodeSparse(n, input.indices, input.values, {});
  } else {
    residual.assign(n, kNaN);
    encoded = encoder.EncodeDense(input.dense, residual);
    twin_encoded = twin.EncodeDense(input.dense, {});
  }
  ASSERT_OK(encoded);
  ASSERT_OK(twin_encoded);
  const std::vector<std::byte> bytes = ToVector(encoded->bytes);
  const EncodeSummary summary = encoded->summary;

  UpdateDecoder decoder;
  SparseUpdate selection;
  ASSERT_OK(decoder.DecodeSparse(twin_encoded->bytes, n, &selection));
  std::vector<bool> selected(n, false);
  for (uint32_t i : selection.indices) selected[i] = true;

  // Header and summary.
  Result<EncodedInfo> info = InspectEncoded(bytes);
  ASSERT_OK(info);
  EXPECT_EQ(info->version, kCompressionFormatVersion);
  EXPECT_EQ(info->size, n);
  EXPECT_EQ(info->count, summary.sent);
  EXPECT_EQ(info->value_coding, config.value_coding());
  EXPECT_EQ(info->index_coding, summary.index_coding);
  if (config.index_coding() != pb::INDEX_AUTO) {
    EXPECT_EQ(summary.index_coding, config.index_coding());
  }
  EXPECT_EQ(info->zstd, summary.zstd);
  if (config.zstd_level() == 0) {
    EXPECT_FALSE(summary.zstd);
  }
  EXPECT_EQ(info->body_bytes, summary.body_bytes);
  EXPECT_EQ(summary.encoded_bytes, bytes.size());
  EXPECT_EQ(summary.size, n);
  EXPECT_EQ(summary.selected, selection.indices.size());
  EXPECT_EQ(summary.sent,
            summary.index_coding == pb::INDEX_DENSE ? n : summary.selected);

  // Decoded every way.
  std::vector<float> decoded(n, kNaN);
  ASSERT_OK(decoder.DecodeDense(bytes, decoded));
  SparseUpdate sparse;
  ASSERT_OK(decoder.DecodeSparse(bytes, n, &sparse));
  EXPECT_EQ(sparse.size, n);
  ASSERT_EQ(sparse.indices.size(), summary.sent);
  ASSERT_EQ(sparse.values.size(), summary.sent);
  std::vector<float> scattered(n, 0.0f);
  for (size_t j = 0; j < sparse.indices.size(); ++j) {
    if (j > 0) {
      ASSERT_LT(sparse.indices[j - 1], sparse.indices[j]);
    }
    scattered[sparse.indices[j]] = sparse.values[j];
  }
  EXPECT_EQ(scattered, decoded);
  std::vector<float> target(n, 1.0f);
  ASSERT_OK(decoder.DecodeAdd(bytes, target));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(target[i], 1.0f + decoded[i]);
  if (n > 0) {
    EXPECT_EQ(decoder.DecodeSparse(bytes, n - 1, &sparse).code(),
              StatusCode::kOutOfRange);
    std::vector<float> wrong(n - 1);
    EXPECT_FALSE(decoder.DecodeDense(bytes, wrong).ok());
  }
  if (summary.index_coding != pb::INDEX_DENSE) {
    EXPECT_EQ(sparse.indices, selection.indices);
  }

  // What was sent, in order (the value array of the message), for the
  // block scales.
  std::vector<float> sent;
  if (summary.index_coding == pb::INDEX_DENSE) {
    for (size_t i = 0; i < n; ++i) {
      sent.push_back(selected[i] ? input.dense[i] : 0.0f);
    }
  } else {
    for (uint32_t i : selection.indices) sent.push_back(input.dense[i]);
  }
  const double levels = config.value_coding() == pb::VALUE_INT4   ? 7
                        : config.value_coding() == pb::VALUE_INT2 ? 3
                                                                  : 127;
  const std::vector<double> scales =
      BlockScales(sent, config.block_size(), levels);
  std::vector<double> scale_of(n, 0.0);
  if (summary.index_coding == pb::INDEX_DENSE) {
    for (size_t i = 0; i < n; ++i) scale_of[i] = scales[i];
  } else {
    for (size_t j = 0; j < selection.indices.size(); ++j) {
      scale_of[selection.indices[j]] = scales[j];
    }
  }

  // Element by element: finite, within the bound where selected, zero
  // elsewhere; the residual is the difference.
  auto check = [&](size_t i, float residual_i) {
    ASSERT_TRUE(std::isfinite(decoded[i])) << i;
    EXPECT_EQ(residual_i, input.dense[i] - decoded[i]) << i;
    if (!selected[i]) {
      EXPECT_EQ(decoded[i], 0.0f) << i;
      return;
    }
    const double error =
        std::abs(static_cast<double>(input.dense[i]) - decoded[i]);
    EXPECT_LE(error, ErrorBound(config.value_coding(), stochastic,
                                input.dense[i], scale_of[i]))
        << "i=" << i << " v=" << input.dense[i] << " decoded=" << decoded[i];
  };
  if (input.sparse) {
    std::vector<bool> given(n, false);
    for (size_t j = 0; j < input.indices.size(); ++j) {
      given[input.indices[j]] = true;
      check(input.indices[j], residual[j]);
    }
    for (size_t i = 0; i < n; ++i) {
      if (!given[i]) {
        EXPECT_EQ(decoded[i], 0.0f) << i;
      }
    }
  } else {
    for (size_t i = 0; i < n; ++i) check(i, residual[i]);
  }
  if (config.value_coding() == pb::VALUE_FP32) {
    for (size_t i = 0; i < n; ++i) {
      if (selected[i]) {
        EXPECT_EQ(decoded[i], input.dense[i]);
      }
    }
  }
}

std::vector<Input> PropertyInputs() {
  std::vector<Input> inputs;
  uint32_t seed = 1;
  for (size_t n : {0, 1, 2, 17, 300, 4099}) {
    for (double density : {0.0, -1.0, 0.01, 0.3, 1.0}) {
      Input in;
      in.n = n;
      in.dense = RandomUpdate(n, density, seed++, n % 2 == 0 ? 1e-3f : 7.0f);
      inputs.push_back(in);
      // The same as a sparse set, with a few explicit zeros given too.
      Input sp = in;
      sp.sparse = true;
      for (size_t i = 0; i < n; ++i) {
        if (in.dense[i] != 0.0f || i % 5 == 0) {
          sp.indices.push_back(static_cast<uint32_t>(i));
          sp.values.push_back(in.dense[i]);
        }
      }
      inputs.push_back(sp);
    }
  }
  return inputs;
}

TEST(CompressionRoundTripTest, EveryPipelineEveryInput) {
  const std::vector<Input> inputs = PropertyInputs();
  for (pb::SelectionKind selection : kSelections) {
    for (pb::IndexCoding index : kIndexCodings) {
      for (pb::ValueCoding value : kValueCodings) {
        for (pb::Rounding rounding :
             {pb::ROUND_NEAREST, pb::ROUND_STOCHASTIC}) {
          if (value == pb::VALUE_FP32 && rounding == pb::ROUND_STOCHASTIC) {
            continue;  // rounding does not apply
          }
          if (!Compatible(index, value)) continue;
          for (int zstd : {0, 1}) {
            const uint32_t block = value == pb::VALUE_INT4 ? 7 : 64;
            const pb::CompressionConfig config =
                MakeConfig(selection, index, value, zstd, rounding, block, 0.1);
            for (const Input& input : inputs) {
              CheckRoundTrip(config, input);
              if (::testing::Test::HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

TEST(CompressionRoundTripTest, ExtremeValuesAndBlockSizes) {
  const float max = std::numeric_limits<float>::max();
  Input in;
  in.dense = {max,      -max,  1.0f,   0.0f,    1e-40f, -1e-45f, 65504.0f,
              70000.0f, -1e6f, 1e-30f, 3.0e38f, 2.0f,   -0.0f,   5e-8f};
  in.n = in.dense.size();
  for (pb::ValueCoding value : kValueCodings) {
    for (uint32_t block : {1u, 2u, 3u, 14u, 15u, kMaxCompressionBlockSize}) {
      for (pb::Rounding rounding : {pb::ROUND_NEAREST, pb::ROUND_STOCHASTIC}) {
        const pb::CompressionConfig config = MakeConfig(
            pb::SELECT_ALL, pb::INDEX_AUTO, value, 3, rounding, block);
        UpdateEncoder encoder = MustCreate(config);
        std::vector<float> residual(in.n);
        Result<EncodedUpdate> e = encoder.EncodeDense(in.dense, residual);
        ASSERT_OK(e);
        std::vector<float> decoded(in.n);
        UpdateDecoder decoder;
        ASSERT_OK(decoder.DecodeDense(e->bytes, decoded));
        for (size_t i = 0; i < in.n; ++i) {
          ASSERT_TRUE(std::isfinite(decoded[i])) << value << " " << i;
          EXPECT_EQ(residual[i], in.dense[i] - decoded[i]);
          // Nothing is lost: what the message misses is in the residual
          // (INT2, no zero level: up to the rounding of v - decoded when a
          // level lies far from a small v).
          const double slack =
              value == pb::VALUE_INT2 ? 0x1p-22 * std::abs(decoded[i]) : 0.0;
          EXPECT_LE(std::abs(static_cast<double>(decoded[i] + residual[i]) -
                             in.dense[i]),
                    slack)
              << DescribeCompressionConfig(config) << " i=" << i;
        }
      }
    }
  }
}

// ---- selection
// ----------------------------------------------------------------

TEST(CompressionSelectionTest, ExactTopKSendsTheKLargest) {
  const size_t n = 10000;
  const std::vector<float> x = RandomUpdate(n, 0.5, 3);
  for (double fraction : {0.0001, 0.01, 0.3, 0.5, 1.0}) {
    UpdateEncoder encoder =
        MustCreate(MakeConfig(pb::TOP_K, pb::INDEX_AUTO, pb::VALUE_FP32, 0,
                              pb::ROUND_NEAREST, 256, fraction));
    std::vector<float> residual(n);
    Result<EncodedUpdate> e = encoder.EncodeDense(x, residual);
    ASSERT_OK(e);
    const size_t nonzero = ToSparse(x).indices.size();
    const size_t k = std::min<size_t>(
        nonzero, static_cast<size_t>(std::ceil(fraction * n - 1e-6)));
    EXPECT_EQ(e->summary.selected, k) << fraction;
    std::vector<float> decoded(n);
    UpdateDecoder decoder;
    ASSERT_OK(decoder.DecodeDense(e->bytes, decoded));
    float min_sent = kInf, max_unsent = 0;
    size_t sent = 0;
    for (size_t i = 0; i < n; ++i) {
      if (decoded[i] != 0.0f) {
        ++sent;
        EXPECT_EQ(decoded[i], x[i]);
        EXPECT_EQ(residual[i], 0.0f);
        min_sent = std::min(min_sent, std::abs(x[i]));
      } else {
        EXPECT_EQ(residual[i], x[i]);
        max_unsent = std::max(max_unsent, std::abs(x[i]));
      }
    }
    EXPECT_EQ(sent, k);
    EXPECT_GE(min_sent, max_unsent);
  }
}

TEST(CompressionSelectionTest, TheTopKFractionCanChangeBetweenEncodes) {
  const size_t n = 10000;
  const std::vector<float> x = RandomUpdate(n, 0.5, 3);
  UpdateEncoder encoder =
      MustCreate(MakeConfig(pb::TOP_K, pb::INDEX_AUTO, pb::VALUE_FP32, 0,
                            pb::ROUND_NEAREST, 256, 0.01));
  EXPECT_EQ(encoder.EncodeDense(x, {})->summary.selected, 100u);
  ASSERT_OK(encoder.SetTopKFraction(0.05));
  EXPECT_EQ(encoder.EncodeDense(x, {})->summary.selected, 500u);
  EXPECT_DOUBLE_EQ(encoder.config().top_k_fraction(), 0.05);
  // Out of range: refused, the fraction stays.
  for (double bad : {0.0, -0.1, 1.5, std::nan("")}) {
    EXPECT_EQ(encoder.SetTopKFraction(bad).code(),
              StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_EQ(encoder.EncodeDense(x, {})->summary.selected, 500u);
  // Without a top-k selection there is no fraction to set.
  UpdateEncoder all =
      MustCreate(MakeConfig(pb::SELECT_ALL, pb::INDEX_AUTO, pb::VALUE_FP32, 0,
                            pb::ROUND_NEAREST, 256, 0.01));
  EXPECT_EQ(all.SetTopKFraction(0.5).code(), StatusCode::kInvalidArgument);
}

TEST(CompressionSelectionTest, SampledTopKSendsAboutKOfTheLargest) {
  const size_t n = 1 << 20;
  for (double density : {1.0, 0.3}) {
    const std::vector<float> x = RandomUpdate(n, density, 4);
    const size_t k = static_cast<size_t>(std::ceil(0.01 * n));
    UpdateEncoder encoder =
        MustCreate(MakeConfig(pb::TOP_K_SAMPLED, pb::INDEX_AUTO, pb::VALUE_FP32,
                              1, pb::ROUND_NEAREST, 256, 0.01));
    for (int round = 0; round < 3; ++round) {
      std::vector<float> residual(n);
      Result<EncodedUpdate> e = encoder.EncodeDense(x, residual);
      ASSERT_OK(e);
      EXPECT_LE(e->summary.selected, k);
      EXPECT_GE(e->summary.selected, k * 8 / 10) << density;
      // A threshold selection: every sent magnitude >= every unsent one.
      std::vector<float> decoded(n);
      UpdateDecoder decoder;
      ASSERT_OK(decoder.DecodeDense(e->bytes, decoded));
      float min_sent = kInf, max_unsent = 0;
      for (size_t i = 0; i < n; ++i) {
        if (decoded[i] != 0.0f) {
          min_sent = std::min(min_sent, std::abs(x[i]));
        } else {
          max_unsent = std::max(max_unsent, std::abs(x[i]));
          ASSERT_EQ(residual[i], x[i]);
        }
      }
      EXPECT_GE(min_sent, max_unsent);
    }
  }
}

TEST(CompressionSelectionTest, SparseSelectAllKeepsGivenZeros) {
  UpdateEncoder encoder = MustCreate(
      MakeConfig(pb::SELECT_ALL, pb::INDEX_DELTA_VARINT, pb::VALUE_FP32, 0));
  const std::vector<uint32_t> indices = {3, 9, 1000};
  const std::vector<float> values = {0.5f, 0.0f, -2.0f};
  Result<EncodedUpdate> e = encoder.EncodeSparse(2000, indices, values, {});
  ASSERT_OK(e);
  UpdateDecoder decoder;
  SparseUpdate out;
  ASSERT_OK(decoder.DecodeSparse(e->bytes, 2000, &out));
  EXPECT_EQ(out.size, 2000u);
  EXPECT_EQ(out.indices, indices);
  EXPECT_EQ(out.values, values);
}

// ---- index coding choice
// -------------------------------------------------------

TEST(CompressionIndexTest, AutoPicksTheSmallestBody) {
  const size_t n = 50000;
  for (double density : {0.0005, 0.01, 0.08, 0.2, 0.9, 1.0}) {
    const std::vector<float> x = RandomUpdate(n, density, 9);
    for (pb::ValueCoding value : kValueCodings) {
      uint64_t smallest = std::numeric_limits<uint64_t>::max();
      pb::IndexCoding best = pb::INDEX_CODING_UNSPECIFIED;
      for (pb::IndexCoding index :
           {pb::INDEX_DENSE, pb::INDEX_BITMAP, pb::INDEX_DELTA_VARINT}) {
        // INT2 is refused with INDEX_DENSE (no zero level): AUTO chooses
        // between the indexed forms.
        if (!Compatible(index, value)) continue;
        UpdateEncoder encoder =
            MustCreate(MakeConfig(pb::SELECT_ALL, index, value, 0));
        Result<EncodedUpdate> e = encoder.EncodeDense(x, {});
        ASSERT_OK(e);
        if (e->summary.body_bytes < smallest) {
          smallest = e->summary.body_bytes;
          best = index;
        }
      }
      UpdateEncoder automatic =
          MustCreate(MakeConfig(pb::SELECT_ALL, pb::INDEX_AUTO, value, 0));
      Result<EncodedUpdate> e = automatic.EncodeDense(x, {});
      ASSERT_OK(e);
      if (!Compatible(pb::INDEX_DENSE, value) &&
          ToSparse(x).indices.size() == n) {
        // Every element sent: the dense form is exact even for INT2, and
        // AUTO may take it where a forced INDEX_DENSE is refused.
        EXPECT_EQ(e->summary.index_coding, pb::INDEX_DENSE);
        EXPECT_LE(e->summary.body_bytes, smallest);
        continue;
      }
      EXPECT_EQ(e->summary.body_bytes, smallest) << density << " " << value;
      EXPECT_EQ(e->summary.index_coding, best) << density << " " << value;
    }
  }
}

TEST(CompressionIndexTest, ZstdIsDroppedWhenItDoesNotShrink) {
  // Random bits (finite floats) do not compress; a constant update does.
  std::mt19937 rng(1);
  std::vector<float> noise(5000);
  for (float& v : noise) {
    uint32_t bits;
    do {
      bits = static_cast<uint32_t>(rng());
    } while ((bits & 0x7f800000u) == 0x7f800000u || (bits << 1) == 0);
    v = std::bit_cast<float>(bits);
  }
  const std::vector<float> constant(5000, 0.25f);
  UpdateEncoder encoder =
      MustCreate(MakeConfig(pb::SELECT_ALL, pb::INDEX_AUTO, pb::VALUE_FP32, 1));
  Result<EncodedUpdate> a = encoder.EncodeDense(noise, {});
  ASSERT_OK(a);
  EXPECT_FALSE(a->summary.zstd);
  EXPECT_LE(a->summary.encoded_bytes, 4 * 5000 + kMaxCompressionHeaderBytes);
  Result<EncodedUpdate> b = encoder.EncodeDense(constant, {});
  ASSERT_OK(b);
  EXPECT_TRUE(b->summary.zstd);
  EXPECT_LT(b->summary.encoded_bytes, 200u);
}

// The size goals of the issue, for the sparse + int8 + zstd pipeline on a
// 1M-element update (the benchmark measures the same).
TEST(CompressionIndexTest, SparseInt8ZstdMeetsTheSizeGoals) {
  const size_t n = 1 << 20;
  const double dense_bytes = 4.0 * n;
  UpdateEncoder encoder =
      MustCreate(MakeConfig(pb::SELECT_ALL, pb::INDEX_AUTO, pb::VALUE_INT8, 1));
  for (auto [density, goal] : {std::pair{0.01, 25.0}, {0.001, 200.0}}) {
    const std::vector<float> x = RandomUpdate(n, density, 12);
    Result<EncodedUpdate> e = encoder.EncodeDense(x, {});
    ASSERT_OK(e);
    EXPECT_LE(e->summary.encoded_bytes, dense_bytes / goal)
        << "density " << density << ": 1/"
        << dense_bytes / e->summary.encoded_bytes;
  }
}

// ---- error feedback
// ---------------------------------------------------------------

TEST(CompressionErrorFeedbackTest, DecodedPlusResidualConservesTheInputs) {
  const size_t n = 20000;
  const int rounds = 150;
  const std::vector<pb::CompressionConfig> configs = {
      MakeConfig(pb::TOP_K, pb::INDEX_AUTO, pb::VALUE_INT4, 1,
                 pb::ROUND_STOCHASTIC, 64, 0.01),
      MakeConfig(pb::TOP_K_SAMPLED, pb::INDEX_DELTA_VARINT, pb::VALUE_INT8, 3,
                 pb::ROUND_NEAREST, 256, 0.001),
      MakeConfig(pb::SELECT_ALL, pb::INDEX_DENSE, pb::VALUE_FP16, 0,
                 pb::ROUND_NEAREST),
      MakeConfig(pb::TOP_K, pb::INDEX_BITMAP, pb::VALUE_BF16, 1,
                 pb::ROUND_STOCHASTIC, 256, 0.05),
  };
  for (const pb::CompressionConfig& config : configs) {
    SCOPED_TRACE(DescribeCompressionConfig(config));
    UpdateEncoder encoder = MustCreate(config);
    UpdateDecoder decoder;
    std::vector<float> accumulator(n, 0.0f);  // the caller's unsent sum
    std::vector<double> inputs(n, 0.0), delivered(n, 0.0);
    std::vector<float> decoded(n);
    double magnitude = 0;
    for (int round = 0; round < rounds; ++round) {
      const std::vector<float> update =
          RandomUpdate(n, 0.2, 1000 + round, 1e-2f);
      for (size_t i = 0; i < n; ++i) {
        inputs[i] += update[i];
        accumulator[i] += update[i];
        magnitude = std::max(magnitude, std::abs(inputs[i]));
      }
      // The accumulator keeps its own residual.
      Result<EncodedUpdate> e = encoder.EncodeDense(accumulator, accumulator);
      ASSERT_OK(e);
      ASSERT_OK(decoder.DecodeDense(e->bytes, decoded));
      for (size_t i = 0; i < n; ++i) delivered[i] += decoded[i];
    }
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
      worst =
          std::max(worst, std::abs(delivered[i] + accumulator[i] - inputs[i]));
    }
    // Float accumulation over `rounds` additions of values ~1e-2.
    EXPECT_LE(worst, 1e-6 * rounds * std::max(magnitude, 1e-2));
    // And something was actually delivered.
    double delivered_norm = 0;
    for (double d : delivered) delivered_norm += std::abs(d);
    EXPECT_GT(delivered_norm, 0.0);
  }
}

TEST(CompressionErrorFeedbackTest, SparseResidualMayBeTheValues) {
  const std::vector<uint32_t> indices = {1, 5, 6, 40, 41, 99};
  std::vector<float> values = {0.1f, -3.0f, 0.02f, 7.5f, -0.001f, 1.0f};
  const std::vector<float> original = values;
  UpdateEncoder encoder = MustCreate(MakeConfig(
      pb::TOP_K, pb::INDEX_AUTO, pb::VALUE_INT8, 0, pb::ROUND_NEAREST, 256,
      0.03));  // k = 3 of a slice of 100
  Result<EncodedUpdate> e = encoder.EncodeSparse(100, indices, values, values);
  ASSERT_OK(e);
  EXPECT_EQ(e->summary.selected, 3u);
  UpdateDecoder decoder;
  std::vector<float> decoded(100);
  ASSERT_OK(decoder.DecodeDense(e->bytes, decoded));
  for (size_t j = 0; j < indices.size(); ++j) {
    EXPECT_EQ(values[j], original[j] - decoded[indices[j]]) << j;
  }
  // The three largest were sent: -3, 7.5, 1.
  EXPECT_NE(decoded[5], 0.0f);
  EXPECT_NE(decoded[40], 0.0f);
  EXPECT_NE(decoded[99], 0.0f);
  EXPECT_EQ(decoded[1], 0.0f);
}

TEST(CompressionErrorFeedbackTest, StochasticRoundingIsUnbiasedAndSeeded) {
  const std::vector<float> x = RandomUpdate(64, 1.0, 21, 1.0f);
  const pb::CompressionConfig config =
      MakeConfig(pb::SELECT_ALL, pb::INDEX_DENSE, pb::VALUE_INT4, 0,
                 pb::ROUND_STOCHASTIC, 64);
  UpdateEncoder a = MustCreate(config);
  UpdateEncoder b = MustCreate(config);
  pb::CompressionConfig other_seed = config;
  other_seed.set_rounding_seed(2);
  UpdateEncoder c = MustCreate(other_seed);
  UpdateDecoder decoder;
  const int draws = 4000;
  std::vector<double> mean(x.size(), 0.0);
  std::vector<float> decoded(x.size());
  bool calls_differ = false, seeds_differ = false;
  std::vector<std::byte> previous;
  for (int d = 0; d < draws; ++d) {
    const std::vector<std::byte> ea = ToVector(a.EncodeDense(x, {})->bytes);
    const std::vector<std::byte> eb = ToVector(b.EncodeDense(x, {})->bytes);
    const std::vector<std::byte> ec = ToVector(c.EncodeDense(x, {})->bytes);
    ASSERT_EQ(ea, eb);  // same seed, same calls: same bytes
    seeds_differ |= ea != ec;
    calls_differ |= !previous.empty() && ea != previous;
    previous = ea;
    ASSERT_OK(decoder.DecodeDense(ea, decoded));
    for (size_t i = 0; i < x.size(); ++i) mean[i] += decoded[i];
  }
  EXPECT_TRUE(seeds_differ);
  EXPECT_TRUE(calls_differ);
  float max_abs = 0;
  for (float v : x) max_abs = std::max(max_abs, std::abs(v));
  const double s = max_abs / 7.0;
  for (size_t i = 0; i < x.size(); ++i) {
    // Standard error <= s / (2 sqrt(draws)); allow 5 of them.
    EXPECT_NEAR(mean[i] / draws, x[i], 5 * s / (2 * std::sqrt(draws))) << i;
  }
}

// ---- encode-side validation
// ----------------------------------------------------------

TEST(CompressionEncodeTest, RejectsNonFiniteValuesAndLeavesTheResidual) {
  UpdateEncoder encoder =
      MustCreate(MakeConfig(pb::TOP_K, pb::INDEX_AUTO, pb::VALUE_INT8, 1));
  for (float bad : {kNaN, kInf, -kInf}) {
    for (size_t at : {0, 16, 99}) {
      std::vector<float> x = RandomUpdate(100, 0.5, 2);
      x[at] = bad;
      std::vector<float> residual(100, 42.0f);
      Result<EncodedUpdate> e = encoder.EncodeDense(x, residual);
      ASSERT_EQ(e.status().code(), StatusCode::kInvalidArgument);
      // (Built in steps: GCC 12 warns falsely on "[" + std::string.)
      std::string where = std::to_string(at);
      where.insert(where.begin(), '[');
      where.push_back(']');
      EXPECT_NE(e.status().message().find(where), std::string::npos)
          << e.status();
      EXPECT_EQ(residual, std::vector<float>(100, 42.0f));
      const std::vector<uint32_t> indices = {3, 7};
      const std::vector<float> values = {1.0f, bad};
      EXPECT_EQ(encoder.EncodeSparse(10, indices, values, {}).status().code(),
                StatusCode::kInvalidArgument);
    }
  }
}

TEST(CompressionEncodeTest, RejectsBadSparseSetsAndResidualSpans) {
  UpdateEncoder encoder =
      MustCreate(MakeConfig(pb::SELECT_ALL, pb::INDEX_AUTO, pb::VALUE_FP32, 0));
  const std::vector<float> two = {1.0f, 2.0f};
  auto sparse = [&](uint64_t size, std::vector<uint32_t> indices) {
    return encoder.EncodeSparse(size, indices, two, {}).status().code();
  };
  EXPECT_EQ(sparse(10, {3, 3}), StatusCode::kInvalidArgument);   // repeated
  EXPECT_EQ(sparse(10, {5, 3}), StatusCode::kInvalidArgument);   // unsorted
  EXPECT_EQ(sparse(10, {3, 10}), StatusCode::kInvalidArgument);  // outside
  EXPECT_EQ(sparse(10, {3}), StatusCode::kInvalidArgument);      // count
  EXPECT_EQ(sparse(kMaxCompressedSliceElements + 1, {0, 1}),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(sparse(kMaxCompressedSliceElements, {0, 0xfffffffeu}),
            StatusCode::kOk);

  std::vector<float> buffer(20, 1.0f);
  std::span<const float> update(buffer.data(), 10);
  EXPECT_EQ(encoder.EncodeDense(update, std::span<float>(buffer.data(), 9))
                .status()
                .code(),
            StatusCode::kInvalidArgument);  // size
  EXPECT_EQ(encoder.EncodeDense(update, std::span<float>(buffer.data() + 5, 10))
                .status()
                .code(),
            StatusCode::kInvalidArgument);  // partial overlap
  EXPECT_OK(encoder.EncodeDense(update, std::span<float>(buffer.data() + 10, 10)));
  EXPECT_OK(encoder.EncodeDense(update, std::span<float>(buffer.data(), 10)));
}

// ---- corrupt input
// -----------------------------------------------------------------

// A few valid buffers of different pipelines.
std::vector<std::vector<std::byte>> ValidBuffers() {
  std::vector<std::vector<std::byte>> buffers;
  const std::vector<float> x = RandomUpdate(700, 0.05, 31);
  for (pb::IndexCoding index :
       {pb::INDEX_DELTA_VARINT, pb::INDEX_BITMAP, pb::INDEX_DENSE}) {
    for (pb::ValueCoding value : kValueCodings) {
      if (!Compatible(index, value)) continue;
      for (int zstd : {0, 1}) {
        UpdateEncoder encoder = MustCreate(MakeConfig(
            pb::SELECT_ALL, index, value, zstd, pb::ROUND_NEAREST, 16));
        buffers.push_back(ToVector(encoder.EncodeDense(x, {})->bytes));
      }
    }
  }
  return buffers;
}

// Decodes `bytes` every way; whatever is accepted must be a sound update.
// Returns whether DecodeSparse accepted it.
bool DecodeAnyway(std::span<const std::byte> bytes, DecodeOptions options,
                  uint64_t max_elements = 1 << 16) {
  UpdateDecoder decoder(options);
  SparseUpdate out;
  const Status status = decoder.DecodeSparse(bytes, max_elements, &out);
  if (!status.ok()) {
    EXPECT_NE(status.message(), "");
    return false;
  }
  EXPECT_LE(out.size, max_elements);
  EXPECT_EQ(out.indices.size(), out.values.size());
  for (size_t j = 0; j < out.indices.size(); ++j) {
    EXPECT_LT(out.indices[j], out.size);
    if (j > 0) {
      EXPECT_LT(out.indices[j - 1], out.indices[j]);
    }
    EXPECT_TRUE(std::isfinite(out.values[j]));
  }
  std::vector<float> dense(out.size);
  EXPECT_OK(decoder.DecodeDense(bytes, dense));
  return true;
}

TEST(CompressionCorruptTest, EveryTruncationIsRefused) {
  for (const std::vector<std::byte>& buffer : ValidBuffers()) {
    ASSERT_TRUE(DecodeAnyway(buffer, {}));
    for (size_t length = 0; length < buffer.size(); ++length) {
      const std::vector<std::byte> cut(buffer.begin(), buffer.begin() + length);
      EXPECT_FALSE(DecodeAnyway(cut, {})) << length;
      EXPECT_FALSE(DecodeAnyway(cut, {.verify_checksum = false})) << length;
      EXPECT_FALSE(InspectEncoded(cut).ok());
    }
    std::vector<std::byte> longer = buffer;
    longer.push_back(std::byte{0});
    EXPECT_FALSE(DecodeAnyway(longer, {}));
    compression::SealChecksum(longer);
    EXPECT_FALSE(DecodeAnyway(longer, {}));
  }
}

TEST(CompressionCorruptTest, EveryGarbledByteFailsTheChecksum) {
  for (const std::vector<std::byte>& buffer : ValidBuffers()) {
    for (size_t at = 0; at < buffer.size(); ++at) {
      for (uint8_t flip : {0x01, 0x80, 0xff}) {
        std::vector<std::byte> garbled = buffer;
        garbled[at] ^= static_cast<std::byte>(flip);
        Result<EncodedInfo> info = InspectEncoded(garbled);
        ASSERT_FALSE(info.ok()) << at;
        if (at != compression::kVersionOffset) {
          EXPECT_EQ(info.status().code(), StatusCode::kDataLoss) << at;
        }
        UpdateDecoder decoder;
        std::vector<float> out(700);
        EXPECT_FALSE(decoder.DecodeDense(garbled, out).ok());
      }
    }
  }
}

// Random garbling behind the checksum: errors or sound updates, never a
// crash (the sanitizer build checks the memory accesses).
TEST(CompressionCorruptTest, RandomGarblingPastTheChecksumIsSafe) {
  std::mt19937 rng(77);
  int accepted = 0, total = 0;
  for (const std::vector<std::byte>& buffer : ValidBuffers()) {
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<std::byte> garbled = buffer;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        const size_t at =
            compression::kFixedHeaderBytes +
            rng() % (garbled.size() - compression::kFixedHeaderBytes);
        garbled[at] = static_cast<std::byte>(rng());
      }
      if (rng() % 4 == 0) garbled.resize(rng() % garbled.size());
      accepted += DecodeAnyway(garbled, {.verify_checksum = false});
      ++total;
      ASSERT_FALSE(::testing::Test::HasFailure());
    }
  }
  // Some garbling (in values) still decodes; most does not.
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, total);
}

TEST(CompressionCorruptTest, WrongMagicAndVersion) {
  const uint8_t fp32_delta =
      Codings(pb::VALUE_FP32, pb::INDEX_DELTA_VARINT, false);
  const std::vector<std::byte> good =
      HandMade(1, fp32_delta, {4, 1, 1}, Bytes({2, 0, 0, 128, 63}));
  UpdateDecoder decoder;
  std::vector<float> out(4);
  ASSERT_OK(decoder.DecodeDense(good, out));
  EXPECT_EQ(out, (std::vector<float>{0, 0, 1, 0}));

  for (uint8_t version : {0, 2, 255}) {
    const std::vector<std::byte> other =
        HandMade(version, fp32_delta, {4, 1, 1}, Bytes({2, 0, 0, 128, 63}));
    const Status status = decoder.DecodeDense(other, out);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("version " + std::to_string(version)),
              std::string::npos)
        << status;
  }
  std::vector<std::byte> magic = good;
  magic[0] = std::byte{'X'};
  EXPECT_EQ(decoder.DecodeDense(magic, out).code(), StatusCode::kDataLoss);
  EXPECT_EQ(decoder.DecodeDense({}, out).code(), StatusCode::kDataLoss);
}

TEST(CompressionCorruptTest, HeaderFieldsOutOfRange) {
  const uint8_t fp32_delta =
      Codings(pb::VALUE_FP32, pb::INDEX_DELTA_VARINT, false);
  const uint8_t fp32_dense = Codings(pb::VALUE_FP32, pb::INDEX_DENSE, false);
  const uint8_t int8_bitmap = Codings(pb::VALUE_INT8, pb::INDEX_BITMAP, false);
  const std::vector<std::byte> one = Bytes({2, 0, 0, 128, 63});
  struct Case {
    const char* what;
    std::vector<std::byte> buffer;
  };
  const uint64_t u32max = 0xffffffffull;
  const std::vector<Case> cases = {
      {"reserved bit", HandMade(1, fp32_delta | 0x80, {4, 1, 1}, one)},
      {"value coding 0", HandMade(1, fp32_delta & ~7, {4, 1, 1}, one)},
      {"value coding 6", HandMade(1, (fp32_delta & ~7) | 6, {4, 1, 1}, one)},
      {"index coding AUTO",
       HandMade(1, Codings(pb::VALUE_FP32, pb::INDEX_AUTO, false), {4, 1, 1},
                one)},
      {"index coding 5",
       HandMade(1, pb::VALUE_FP32 | (5 << 3), {4, 1, 1}, one)},
      {"size >= 2^32", HandMade(1, fp32_delta, {u32max + 1, 1, 1}, one)},
      {"count > size", HandMade(1, fp32_delta, {4, 5, 1}, one)},
      {"count 2^32-1 with a 4-byte body",
       HandMade(1, fp32_delta, {u32max, u32max, u32max}, one)},
      {"index bytes < count", HandMade(1, fp32_delta, {4, 2, 1}, one)},
      {"index bytes > 5 count", HandMade(1, fp32_delta, {4, 1, 6}, one)},
      {"index bytes 2^64-1",
       HandMade(1, fp32_delta, {4, 1, std::numeric_limits<uint64_t>::max()},
                one)},
      {"dense count != size", HandMade(1, fp32_dense, {4, 3}, one)},
      {"dense huge size, short body",
       HandMade(1, fp32_dense, {u32max, u32max}, one)},
      {"block size 0", HandMade(1, int8_bitmap, {4, 1, 0}, one)},
      {"block size too big",
       HandMade(1, int8_bitmap, {4, 1, kMaxCompressionBlockSize + 1}, one)},
      {"missing block size", HandMade(1, int8_bitmap, {4, 1}, {})},
      {"missing count", HandMade(1, fp32_delta, {4}, {})},
      {"non-canonical size",
       HandMade(1, fp32_delta, {},
                Bytes({0x84, 0x00, 1, 1, 2, 0, 0, 128, 63}))},
      {"body longer than the header says",
       HandMade(1, fp32_delta, {4, 1, 1}, Bytes({2, 0, 0, 128, 63, 0}))},
      {"delta index outside the slice",
       HandMade(1, fp32_delta, {4, 1, 1}, Bytes({4, 0, 0, 128, 63}))},
      {"bitmap count mismatch",
       HandMade(1, Codings(pb::VALUE_FP32, pb::INDEX_BITMAP, false), {4, 1},
                Bytes({0x3, 0, 0, 128, 63}))},
      {"NaN value",
       HandMade(1, fp32_delta, {4, 1, 1}, Bytes({2, 0, 0, 192, 127}))},
      {"int8 -128",
       HandMade(1, int8_bitmap, {4, 1, 8}, Bytes({0x1, 0, 0, 128, 63, 0x80}))},
      {"int8 negative scale",
       HandMade(1, int8_bitmap, {4, 1, 8}, Bytes({0x1, 0, 0, 128, 191, 0x10}))},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    UpdateDecoder decoder;
    SparseUpdate out;
    const Status status = decoder.DecodeSparse(c.buffer, u32max, &out);
    EXPECT_FALSE(status.ok());
    EXPECT_EQ(status.code(), StatusCode::kDataLoss) << status;
    std::vector<float> dense(4);
    EXPECT_FALSE(decoder.DecodeDense(c.buffer, dense).ok());
  }
}

TEST(CompressionCorruptTest, SizeLimitIsCheckedBeforeAllocating) {
  // A valid-looking header for 2^32 - 1 elements: refused by the caller's
  // limit (OutOfRange), or by the destination size.
  const std::vector<std::byte> huge =
      HandMade(1, Codings(pb::VALUE_INT8, pb::INDEX_BITMAP, true),
               {0xffffffffull, 0xffffffffull, 1}, Bytes({1, 2, 3}));
  UpdateDecoder decoder({.verify_checksum = false});
  SparseUpdate out;
  EXPECT_EQ(decoder.DecodeSparse(huge, 1 << 20, &out).code(),
            StatusCode::kOutOfRange);
  std::vector<float> dense(100);
  EXPECT_FALSE(decoder.DecodeDense(huge, dense).ok());
  EXPECT_FALSE(decoder.DecodeAdd(huge, dense).ok());
}

TEST(CompressionCorruptTest, ZstdFramesMustMatchTheHeader) {
  const std::vector<float> x = RandomUpdate(3000, 1.0, 8);
  UpdateEncoder encoder = MustCreate(
      MakeConfig(pb::SELECT_ALL, pb::INDEX_DENSE, pb::VALUE_INT8, 3));
  Result<EncodedUpdate> e = encoder.EncodeDense(x, {});
  ASSERT_OK(e);
  ASSERT_TRUE(e->summary.zstd);
  const std::vector<std::byte> good = ToVector(e->bytes);
  Result<EncodedInfo> info = InspectEncoded(good);
  ASSERT_OK(info);
  const std::vector<std::byte> header(good.begin(),
                                      good.begin() + info->header_bytes);
  const std::vector<std::byte> frame(good.begin() + info->header_bytes,
                                     good.end());
  auto with = [&header](std::vector<std::byte> payload) {
    std::vector<std::byte> buffer = header;
    buffer.insert(buffer.end(), payload.begin(), payload.end());
    compression::SealChecksum(buffer);
    return buffer;
  };
  UpdateDecoder decoder;
  std::vector<float> out(3000);
  ASSERT_OK(decoder.DecodeDense(good, out));

  std::vector<std::byte> trailing = frame;
  trailing.push_back(std::byte{0});
  std::vector<std::byte> truncated(frame.begin(), frame.end() - 3);
  std::vector<std::byte> garbage(frame.size(), std::byte{0x5a});
  std::vector<std::byte> two = frame;
  two.insert(two.end(), frame.begin(), frame.end());
  for (const auto& payload :
       {trailing, truncated, garbage, two, std::vector<std::byte>{}}) {
    EXPECT_EQ(decoder.DecodeDense(with(payload), out).code(),
              StatusCode::kDataLoss);
  }
  // A frame of the wrong content size: the body of a different header.
  std::vector<std::byte> other_header = HandMade(
      1, Codings(pb::VALUE_INT8, pb::INDEX_DENSE, true), {2999, 2999, 256}, {});
  other_header.insert(other_header.end(), frame.begin(), frame.end());
  compression::SealChecksum(other_header);
  std::vector<float> smaller(2999);
  EXPECT_EQ(decoder.DecodeDense(other_header, smaller).code(),
            StatusCode::kDataLoss);
  // zstd on an empty body.
  EXPECT_FALSE(
      decoder
          .DecodeDense(
              HandMade(1, Codings(pb::VALUE_FP32, pb::INDEX_DENSE, true),
                       {0, 0}, frame),
              std::span<float>())
          .ok());
}

TEST(CompressionCorruptTest, DecodeAddLeavesTheTargetOnError) {
  // Three values; the last is NaN.
  const std::vector<std::byte> bad =
      HandMade(1, Codings(pb::VALUE_FP32, pb::INDEX_DENSE, false), {3, 3},
               Bytes({0, 0, 128, 63, 0, 0, 128, 63, 0, 0, 192, 127}));
  std::vector<float> target = {5, 6, 7};
  UpdateDecoder decoder;
  EXPECT_EQ(decoder.DecodeAdd(bad, target).code(), StatusCode::kDataLoss);
  EXPECT_EQ(target, (std::vector<float>{5, 6, 7}));
}

TEST(CompressionDecodeTest, EmptySliceAndEmptySelection) {
  UpdateEncoder encoder =
      MustCreate(MakeConfig(pb::SELECT_ALL, pb::INDEX_AUTO, pb::VALUE_INT8, 1));
  UpdateDecoder decoder;
  Result<EncodedUpdate> empty = encoder.EncodeDense({}, {});
  ASSERT_OK(empty);
  EXPECT_OK(decoder.DecodeDense(empty->bytes, {}));
  const std::vector<float> zeros(1000, 0.0f);
  Result<EncodedUpdate> none = encoder.EncodeDense(zeros, {});
  ASSERT_OK(none);
  EXPECT_EQ(none->summary.sent, 0u);
  EXPECT_LE(none->summary.encoded_bytes, 16u);
  std::vector<float> out(1000, 3.0f);
  ASSERT_OK(decoder.DecodeDense(none->bytes, out));
  EXPECT_EQ(out, zeros);
}

}  // namespace
}  // namespace meridian
