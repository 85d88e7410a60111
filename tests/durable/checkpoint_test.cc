// Tests of a site server's durable state (src/runtime/checkpoint.h):
// checkpoint files and directories, the append-only log, the background
// checkpoint writer, and the seed corpus of the fuzz target
// tests/fuzz/checkpoint_fuzz.cc, defined here and checked against the
// files in tests/fuzz/corpus/checkpoint/. To (re)write those files:
//
//   MERIDIAN_REGENERATE_CORPUS=1 build/bin/checkpoint_test
//       --gtest_filter='CheckpointCorpusTest.*'    (one command line)

#include "durable/checkpoint.h"
#include "site/site_checkpoint.h"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "testing/test_data.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

namespace fs = std::filesystem;

// Passes when `text` contains `part`; prints both otherwise.
::testing::AssertionResult Contains(const char* text_expr, const char*,
                                    const std::string& text,
                                    const std::string& part) {
  if (text.find(part) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << text_expr << " is \"" << text << "\", without \"" << part << "\"";
}
#define EXPECT_CONTAINS(text, part) EXPECT_PRED_FORMAT2(Contains, text, part)

const std::string& Fp() {
  static const std::string* fp =
      new std::string(CheckpointFingerprint("mnist", "us", 7, "3f2a9c"));
  return *fp;
}

std::vector<std::byte> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> chars((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  if (!chars.empty()) std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

void WriteBytes(const std::string& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::vector<std::byte> Bytes(std::string_view text) {
  std::vector<std::byte> bytes(text.size());
  if (!text.empty()) std::memcpy(bytes.data(), text.data(), text.size());
  return bytes;
}

// A checkpoint with a meta blob (NUL bytes included), and arrays holding
// NaN, infinities, -0 and subnormals, plus an empty one.
Checkpoint MakeCheckpoint(uint64_t sequence, size_t elements = 10,
                          const std::string& fingerprint = Fp()) {
  Checkpoint c;
  c.sequence = sequence;
  c.fingerprint = fingerprint;
  c.meta = std::string("clock\0=42;", 10) + std::to_string(sequence);
  NamedArray w{"layer0/w", {}};
  for (size_t i = 0; i < elements; ++i) {
    w.values.push_back(static_cast<float>(sequence) + 0.25f * i);
  }
  if (elements >= 4) {
    w.values[0] = std::numeric_limits<float>::quiet_NaN();
    w.values[1] = -std::numeric_limits<float>::infinity();
    w.values[2] = -0.0f;
    w.values[3] = std::numeric_limits<float>::denorm_min();
  }
  c.arrays.push_back(std::move(w));
  c.arrays.push_back({"layer0/b", {1.5f, -2.5f}});
  c.arrays.push_back({"empty", {}});
  return c;
}

// Bitwise equality (NaN != NaN under ==).
void ExpectSameCheckpoint(const Checkpoint& a, const Checkpoint& b) {
  EXPECT_EQ(a.sequence, b.sequence);
  EXPECT_EQ(a.fingerprint, b.fingerprint);
  EXPECT_EQ(a.meta, b.meta);
  ASSERT_EQ(a.arrays.size(), b.arrays.size());
  for (size_t i = 0; i < a.arrays.size(); ++i) {
    EXPECT_EQ(a.arrays[i].name, b.arrays[i].name);
    ASSERT_EQ(a.arrays[i].values.size(), b.arrays[i].values.size());
    for (size_t j = 0; j < a.arrays[i].values.size(); ++j) {
      EXPECT_EQ(std::bit_cast<uint32_t>(a.arrays[i].values[j]),
                std::bit_cast<uint32_t>(b.arrays[i].values[j]))
          << a.arrays[i].name << "[" << j << "]";
    }
  }
}

std::vector<std::byte> Encode(const Checkpoint& c) {
  Result<std::vector<std::byte>> bytes = EncodeCheckpoint(c);
  EXPECT_OK(bytes);
  return bytes.ok() ? *bytes : std::vector<std::byte>{};
}

uint32_t Crc(std::span<const std::byte> bytes, uint32_t crc = 0) {
  if (bytes.empty()) return crc;  // zlib returns 0 for a null buffer
  return static_cast<uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

template <typename T>
void Store(std::vector<std::byte>* bytes, size_t offset, T value) {
  std::memcpy(bytes->data() + offset, &value, sizeof(T));
}

template <typename T>
void Append(std::vector<std::byte>* bytes, T value) {
  const size_t at = bytes->size();
  bytes->resize(at + sizeof(T));
  Store(bytes, at, value);
}

void AppendText(std::vector<std::byte>* bytes, std::string_view text) {
  const std::vector<std::byte> b = Bytes(text);
  bytes->insert(bytes->end(), b.begin(), b.end());
}

// Recomputes the trailing checksum (after a deliberate edit).
void Reseal(std::vector<std::byte>* bytes) {
  Store<uint32_t>(bytes, bytes->size() - 4,
                  Crc(std::span(*bytes).first(bytes->size() - 4)));
}

// A checkpoint file built by hand: header, fingerprint "f", no meta,
// `count` arrays, then `tail` (array contents), sealed.
std::vector<std::byte> HandMadeCheckpoint(uint32_t count,
                                          const std::vector<std::byte>& tail) {
  std::vector<std::byte> b;
  AppendText(&b, "MRDNCKPT");
  Append<uint32_t>(&b, 1);
  Append<uint64_t>(&b, 0);  // total, set below
  Append<uint64_t>(&b, 9);  // sequence
  Append<uint32_t>(&b, 1);
  AppendText(&b, "f");
  Append<uint64_t>(&b, 0);  // meta
  Append<uint32_t>(&b, count);
  b.insert(b.end(), tail.begin(), tail.end());
  Append<uint32_t>(&b, 0);
  Store<uint64_t>(&b, 12, b.size());
  Reseal(&b);
  return b;
}

std::vector<std::byte> ArrayBytes(std::string_view name, uint64_t count,
                                  size_t actual_floats) {
  std::vector<std::byte> b;
  Append<uint32_t>(&b, static_cast<uint32_t>(name.size()));
  AppendText(&b, name);
  Append<uint64_t>(&b, count);
  for (size_t i = 0; i < actual_floats; ++i) Append<float>(&b, 1.0f);
  return b;
}

// A log segment built by hand, as the header comment documents it.
std::vector<std::byte> HandMadeSegment(
    uint64_t segment, uint64_t previous, std::string_view fingerprint,
    const std::vector<std::vector<std::byte>>& records) {
  std::vector<std::byte> b;
  AppendText(&b, "MRDNULOG");
  Append<uint32_t>(&b, 1);
  Append<uint64_t>(&b, segment);
  Append<uint64_t>(&b, previous);
  Append<uint32_t>(&b, static_cast<uint32_t>(fingerprint.size()));
  AppendText(&b, fingerprint);
  Append<uint32_t>(&b, Crc(b));
  for (const std::vector<std::byte>& record : records) {
    const auto length = static_cast<uint32_t>(record.size());
    std::vector<std::byte> length_bytes;
    Append<uint32_t>(&length_bytes, length);
    Append<uint32_t>(&b, length);
    Append<uint32_t>(&b, Crc(record, Crc(length_bytes)));
    b.insert(b.end(), record.begin(), record.end());
  }
  return b;
}

std::string Dir(const std::string& name) {
  return testing::MakeTempDir("checkpoint-" + name);
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Sets RLIMIT_FSIZE for its scope, so that writes beyond `bytes` fail
// with EFBIG (the closest to ENOSPC a test can provoke without a mount);
// SIGXFSZ is ignored meanwhile.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    previous_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &previous_);
    rlimit limit = previous_;
    limit.rlim_cur = bytes;
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &previous_);
    std::signal(SIGXFSZ, previous_handler_);
  }

 private:
  rlimit previous_;
  void (*previous_handler_)(int);
};

// ---------------------------------------------------------------------------
// Checkpoint format

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
// Checkpoint directories

TEST(CheckpointDirTest, WriteThenLoadLatest) {
  const std::string dir = Dir("write") + "/sub/ckpt";  // created
  const Checkpoint c = MakeCheckpoint(12, 1000);
  ASSERT_OK(WriteCheckpoint(dir, c));
  EXPECT_EQ(Names(dir), std::vector<std::string>{"ckpt-000000000000000c"});
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_OK(loaded);
  ASSERT_TRUE(loaded->checkpoint.has_value());
  ExpectSameCheckpoint(c, *loaded->checkpoint);
  EXPECT_EQ(loaded->path, dir + "/ckpt-000000000000000c");
  EXPECT_TRUE(loaded->refused.empty());
  // The file is exactly the encoding.
  EXPECT_EQ(ReadBytes(loaded->path), Encode(c));
}

TEST(CheckpointDirTest, MissingOrEmptyDirectoryIsNoCheckpoint) {
  const std::string dir = Dir("empty");
  for (const std::string& d : {dir + "/missing", dir}) {
    Result<LoadedCheckpoint> loaded = LoadLatest(d, Fp());
    ASSERT_OK(loaded);
    EXPECT_FALSE(loaded->checkpoint.has_value());
    EXPECT_TRUE(loaded->refused.empty());
  }
  // Temporary files and unrelated names do not count.
  WriteBytes(dir + "/ckpt-0000000000000001.tmp", Bytes("half"));
  WriteBytes(dir + "/ckpt-1", Bytes("not ours"));
  WriteBytes(dir + "/notes.txt", Bytes("hello"));
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_OK(loaded);
  EXPECT_FALSE(loaded->checkpoint.has_value());
  // A path that is a file is an error, not "no checkpoint".
  EXPECT_FALSE(LoadLatest(dir + "/notes.txt", Fp()).ok());
}

TEST(CheckpointDirTest, KeepsTheNewestTwo) {
  const std::string dir = Dir("keep");
  for (uint64_t s = 1; s <= 5; ++s) {
    ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(s)));
  }
  EXPECT_EQ(*ListCheckpoints(dir), (std::vector<uint64_t>{4, 5}));
  // A lower sequence (a caller that resumed from an older checkpoint)
  // becomes the latest: newer files would otherwise shadow it.
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(3)));
  EXPECT_EQ(*ListCheckpoints(dir), (std::vector<uint64_t>{3}));
  EXPECT_EQ(LoadLatest(dir, Fp())->checkpoint->sequence, 3u);
  // Rewriting the same sequence replaces it.
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(4)));
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(4, 3)));
  EXPECT_EQ(*ListCheckpoints(dir), (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(LoadLatest(dir, Fp())->checkpoint->arrays[0].values.size(), 3u);
}

TEST(CheckpointDirTest, FallsBackToTheOlderWhenTheNewestIsCorrupt) {
  const std::string dir = Dir("fallback");
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(7)));
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(8)));
  const std::string newest = dir + "/ckpt-0000000000000008";
  std::vector<std::byte> bytes = ReadBytes(newest);
  bytes[bytes.size() / 2] ^= std::byte{0x10};
  WriteBytes(newest, bytes);
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_OK(loaded);
  EXPECT_EQ(loaded->checkpoint->sequence, 7u);
  ASSERT_EQ(loaded->refused.size(), 1u);
  EXPECT_CONTAINS(loaded->refused[0], newest);
  EXPECT_CONTAINS(loaded->refused[0], "checksum mismatch");
  // Truncated (e.g. by a file system after a crash): the same.
  const std::vector<std::byte> older =
      ReadBytes(dir + "/ckpt-0000000000000007");
  WriteBytes(newest, std::span(older).first(100));
  loaded = LoadLatest(dir, Fp());
  ASSERT_OK(loaded);
  EXPECT_EQ(loaded->checkpoint->sequence, 7u);
  EXPECT_CONTAINS(loaded->refused[0], "truncated");
  // The caller continues at 8, replacing the refused file.
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(8)));
  loaded = LoadLatest(dir, Fp());
  EXPECT_EQ(loaded->checkpoint->sequence, 8u);
  EXPECT_TRUE(loaded->refused.empty());
}

TEST(CheckpointDirTest, AFileUnderTheWrongNameIsRefused) {
  const std::string dir = Dir("misnamed");
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(1)));
  fs::copy_file(dir + "/ckpt-0000000000000001", dir + "/ckpt-0000000000000009");
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_OK(loaded);
  EXPECT_EQ(loaded->checkpoint->sequence, 1u);
  ASSERT_EQ(loaded->refused.size(), 1u);
  EXPECT_CONTAINS(loaded->refused[0], "holds sequence 1, its name says 9");
}

TEST(CheckpointDirTest, OnlyCorruptCheckpointsIsAnError) {
  const std::string dir = Dir("corrupt");
  WriteBytes(dir + "/ckpt-0000000000000002", Bytes("garbage"));
  WriteBytes(dir + "/ckpt-0000000000000001", {});
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kDataLoss);
  EXPECT_CONTAINS(loaded.status().message(), "no usable checkpoint");
  EXPECT_CONTAINS(loaded.status().message(), dir + "/ckpt-0000000000000002");
  EXPECT_CONTAINS(loaded.status().message(), dir + "/ckpt-0000000000000001");
}

TEST(CheckpointDirTest, ForeignCheckpointsAreRefusedNamingBothJobs) {
  const std::string dir = Dir("foreign");
  const std::string other = CheckpointFingerprint("cifar", "eu", 7, "3f2a9c");
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(12, 10, other)));
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_CONTAINS(
      loaded.status().message(),
      "checkpoint '" + dir +
          "/ckpt-000000000000000c' belongs to job 'cifar' site 'eu' "
          "seed 7 layout 3f2a9c, not to job 'mnist' site 'us' seed 7 "
          "layout 3f2a9c");
  Result<Checkpoint> read =
      ReadCheckpointFile(dir + "/ckpt-000000000000000c", Fp());
  EXPECT_EQ(read.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_OK(ReadCheckpointFile(dir + "/ckpt-000000000000000c", other));
}

TEST(CheckpointDirTest, AHugeForeignFileIsRefusedWithoutReadingIt) {
  // 64 GiB of sparse zeros: refused from its first bytes; allocating its
  // size would fail or kill the process.
  const std::string dir = Dir("huge");
  const std::string path = dir + "/ckpt-0000000000000001";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, off_t{64} << 30), 0);
  ::close(fd);
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_FALSE(loaded.ok());
  EXPECT_CONTAINS(loaded.status().message(), "not a Meridian checkpoint");
  // The same for a log segment.
  const std::string segment = dir + "/log-0000000000000001";
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);
  ASSERT_EQ(::rename(path.c_str(), segment.c_str()), 0);
  ASSERT_EQ(::truncate(segment.c_str(), off_t{64} << 30), 0);
  EXPECT_CONTAINS(ReadLog(dir, Fp(), 0).status().message(),
                  "not a Meridian log segment");
}

TEST(CheckpointDirTest, AStaleTemporaryFileIsIgnoredThenCleaned) {
  const std::string dir = Dir("stale");
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(2)));
  // A crash mid-write of checkpoint 3 left half a file.
  const std::vector<std::byte> half = Encode(MakeCheckpoint(3, 100));
  WriteBytes(dir + "/ckpt-0000000000000003.tmp",
             std::span(half).first(half.size() / 2));
  WriteBytes(dir + "/ckpt-0000000000000009.tmp", Bytes("older crash"));
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_OK(loaded);
  EXPECT_EQ(loaded->checkpoint->sequence, 2u);
  EXPECT_TRUE(loaded->refused.empty());
  EXPECT_EQ(Names(dir).size(), 3u);  // loading deletes nothing
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(3)));
  EXPECT_EQ(Names(dir), (std::vector<std::string>{"ckpt-0000000000000002",
                                                  "ckpt-0000000000000003"}));
  // PruneCheckpoints cleans them too.
  WriteBytes(dir + "/ckpt-0000000000000004.tmp", Bytes("x"));
  ASSERT_OK(PruneCheckpoints(dir, 3));
  EXPECT_EQ(Names(dir), std::vector<std::string>{"ckpt-0000000000000003"});
  EXPECT_OK(PruneCheckpoints(dir + "/missing", 3));
}

TEST(CheckpointDirTest, WriteErrorsNameThePathAndLeaveTheOldState) {
  const std::string dir = Dir("errors");
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(1)));

  // The directory cannot be created: its parent is a file.
  WriteBytes(dir + "/file", Bytes("x"));
  Status status = WriteCheckpoint(dir + "/file/sub", MakeCheckpoint(2));
  ASSERT_FALSE(status.ok());
  EXPECT_CONTAINS(status.message(), "'" + dir + "/file/sub'");

  // The final name is taken by a directory: the rename fails.
  fs::create_directories(dir + "/ckpt-0000000000000002/x");
  status = WriteCheckpoint(dir, MakeCheckpoint(2));
  ASSERT_FALSE(status.ok());
  EXPECT_CONTAINS(status.message(), "cannot rename '" + dir +
                                        "/ckpt-0000000000000002.tmp' to '" +
                                        dir + "/ckpt-0000000000000002'");
  fs::remove_all(dir + "/ckpt-0000000000000002");

  // The disk is "full" mid-write (file size limit: EFBIG).
  {
    FileSizeLimit limit(16 * 1024);
    status = WriteCheckpoint(dir, MakeCheckpoint(3, 100000));
  }
  ASSERT_FALSE(status.ok());
  EXPECT_CONTAINS(status.message(),
                  "cannot write '" + dir + "/ckpt-0000000000000003.tmp'");
  EXPECT_CONTAINS(status.message(), "File too large");
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);

  // Nothing of the failed writes is left; the old checkpoint loads.
  EXPECT_EQ(Names(dir),
            (std::vector<std::string>{"ckpt-0000000000000001", "file"}));
  EXPECT_EQ(LoadLatest(dir, Fp())->checkpoint->sequence, 1u);
}

// Runs `body` where file permissions apply: in this process, or, when it
// runs as root (whose CAP_DAC_OVERRIDE ignores them), in a child process
// that became `nobody`. Returns what `body` returned, or "SKIP: why".
std::string RunUnprivileged(const std::function<std::string()>& body) {
  if (::geteuid() != 0) return body();
  int fds[2];
  if (::pipe(fds) != 0) return "SKIP: pipe failed";
  const pid_t pid = ::fork();
  if (pid < 0) return "SKIP: fork failed";
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 ||
        ::setuid(65534) != 0) {
      out = "SKIP: cannot become nobody";
    } else {
      out = body();
    }
    const ssize_t n = ::write(fds[1], out.data(), out.size());
    ::_exit(n == static_cast<ssize_t>(out.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buffer, sizeof(buffer))) > 0) {
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return "child failed: " + out;
  }
  return out;
}

TEST(CheckpointDirTest, AnUnwritableDirectoryIsAnError) {
  const std::string dir = Dir("readonly");
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(1)));
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  const std::string written = RunUnprivileged(
      [&] { return WriteCheckpoint(dir, MakeCheckpoint(2)).ToString(); });
  if (written.starts_with("SKIP: ")) GTEST_SKIP() << written;
  EXPECT_EQ(written, "FAILED_PRECONDITION: cannot create '" + dir +
                         "/ckpt-0000000000000002.tmp': Permission denied");
  // A directory that cannot be listed is an error, not "no checkpoint".
  ASSERT_EQ(::chmod(dir.c_str(), 0300), 0);
  const std::string loaded = RunUnprivileged(
      [&] { return LoadLatest(dir, Fp()).status().ToString(); });
  EXPECT_EQ(loaded, "FAILED_PRECONDITION: cannot list directory '" + dir +
                        "': Permission denied");
  ::chmod(dir.c_str(), 0755);
  EXPECT_EQ(*ListCheckpoints(dir), std::vector<uint64_t>{1});
}

// ---------------------------------------------------------------------------
// Log

std::vector<std::byte> Record(int i, size_t size) {
  std::vector<std::byte> r(size);
  for (size_t j = 0; j < size; ++j) {
    r[j] = std::byte{static_cast<uint8_t>(i * 31 + j)};
  }
  return r;
}

std::unique_ptr<LogWriter> OpenLog(const std::string& dir, uint64_t segment,
                                   LogWriterOptions options = {}) {
  Result<std::unique_ptr<LogWriter>> writer =
      LogWriter::Open(dir, Fp(), segment, options);
  EXPECT_OK(writer);
  return writer.ok() ? std::move(writer).value() : nullptr;
}

// Writes segments 1, 2, 3 with `per_segment` records each; returns them.
std::vector<std::vector<std::byte>> WriteThreeSegments(const std::string& dir,
                                                       int per_segment = 3) {
  std::vector<std::vector<std::byte>> records;
  std::unique_ptr<LogWriter> log = OpenLog(dir, 1);
  for (uint64_t s = 1; s <= 3; ++s) {
    if (s > 1) {
      EXPECT_OK(log->Rotate(s));
    }
    for (int i = 0; i < per_segment; ++i) {
      records.push_back(
          Record(static_cast<int>(records.size()), static_cast<size_t>(i * 7)));
      EXPECT_OK(log->Append(records.back()));
    }
  }
  return records;
}

std::string SegmentPath(const std::string& dir, uint64_t segment) {
  return dir + "/" + LogSegmentFileName(segment);
}

TEST(LogTest, RoundTrip) {
  for (bool sync : {false, true}) {
    const std::string dir = Dir("log");
    std::unique_ptr<LogWriter> log =
        OpenLog(dir, 5, {.fsync_each_append = sync});
    ASSERT_NE(log, nullptr);
    std::vector<std::vector<std::byte>> records = {
        Record(0, 0), Record(1, 1), Record(2, 100000), Record(3, 17)};
    ASSERT_OK(log->Append(records[0]));
    ASSERT_OK(log->Append(records[1]));
    ASSERT_OK(log->Rotate(9));
    EXPECT_EQ(log->segment(), 9u);
    ASSERT_OK(log->Append(records[2]));
    ASSERT_OK(log->Append(records[3]));
    EXPECT_FALSE(log->Rotate(9).ok());  // must move forward
    EXPECT_TRUE(log->repair_note().empty());
    EXPECT_EQ(*ListLogSegments(dir), (std::vector<uint64_t>{5, 9}));

    Result<LogContents> read = ReadLog(dir, Fp(), 0);
    ASSERT_OK(read);
    ASSERT_EQ(read->records.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(read->records[i].payload, records[i]) << i;
      EXPECT_EQ(read->records[i].segment, i < 2 ? 5u : 9u) << i;
    }
    EXPECT_EQ(read->last_segment, 9u);
    EXPECT_EQ(read->ignored_bytes, 0u);
    EXPECT_TRUE(read->ignored_note.empty());

    read = ReadLog(dir, Fp(), 6);
    ASSERT_OK(read);
    ASSERT_EQ(read->records.size(), 2u);
    EXPECT_EQ(read->records[0].payload, records[2]);
    // The file is the documented format, byte for byte.
    EXPECT_EQ(ReadBytes(SegmentPath(dir, 9)),
              HandMadeSegment(9, 5, Fp(), {records[2], records[3]}));
  }
}

TEST(LogTest, MissingOrEmptyLogIsEmpty) {
  const std::string dir = Dir("nolog");
  for (const std::string& d : {dir, dir + "/missing"}) {
    Result<LogContents> read = ReadLog(d, Fp(), 0);
    ASSERT_OK(read);
    EXPECT_TRUE(read->records.empty());
    EXPECT_EQ(read->last_segment, kNoSegment);
  }
}

TEST(LogTest, ATornLastRecordIsIgnoredAtEveryCut) {
  const std::string dir = Dir("torn");
  const std::vector<std::vector<std::byte>> records = WriteThreeSegments(dir);
  const std::string last = SegmentPath(dir, 3);
  const std::vector<std::byte> full = ReadBytes(last);
  const size_t header = 32 + Fp().size() + 4;
  // Record boundaries of segment 3 (records 6, 7, 8 of 0, 7, 14 bytes).
  const std::vector<size_t> ends = {header, header + 8, header + 8 + 15,
                                    header + 8 + 15 + 22};
  ASSERT_EQ(ends.back(), full.size());
  for (size_t cut = header; cut < full.size(); ++cut) {
    WriteBytes(last, std::span(full).first(cut));
    Result<LogContents> read = ReadLog(dir, Fp(), 0);
    ASSERT_OK(read) << cut << ": " << read.status();
    size_t complete = 0;
    while (complete + 1 < ends.size() && ends[complete + 1] <= cut) {
      ++complete;
    }
    EXPECT_EQ(read->records.size(), 6 + complete) << cut;
    EXPECT_EQ(read->ignored_bytes, cut - ends[complete]) << cut;
    EXPECT_EQ(read->ignored_note.empty(), cut == ends[complete]) << cut;
    for (size_t i = 0; i < read->records.size(); ++i) {
      ASSERT_EQ(read->records[i].payload, records[i]) << cut;
    }
  }
}

TEST(LogTest, ATornTailIsReportedThenCutByTheNextWriter) {
  const std::string dir = Dir("repair");
  const std::vector<std::vector<std::byte>> records = WriteThreeSegments(dir);
  const std::string last = SegmentPath(dir, 3);
  std::vector<std::byte> bytes = ReadBytes(last);
  const size_t size = bytes.size();
  // A crash mid-append: a record header that promises more than is there.
  Append<uint32_t>(&bytes, 1000);
  Append<uint32_t>(&bytes, 0x12345678);
  AppendText(&bytes, "partial");
  WriteBytes(last, bytes);
  Result<LogContents> read = ReadLog(dir, Fp(), 0);
  ASSERT_OK(read);
  EXPECT_EQ(read->records.size(), records.size());
  EXPECT_EQ(read->ignored_bytes, 15u);
  EXPECT_CONTAINS(read->ignored_note, last + ": record at offset " +
                                          std::to_string(size) +
                                          ": declares 1000 bytes, 7 left");
  // A restarted writer continues above the last segment and cuts the torn
  // tail first: segment 3 is no longer the newest.
  EXPECT_EQ(LogWriter::Open(dir, Fp(), 3).status().code(),
            StatusCode::kFailedPrecondition);
  std::unique_ptr<LogWriter> log = OpenLog(dir, read->last_segment + 1);
  ASSERT_NE(log, nullptr);
  EXPECT_CONTAINS(log->repair_note(), "cut 15 torn bytes off " + last);
  EXPECT_EQ(ReadBytes(last).size(), size);
  ASSERT_OK(log->Append(Record(99, 5)));
  read = ReadLog(dir, Fp(), 0);
  ASSERT_OK(read);
  EXPECT_EQ(read->records.size(), records.size() + 1);
  EXPECT_EQ(read->records.back().segment, 4u);
  EXPECT_EQ(read->ignored_bytes, 0u);
}

TEST(LogTest, CorruptionInTheLastSegmentStopsReading) {
  const std::string dir = Dir("lastcorrupt");
  const std::vector<std::vector<std::byte>> records = WriteThreeSegments(dir);
  const std::string last = SegmentPath(dir, 3);
  const std::vector<std::byte> full = ReadBytes(last);
  const size_t header = 32 + Fp().size() + 4;
  // Any byte of a record: reading stops before it, never returns it.
  for (size_t i = header; i < full.size(); ++i) {
    std::vector<std::byte> bad = full;
    bad[i] ^= std::byte{0x40};
    WriteBytes(last, bad);
    Result<LogContents> read = ReadLog(dir, Fp(), 0);
    ASSERT_OK(read) << i << ": " << read.status();
    ASSERT_LT(read->records.size(), records.size()) << i;
    EXPECT_GT(read->ignored_bytes, 0u) << i;
    for (size_t r = 0; r < read->records.size(); ++r) {
      ASSERT_EQ(read->records[r].payload, records[r]) << i;
    }
  }
  // Any byte of its header: an error (the header is written atomically).
  for (size_t i = 0; i < header; ++i) {
    std::vector<std::byte> bad = full;
    bad[i] ^= std::byte{0x40};
    WriteBytes(last, bad);
    EXPECT_FALSE(ReadLog(dir, Fp(), 0).ok()) << i;
  }
}

TEST(LogTest, AnyCorruptionOfAnOlderSegmentIsAnError) {
  const std::string dir = Dir("midcorrupt");
  WriteThreeSegments(dir);
  const std::string middle = SegmentPath(dir, 2);
  const std::vector<std::byte> full = ReadBytes(middle);
  for (size_t i = 0; i < full.size(); ++i) {
    std::vector<std::byte> bad = full;
    bad[i] ^= std::byte{0x01};
    WriteBytes(middle, bad);
    Result<LogContents> read = ReadLog(dir, Fp(), 0);
    ASSERT_FALSE(read.ok()) << i;
    EXPECT_CONTAINS(read.status().message(), middle) << i;
  }
  // Truncated: a torn tail in an older segment is an error too.
  const size_t header = 32 + Fp().size() + 4;
  for (size_t cut = 0; cut < full.size(); ++cut) {
    if (cut == header || cut == header + 8 || cut == header + 8 + 15) {
      continue;  // a record boundary: a shorter but well-formed segment
    }
    WriteBytes(middle, std::span(full).first(cut));
    Result<LogContents> read = ReadLog(dir, Fp(), 0);
    ASSERT_FALSE(read.ok()) << cut;
    EXPECT_EQ(read.status().code(), StatusCode::kDataLoss) << cut;
  }
  WriteBytes(middle, std::span(full).first(full.size() - 3));
  EXPECT_CONTAINS(ReadLog(dir, Fp(), 0).status().message(),
                  "log segment '" + middle + "': record at offset " +
                      std::to_string(header + 8 + 15) +
                      ": declares 14 bytes, 11 left: corrupt");
  // Reading from the segment after it does not look at it.
  EXPECT_OK(ReadLog(dir, Fp(), 3));
}

TEST(LogTest, AMissingSegmentIsAnError) {
  const std::string dir = Dir("gap");
  WriteThreeSegments(dir);
  ASSERT_TRUE(fs::remove(SegmentPath(dir, 2)));
  Result<LogContents> read = ReadLog(dir, Fp(), 0);
  ASSERT_FALSE(read.ok());
  EXPECT_CONTAINS(read.status().message(),
                  "follows segment 2, but the segment before it is 1");
  read = ReadLog(dir, Fp(), 2);
  ASSERT_FALSE(read.ok());
  EXPECT_CONTAINS(read.status().message(),
                  "follows segment 2, which is missing");
  EXPECT_OK(ReadLog(dir, Fp(), 3));
}

TEST(LogTest, ForeignAndMisnamedSegmentsAreRefused) {
  const std::string dir = Dir("logforeign");
  const std::string other = CheckpointFingerprint("cifar", "us", 7, "3f2a9c");
  WriteBytes(SegmentPath(dir, 1), HandMadeSegment(1, kNoSegment, other, {}));
  Result<LogContents> read = ReadLog(dir, Fp(), 0);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_CONTAINS(read.status().message(),
                  "belongs to job 'cifar' site 'us' seed 7 layout "
                  "3f2a9c, not to job 'mnist'");
  // A writer refuses to continue another job's log.
  EXPECT_EQ(LogWriter::Open(dir, Fp(), 2).status().code(),
            StatusCode::kFailedPrecondition);
  WriteBytes(SegmentPath(dir, 1), HandMadeSegment(4, kNoSegment, Fp(), {}));
  EXPECT_CONTAINS(ReadLog(dir, Fp(), 0).status().message(),
                  "its header says segment 4, its name 1");
  WriteBytes(SegmentPath(dir, 1),
             Bytes(std::string_view("MRDNULOG\x02\0\0\0 and more", 21)));
  EXPECT_CONTAINS(ReadLog(dir, Fp(), 0).status().message(), "format version 2");
  WriteBytes(SegmentPath(dir, 1), Bytes("hello"));
  EXPECT_CONTAINS(ReadLog(dir, Fp(), 0).status().message(),
                  "not a Meridian log segment");
}

TEST(LogTest, PruneDeletesOlderSegments) {
  const std::string dir = Dir("prune");
  const std::vector<std::vector<std::byte>> records = WriteThreeSegments(dir);
  ASSERT_OK(PruneLog(dir, 3));
  EXPECT_EQ(*ListLogSegments(dir), std::vector<uint64_t>{3});
  Result<LogContents> read = ReadLog(dir, Fp(), 3);
  ASSERT_OK(read);
  ASSERT_EQ(read->records.size(), 3u);
  EXPECT_EQ(read->records[0].payload, records[6]);
  EXPECT_OK(PruneLog(dir + "/missing", 3));
}

TEST(LogTest, OpenCleansStaleTemporaryFiles) {
  const std::string dir = Dir("logtmp");
  WriteThreeSegments(dir);
  WriteBytes(dir + "/log-0000000000000004.tmp", Bytes("MRDN"));
  std::unique_ptr<LogWriter> log = OpenLog(dir, 4);
  ASSERT_NE(log, nullptr);
  EXPECT_FALSE(fs::exists(dir + "/log-0000000000000004.tmp"));
  EXPECT_OK(ReadLog(dir, Fp(), 0));
}

TEST(LogTest, AFailedAppendLeavesNoTornRecord) {
  const std::string dir = Dir("logfull");
  std::unique_ptr<LogWriter> log = OpenLog(dir, 1);
  ASSERT_NE(log, nullptr);
  ASSERT_OK(log->Append(Record(0, 10)));
  {
    // Room for part of the next record only.
    FileSizeLimit limit(log->segment_bytes() + 100);
    const Status status = log->Append(Record(1, 1000));
    ASSERT_FALSE(status.ok());
    EXPECT_CONTAINS(status.message(),
                    "cannot write '" + SegmentPath(dir, 1) + "'");
  }
  ASSERT_OK(log->Append(Record(2, 10)));
  Result<LogContents> read = ReadLog(dir, Fp(), 0);
  ASSERT_OK(read);
  ASSERT_EQ(read->records.size(), 2u);
  EXPECT_EQ(read->records[1].payload, Record(2, 10));
  EXPECT_EQ(read->ignored_bytes, 0u);
}

// ---------------------------------------------------------------------------
// CheckpointWriter

// A write function that records what it writes and can be held.
class FakeDisk {
 public:
  Status Write(const std::string&, const Checkpoint& c) {
    std::unique_lock<std::mutex> lock(mu_);
    started_.push_back(c.sequence);
    cv_.notify_all();
    cv_.wait(lock, [&] { return !hold_; });
    if (fail_.count(c.sequence) > 0) {
      return UnavailableError("disk says no to " + std::to_string(c.sequence));
    }
    written_.push_back(c.sequence);
    return Status::Ok();
  }
  void Hold(bool hold) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = hold;
    cv_.notify_all();
  }
  void Fail(uint64_t sequence) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_.insert(sequence);
  }
  void WaitStarted(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return started_.size() >= n; });
  }
  std::vector<uint64_t> written() {
    std::lock_guard<std::mutex> lock(mu_);
    return written_;
  }
  std::vector<uint64_t> started() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  std::set<uint64_t> fail_;
  std::vector<uint64_t> started_;
  std::vector<uint64_t> written_;
};

CheckpointWriterOptions FakeOptions(FakeDisk* disk, uint64_t durable = 0) {
  CheckpointWriterOptions options;
  options.dir = "unused";
  options.durable_sequence = durable;
  options.write = [disk](const std::string& dir, const Checkpoint& c) {
    return disk->Write(dir, c);
  };
  return options;
}

TEST(CheckpointWriterTest, WritesToDiskAndReportsDurableSequence) {
  const std::string dir = Dir("writer");
  CheckpointWriter writer({.dir = dir, .durable_sequence = 4});
  EXPECT_EQ(writer.durable_sequence(), 4u);
  EXPECT_FALSE(writer.Submit(MakeCheckpoint(5, 1000)));
  EXPECT_OK(writer.Flush());
  EXPECT_EQ(writer.durable_sequence(), 5u);
  EXPECT_EQ(writer.stats().written, 1u);
  EXPECT_EQ(LoadLatest(dir, Fp())->checkpoint->sequence, 5u);
  EXPECT_OK(writer.Flush());  // nothing submitted since: returns
}

TEST(CheckpointWriterTest, ANewerSubmissionReplacesAPendingOne) {
  FakeDisk disk;
  disk.Hold(true);
  CheckpointWriter writer(FakeOptions(&disk));
  EXPECT_FALSE(writer.Submit(MakeCheckpoint(1)));
  disk.WaitStarted(1);                             // 1 is being written, held
  EXPECT_FALSE(writer.Submit(MakeCheckpoint(2)));  // pending
  EXPECT_TRUE(writer.Submit(MakeCheckpoint(3)));   // replaces 2
  EXPECT_TRUE(writer.Submit(MakeCheckpoint(4)));   // replaces 3
  EXPECT_EQ(writer.durable_sequence(), 0u);
  disk.Hold(false);
  EXPECT_OK(writer.Flush());
  EXPECT_EQ(disk.written(), (std::vector<uint64_t>{1, 4}));
  EXPECT_EQ(writer.durable_sequence(), 4u);
  const CheckpointWriter::Stats stats = writer.stats();
  EXPECT_EQ(stats.written, 2u);
  EXPECT_EQ(stats.replaced, 2u);
  EXPECT_EQ(stats.failed, 0u);
}

TEST(CheckpointWriterTest, FailuresAreReportedAndDoNotAdvance) {
  FakeDisk disk;
  disk.Fail(2);
  CheckpointWriter writer(FakeOptions(&disk, 1));
  writer.Submit(MakeCheckpoint(2));
  const Status status = writer.Flush();
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_CONTAINS(status.message(), "disk says no to 2");
  EXPECT_EQ(writer.last_error(), status);
  EXPECT_EQ(writer.durable_sequence(), 1u);
  EXPECT_EQ(writer.stats().failed, 1u);
  writer.Submit(MakeCheckpoint(3));
  EXPECT_OK(writer.Flush());
  EXPECT_OK(writer.last_error());
  EXPECT_EQ(writer.durable_sequence(), 3u);
}

TEST(CheckpointWriterTest, RealWriteErrorsNameThePath) {
  const std::string dir = Dir("writer-error");
  WriteBytes(dir + "/file", Bytes("x"));
  CheckpointWriter writer({.dir = dir + "/file/sub"});
  writer.Submit(MakeCheckpoint(1));
  const Status status = writer.Flush();
  ASSERT_FALSE(status.ok());
  EXPECT_CONTAINS(status.message(), dir + "/file/sub");
  EXPECT_EQ(writer.durable_sequence(), 0u);
}

TEST(CheckpointWriterTest, DestructorFinishesTheWriteInProgress) {
  FakeDisk disk;
  disk.Hold(true);
  auto writer = std::make_unique<CheckpointWriter>(FakeOptions(&disk));
  writer->Submit(MakeCheckpoint(1));
  disk.WaitStarted(1);
  writer->Submit(MakeCheckpoint(2));  // pending: dropped by the destructor
  std::thread destroy([&] { writer.reset(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(disk.written().empty());  // still held: the destructor waits
  disk.Hold(false);
  destroy.join();
  EXPECT_EQ(disk.written(), std::vector<uint64_t>{1});
  EXPECT_EQ(disk.started(), std::vector<uint64_t>{1});
}

TEST(CheckpointWriterTest, ManyThreadsSubmitting) {
  const std::string dir = Dir("writer-threads");
  CheckpointWriter writer({.dir = dir});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&writer, t] {
      for (uint64_t i = 1; i <= 20; ++i) {
        writer.Submit(MakeCheckpoint(t * 100 + i, 50));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_OK(writer.Flush());
  const CheckpointWriter::Stats stats = writer.stats();
  EXPECT_EQ(stats.written + stats.replaced, 80u);
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_OK(loaded);
  EXPECT_EQ(loaded->checkpoint->sequence, writer.durable_sequence());
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
      "tests/runtime/checkpoint_test.cc)";
  EXPECT_EQ(files, seeds.size()) << hint;
  for (const Seed& seed : seeds) {
    EXPECT_TRUE(ReadBytes(dir / seed.name) == seed.bytes)
        << seed.name << ": " << hint;
  }
}

TEST(CheckpointWriterTest, ReportsHowLongTheLastWriteTook) {
  FakeDisk disk;
  disk.Hold(true);
  CheckpointWriter writer(FakeOptions(&disk));
  EXPECT_EQ(writer.stats().last_write_s, 0.0);
  writer.Submit(MakeCheckpoint(1));
  disk.WaitStarted(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  disk.Hold(false);
  ASSERT_OK(writer.Flush());
  EXPECT_GE(writer.stats().last_write_s, 0.05);
}

// ---------------------------------------------------------------------------
// SiteCheckpointer: when a checkpoint is due

TEST(EarlyCheckpointSpacingTest, FollowsTheWriteCostWithinBounds) {
  EXPECT_DOUBLE_EQ(EarlyCheckpointSpacing(0.0, 10), 0.1);    // floor
  EXPECT_DOUBLE_EQ(EarlyCheckpointSpacing(0.01, 10), 0.1);
  EXPECT_DOUBLE_EQ(EarlyCheckpointSpacing(0.08, 10), 0.4);   // 5 × cost
  EXPECT_DOUBLE_EQ(EarlyCheckpointSpacing(4.0, 10), 10.0);   // the period
  EXPECT_DOUBLE_EQ(EarlyCheckpointSpacing(4.0, 0), 20.0);    // no period
}

TEST(SiteCheckpointerTest, EarlyCheckpointsFollowTheWriteNotASecond) {
  const std::string dir = Dir("site-due");
  Result<std::unique_ptr<SiteCheckpointer>> opened = SiteCheckpointer::Open(
      {.dir = dir, .fingerprint = Fp(), .period_s = 10}, /*resume=*/false);
  ASSERT_OK(opened);
  SiteCheckpointer& checkpointer = **opened;
  EXPECT_TRUE(checkpointer.Due(100.0, false));  // none yet
  checkpointer.Submit(pb::SiteCheckpoint(), {{"model", {1, 2, 3}}}, 100.0);
  // Written but not yet taken as durable: an early one waits for it.
  ASSERT_OK(checkpointer.Flush());
  EXPECT_FALSE(checkpointer.Due(100.5, true));
  EXPECT_TRUE(checkpointer.TakeDurable().has_value());
  // Wanted checkpoints follow after EarlyCheckpointSpacing (0.1 s for a
  // write under 20 ms; the old rule waited a second), unwanted ones wait
  // for the period.
  const double spacing =
      EarlyCheckpointSpacing(checkpointer.last_write_s(), 10);
  EXPECT_FALSE(checkpointer.Due(100.0 + 0.9 * spacing, true));
  EXPECT_TRUE(checkpointer.Due(100.0 + spacing + 1e-9, true));
  EXPECT_FALSE(checkpointer.Due(100.0 + spacing + 1e-9, false));
  EXPECT_FALSE(checkpointer.Due(109.9, false));
  EXPECT_TRUE(checkpointer.Due(110.0, false));
}

}  // namespace
}  // namespace meridian
