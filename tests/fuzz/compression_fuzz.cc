// libFuzzer target for the compression decoder (UpdateDecoder and
// InspectEncoded, include/meridian/compression.h). The input is one encoded
// buffer. It is decoded with the checksum ignored, so that mutations reach
// the parser behind it, and again with the checksum verified. Besides "no
// crash, no leak, no out-of-bounds access, no unbounded allocation", it
// checks what an accepted buffer promises, so that a decoder that lets a
// bad buffer through is a finding too:
//   - the entries are strictly increasing, inside the slice, finite, and
//     agree with the header;
//   - DecodeDense, DecodeAdd and DecodeSparse agree;
//   - re-encoding the decoded entries losslessly and decoding again gives
//     the same entries, bit for bit;
//   - with the checksum verified, the result is the same or a refusal.
// The seed corpus is tests/fuzz/corpus/compression/ (written by
// tests/compression/corpus_test.cc).

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "meridian/compression/compression.h"
#include "meridian/job.pb.h"
#include "meridian/core/status.h"

namespace {

using meridian::DecodeOptions;
using meridian::EncodedInfo;
using meridian::SparseUpdate;
using meridian::Status;
using meridian::UpdateDecoder;
namespace pb = meridian::pb;

// The caller's limit: 2^16 elements (about a MB of scratch at most; small
// enough to keep executions fast).
constexpr uint64_t kMaxElements = uint64_t{1} << 16;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "compression_fuzz: invariant violated: %s\n", what);
  std::abort();
}

void Require(bool condition, const char* what) {
  if (!condition) Fail(what);
}

void CheckRefusal(const Status& status) {
  Require(!status.ok(), "refusal is OK");
  Require(!status.message().empty(), "refusal without a message");
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) {
      return false;
    }
  }
  return true;
}

// Decoders kept across inputs, as a receiver keeps them: their scratch
// buffers are reused with every size the fuzzer comes up with.
UpdateDecoder& Unchecked() {
  static UpdateDecoder* const decoder =
      new UpdateDecoder(DecodeOptions{.verify_checksum = false});
  return *decoder;
}

UpdateDecoder& Checked() {
  static UpdateDecoder* const decoder = new UpdateDecoder();
  return *decoder;
}

void CheckAccepted(std::span<const std::byte> bytes,
                   const SparseUpdate& sparse) {
  // The header agrees.
  meridian::Result<EncodedInfo> info =
      meridian::InspectEncoded(bytes, DecodeOptions{.verify_checksum = false});
  Require(info.ok(), "decoded buffer fails InspectEncoded");
  Require(info->size == sparse.size, "size differs from the header");
  Require(info->count == sparse.indices.size(), "count differs from header");
  Require(info->version == meridian::kCompressionFormatVersion,
          "accepted a foreign version");
  Require(sparse.size <= kMaxElements, "accepted a slice above the limit");

  // Sound entries.
  Require(sparse.indices.size() == sparse.values.size(),
          "indices and values differ in number");
  for (size_t j = 0; j < sparse.indices.size(); ++j) {
    Require(sparse.indices[j] < sparse.size, "index outside the slice");
    Require(j == 0 || sparse.indices[j - 1] < sparse.indices[j],
            "indices not strictly increasing");
    Require(std::isfinite(sparse.values[j]), "non-finite value");
  }
  if (info->index_coding == pb::INDEX_DENSE) {
    Require(sparse.indices.size() == sparse.size, "dense buffer not full");
  }

  // Dense, add and sparse agree.
  std::vector<float> expected(sparse.size, 0.0f);
  for (size_t j = 0; j < sparse.indices.size(); ++j) {
    expected[sparse.indices[j]] = sparse.values[j];
  }
  std::vector<float> dense(sparse.size, 1.0f);
  Require(Unchecked().DecodeDense(bytes, dense).ok(),
          "DecodeDense refuses what DecodeSparse accepted");
  Require(SameBits(dense, expected), "DecodeDense differs from DecodeSparse");
  std::vector<float> sum(sparse.size, 0.0f);
  Require(Unchecked().DecodeAdd(bytes, sum).ok(),
          "DecodeAdd refuses what DecodeSparse accepted");
  for (size_t i = 0; i < sum.size(); ++i) {
    Require(sum[i] == expected[i], "DecodeAdd differs from DecodeSparse");
  }
  std::vector<float> wrong(sparse.size + 1);
  Require(!Unchecked().DecodeDense(bytes, wrong).ok(),
          "DecodeDense accepted a destination of the wrong size");

  // A lossless re-encode round-trips bit for bit.
  pb::CompressionConfig lossless;  // SELECT_ALL, AUTO, FP32
  lossless.set_zstd_level(1);
  meridian::Result<meridian::UpdateEncoder> encoder =
      meridian::UpdateEncoder::Create(lossless);
  Require(encoder.ok(), "cannot create the lossless encoder");
  meridian::Result<meridian::EncodedUpdate> again =
      encoder->EncodeSparse(sparse.size, sparse.indices, sparse.values, {});
  Require(again.ok(), "cannot re-encode an accepted update");
  SparseUpdate round_trip;
  Require(Checked().DecodeSparse(again->bytes, kMaxElements, &round_trip).ok(),
          "re-encoded update is refused");
  Require(round_trip.size == sparse.size &&
              round_trip.indices == sparse.indices &&
              SameBits(round_trip.values, sparse.values),
          "re-encoded update decodes differently");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(
      reinterpret_cast<const std::byte*>(data), size);

  SparseUpdate sparse;
  const Status status = Unchecked().DecodeSparse(bytes, kMaxElements, &sparse);
  if (status.ok()) {
    CheckAccepted(bytes, sparse);
  } else {
    CheckRefusal(status);
    std::vector<float> dense(64);
    Require(!Unchecked().DecodeDense(bytes, dense).ok(),
            "DecodeDense accepts what DecodeSparse refused");
  }
  (void)meridian::InspectEncoded(bytes);

  // With the checksum verified: the same result, or a refusal.
  SparseUpdate checked;
  const Status verified = Checked().DecodeSparse(bytes, kMaxElements, &checked);
  if (verified.ok()) {
    Require(status.ok(), "the checksum turns a refusal into a success");
    Require(checked.size == sparse.size && checked.indices == sparse.indices &&
                SameBits(checked.values, sparse.values),
            "the checksum changes the decoded update");
  } else {
    CheckRefusal(verified);
  }
  return 0;
}
