// Wire messages: a Protobuf pb::Header in frame 0 and one raw payload frame
// per header slice. This file holds the pure (socket-free) parts: building
// headers, decoding frames and validating them against a model layout, so
// that the decoder can be unit-tested and fuzzed without a network.
#ifndef MERIDIAN_NET_MESSAGE_H_
#define MERIDIAN_NET_MESSAGE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "meridian/core/layout.h"
#include "meridian/core/status.h"
#include "meridian/wire.pb.h"

namespace meridian {

// A model layout in wire form (pb::TensorSpec, in order) and back.
void LayoutToSpecs(const ModelLayout& layout,
                   google::protobuf::RepeatedPtrField<pb::TensorSpec>* specs);
Result<ModelLayout> LayoutFromSpecs(
    const google::protobuf::RepeatedPtrField<pb::TensorSpec>& specs);

inline constexpr uint32_t kProtocolVersion = pb::PROTOCOL_VERSION_CURRENT;

// Upper bounds that keep a hostile header from making us allocate or loop
// without limit. A header is small by design: values travel in payloads.
inline constexpr size_t kMaxHeaderBytes = 1 << 20;
inline constexpr int kMaxSlices = 4096;

// Why a message was refused: the code and text sent back in the ERROR reply
// and logged by the receiver.
struct Rejection {
  pb::ErrorCode code = pb::ERROR_MALFORMED;
  std::string reason;

  Status ToStatus() const;
};

// nullopt when the message passed the check.
using Verdict = std::optional<Rejection>;

// Bytes of one element of `dtype`; 0 for unknown types.
size_t DTypeSize(pb::DType dtype);

// A header with version, type, sender and sequence filled in.
pb::Header MakeHeader(pb::MessageType type, const pb::Endpoint& sender,
                      uint64_t sequence);

// Appends a FLOAT32/RAW slice covering a whole tensor.
void AddTensorSlice(const TensorInfo& tensor, pb::Header* header);
// Appends one slice per tensor of `layout`, in layout order.
void AddLayoutSlices(const ModelLayout& layout, pb::Header* header);

// A received message, frames borrowed from the transport.
struct FrameView {
  std::span<const std::byte> bytes;
};

// Parses frame 0 into `header` and checks everything that does not need
// the model: the protocol version, a known message type with the body it
// requires, one payload frame per slice, each frame's size equal to its
// slice's payload_bytes (and, for RAW slices, to length * dtype size),
// known dtype/codec. `payload` are frames 1..N. CODEC_PIPELINE payloads are
// validated by their decoder (compression.h).
Verdict DecodeMessage(std::span<const std::byte> frame0,
                      std::span<const FrameView> payload, pb::Header* header);

// Checks the header's slices against `layout`: every tensor exists and
// offset + length stays inside it (overflow-safe). When `whole_model` is
// set, the slices must cover every tensor exactly once and entirely, in
// layout order (what a worker commit carries).
Verdict CheckSlicesAgainstLayout(const pb::Header& header,
                                 const ModelLayout& layout, bool whole_model);

// Every slice of `header` uses `codec` (models are RAW), or `also` when
// given (worker commits: RAW or ROWS).
Verdict CheckCodec(const pb::Header& header, pb::Codec codec,
                   std::optional<pb::Codec> also = std::nullopt);

// Rejects NaN or +-Inf in a FLOAT32 payload; names the slice and index.
Verdict CheckFinite(const pb::TensorSlice& slice,
                    std::span<const std::byte> payload);

// ---- CODEC_ROWS: whole rows of a tensor (sparse, embedding-like updates) --

// Elements per row of `tensor`: size / shape[0] (0 for an empty shape).
uint64_t RowLength(const TensorInfo& tensor);

// Bytes of a CODEC_ROWS payload of `rows` rows of `row_length` elements.
uint64_t RowsPayloadBytes(uint64_t rows, uint64_t row_length);

// Writes a CODEC_ROWS payload for `rows` (ascending, each < shape[0]) of
// `tensor` into `out` (RowsPayloadBytes long) and returns where the row
// values go: rows.size() x RowLength(tensor) floats for the caller to fill,
// row by row. Appends the slice (whole tensor, CODEC_ROWS) to `header`.
float* AddRowsSlice(const TensorInfo& tensor, std::span<const uint32_t> rows,
                    std::span<std::byte> out, pb::Header* header);

// A decoded CODEC_ROWS payload: row r = rows[k] has the values
// values[k * row_length, (k + 1) * row_length).
struct DecodedRows {
  uint64_t row_length = 0;
  std::vector<uint32_t> rows;
  std::vector<float> values;
};

// Checks and decodes a CODEC_ROWS payload of `slice`, which must cover the
// whole of `tensor` in FLOAT32: the row count at most shape[0], the size
// exactly RowsPayloadBytes, rows strictly ascending and in range, values
// finite. Each failure names the slice and what is wrong.
Verdict DecodeRows(const pb::TensorSlice& slice, const TensorInfo& tensor,
                   std::span<const std::byte> payload, DecodedRows* out);

// A COMMIT's Commit.reads checked against `layout`: every tensor known and
// listed once, with rows strictly ascending below its shape[0]. On success
// `rows` is empty without reads (the whole model is the answer), else has
// one entry per tensor of the layout: the rows to answer with, or nullopt
// for a tensor answered whole.
Verdict ParseRowReads(const pb::Commit& commit, const ModelLayout& layout,
                      std::vector<std::optional<std::vector<uint32_t>>>* rows);

// "COMMIT from site-a/worker#3 seq 17 (2 slices)".
std::string DescribeHeader(const pb::Header& header);

}  // namespace meridian

#endif  // MERIDIAN_NET_MESSAGE_H_
