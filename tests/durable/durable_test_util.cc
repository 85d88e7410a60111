#include "tests/durable/durable_test_util.h"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "testing/status_matchers.h"
#include "testing/test_data.h"

namespace meridian::durable_test {

namespace fs = std::filesystem;

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
Checkpoint MakeCheckpoint(uint64_t sequence, size_t elements,
                          const std::string& fingerprint) {
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

uint32_t Crc(std::span<const std::byte> bytes, uint32_t crc) {
  if (bytes.empty()) return crc;  // zlib returns 0 for a null buffer
  return static_cast<uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
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

std::vector<std::byte> Record(int i, size_t size) {
  std::vector<std::byte> r(size);
  for (size_t j = 0; j < size; ++j) {
    r[j] = std::byte{static_cast<uint8_t>(i * 31 + j)};
  }
  return r;
}

}  // namespace meridian::durable_test
