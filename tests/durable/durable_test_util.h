// Helpers shared by the tests of src/durable: a standard checkpoint, files
// built by hand as the formats document them (checkpoint_codec.h,
// log_format.h), byte edits, and a file size limit that makes writes fail.
#ifndef MERIDIAN_TESTS_DURABLE_DURABLE_TEST_UTIL_H_
#define MERIDIAN_TESTS_DURABLE_DURABLE_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "durable/checkpoint.h"

namespace meridian::durable_test {

// Passes when `text` contains `part`; prints both otherwise.
inline ::testing::AssertionResult Contains(const char* text_expr, const char*,
                                           const std::string& text,
                                           const std::string& part) {
  if (text.find(part) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << text_expr << " is \"" << text << "\", without \"" << part << "\"";
}
#define EXPECT_CONTAINS(text, part) \
  EXPECT_PRED_FORMAT2(::meridian::durable_test::Contains, text, part)

// The fingerprint of the tests' job: "job 'mnist' site 'us' seed 7 ...".
const std::string& Fp();

std::vector<std::byte> ReadBytes(const std::string& path);
void WriteBytes(const std::string& path, std::span<const std::byte> bytes);
std::vector<std::byte> Bytes(std::string_view text);

// A checkpoint with a meta blob (NUL bytes included), and arrays holding
// NaN, infinities, -0 and subnormals, plus an empty one.
Checkpoint MakeCheckpoint(uint64_t sequence, size_t elements = 10,
                          const std::string& fingerprint = Fp());

// Bitwise equality (NaN != NaN under ==).
void ExpectSameCheckpoint(const Checkpoint& a, const Checkpoint& b);

// EncodeCheckpoint, expected to succeed.
std::vector<std::byte> Encode(const Checkpoint& c);

// zlib's CRC-32 of `bytes`, continuing from `crc`.
uint32_t Crc(std::span<const std::byte> bytes, uint32_t crc = 0);

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

void AppendText(std::vector<std::byte>* bytes, std::string_view text);

// Recomputes the trailing checksum (after a deliberate edit).
void Reseal(std::vector<std::byte>* bytes);

// A checkpoint file built by hand: header, fingerprint "f", no meta,
// `count` arrays, then `tail` (array contents), sealed.
std::vector<std::byte> HandMadeCheckpoint(uint32_t count,
                                          const std::vector<std::byte>& tail);

// One array of a hand-made checkpoint: declares `count` elements, holds
// `actual_floats`.
std::vector<std::byte> ArrayBytes(std::string_view name, uint64_t count,
                                  size_t actual_floats);

// A log segment built by hand, as log_format.h documents it.
std::vector<std::byte> HandMadeSegment(
    uint64_t segment, uint64_t previous, std::string_view fingerprint,
    const std::vector<std::vector<std::byte>>& records);

// A fresh temporary directory "checkpoint-<name>...".
std::string Dir(const std::string& name);

// The names in `dir`, sorted.
std::vector<std::string> Names(const std::string& dir);

// Log record number `i` of `size` bytes.
std::vector<std::byte> Record(int i, size_t size);

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

}  // namespace meridian::durable_test

#endif  // MERIDIAN_TESTS_DURABLE_DURABLE_TEST_UTIL_H_
