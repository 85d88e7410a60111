// Tests of a checkpoint's file format (src/durable/checkpoint_codec.h), and
// the seed corpus of the fuzz target tests/fuzz/checkpoint_fuzz.cc, defined
// here and checked against the files in tests/fuzz/corpus/checkpoint/. To
// (re)write those files:
//
//   MERIDIAN_REGENERATE_CORPUS=1 build/bin/durable_test
//       --gtest_filter='CheckpointCorpusTest.*'    (one command line)

#include "durable/checkpoint_codec.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "testing/status_matchers.h"
#include "tests/durable/durable_test_util.h"

namespace meridian::durable_test {
namespace {

namespace fs = std::filesystem;

TEST(CheckpointFormatTest, RoundTripInMemory) {
  const Checkpoint c = MakeCheckpoint(12, 100);
  const std::vector<std::byte> bytes = Encode(c);
  Result<Checkpoint> back = DecodeCheckpoint(bytes, "mem");
  ASSERT_OK(back);
  ExpectSameCheckpoint(c, *back);
  EXPECT_EQ(back->Find("layer0/b")->values, (std::vector<float>{1.5f, -2.5f}));
  EXPECT_EQ(back->Find("nope"), nullptr);
  // The documented layout: magic, version, total length at fixed offsets.
  EXPECT_EQ(std::memcmp(bytes.data(), "MRDNCKPT", 8), 0);
  uint32_t version;
  uint64_t total;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&total, bytes.data() + 12, 8);
  EXPECT_EQ(version, kCheckpointFormatVersion);
  EXPECT_EQ(total, bytes.size());
}

TEST(CheckpointFormatTest, MinimalCheckpointRoundTrips) {
  Checkpoint c;
  c.sequence = 0;
  c.fingerprint = "x";
  Result<Checkpoint> back = DecodeCheckpoint(Encode(c), "mem");
  ASSERT_OK(back);
  EXPECT_EQ(*back, c);
}

TEST(CheckpointFormatTest, EncodeRefusesWhatCouldNotBeReadBack) {
  Checkpoint c = MakeCheckpoint(1);
  c.fingerprint.clear();
  EXPECT_EQ(EncodeCheckpoint(c).status().code(), StatusCode::kInvalidArgument);
  c.fingerprint = std::string(kMaxFingerprintBytes + 1, 'f');
  EXPECT_EQ(EncodeCheckpoint(c).status().code(), StatusCode::kInvalidArgument);
  c = MakeCheckpoint(1);
  c.arrays.push_back({"layer0/b", {}});
  EXPECT_CONTAINS(EncodeCheckpoint(c).status().message(),
                  "'layer0/b' appears twice");
  c = MakeCheckpoint(1);
  c.arrays.push_back({"", {}});
  EXPECT_EQ(EncodeCheckpoint(c).status().code(), StatusCode::kInvalidArgument);
  // WriteCheckpoint refuses the same, before touching the directory.
  const std::string dir = Dir("refuse");
  EXPECT_EQ(WriteCheckpoint(dir, c).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Names(dir).empty());
}

TEST(CheckpointFormatTest, EveryTruncationIsRefused) {
  const std::vector<std::byte> bytes = Encode(MakeCheckpoint(3, 20));
  for (size_t size = 0; size < bytes.size(); ++size) {
    Result<Checkpoint> c =
        DecodeCheckpoint(std::span(bytes).first(size), "cut");
    ASSERT_FALSE(c.ok()) << size;
    EXPECT_EQ(c.status().code(), StatusCode::kDataLoss) << size;
    EXPECT_CONTAINS(c.status().message(), "truncated") << size;
    EXPECT_CONTAINS(c.status().message(), "checkpoint 'cut'") << size;
  }
}

TEST(CheckpointFormatTest, EverySingleByteCorruptionIsRefused) {
  const std::vector<std::byte> bytes = Encode(MakeCheckpoint(3, 20));
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t flip : {0x01, 0x80, 0xff}) {
      std::vector<std::byte> bad = bytes;
      bad[i] ^= std::byte{flip};
      Result<Checkpoint> c = DecodeCheckpoint(bad, "bad");
      ASSERT_FALSE(c.ok()) << "byte " << i << " ^ " << int{flip};
      EXPECT_FALSE(c.status().message().empty());
    }
  }
}

TEST(CheckpointFormatTest, SampledCorruptionOfALargeFileIsRefused) {
  const std::vector<std::byte> bytes = Encode(MakeCheckpoint(3, 1 << 18));
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::byte> bad = bytes;
    const size_t i = rng() % bad.size();
    bad[i] ^= std::byte{static_cast<uint8_t>(1 + rng() % 255)};
    ASSERT_FALSE(DecodeCheckpoint(bad, "bad").ok()) << "byte " << i;
  }
  // An extra byte at the end is refused too.
  std::vector<std::byte> longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_CONTAINS(DecodeCheckpoint(longer, "long").status().message(),
                  "wrong size");
}

TEST(CheckpointFormatTest, WrongMagicAndVersionAreNamed) {
  std::vector<std::byte> bytes = Encode(MakeCheckpoint(3));
  std::vector<std::byte> magic = bytes;
  magic[3] = std::byte{'X'};
  EXPECT_CONTAINS(DecodeCheckpoint(magic, "m").status().message(),
                  "not a Meridian checkpoint");
  EXPECT_CONTAINS(DecodeCheckpoint(Bytes("PK\x03\x04 a zip file"), "zip")
                      .status()
                      .message(),
                  "not a Meridian checkpoint");
  std::vector<std::byte> version = bytes;
  Store<uint32_t>(&version, 8, 2);
  Reseal(&version);
  const Status status = DecodeCheckpoint(version, "v").status();
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_CONTAINS(status.message(),
                  "format version 2, this build reads version 1");
}

TEST(CheckpointFormatTest, BadLengthsBehindAValidChecksumAreRefused) {
  // Each is sealed with a correct checksum, so only the parser stands
  // between the lengths and an allocation.
  struct Case {
    const char* name;
    std::vector<std::byte> bytes;
    const char* expected;
  };
  const Case cases[] = {
      {"huge array count", HandMadeCheckpoint(0xffffffffu, {}),
       "arrays cannot fit"},
      {"huge element count",
       HandMadeCheckpoint(1, ArrayBytes("w", uint64_t{1} << 61, 1)),
       "elements cannot fit"},
      {"element count one too many",
       HandMadeCheckpoint(1, ArrayBytes("w", 3, 2)), "elements cannot fit"},
      {"empty name", HandMadeCheckpoint(1, ArrayBytes("", 0, 0)),
       "name length 0"},
      {"duplicate name",
       [] {
         std::vector<std::byte> tail = ArrayBytes("w", 1, 1);
         std::vector<std::byte> again = ArrayBytes("w", 0, 0);
         tail.insert(tail.end(), again.begin(), again.end());
         return HandMadeCheckpoint(2, tail);
       }(),
       "appears twice"},
      {"bytes after the arrays",
       HandMadeCheckpoint(1,
                          [] {
                            std::vector<std::byte> tail = ArrayBytes("w", 1, 1);
                            tail.push_back(std::byte{7});
                            return tail;
                          }()),
       "unexpected bytes"},
  };
  for (const Case& c : cases) {
    Result<Checkpoint> decoded = DecodeCheckpoint(c.bytes, c.name);
    ASSERT_FALSE(decoded.ok()) << c.name;
    EXPECT_EQ(decoded.status().code(), StatusCode::kDataLoss) << c.name;
    EXPECT_CONTAINS(decoded.status().message(), c.expected) << c.name;
  }
  // And the hand-made encoder agrees with the real one when lengths hold.
  Result<Checkpoint> ok =
      DecodeCheckpoint(HandMadeCheckpoint(1, ArrayBytes("w", 2, 2)), "hand");
  ASSERT_OK(ok);
  EXPECT_EQ(ok->sequence, 9u);
  EXPECT_EQ(ok->arrays[0].values, (std::vector<float>{1.0f, 1.0f}));
}

// ---------------------------------------------------------------------------
// Seed corpus of tests/fuzz/checkpoint_fuzz.cc

// Byte 0 of a fuzz input: bit 0 log segment (else checkpoint), bit 1 fix
// the checksums (see the harness).
constexpr uint8_t kModeCheckpoint = 0;
constexpr uint8_t kModeLog = 1;
constexpr uint8_t kModeFix = 2;

struct Seed {
  std::string name;  // ends in _valid, _bad or (logs) _torn
  std::vector<std::byte> bytes;
};

Seed MakeSeed(std::string name, uint8_t mode, std::vector<std::byte> file) {
  file.insert(file.begin(), std::byte{mode});
  return {std::move(name), std::move(file)};
}

std::vector<Seed> SeedCorpus() {
  std::vector<Seed> seeds;
  seeds.push_back({"empty_input_bad", {}});
  Checkpoint small = MakeCheckpoint(12, 6, "job 'a' site 'b' seed 1 layout c");
  const std::vector<std::byte> ckpt = Encode(small);
  seeds.push_back(MakeSeed("ckpt_small_valid", kModeCheckpoint, ckpt));
  Checkpoint minimal;
  minimal.fingerprint = "f";
  seeds.push_back(
      MakeSeed("ckpt_minimal_valid", kModeCheckpoint, Encode(minimal)));
  seeds.push_back(
      MakeSeed("ckpt_small_fixed_valid", kModeCheckpoint | kModeFix, ckpt));
  seeds.push_back(MakeSeed("ckpt_truncated_bad", kModeCheckpoint,
                           {ckpt.begin(), ckpt.end() - 9}));
  std::vector<std::byte> flipped = ckpt;
  flipped[60] ^= std::byte{1};
  seeds.push_back(MakeSeed("ckpt_flipped_byte_bad", kModeCheckpoint, flipped));
  std::vector<std::byte> version = ckpt;
  Store<uint32_t>(&version, 8, 2);
  seeds.push_back(
      MakeSeed("ckpt_version_2_bad", kModeCheckpoint | kModeFix, version));
  seeds.push_back(MakeSeed("ckpt_huge_array_count_bad",
                           kModeCheckpoint | kModeFix,
                           HandMadeCheckpoint(0xffffffffu, {})));
  seeds.push_back(
      MakeSeed("ckpt_huge_element_count_bad", kModeCheckpoint | kModeFix,
               HandMadeCheckpoint(1, ArrayBytes("w", uint64_t{1} << 62, 1))));
  seeds.push_back(MakeSeed("ckpt_hand_made_valid", kModeCheckpoint | kModeFix,
                           HandMadeCheckpoint(1, ArrayBytes("w", 2, 2))));

  const std::string fp = "job 'a' site 'b' seed 1 layout c";
  const std::vector<std::vector<std::byte>> records = {
      Bytes(""), Bytes("first update"), Record(3, 40)};
  const std::vector<std::byte> segment = HandMadeSegment(7, 6, fp, records);
  seeds.push_back(MakeSeed("log_valid", kModeLog, segment));
  seeds.push_back(MakeSeed("log_first_segment_valid", kModeLog,
                           HandMadeSegment(0, kNoSegment, fp, {})));
  seeds.push_back(MakeSeed("log_fixed_valid", kModeLog | kModeFix, segment));
  std::vector<std::byte> torn = segment;
  Append<uint32_t>(&torn, 500);
  Append<uint32_t>(&torn, 0);
  AppendText(&torn, "cut");
  seeds.push_back(MakeSeed("log_torn_length_torn", kModeLog, torn));
  std::vector<std::byte> bad_record = segment;
  bad_record[bad_record.size() - 5] ^= std::byte{8};
  seeds.push_back(MakeSeed("log_record_checksum_torn", kModeLog, bad_record));
  seeds.push_back(MakeSeed("log_short_record_header_torn", kModeLog, [&] {
    std::vector<std::byte> b = segment;
    Append<uint16_t>(&b, 3);
    return b;
  }()));
  std::vector<std::byte> bad_header = segment;
  bad_header[14] ^= std::byte{1};
  seeds.push_back(MakeSeed("log_header_checksum_bad", kModeLog, bad_header));
  std::vector<std::byte> huge_fp = segment;
  Store<uint32_t>(&huge_fp, 28, 0x7fffffff);
  seeds.push_back(
      MakeSeed("log_huge_fingerprint_bad", kModeLog | kModeFix, huge_fp));
  // Shorter than a header, checksums "fixed": once crashed the harness.
  seeds.push_back(MakeSeed("log_fixed_short_header_bad", kModeLog | kModeFix,
                           {segment.begin(), segment.begin() + 34}));
  seeds.push_back(MakeSeed("log_truncated_header_bad", kModeLog,
                           {segment.begin(), segment.begin() + 30}));
  seeds.push_back(MakeSeed("log_wrong_magic_bad", kModeLog, ckpt));
  return seeds;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What the harness does with a seed, reduced to: "valid" (accepted as is),
// "torn" (a log accepted only with its torn tail ignored) or "bad".
std::string Classify(const std::vector<std::byte>& input) {
  if (input.empty()) return "bad";
  const auto mode = static_cast<uint8_t>(input[0]);
  std::vector<std::byte> file(input.begin() + 1, input.end());
  if ((mode & kModeLog) == 0) {
    if ((mode & kModeFix) != 0 && file.size() >= 24) {
      Store<uint64_t>(&file, 12, file.size());
      Reseal(&file);
    }
    return DecodeCheckpoint(file, "seed").ok() ? "valid" : "bad";
  }
  if ((mode & kModeFix) != 0 && file.size() >= 36) {
    // Only the header checksum: the seeds' records are already sealed.
    uint32_t fp_bytes;
    std::memcpy(&fp_bytes, file.data() + 28, 4);
    if (fp_bytes <= file.size() - 36) {
      Store<uint32_t>(&file, 32 + fp_bytes,
                      Crc(std::span(file).first(32 + fp_bytes)));
    }
  }
  if (DecodeLogSegment(file, "seed", false).ok()) return "valid";
  Result<DecodedLogSegment> tolerant = DecodeLogSegment(file, "seed", true);
  return tolerant.ok() && tolerant->ignored_bytes > 0 ? "torn" : "bad";
}

TEST(CheckpointCorpusTest, SeedsDecodeAsNamed) {
  for (const Seed& seed : SeedCorpus()) {
    const std::string kind = Classify(seed.bytes);
    EXPECT_TRUE(EndsWith(seed.name, "_" + kind))
        << seed.name << " decodes as " << kind;
  }
}

TEST(CheckpointCorpusTest, SeedCorpusFilesAreCurrent) {
  const fs::path dir = MERIDIAN_CHECKPOINT_CORPUS;
  const std::vector<Seed> seeds = SeedCorpus();
  const char* regenerate = std::getenv("MERIDIAN_REGENERATE_CORPUS");
  if (regenerate != nullptr && std::string(regenerate) == "1") {
    fs::create_directories(dir);
    for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
      fs::remove(entry.path());
    }
    for (const Seed& seed : seeds) WriteBytes(dir / seed.name, seed.bytes);
  }
  size_t files = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    ++files;
    (void)entry;
  }
  const char* hint =
      "regenerate the corpus (see the top of "
      "tests/durable/checkpoint_codec_test.cc)";
  EXPECT_EQ(files, seeds.size()) << hint;
  for (const Seed& seed : seeds) {
    EXPECT_TRUE(ReadBytes(dir / seed.name) == seed.bytes)
        << seed.name << ": " << hint;
  }
}

}  // namespace
}  // namespace meridian::durable_test
