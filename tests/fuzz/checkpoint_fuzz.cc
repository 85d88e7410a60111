// libFuzzer target for the decoders of a site server's durable state:
// DecodeCheckpoint (src/durable/checkpoint_codec.h) and DecodeLogSegment
// (src/durable/log_reader.h) read
// files a crash may have truncated and a disk may have corrupted. Besides
// "no crash, no leak, no out-of-bounds access, no unbounded allocation",
// it checks what an accepted input promises, so that a decoder that lets a
// bad file through is a finding too:
//   - an accepted checkpoint re-encodes to exactly the input bytes (the
//     format has one encoding per checkpoint);
//   - an accepted log segment's records lie back to back after its header,
//     valid + ignored bytes cover the input, nothing is ignored when a torn
//     tail is not tolerated, and the strict and tolerant readings agree.
//
// Input framing: byte 0 is a mode, the rest the file's bytes.
//   bit 0  0: a checkpoint file; 1: a log segment file (read both as an
//          older segment and as the newest, whose torn tail is tolerated)
//   bit 1  fix the checksums (and a checkpoint's total length) before
//          decoding, so that mutations reach the parser behind them
//   other bits are ignored.
// The seed corpus is tests/fuzz/corpus/checkpoint/ (written by
// tests/durable/checkpoint_codec_test.cc).

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "durable/checkpoint_codec.h"
#include "durable/log_reader.h"
#include "meridian/core/status.h"

namespace {

using meridian::Checkpoint;
using meridian::DecodedLogSegment;
using meridian::Result;
using meridian::Status;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "checkpoint_fuzz: invariant violated: %s\n", what);
  std::abort();
}

void Require(bool condition, const char* what) {
  if (!condition) Fail(what);
}

void CheckRefusal(const Status& status) {
  Require(!status.ok(), "refusal is OK");
  Require(!status.message().empty(), "refusal without a message");
}

uint32_t Crc(std::span<const std::byte> bytes, uint32_t crc = 0) {
  if (bytes.empty()) return crc;  // zlib returns 0 for a null buffer
  return static_cast<uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

template <typename T>
T Load(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

template <typename T>
void Store(std::byte* p, T value) {
  std::memcpy(p, &value, sizeof(T));
}

// Patches the total length (bytes 12..20) and the trailing checksum.
void FixCheckpoint(std::vector<std::byte>* bytes) {
  if (bytes->size() < 24) return;
  Store<uint64_t>(bytes->data() + 12, bytes->size());
  const size_t body = bytes->size() - 4;
  Store<uint32_t>(bytes->data() + body, Crc(std::span(*bytes).first(body)));
}

// Patches the header checksum and every record checksum that fits.
void FixLogSegment(std::vector<std::byte>* bytes) {
  if (bytes->size() < 36) return;
  const uint64_t fingerprint = Load<uint32_t>(bytes->data() + 28);
  if (fingerprint > bytes->size() - 36) return;
  const size_t header = 32 + static_cast<size_t>(fingerprint);
  Store<uint32_t>(bytes->data() + header, Crc(std::span(*bytes).first(header)));
  size_t offset = header + 4;
  while (bytes->size() - offset >= 8) {
    const uint32_t length = Load<uint32_t>(bytes->data() + offset);
    if (length > bytes->size() - offset - 8) return;
    const uint32_t crc = Crc(std::span(*bytes).subspan(offset + 8, length),
                             Crc(std::span(*bytes).subspan(offset, 4)));
    Store<uint32_t>(bytes->data() + offset + 4, crc);
    offset += 8 + length;
  }
}

void FuzzCheckpoint(const std::vector<std::byte>& bytes) {
  Result<Checkpoint> checkpoint = meridian::DecodeCheckpoint(bytes, "fuzz");
  if (!checkpoint.ok()) {
    CheckRefusal(checkpoint.status());
    return;
  }
  Result<std::vector<std::byte>> again =
      meridian::EncodeCheckpoint(*checkpoint);
  Require(again.ok(), "an accepted checkpoint does not re-encode");
  Require(*again == bytes, "an accepted checkpoint re-encodes differently");
}

void CheckSegment(const DecodedLogSegment& segment,
                  const std::vector<std::byte>& bytes, bool tolerant) {
  Require(segment.valid_bytes + segment.ignored_bytes == bytes.size(),
          "valid + ignored bytes do not cover the segment");
  Require(tolerant || segment.ignored_bytes == 0,
          "bytes ignored without a tolerated torn tail");
  Require((segment.ignored_bytes == 0) == segment.ignored_note.empty(),
          "ignored bytes and their note disagree");
  Require(!segment.fingerprint.empty() &&
              segment.fingerprint.size() <= meridian::kMaxFingerprintBytes,
          "fingerprint length outside its bounds");
  size_t offset = 32 + segment.fingerprint.size() + 4;
  for (std::span<const std::byte> record : segment.records) {
    Require(record.data() == bytes.data() + offset + 8,
            "records are not back to back");
    Require(Load<uint32_t>(bytes.data() + offset) == record.size(),
            "a record's size differs from its length field");
    offset += 8 + record.size();
  }
  Require(offset == segment.valid_bytes, "records do not end at valid_bytes");
}

void FuzzLogSegment(const std::vector<std::byte>& bytes) {
  Result<DecodedLogSegment> strict =
      meridian::DecodeLogSegment(bytes, "fuzz", false);
  Result<DecodedLogSegment> lenient =
      meridian::DecodeLogSegment(bytes, "fuzz", true);
  if (strict.ok()) CheckSegment(*strict, bytes, false);
  if (lenient.ok()) CheckSegment(*lenient, bytes, true);
  if (!strict.ok()) CheckRefusal(strict.status());
  if (!lenient.ok()) CheckRefusal(lenient.status());
  if (strict.ok()) {
    Require(lenient.ok() && lenient->records.size() == strict->records.size(),
            "the tolerant reading differs from an accepted strict one");
  }
  if (lenient.ok() && lenient->ignored_bytes == 0) {
    Require(strict.ok(), "a segment without a torn tail is refused");
  }
  if (lenient.ok() && !strict.ok()) {
    Require(lenient->ignored_bytes > 0,
            "refused strictly, but nothing ignored when tolerant");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::vector<std::byte> bytes(size - 1);
  if (size > 1) std::memcpy(bytes.data(), data + 1, size - 1);
  const bool log = (mode & 1) != 0;
  if ((mode & 2) != 0) {
    if (log) {
      FixLogSegment(&bytes);
    } else {
      FixCheckpoint(&bytes);
    }
  }
  if (log) {
    FuzzLogSegment(bytes);
  } else {
    FuzzCheckpoint(bytes);
  }
  return 0;
}
