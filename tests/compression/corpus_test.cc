// The seed corpus of the compression decoder's fuzz target
// (tests/fuzz/compression_fuzz.cc), defined here and checked against the
// files in tests/fuzz/corpus/compression/. To (re)write the files:
//
//   MERIDIAN_REGENERATE_CORPUS=1 build/bin/compression_test
//       --gtest_filter='CompressionCorpusTest.*'    (one command line)
//
// Each seed's name ends in "_valid" (it decodes) or "_bad" (it is refused
// even with the checksum ignored), which the test checks.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "meridian/compression/compression.h"
#include "tests/compression/test_util.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

using testing::Bytes;
using testing::Codings;
using testing::HandMade;
using testing::MakeConfig;
using testing::RandomUpdate;
using testing::ToVector;

struct Seed {
  std::string name;
  std::vector<std::byte> bytes;
};

std::string CodingName(pb::ValueCoding value) {
  switch (value) {
    case pb::VALUE_FP32:
      return "fp32";
    case pb::VALUE_FP16:
      return "fp16";
    case pb::VALUE_BF16:
      return "bf16";
    case pb::VALUE_INT8:
      return "int8";
    case pb::VALUE_INT2:
      return "int2";
    default:
      return "int4";
  }
}

std::string IndexName(pb::IndexCoding index) {
  switch (index) {
    case pb::INDEX_DELTA_VARINT:
      return "delta";
    case pb::INDEX_BITMAP:
      return "bitmap";
    default:
      return "dense";
  }
}

std::vector<Seed> SeedCorpus() {
  std::vector<Seed> seeds;
  seeds.push_back({"empty_input_bad", {}});
  // Small valid buffers of every coding, with and without zstd.
  const std::vector<float> x = RandomUpdate(40, 0.3, 5);
  for (pb::ValueCoding value : {pb::VALUE_FP32, pb::VALUE_FP16, pb::VALUE_BF16,
                                pb::VALUE_INT8, pb::VALUE_INT4,
                                pb::VALUE_INT2}) {
    for (pb::IndexCoding index :
         {pb::INDEX_DELTA_VARINT, pb::INDEX_BITMAP, pb::INDEX_DENSE}) {
      // INT2 has no zero level: its encoders never write INDEX_DENSE of a
      // partial selection.
      if (value == pb::VALUE_INT2 && index == pb::INDEX_DENSE) continue;
      for (int zstd : {0, 1}) {
        Result<UpdateEncoder> encoder = UpdateEncoder::Create(MakeConfig(
            pb::SELECT_ALL, index, value, zstd, pb::ROUND_NEAREST, 5));
        EXPECT_OK(encoder);
        Result<EncodedUpdate> e = encoder->EncodeDense(x, {});
        EXPECT_OK(e);
        // zstd is dropped from buffers it does not shrink: those are the
        // same bytes as without zstd.
        if (zstd != 0 && !e->summary.zstd) continue;
        seeds.push_back({CodingName(value) + "_" + IndexName(index) +
                             (zstd != 0 ? "_zstd" : "") + "_valid",
                         ToVector(e->bytes)});
      }
    }
  }
  // Compressible sparse updates (repeated values), where zstd is kept.
  std::vector<float> repeated = RandomUpdate(600, 0.3, 6);
  for (float& v : repeated) {
    if (v != 0.0f) v = 0.5f;
  }
  for (pb::ValueCoding value : {pb::VALUE_FP32, pb::VALUE_INT4}) {
    for (pb::IndexCoding index : {pb::INDEX_DELTA_VARINT, pb::INDEX_BITMAP}) {
      Result<UpdateEncoder> encoder = UpdateEncoder::Create(
          MakeConfig(pb::SELECT_ALL, index, value, 1, pb::ROUND_NEAREST, 64));
      EXPECT_OK(encoder);
      Result<EncodedUpdate> e = encoder->EncodeDense(repeated, {});
      EXPECT_OK(e);
      EXPECT_TRUE(e->summary.zstd);
      seeds.push_back(
          {CodingName(value) + "_" + IndexName(index) + "_zstd_repeated_valid",
           ToVector(e->bytes)});
    }
  }
  {
    // A compressible one, where zstd is kept for sure.
    const std::vector<float> constant(300, 0.5f);
    Result<UpdateEncoder> encoder = UpdateEncoder::Create(
        MakeConfig(pb::SELECT_ALL, pb::INDEX_AUTO, pb::VALUE_INT8, 3));
    EXPECT_OK(encoder);
    seeds.push_back({"int8_dense_zstd_constant_valid",
                     ToVector(encoder->EncodeDense(constant, {})->bytes)});
    const std::vector<float> none(64, 0.0f);
    seeds.push_back({"nothing_selected_valid",
                     ToVector(encoder->EncodeDense(none, {})->bytes)});
  }
  const uint8_t fp32_delta =
      Codings(pb::VALUE_FP32, pb::INDEX_DELTA_VARINT, false);
  const uint8_t int8_bitmap = Codings(pb::VALUE_INT8, pb::INDEX_BITMAP, false);
  const std::vector<std::byte> one = Bytes({2, 0, 0, 128, 63});
  seeds.push_back(
      {"handmade_delta_valid", HandMade(1, fp32_delta, {4, 1, 1}, one)});
  seeds.push_back({"version_2_bad", HandMade(2, fp32_delta, {4, 1, 1}, one)});
  seeds.push_back(
      {"count_above_size_bad", HandMade(1, fp32_delta, {4, 5, 1}, one)});
  seeds.push_back(
      {"huge_count_bad",
       HandMade(1, fp32_delta, {0xffffffffull, 0xffffffffull, 0xffffffffull},
                one)});
  seeds.push_back(
      {"index_outside_slice_bad",
       HandMade(1, fp32_delta, {4, 1, 1}, Bytes({4, 0, 0, 128, 63}))});
  seeds.push_back({"nan_value_bad", HandMade(1, fp32_delta, {4, 1, 1},
                                             Bytes({2, 0, 0, 192, 127}))});
  seeds.push_back(
      {"block_size_0_bad", HandMade(1, int8_bitmap, {4, 1, 0}, one)});
  seeds.push_back(
      {"int8_minus_128_bad",
       HandMade(1, int8_bitmap, {4, 1, 8}, Bytes({0x1, 0, 0, 128, 63, 0x80}))});
  // INT2, 3 values of a slice of 4 (bitmap 0b0111), block 8: scale 1,
  // codes 0, 3, 1 (levels -3, 3, -1); then the same with a padding bit.
  const uint8_t int2_bitmap = Codings(pb::VALUE_INT2, pb::INDEX_BITMAP, false);
  seeds.push_back({"int2_bitmap_handmade_valid",
                   HandMade(1, int2_bitmap, {4, 3, 8},
                            Bytes({0x7, 0, 0, 128, 63, 0x1c}))});
  seeds.push_back({"int2_padding_bits_bad",
                   HandMade(1, int2_bitmap, {4, 3, 8},
                            Bytes({0x7, 0, 0, 128, 63, 0x5c}))});
  seeds.push_back({"int2_negative_scale_bad",
                   HandMade(1, int2_bitmap, {4, 3, 8},
                            Bytes({0x7, 0, 0, 128, 191, 0x1c}))});
  seeds.push_back({"bitmap_count_mismatch_bad",
                   HandMade(1, Codings(pb::VALUE_FP32, pb::INDEX_BITMAP, false),
                            {4, 1}, Bytes({0x3, 0, 0, 128, 63}))});
  return seeds;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

TEST(CompressionCorpusTest, SeedsDecodeAsNamed) {
  for (const Seed& seed : SeedCorpus()) {
    ASSERT_TRUE(EndsWith(seed.name, "_valid") || EndsWith(seed.name, "_bad"))
        << seed.name;
    UpdateDecoder decoder({.verify_checksum = false});
    SparseUpdate out;
    const Status status = decoder.DecodeSparse(seed.bytes, 1 << 20, &out);
    EXPECT_EQ(status.ok(), EndsWith(seed.name, "_valid"))
        << seed.name << ": " << status;
  }
}

TEST(CompressionCorpusTest, SeedCorpusFilesAreCurrent) {
  namespace fs = std::filesystem;
  const fs::path dir = MERIDIAN_COMPRESSION_CORPUS;
  const char* regenerate = std::getenv("MERIDIAN_REGENERATE_CORPUS");
  const std::vector<Seed> seeds = SeedCorpus();
  if (regenerate != nullptr && std::string(regenerate) == "1") {
    fs::create_directories(dir);
    for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
      fs::remove(entry.path());
    }
    for (const Seed& seed : seeds) {
      std::ofstream out(dir / seed.name, std::ios::binary);
      out.write(reinterpret_cast<const char*>(seed.bytes.data()),
                static_cast<std::streamsize>(seed.bytes.size()));
      ASSERT_TRUE(out.good()) << seed.name;
    }
  }
  // Every seed has its file, and every file decodes as its name says (the
  // bytes of zstd frames may differ between zstd versions, so files are
  // not compared byte for byte).
  size_t files = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    ++files;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::vector<char> chars((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    std::vector<std::byte> bytes;
    for (char c : chars) bytes.push_back(static_cast<std::byte>(c));
    const std::string name = entry.path().filename().string();
    UpdateDecoder decoder({.verify_checksum = false});
    SparseUpdate out;
    EXPECT_EQ(decoder.DecodeSparse(bytes, 1 << 20, &out).ok(),
              EndsWith(name, "_valid"))
        << name;
  }
  EXPECT_EQ(files, seeds.size()) << "regenerate the corpus (see the top of "
                                    "tests/compression/corpus_test.cc)";
  for (const Seed& seed : seeds) {
    EXPECT_TRUE(fs::exists(dir / seed.name)) << seed.name;
  }
}

}  // namespace
}  // namespace meridian
