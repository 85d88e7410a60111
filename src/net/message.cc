#include "meridian/net/message.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "meridian/core/log.h"

namespace meridian {

namespace {

// proto2 enums are closed: a dtype or codec number this build does not know
// (sent by a newer peer) is parsed into the unknown fields and the field
// reads as its default, FLOAT32 / RAW. Such a slice must be refused rather
// than decoded as raw floats.
template <typename Message>
bool HasUnknownValue(const Message& message, int field_number) {
  const auto& unknown = message.unknown_fields();
  for (int i = 0; i < unknown.field_count(); ++i) {
    if (unknown.field(i).number() == field_number) return true;
  }
  return false;
}

}  // namespace

void LayoutToSpecs(const ModelLayout& layout,
                   google::protobuf::RepeatedPtrField<pb::TensorSpec>* specs) {
  specs->Clear();
  for (const TensorInfo& info : layout.tensors()) {
    pb::TensorSpec* spec = specs->Add();
    spec->set_name(info.name);
    for (uint64_t dim : info.shape) spec->add_shape(dim);
    // F32, the type of every built-in model, stays implicit: older peers
    // send no type.
    if (info.type != ElementType::kF32) spec->set_type(TensorTypeOf(info.type));
  }
}

Result<ModelLayout> LayoutFromSpecs(
    const google::protobuf::RepeatedPtrField<pb::TensorSpec>& specs) {
  ModelLayout layout;
  for (const pb::TensorSpec& spec : specs) {
    if (HasUnknownValue(spec, pb::TensorSpec::kTypeFieldNumber)) {
      return InvalidArgumentError("tensor '" + Sanitized(spec.name(), 64) +
                                  "' has a type this build does not know");
    }
    MERIDIAN_ASSIGN_OR_RETURN(const ElementType type,
                              ElementTypeOf(spec.type(), spec.name()));
    MERIDIAN_RETURN_IF_ERROR(layout.Add(
        spec.name(),
        std::vector<uint64_t>(spec.shape().begin(), spec.shape().end()),
        type));
  }
  return layout;
}

Check CheckHelloLayout(const pb::Hello& hello, const ModelLayout& site,
                       std::string_view who) {
  const std::string theirs = "the " + std::string(who) + "'s model";
  Result<ModelLayout> layout = LayoutFromSpecs(hello.layout());
  const std::optional<std::string> difference =
      layout.ok() ? site.FirstDifference(*layout, "the site's model", theirs)
                  : layout.status().message();
  if (!difference) return Check();
  return Rejection{pb::ERROR_LAYOUT_MISMATCH,
                   theirs + " differs from the site's: " + *difference +
                       " (are both built from the same job file and "
                       "weights?)"};
}

pb::TensorType TensorTypeOf(ElementType type) {
  switch (type) {
    case ElementType::kF16: return pb::TENSOR_TYPE_F16;
    case ElementType::kBF16: return pb::TENSOR_TYPE_BF16;
    case ElementType::kF64: return pb::TENSOR_TYPE_F64;
    default: return pb::TENSOR_TYPE_F32;
  }
}

Result<ElementType> ElementTypeOf(pb::TensorType type,
                                  std::string_view tensor) {
  switch (type) {
    case pb::TENSOR_TYPE_UNSPECIFIED:
    case pb::TENSOR_TYPE_F32: return ElementType::kF32;
    case pb::TENSOR_TYPE_F16: return ElementType::kF16;
    case pb::TENSOR_TYPE_BF16: return ElementType::kBF16;
    case pb::TENSOR_TYPE_F64: return ElementType::kF64;
  }
  return InvalidArgumentError("tensor '" + std::string(tensor) +
                              "' has an unknown type " + std::to_string(type));
}

namespace {

Rejection Reject(pb::ErrorCode code, std::string reason) {
  return Rejection{code, std::move(reason)};
}

// The body a message type must carry, and whether it may carry slices.
struct TypeRule {
  pb::Header::BodyCase body;  // BODY_NOT_SET: no body required
  bool body_optional;
  bool slices_allowed;
};

std::optional<TypeRule> RuleFor(pb::MessageType type) {
  using H = pb::Header;
  switch (type) {
    case pb::HELLO:
      return TypeRule{H::kHello, false, false};
    case pb::WELCOME:
      return TypeRule{H::kWelcome, false, true};
    case pb::COMMIT:
      return TypeRule{H::kCommit, false, true};
    case pb::MODEL:
      return TypeRule{H::kModel, false, true};
    case pb::PULL:
      return TypeRule{H::kPull, true, false};
    case pb::BYE:
      return TypeRule{H::kBye, true, false};
    case pb::ERROR:
      return TypeRule{H::kError, false, false};
    case pb::STATUS_REQUEST:
      return TypeRule{H::BODY_NOT_SET, true, false};
    case pb::STATUS_REPLY:
      return TypeRule{H::kStatus, false, false};
    case pb::SHUTDOWN:
      return TypeRule{H::kShutdown, true, false};
    case pb::MIRROR_HELLO:
      return TypeRule{H::kMirrorHello, false, false};
    case pb::MIRROR_UPDATE:
    case pb::MIRROR_INDICES:
      return TypeRule{H::kMirrorUpdate, false, true};
    case pb::MIRROR_CLOCK:
      return TypeRule{H::kMirrorClock, false, false};
    case pb::SET_PEERS:
      return TypeRule{H::kPeers, false, false};
    case pb::HEARTBEAT:
      return TypeRule{H::kHeartbeat, true, false};
    case pb::MIRROR_ACK:
      return TypeRule{H::kMirrorAck, false, false};
    case pb::MIRROR_TRAVEL:
      return TypeRule{H::kMirrorTravel, false, true};
    case pb::MIRROR_TRAVEL_RESULT:
      return TypeRule{H::kMirrorTravelResult, false, false};
    case pb::EVAL_RESULT:
      return TypeRule{H::kEvalResult, false, false};
    case pb::EVAL_TASK:
      return TypeRule{H::kEvalTask, false, true};
    case pb::MESSAGE_TYPE_UNSPECIFIED:
      break;
  }
  return std::nullopt;
}

// One payload frame per slice.
Check CheckFrameCount(const pb::Header& header, size_t frames) {
  if (static_cast<size_t>(header.slices_size()) != frames) {
    return Reject(pb::ERROR_SIZE_MISMATCH,
                  "header announces " + std::to_string(header.slices_size()) +
                      " payload frames, message has " + std::to_string(frames));
  }
  return Check();
}

}  // namespace

Status Rejection::ToStatus() const {
  return InvalidArgumentError(pb::ErrorCode_Name(code) + ": " + reason);
}

size_t DTypeSize(pb::DType dtype) {
  switch (dtype) {
    case pb::DTYPE_FLOAT32:
      return 4;
    case pb::DTYPE_UNSPECIFIED:
      break;
  }
  return 0;
}

pb::Header MakeHeader(pb::MessageType type, const pb::Endpoint& sender,
                      uint64_t sequence) {
  pb::Header header;
  header.set_protocol_version(kProtocolVersion);
  header.set_type(type);
  *header.mutable_sender() = sender;
  header.set_sequence(sequence);
  return header;
}

void AddTensorSlice(const TensorInfo& tensor, pb::Header* header) {
  pb::TensorSlice* slice = header->add_slices();
  slice->set_tensor(tensor.name);
  slice->set_offset(0);
  slice->set_length(tensor.size);
  slice->set_dtype(pb::DTYPE_FLOAT32);
  slice->set_codec(pb::CODEC_RAW);
  slice->set_payload_bytes(tensor.size * sizeof(float));
}

void AddLayoutSlices(const ModelLayout& layout, pb::Header* header) {
  for (const TensorInfo& tensor : layout.tensors()) {
    AddTensorSlice(tensor, header);
  }
}

Parsed<pb::Header> DecodeMessage(std::span<const std::byte> frame0,
                                 std::span<const FrameView> payload) {
  pb::Header parsed;
  pb::Header* header = &parsed;
  if (frame0.empty()) {
    return Reject(pb::ERROR_MALFORMED, "empty header frame");
  }
  if (frame0.size() > kMaxHeaderBytes) {
    return Reject(pb::ERROR_MALFORMED, "header frame of " +
                                           std::to_string(frame0.size()) +
                                           " bytes exceeds the limit of " +
                                           std::to_string(kMaxHeaderBytes));
  }
  if (!header->ParseFromArray(frame0.data(), static_cast<int>(frame0.size()))) {
    return Reject(pb::ERROR_MALFORMED,
                  "header frame is not a valid meridian.pb.Header (" +
                      std::to_string(frame0.size()) + " bytes)");
  }
  if (header->protocol_version() != kProtocolVersion) {
    return Reject(
        pb::ERROR_VERSION,
        "protocol version " + std::to_string(header->protocol_version()) +
            ", this build speaks " + std::to_string(kProtocolVersion));
  }
  const std::optional<TypeRule> rule = RuleFor(header->type());
  if (!rule) {
    return Reject(pb::ERROR_MALFORMED, "message type is missing or unknown");
  }
  const std::string type_name = pb::MessageType_Name(header->type());
  if (rule->body == pb::Header::BODY_NOT_SET) {
    if (header->body_case() != pb::Header::BODY_NOT_SET) {
      return Reject(pb::ERROR_MALFORMED, type_name + " must not carry a body");
    }
  } else if (header->body_case() != rule->body &&
             !(rule->body_optional &&
               header->body_case() == pb::Header::BODY_NOT_SET)) {
    return Reject(pb::ERROR_MALFORMED,
                  type_name + " carries the wrong body or none");
  }
  if (!rule->slices_allowed && header->slices_size() > 0) {
    return Reject(pb::ERROR_MALFORMED,
                  type_name + " must not carry tensor slices");
  }
  if (header->slices_size() > kMaxSlices) {
    return Reject(pb::ERROR_MALFORMED, std::to_string(header->slices_size()) +
                                           " slices exceed the limit of " +
                                           std::to_string(kMaxSlices));
  }
  MERIDIAN_RETURN_IF_REJECTED(CheckFrameCount(*header, payload.size()));
  for (int i = 0; i < header->slices_size(); ++i) {
    const pb::TensorSlice& slice = header->slices(i);
    const std::string where = "slice " + std::to_string(i) + " ('" +
                              Sanitized(slice.tensor(), 64) + "')";
    const size_t element = DTypeSize(slice.dtype());
    if (element == 0 ||
        HasUnknownValue(slice, pb::TensorSlice::kDtypeFieldNumber)) {
      return Reject(pb::ERROR_MALFORMED, where + ": unknown dtype");
    }
    const bool raw = slice.codec() == pb::CODEC_RAW;
    if ((!raw && slice.codec() != pb::CODEC_PIPELINE &&
         slice.codec() != pb::CODEC_ROWS) ||
        HasUnknownValue(slice, pb::TensorSlice::kCodecFieldNumber)) {
      return Reject(pb::ERROR_MALFORMED, where + ": unknown codec");
    }
    const uint64_t frame_bytes = payload[i].bytes.size();
    if (slice.payload_bytes() != frame_bytes) {
      return Reject(
          pb::ERROR_SIZE_MISMATCH,
          where + ": header says " + std::to_string(slice.payload_bytes()) +
              " payload bytes, frame has " + std::to_string(frame_bytes));
    }
    // Pipeline and rows buffers describe their own size (checked by their
    // decoders); raw values must fill the frame exactly.
    if (raw &&
        (slice.length() > std::numeric_limits<uint64_t>::max() / element ||
         slice.length() * element != frame_bytes)) {
      return Reject(pb::ERROR_SIZE_MISMATCH,
                    where + ": " + std::to_string(slice.length()) +
                        " elements of " + std::to_string(element) +
                        " bytes do not match a " + std::to_string(frame_bytes) +
                        "-byte frame");
    }
  }
  return parsed;
}

pb::Header PartialHeader(std::span<const std::byte> frame0) {
  pb::Header header;
  if (frame0.size() > kMaxHeaderBytes ||
      !header.ParseFromArray(frame0.data(), static_cast<int>(frame0.size()))) {
    header.Clear();
  }
  return header;
}

Check CheckSlicesAgainstLayout(const pb::Header& header,
                               const ModelLayout& layout, bool whole_model) {
  if (whole_model &&
      static_cast<size_t>(header.slices_size()) != layout.tensors().size()) {
    return Reject(pb::ERROR_OUT_OF_RANGE,
                  "expected one slice per tensor (" +
                      std::to_string(layout.tensors().size()) + "), got " +
                      std::to_string(header.slices_size()));
  }
  for (int i = 0; i < header.slices_size(); ++i) {
    const pb::TensorSlice& slice = header.slices(i);
    const TensorInfo* tensor = layout.Find(slice.tensor());
    if (tensor == nullptr) {
      return Reject(pb::ERROR_OUT_OF_RANGE,
                    "slice " + std::to_string(i) + ": unknown tensor '" +
                        Sanitized(slice.tensor(), 64) + "'");
    }
    // offset + length <= size, written so that it cannot overflow.
    if (slice.offset() > tensor->size ||
        slice.length() > tensor->size - slice.offset()) {
      return Reject(pb::ERROR_OUT_OF_RANGE,
                    "slice " + std::to_string(i) + ": elements [" +
                        std::to_string(slice.offset()) + ", +" +
                        std::to_string(slice.length()) + ") outside tensor '" +
                        tensor->name + "' of " + std::to_string(tensor->size) +
                        " elements");
    }
    if (whole_model && (tensor != &layout.tensors()[i] || slice.offset() != 0 ||
                        slice.length() != tensor->size)) {
      return Reject(pb::ERROR_OUT_OF_RANGE,
                    "slice " + std::to_string(i) +
                        " must cover the whole tensor '" +
                        layout.tensors()[i].name + "'");
    }
  }
  return Check();
}

Check CheckCodec(const pb::Header& header, pb::Codec codec,
                 std::optional<pb::Codec> also) {
  for (int i = 0; i < header.slices_size(); ++i) {
    const pb::Codec used = header.slices(i).codec();
    if (used != codec && used != also) {
      return Reject(pb::ERROR_MALFORMED,
                    "slice " + std::to_string(i) + " ('" +
                        Sanitized(header.slices(i).tensor(), 64) +
                        "') must be encoded as " + pb::Codec_Name(codec) +
                        (also ? " or " + pb::Codec_Name(*also) : "") + " in " +
                        pb::MessageType_Name(header.type()));
    }
  }
  return Check();
}

uint64_t RowLength(const TensorInfo& tensor) {
  if (tensor.shape.empty() || tensor.shape[0] == 0) return 0;
  return tensor.size / tensor.shape[0];
}

uint64_t RowsPayloadBytes(uint64_t rows, uint64_t row_length) {
  return sizeof(uint32_t) + rows * sizeof(uint32_t) +
         rows * row_length * sizeof(float);
}

namespace {

void PutU32(uint32_t value, std::byte* out) {
  for (int b = 0; b < 4; ++b) {
    out[b] = static_cast<std::byte>((value >> (8 * b)) & 0xff);
  }
}

uint32_t GetU32(const std::byte* in) {
  uint32_t value = 0;
  for (int b = 0; b < 4; ++b) {
    value |= static_cast<uint32_t>(in[b]) << (8 * b);
  }
  return value;
}

}  // namespace

float* AddRowsSlice(const TensorInfo& tensor, std::span<const uint32_t> rows,
                    std::span<std::byte> out, pb::Header* header) {
  PutU32(static_cast<uint32_t>(rows.size()), out.data());
  for (size_t k = 0; k < rows.size(); ++k) {
    PutU32(rows[k], out.data() + sizeof(uint32_t) * (k + 1));
  }
  pb::TensorSlice* slice = header->add_slices();
  slice->set_tensor(tensor.name);
  slice->set_offset(0);
  slice->set_length(tensor.size);
  slice->set_codec(pb::CODEC_ROWS);
  slice->set_payload_bytes(out.size());
  // Values are little-endian floats, as on every platform we build for.
  return reinterpret_cast<float*>(out.data() +
                                  sizeof(uint32_t) * (rows.size() + 1));
}

Parsed<RowReads> ParseRowReads(const pb::Commit& commit,
                               const ModelLayout& layout) {
  RowReads parsed;
  RowReads* rows = &parsed;
  if (commit.reads_size() == 0) return parsed;  // the whole model
  rows->assign(layout.tensors().size(), std::nullopt);
  for (int r = 0; r < commit.reads_size(); ++r) {
    const pb::RowRead& read = commit.reads(r);
    const std::string where = "reads[" + std::to_string(r) + "] ('" +
                              Sanitized(read.tensor(), 64) + "')";
    const TensorInfo* tensor = layout.Find(read.tensor());
    if (tensor == nullptr) {
      return Reject(pb::ERROR_OUT_OF_RANGE, where + ": unknown tensor");
    }
    const auto t = static_cast<size_t>(tensor - layout.tensors().data());
    if ((*rows)[t].has_value()) {
      return Reject(pb::ERROR_MALFORMED, where + ": tensor listed twice");
    }
    if (RowLength(*tensor) == 0) {
      return Reject(pb::ERROR_MALFORMED, where + ": the tensor has no rows");
    }
    std::vector<uint32_t>& list = (*rows)[t].emplace();
    list.reserve(static_cast<size_t>(read.rows_size()));
    for (int k = 0; k < read.rows_size(); ++k) {
      const uint32_t row = read.rows(k);
      if (row >= tensor->shape[0] || (k > 0 && row <= list.back())) {
        return Reject(pb::ERROR_MALFORMED,
                      where + ": row " + std::to_string(k) + " (" +
                          std::to_string(row) +
                          ") is out of range or not ascending");
      }
      list.push_back(row);
    }
  }
  return parsed;
}

Parsed<DecodedRows> DecodeRows(const pb::TensorSlice& slice,
                               const TensorInfo& tensor,
                               std::span<const std::byte> payload) {
  DecodedRows decoded;
  DecodedRows* out = &decoded;
  const std::string where = "rows of '" + Sanitized(slice.tensor(), 64) + "'";
  if (slice.dtype() != pb::DTYPE_FLOAT32 || slice.offset() != 0 ||
      slice.length() != tensor.size) {
    return Reject(pb::ERROR_MALFORMED,
                  where +
                      ": a CODEC_ROWS slice must be FLOAT32 and cover the "
                      "whole tensor");
  }
  const uint64_t row_length = RowLength(tensor);
  if (row_length == 0) {
    return Reject(pb::ERROR_MALFORMED, where + ": the tensor has no rows");
  }
  if (payload.size() < sizeof(uint32_t)) {
    return Reject(pb::ERROR_SIZE_MISMATCH,
                  where + ": payload shorter than its row count");
  }
  const uint64_t count = GetU32(payload.data());
  if (count > tensor.shape[0]) {
    return Reject(pb::ERROR_OUT_OF_RANGE, where + ": " + std::to_string(count) +
                                              " rows, the tensor has " +
                                              std::to_string(tensor.shape[0]));
  }
  // count <= shape[0] and row_length <= size: no overflow.
  if (payload.size() != RowsPayloadBytes(count, row_length)) {
    return Reject(pb::ERROR_SIZE_MISMATCH,
                  where + ": " + std::to_string(count) + " rows of " +
                      std::to_string(row_length) + " floats need " +
                      std::to_string(RowsPayloadBytes(count, row_length)) +
                      " bytes, the payload has " +
                      std::to_string(payload.size()));
  }
  out->row_length = row_length;
  out->rows.resize(count);
  for (uint64_t k = 0; k < count; ++k) {
    const uint32_t row = GetU32(payload.data() + sizeof(uint32_t) * (k + 1));
    if (row >= tensor.shape[0] || (k > 0 && row <= out->rows[k - 1])) {
      return Reject(pb::ERROR_MALFORMED,
                    where + ": row index " + std::to_string(k) + " (" +
                        std::to_string(row) +
                        ") is out of range or not ascending");
    }
    out->rows[k] = row;
  }
  const std::span<const std::byte> values =
      payload.subspan(sizeof(uint32_t) * (count + 1));
  MERIDIAN_RETURN_IF_REJECTED(CheckFinite(slice, values));
  out->values.resize(count * row_length);
  // No rows: an empty vector's data() may be null, which memcpy must not get.
  if (!values.empty()) {
    std::memcpy(out->values.data(), values.data(), values.size());
  }
  return decoded;
}

bool ModelPayload::has_rows() const {
  return std::any_of(tensors.begin(), tensors.end(),
                     [](const TensorPayload& t) { return t.rows.has_value(); });
}

Parsed<ModelPayload> ParseModelPayload(const pb::Header& header,
                                       std::span<const FrameView> frames,
                                       const ModelLayout& layout) {
  MERIDIAN_RETURN_IF_REJECTED(CheckFrameCount(header, frames.size()));
  MERIDIAN_RETURN_IF_REJECTED(
      CheckSlicesAgainstLayout(header, layout, /*whole_model=*/true));
  MERIDIAN_RETURN_IF_REJECTED(
      CheckCodec(header, pb::CODEC_RAW, pb::CODEC_ROWS));
  ModelPayload payload;
  payload.tensors.resize(frames.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    const pb::TensorSlice& slice = header.slices(static_cast<int>(i));
    const std::span<const std::byte> bytes = frames[i].bytes;
    TensorPayload& tensor = payload.tensors[i];
    tensor.tensor = &layout.tensors()[i];
    if (slice.codec() == pb::CODEC_ROWS) {
      Parsed<DecodedRows> rows = DecodeRows(slice, *tensor.tensor, bytes);
      if (!rows.ok()) return std::move(rows).rejection();
      tensor.rows = std::move(rows).value();
      continue;
    }
    MERIDIAN_RETURN_IF_REJECTED(CheckFinite(slice, bytes));
    // DecodeMessage checked that a RAW frame holds exactly `length` floats,
    // and the slice covers its tensor.
    const size_t count = bytes.size() / sizeof(float);
    if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) == 0) {
      tensor.values = {reinterpret_cast<const float*>(bytes.data()), count};
    } else {
      std::vector<float>& copy = payload.realigned.emplace_back(count);
      std::memcpy(copy.data(), bytes.data(), count * sizeof(float));
      tensor.values = copy;
    }
  }
  return payload;
}

Parsed<WorkerCommit> ParseCommit(const pb::Header& header,
                                 std::span<const FrameView> frames,
                                 const ModelLayout& layout) {
  Parsed<ModelPayload> update = ParseModelPayload(header, frames, layout);
  if (!update.ok()) return std::move(update).rejection();
  Parsed<RowReads> reads = ParseRowReads(header.commit(), layout);
  if (!reads.ok()) return std::move(reads).rejection();
  WorkerCommit commit;
  commit.fields = &header.commit();
  commit.update = std::move(update).value();
  commit.reads = std::move(reads).value();
  return commit;
}

Check CheckFinite(const pb::TensorSlice& slice,
                  std::span<const std::byte> payload) {
  // An IEEE-754 float is NaN or Inf exactly when its exponent bits are all
  // ones. The branch-free first pass vectorises (the accumulator must be an
  // integer: GCC leaves a `bool |=` loop scalar, 3x slower); the second one
  // only runs to name the culprit.
  constexpr uint32_t kExponent = 0x7f800000u;
  const size_t count = payload.size() / sizeof(float);
  uint32_t any_bad = 0;
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, payload.data() + i * sizeof(float), sizeof(bits));
    any_bad |= static_cast<uint32_t>((bits & kExponent) == kExponent);
  }
  if (any_bad == 0) return Check();
  for (size_t i = 0; i < count; ++i) {
    float value;
    std::memcpy(&value, payload.data() + i * sizeof(float), sizeof(value));
    if (!std::isfinite(value)) {
      return Reject(pb::ERROR_NON_FINITE,
                    std::string(std::isnan(value) ? "NaN" : "Inf") +
                        " in tensor '" + Sanitized(slice.tensor(), 64) +
                        "' at element " + std::to_string(slice.offset() + i));
    }
  }
  return Check();
}

std::string DescribeHeader(const pb::Header& header) {
  std::string out = pb::MessageType_Name(header.type());
  if (out.empty()) out = "type " + std::to_string(header.type());
  out += " from ";
  // The site name is the sender's to choose: a plain name is shown as it
  // is, anything else quoted and escaped, so that it can neither pose as
  // another sender ("a/server seq 1") nor break the line.
  const std::string& site = header.sender().site();
  constexpr size_t kMaxSiteBytes = 64;
  const bool plain =
      site.size() <= kMaxSiteBytes &&
      std::all_of(site.begin(), site.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
      });
  if (site.empty()) {
    out += "?";
  } else if (plain) {
    out += site;
  } else {
    out += '"' + Sanitized(site, kMaxSiteBytes) + '"';
  }
  out += '/';
  static constexpr std::pair<pb::Role, std::string_view> kRoleWords[] = {
      {pb::ROLE_SITE_SERVER, "server"}, {pb::ROLE_LAUNCHER, "launcher"},
      {pb::ROLE_CLIENT, "client"},      {pb::ROLE_EVALUATOR, "evaluator"},
      {pb::ROLE_WORKER, "worker#"}};
  std::string_view role = "?";
  for (const auto& [value, word] : kRoleWords) {
    if (value == header.sender().role()) role = word;
  }
  out += role;
  if (header.sender().role() == pb::ROLE_WORKER) {
    out += std::to_string(header.sender().id());
  }
  out += " seq " + std::to_string(header.sequence());
  if (header.slices_size() > 0) {
    out += " (" + std::to_string(header.slices_size()) + " slices)";
  }
  return out;
}

}  // namespace meridian
