// Wire messages: a Protobuf pb::Header in frame 0 and one raw payload frame
// per header slice. This file holds the pure (socket-free) parts: building
// headers, decoding frames, validating them against a model layout and
// parsing what a worker and its site server exchange into typed values
// (ParseModelPayload, ParseCommit), so that the decoder can be unit-tested
// and fuzzed without a network.
#ifndef MERIDIAN_NET_MESSAGE_H_
#define MERIDIAN_NET_MESSAGE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
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
// A tensor's element type on the wire and back (UNSPECIFIED reads as F32;
// `tensor` names it in the error for an unknown number).
pb::TensorType TensorTypeOf(ElementType type);
Result<ElementType> ElementTypeOf(pb::TensorType type, std::string_view tensor);

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

// The outcome of a check of bytes from a peer: accepted (ok()), or the
// rejection to answer and log. Reads the right way round:
//   if (Check check = CheckCodec(...); !check.ok()) return check.rejection();
class [[nodiscard]] Check {
 public:
  Check() = default;  // accepted
  Check(Rejection rejection)  // NOLINT: implicit, as `return Reject(...)`
      : rejection_(std::move(rejection)) {}

  bool ok() const { return !rejection_.has_value(); }
  // Precondition: !ok().
  const Rejection& rejection() const& { return *rejection_; }
  Rejection&& rejection() && { return std::move(*rejection_); }

 private:
  std::optional<Rejection> rejection_;
};

// A typed value parsed from bytes a peer sent, or why they were refused:
// parse at the boundary, then act on the value.
template <typename T>
class [[nodiscard]] Parsed {
 public:
  Parsed(T value) : state_(std::move(value)) {}  // NOLINT: implicit by design
  Parsed(Rejection rejection)                     // NOLINT
      : state_(std::move(rejection)) {}

  bool ok() const { return std::holds_alternative<T>(state_); }
  // Precondition: !ok().
  const Rejection& rejection() const& { return std::get<Rejection>(state_); }
  Rejection&& rejection() && { return std::get<Rejection>(std::move(state_)); }
  // Precondition: ok().
  T& value() & { return std::get<T>(state_); }
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Rejection> state_;
};

// Returns the rejection of `expr` (a Check or a Parsed<T>) from the
// enclosing function (which returns a Check, a Parsed<U> or a Rejection).
#define MERIDIAN_RETURN_IF_REJECTED(expr)                    \
  do {                                                       \
    if (auto meridian_check_ = (expr); !meridian_check_.ok()) { \
      return std::move(meridian_check_).rejection();         \
    }                                                        \
  } while (false)

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

// Parses frame 0 into a header and checks everything that does not need
// the model: the protocol version, a known message type with the body it
// requires, one payload frame per slice, each frame's size equal to its
// slice's payload_bytes (and, for RAW slices, to length * dtype size),
// known dtype/codec. `payload` are frames 1..N. CODEC_PIPELINE payloads are
// validated by their decoder (compression.h).
Parsed<pb::Header> DecodeMessage(std::span<const std::byte> frame0,
                                 std::span<const FrameView> payload);

// A refused message's header as far as it parses (empty when frame 0 is
// not a header or is over kMaxHeaderBytes): what the ERROR reply echoes
// (sequence, sender) and the log names. Only for the refusal path.
pb::Header PartialHeader(std::span<const std::byte> frame0);

// Checks the header's slices against `layout`: every tensor exists and
// offset + length stays inside it (overflow-safe). When `whole_model` is
// set, the slices must cover every tensor exactly once and entirely, in
// layout order (what a worker commit carries).
Check CheckSlicesAgainstLayout(const pb::Header& header,
                               const ModelLayout& layout, bool whole_model);

// The check of a HELLO's layout (a worker's or an evaluator's) against the
// site's: accepted, or ERROR_LAYOUT_MISMATCH naming the first differing
// tensor. `who`: "worker", "evaluator".
Check CheckHelloLayout(const pb::Hello& hello, const ModelLayout& site,
                       std::string_view who);

// Every slice of `header` uses `codec` (models are RAW), or `also` when
// given (worker commits: RAW or ROWS).
Check CheckCodec(const pb::Header& header, pb::Codec codec,
                 std::optional<pb::Codec> also = std::nullopt);

// Rejects NaN or +-Inf in a FLOAT32 payload; names the slice and index.
Check CheckFinite(const pb::TensorSlice& slice,
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
Parsed<DecodedRows> DecodeRows(const pb::TensorSlice& slice,
                               const TensorInfo& tensor,
                               std::span<const std::byte> payload);

// A COMMIT's Commit.reads checked against `layout`: every tensor known and
// listed once, with rows strictly ascending below its shape[0]. On success
// the result is empty without reads (the whole model is the answer), else
// has one entry per tensor of the layout: the rows to answer with, or
// nullopt for a tensor answered whole.
using RowReads = std::vector<std::optional<std::vector<uint32_t>>>;
Parsed<RowReads> ParseRowReads(const pb::Commit& commit,
                               const ModelLayout& layout);

// ---- Whole-model payloads: a worker's COMMIT, a site's MODEL and WELCOME --
// The one place where such a payload is checked against the model layout
// and decoded; the site server (commits) and the worker (the model it is
// answered with) both read it through ParseModelPayload.

// Byte views of received payload frames (anything with data() and size(),
// e.g. zmq::message_t), in order, for the parse functions below.
template <typename Frame>
std::vector<FrameView> ViewFrames(const std::vector<Frame>& frames) {
  std::vector<FrameView> views;
  views.reserve(frames.size());
  for (const Frame& frame : frames) {
    views.push_back(FrameView{std::span<const std::byte>(
        static_cast<const std::byte*>(frame.data()), frame.size())});
  }
  return views;
}

// One tensor of a parsed whole-model payload: its values whole (CODEC_RAW)
// or the rows its slice carries (CODEC_ROWS).
struct TensorPayload {
  const TensorInfo* tensor = nullptr;  // in the layout parsed against
  // CODEC_RAW: the tensor's tensor->size values, finite. Borrowed from the
  // frame, or from ModelPayload::realigned when the frame's bytes are not
  // aligned for floats. Empty for CODEC_ROWS.
  std::span<const float> values;
  // CODEC_ROWS: the rows and their values, decoded (DecodeRows).
  std::optional<DecodedRows> rows;
};

// A payload that covers the whole model, one entry per tensor in layout
// order. Borrows the frames it was parsed from: use it while they live.
// Move-only (values may point into `realigned`, which a move keeps).
struct ModelPayload {
  ModelPayload() = default;
  ModelPayload(ModelPayload&&) = default;
  ModelPayload& operator=(ModelPayload&&) = default;
  ModelPayload(const ModelPayload&) = delete;
  ModelPayload& operator=(const ModelPayload&) = delete;

  // Whether any tensor came as rows (a sparse model's commit or answer).
  bool has_rows() const;

  std::vector<TensorPayload> tensors;  // tensors[t]: layout.tensors()[t]
  // Copies of the RAW frames a transport handed over at an address not
  // aligned for floats (ZeroMQ may; usually none).
  std::vector<std::vector<float>> realigned;
};

// Parses the payload of a message that carries the whole model (`header`
// and `frames` as DecodeMessage accepted them): the slices cover every
// tensor of `layout` once, entirely and in order
// (CheckSlicesAgainstLayout), each is CODEC_RAW or CODEC_ROWS (CheckCodec),
// RAW values are finite (CheckFinite) and ROWS payloads decode
// (DecodeRows). The first failure, in that order, is the rejection.
Parsed<ModelPayload> ParseModelPayload(const pb::Header& header,
                                       std::span<const FrameView> frames,
                                       const ModelLayout& layout);

// A worker's COMMIT parsed against the site's layout: the commit fields,
// the update and the rows its answer carries. Borrows `header` and the
// frames it was parsed from.
struct WorkerCommit {
  const pb::Commit* fields = nullptr;  // header.commit()
  ModelPayload update;                 // ParseModelPayload
  RowReads reads;                      // ParseRowReads
};

// Parses a COMMIT (`header` and `frames` as DecodeMessage accepted them):
// ParseModelPayload, then ParseRowReads; the first failure is the
// rejection.
Parsed<WorkerCommit> ParseCommit(const pb::Header& header,
                                 std::span<const FrameView> frames,
                                 const ModelLayout& layout);

// "COMMIT from site-a/worker#3 seq 17 (2 slices)".
std::string DescribeHeader(const pb::Header& header);

}  // namespace meridian

#endif  // MERIDIAN_NET_MESSAGE_H_
