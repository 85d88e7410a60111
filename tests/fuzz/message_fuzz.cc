// libFuzzer target for the wire decoder (DecodeMessage, the checks a
// receiver runs after it and the parse functions composed of them:
// ParseModelPayload, ParseCommit). Besides "no crash, no leak, no out-of-bounds
// read", it checks what an accepted message promises, so that a decoder
// that lets a bad message through is a finding too.
//
// Input framing (any byte string maps to some frames):
//   byte 0           number of payload frames P (0..255)
//   then P + 1 times [4-byte little-endian length L][L bytes]
//                    frame 0 is the header, frames 1..P the payloads.
// A length is clamped to the bytes left; a length prefix cut short by the
// end of the input is zero-padded. Bytes after the last frame are ignored.
// Each frame is copied into its own heap block of exactly its size so that
// AddressSanitizer catches a read past any frame's end.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "meridian/core/layout.h"
#include "meridian/net/message.h"
#include "meridian/wire.pb.h"

namespace {

using meridian::FrameView;
using meridian::ModelLayout;
using meridian::TensorInfo;
using meridian::Check;
using meridian::Rejection;
namespace pb = meridian::pb;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "message_fuzz: invariant violated: %s\n", what);
  std::abort();
}

void Require(bool condition, const char* what) {
  if (!condition) Fail(what);
}

// The fixed layout the seed corpus is written for: w[2,3] and b[3].
const ModelLayout& FuzzLayout() {
  static const ModelLayout* const layout = [] {
    auto* l = new ModelLayout;
    if (!l->Add("w", {2, 3}).ok() || !l->Add("b", {3}).ok()) {
      Fail("cannot build the layout");
    }
    return l;
  }();
  return *layout;
}

std::vector<std::vector<std::byte>> SplitFrames(const uint8_t* data,
                                                size_t size) {
  std::vector<std::vector<std::byte>> frames;
  if (size == 0) {
    frames.emplace_back();  // an empty header frame
    return frames;
  }
  const size_t count = size_t{data[0]} + 1;
  size_t pos = 1;
  frames.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    uint32_t length = 0;
    const size_t prefix = std::min<size_t>(4, size - pos);
    for (size_t b = 0; b < prefix; ++b) {
      length |= uint32_t{data[pos + b]} << (8 * b);
    }
    pos += prefix;
    const size_t take = std::min<size_t>(length, size - pos);
    frames.emplace_back(take);
    if (take > 0) std::memcpy(frames.back().data(), data + pos, take);
    pos += take;
  }
  return frames;
}

std::span<const std::byte> View(const std::vector<std::byte>& frame) {
  return {frame.data(), frame.size()};
}

void CheckRejection(const Rejection& rejection) {
  Require(rejection.code != pb::ERROR_CODE_UNSPECIFIED,
          "rejection without an error code");
  Require(pb::ErrorCode_IsValid(rejection.code), "invalid error code");
  Require(!rejection.reason.empty(), "rejection without a reason");
  Require(!rejection.ToStatus().ok(), "rejection converts to OK");
}

// Independent re-statement of what CheckSlicesAgainstLayout promises.
bool SliceInside(const pb::TensorSlice& slice, const ModelLayout& layout) {
  const TensorInfo* tensor = layout.Find(slice.tensor());
  if (tensor == nullptr) return false;
  const unsigned __int128 end =
      static_cast<unsigned __int128>(slice.offset()) + slice.length();
  return end <= tensor->size;
}

// DecodeRows (a site server's decoder of sparse commits): what it accepts
// is a whole-tensor slice whose rows ascend inside the tensor, with
// exactly their values, all finite.
void CheckRows(const pb::TensorSlice& slice, std::span<const std::byte> bytes,
               const ModelLayout& layout) {
  const TensorInfo* tensor = layout.Find(slice.tensor());
  if (tensor == nullptr) return;
  meridian::Parsed<meridian::DecodedRows> decoded =
      meridian::DecodeRows(slice, *tensor, bytes);
  if (!decoded.ok()) {
    CheckRejection(decoded.rejection());
    return;
  }
  const meridian::DecodedRows& rows = *decoded;
  Require(slice.offset() == 0 && slice.length() == tensor->size,
          "rows: accepted a partial slice");
  Require(
      rows.row_length == meridian::RowLength(*tensor) && rows.row_length > 0,
      "rows: wrong row length");
  Require(bytes.size() ==
              meridian::RowsPayloadBytes(rows.rows.size(), rows.row_length),
          "rows: accepted a payload of the wrong size");
  Require(rows.values.size() == rows.rows.size() * rows.row_length,
          "rows: values do not fill the rows");
  for (size_t k = 0; k < rows.rows.size(); ++k) {
    Require(rows.rows[k] < tensor->shape[0], "rows: row out of range");
    Require(k == 0 || rows.rows[k] > rows.rows[k - 1],
            "rows: rows not ascending");
  }
  for (float v : rows.values) {
    Require(std::isfinite(v), "rows: accepted a non-finite value");
  }
}

// The rejection of the checks ParseModelPayload composes, in its order
// (an independent re-statement of the sequence); nullopt: all accept.
std::optional<Rejection> ComposedRejection(const pb::Header& header,
                                           std::span<const FrameView> payload,
                                           const ModelLayout& layout) {
  if (Check c = meridian::CheckSlicesAgainstLayout(header, layout, true);
      !c.ok()) {
    return c.rejection();
  }
  if (Check c = meridian::CheckCodec(header, pb::CODEC_RAW, pb::CODEC_ROWS);
      !c.ok()) {
    return c.rejection();
  }
  for (int i = 0; i < header.slices_size(); ++i) {
    const pb::TensorSlice& slice = header.slices(i);
    if (slice.codec() == pb::CODEC_ROWS) {
      const meridian::Parsed<meridian::DecodedRows> rows =
          meridian::DecodeRows(slice, layout.tensors()[i], payload[i].bytes);
      if (!rows.ok()) return rows.rejection();
    } else if (Check c = meridian::CheckFinite(slice, payload[i].bytes);
               !c.ok()) {
      return c.rejection();
    }
  }
  return std::nullopt;
}

void RequireSameRejection(const Rejection& got, const Rejection& expected,
                          const char* what) {
  CheckRejection(got);
  Require(got.code == expected.code && got.reason == expected.reason, what);
}

// What ParseModelPayload accepts holds, per tensor of the layout, exactly
// the frame's values (finite) or its decoded rows.
void CheckModelPayloadValue(const meridian::ModelPayload& parsed,
                            const pb::Header& header,
                            std::span<const FrameView> payload,
                            const ModelLayout& layout) {
  Require(parsed.tensors.size() == layout.tensors().size(),
          "payload: not one entry per tensor");
  for (size_t t = 0; t < parsed.tensors.size(); ++t) {
    const meridian::TensorPayload& tensor = parsed.tensors[t];
    Require(tensor.tensor == &layout.tensors()[t], "payload: wrong tensor");
    const std::span<const std::byte> bytes = payload[t].bytes;
    if (header.slices(static_cast<int>(t)).codec() == pb::CODEC_ROWS) {
      Require(tensor.rows.has_value() && tensor.values.empty(),
              "payload: a ROWS slice without its rows");
      continue;
    }
    Require(!tensor.rows.has_value(), "payload: rows of a RAW slice");
    Require(tensor.values.size() == tensor.tensor->size &&
                tensor.values.size_bytes() == bytes.size(),
            "payload: values do not cover the tensor");
    Require(bytes.empty() || std::memcmp(tensor.values.data(), bytes.data(),
                                         bytes.size()) == 0,
            "payload: values differ from the frame");
    for (float v : tensor.values) {
      Require(std::isfinite(v), "payload: accepted a non-finite value");
    }
  }
}

// ParseModelPayload and ParseCommit (a site server's reading of a COMMIT,
// a worker's of its MODEL): accepted exactly when every check they compose
// accepts, else refused with the first one's rejection; the same from
// frames at an address not aligned for floats (a copy one byte in).
void CheckParsers(const pb::Header& header, std::span<const FrameView> payload,
                  const ModelLayout& layout) {
  const std::optional<Rejection> expected =
      ComposedRejection(header, payload, layout);
  const meridian::Parsed<meridian::ModelPayload> parsed =
      meridian::ParseModelPayload(header, payload, layout);
  Require(parsed.ok() == !expected.has_value(),
          "ParseModelPayload disagrees with the checks it composes");
  if (!parsed.ok()) {
    RequireSameRejection(parsed.rejection(), *expected,
                         "ParseModelPayload: not the first check's rejection");
  } else {
    CheckModelPayloadValue(*parsed, header, payload, layout);
    std::vector<std::vector<std::byte>> shifted;
    std::vector<FrameView> views;
    shifted.reserve(payload.size());
    for (const FrameView& frame : payload) {
      std::vector<std::byte>& copy =
          shifted.emplace_back(frame.bytes.size() + 1);
      if (!frame.bytes.empty()) {
        std::memcpy(copy.data() + 1, frame.bytes.data(), frame.bytes.size());
      }
      views.push_back(FrameView{std::span<const std::byte>(copy).subspan(1)});
    }
    const meridian::Parsed<meridian::ModelPayload> again =
        meridian::ParseModelPayload(header, views, layout);
    Require(again.ok(), "ParseModelPayload: refused misaligned frames");
    CheckModelPayloadValue(*again, header, views, layout);
  }
  if (header.type() != pb::COMMIT) return;
  const meridian::Parsed<meridian::WorkerCommit> commit =
      meridian::ParseCommit(header, payload, layout);
  const meridian::Parsed<meridian::RowReads> reads =
      meridian::ParseRowReads(header.commit(), layout);
  Require(commit.ok() == (parsed.ok() && reads.ok()),
          "ParseCommit disagrees with its parts");
  if (!commit.ok()) {
    RequireSameRejection(commit.rejection(),
                         parsed.ok() ? reads.rejection() : *expected,
                         "ParseCommit: not the first part's rejection");
    return;
  }
  Require(commit->fields == &header.commit(), "ParseCommit: wrong fields");
  Require(commit->reads == *reads, "ParseCommit: reads differ");
  CheckModelPayloadValue(commit->update, header, payload, layout);
}

void CheckAccepted(const pb::Header& header, std::span<const FrameView> payload,
                   const ModelLayout& layout) {
  // DecodeMessage's promises.
  Require(header.protocol_version() == meridian::kProtocolVersion,
          "accepted a foreign protocol version");
  Require(header.type() != pb::MESSAGE_TYPE_UNSPECIFIED,
          "accepted a message without a type");
  Require(header.slices_size() <= meridian::kMaxSlices,
          "accepted too many slices");
  Require(static_cast<size_t>(header.slices_size()) == payload.size(),
          "accepted a frame count different from the slice count");
  for (int i = 0; i < header.slices_size(); ++i) {
    const pb::TensorSlice& slice = header.slices(i);
    const size_t frame = payload[i].bytes.size();
    Require(slice.dtype() == pb::DTYPE_FLOAT32, "accepted an unknown dtype");
    Require(slice.codec() == pb::CODEC_RAW ||
                slice.codec() == pb::CODEC_PIPELINE ||
                slice.codec() == pb::CODEC_ROWS,
            "accepted an unknown codec");
    Require(slice.payload_bytes() == frame, "accepted payload_bytes != frame");
    if (slice.codec() == pb::CODEC_RAW) {
      Require(slice.length() <= frame / sizeof(float) &&
                  slice.length() * sizeof(float) == frame,
              "accepted length * 4 != frame size");
    }
  }

  // A commit's row reads (ParseRowReads): what it accepts is one entry per
  // tensor, listed rows strictly ascending inside their tensor.
  if (header.has_commit()) {
    const meridian::Parsed<meridian::RowReads> reads =
        meridian::ParseRowReads(header.commit(), layout);
    if (!reads.ok()) {
      CheckRejection(reads.rejection());
    } else {
      const meridian::RowReads& rows = *reads;
      Require(rows.size() == (header.commit().reads_size() == 0
                                  ? 0
                                  : layout.tensors().size()),
              "reads: not one entry per tensor (none without reads)");
      for (size_t t = 0; t < rows.size(); ++t) {
        if (!rows[t]) continue;
        for (size_t k = 0; k < rows[t]->size(); ++k) {
          Require((*rows[t])[k] < layout.tensors()[t].shape[0],
                  "reads: row out of range");
          Require(k == 0 || (*rows[t])[k] > (*rows[t])[k - 1],
                  "reads: rows not ascending");
        }
      }
    }
  }

  // Layout checks, both modes.
  for (const bool whole_model : {false, true}) {
    const Check check =
        meridian::CheckSlicesAgainstLayout(header, layout, whole_model);
    if (!check.ok()) {
      CheckRejection(check.rejection());
      continue;
    }
    uint64_t covered = 0;
    for (int i = 0; i < header.slices_size(); ++i) {
      Require(SliceInside(header.slices(i), layout),
              "accepted a slice outside its tensor");
      covered += header.slices(i).length();
    }
    if (whole_model) {
      Require(
          static_cast<size_t>(header.slices_size()) == layout.tensors().size(),
          "whole model: slice count != tensor count");
      for (int i = 0; i < header.slices_size(); ++i) {
        const pb::TensorSlice& slice = header.slices(i);
        Require(slice.tensor() == layout.tensors()[i].name &&
                    slice.offset() == 0 &&
                    slice.length() == layout.tensors()[i].size,
                "whole model: slice does not cover its tensor");
      }
      Require(covered == layout.num_elements(),
              "whole model: coverage != model size");
    }
  }

  // CheckFinite on every payload whose slice is inside the layout (what a
  // receiver does before touching its model).
  for (int i = 0; i < header.slices_size(); ++i) {
    const pb::TensorSlice& slice = header.slices(i);
    pb::Header single;
    *single.add_slices() = slice;
    const Check in_layout =
        meridian::CheckSlicesAgainstLayout(single, layout, false);
    Require(in_layout.ok() == SliceInside(slice, layout),
            "single-slice layout check disagrees with the range");
    if (!in_layout.ok()) continue;
    const std::span<const std::byte> bytes = payload[i].bytes;
    const Check finite = meridian::CheckFinite(slice, bytes);
    bool all_finite = true;
    for (size_t e = 0; e + sizeof(float) <= bytes.size(); e += sizeof(float)) {
      uint32_t bits;
      std::memcpy(&bits, bytes.data() + e, sizeof(bits));
      if ((bits & 0x7f800000u) == 0x7f800000u) all_finite = false;
    }
    Require(finite.ok() == all_finite, "CheckFinite disagrees with the bits");
    if (!finite.ok()) {
      CheckRejection(finite.rejection());
      Require(finite.rejection().code == pb::ERROR_NON_FINITE,
              "wrong non-finite code");
    }
    if (slice.codec() == pb::CODEC_ROWS) CheckRows(slice, bytes, layout);
  }

  CheckParsers(header, payload, layout);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::vector<std::byte>> frames = SplitFrames(data, size);
  std::vector<FrameView> payload;
  payload.reserve(frames.size() - 1);
  for (size_t i = 1; i < frames.size(); ++i) {
    payload.push_back(FrameView{View(frames[i])});
  }

  meridian::Parsed<pb::Header> decoded =
      meridian::DecodeMessage(View(frames[0]), payload);
  if (!decoded.ok()) {
    (void)meridian::DescribeHeader(meridian::PartialHeader(View(frames[0])));
    CheckRejection(decoded.rejection());
    return 0;
  }
  const pb::Header& header = *decoded;
  (void)meridian::DescribeHeader(header);
  CheckAccepted(header, payload, FuzzLayout());

  // What was accepted stays accepted after a re-encode (a relay forwarding
  // the header must not turn a valid message into an invalid one). Skipped
  // when re-encoding grows the header past the limit: proto2 writes packed
  // repeated fields unpacked.
  std::string reencoded;
  Require(header.SerializeToString(&reencoded), "cannot re-encode");
  if (reencoded.size() <= meridian::kMaxHeaderBytes) {
    const meridian::Parsed<pb::Header> second = meridian::DecodeMessage(
        std::as_bytes(std::span(reencoded)), payload);
    Require(second.ok(), "re-encoded accepted header is rejected");
  }
  return 0;
}
