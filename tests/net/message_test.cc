#include "meridian/net/message.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>
#include <zmq.hpp>

#include "meridian/net/transport.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

// w: 2x3 = 6 elements, b: 3 elements.
ModelLayout SmallLayout() {
  ModelLayout layout;
  EXPECT_OK(layout.Add("w", {2, 3}));
  EXPECT_OK(layout.Add("b", {3}));
  return layout;
}

pb::Endpoint Worker(uint32_t id) {
  pb::Endpoint endpoint;
  endpoint.set_site("site-a");
  endpoint.set_role(pb::ROLE_WORKER);
  endpoint.set_id(id);
  return endpoint;
}

std::string FloatBytes(const std::vector<float>& values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  if (!values.empty()) {
    std::memcpy(bytes.data(), values.data(), bytes.size());
  }
  return bytes;
}

// A message as raw frames: what arrives from the socket.
struct Wire {
  pb::Header header;
  std::vector<std::string> payload;
};

// A well-formed COMMIT carrying the whole SmallLayout().
Wire ValidCommit() {
  Wire wire;
  wire.header = MakeHeader(pb::COMMIT, Worker(3), 17);
  wire.header.mutable_commit()->set_base_version(5);
  wire.header.mutable_commit()->set_local_steps(2);
  AddLayoutSlices(SmallLayout(), &wire.header);
  wire.payload.push_back(FloatBytes({1, 2, 3, 4, 5, 6}));
  wire.payload.push_back(FloatBytes({-1, -2, -3}));
  return wire;
}

// The rejection of a check or a parse; nullopt when it was accepted.
using Verdict = std::optional<Rejection>;
Verdict RejectionOf(const Check& check) {
  if (check.ok()) return std::nullopt;
  return check.rejection();
}
template <typename T>
Verdict RejectionOf(const Parsed<T>& parsed) {
  if (parsed.ok()) return std::nullopt;
  return parsed.rejection();
}

// DecodeMessage of the frames; `header` gets the parsed header when it was
// accepted, else what a receiver answers with (PartialHeader).
Verdict DecodeFrames(const std::string& frame0,
                     const std::vector<std::string>& payload,
                     pb::Header* header) {
  std::vector<FrameView> views;
  for (const std::string& frame : payload) {
    views.push_back(FrameView{std::as_bytes(std::span(frame))});
  }
  Parsed<pb::Header> parsed =
      DecodeMessage(std::as_bytes(std::span(frame0)), views);
  *header = parsed.ok() ? *parsed
                       : PartialHeader(std::as_bytes(std::span(frame0)));
  return RejectionOf(parsed);
}

Verdict Decode(const Wire& wire, pb::Header* header) {
  return DecodeFrames(wire.header.SerializeAsString(), wire.payload, header);
}

// The error code of a rejection, or ERROR_CODE_UNSPECIFIED when accepted.
pb::ErrorCode CodeOf(const Verdict& verdict) {
  return verdict ? verdict->code : pb::ERROR_CODE_UNSPECIFIED;
}

pb::ErrorCode DecodeCode(const Wire& wire) {
  pb::Header header;
  return CodeOf(Decode(wire, &header));
}

// ---------------------------------------------------------------------------
// DecodeMessage

ModelLayout TwoLayerLayout() {
  ModelLayout layout;
  EXPECT_OK(layout.Add("fc1.w", {784, 128}));
  EXPECT_OK(layout.Add("fc1.b", {128}));
  EXPECT_OK(layout.Add("fc2.w", {128, 10}));
  EXPECT_OK(layout.Add("fc2.b", {10}));
  return layout;
}

TEST(LayoutSpecsTest, RoundTrip) {
  const ModelLayout layout = TwoLayerLayout();
  google::protobuf::RepeatedPtrField<pb::TensorSpec> specs;
  specs.Add()->set_name("stale");  // ToSpecs replaces the contents
  LayoutToSpecs(layout, &specs);
  ASSERT_EQ(specs.size(), 4);
  EXPECT_EQ(specs[0].name(), "fc1.w");
  ASSERT_EQ(specs[0].shape_size(), 2);
  EXPECT_EQ(specs[0].shape(0), 784u);
  EXPECT_EQ(specs[0].shape(1), 128u);
  EXPECT_EQ(specs[3].name(), "fc2.b");

  Result<ModelLayout> back = LayoutFromSpecs(specs);
  ASSERT_OK(back);
  EXPECT_TRUE(*back == layout);
  EXPECT_EQ(back->num_elements(), layout.num_elements());
  EXPECT_EQ(back->Find("fc2.b")->offset, 101760u);
}

TEST(LayoutSpecsTest, RejectsInvalidSpecs) {
  google::protobuf::RepeatedPtrField<pb::TensorSpec> specs;
  pb::TensorSpec* a = specs.Add();
  a->set_name("a");
  a->add_shape(2);
  *specs.Add() = *a;  // duplicate name
  EXPECT_EQ(LayoutFromSpecs(specs).status().code(),
            StatusCode::kInvalidArgument);

  specs.RemoveLast();
  pb::TensorSpec* empty = specs.Add();
  empty->set_name("empty");
  empty->add_shape(3);
  empty->add_shape(0);
  EXPECT_EQ(LayoutFromSpecs(specs).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(LayoutSpecsTest, ScalarsAndElementTypesRoundTrip) {
  google::protobuf::RepeatedPtrField<pb::TensorSpec> specs;
  pb::TensorSpec* scale = specs.Add();
  scale->set_name("scale");  // a 0-dim parameter: one element
  pb::TensorSpec* half = specs.Add();
  half->set_name("w");
  half->add_shape(2);
  half->set_type(pb::TENSOR_TYPE_BF16);
  Result<ModelLayout> layout = LayoutFromSpecs(specs);
  ASSERT_OK(layout);
  EXPECT_EQ(layout->tensors()[0].size, 1u);
  EXPECT_EQ(layout->tensors()[1].type, ElementType::kBF16);
  google::protobuf::RepeatedPtrField<pb::TensorSpec> again;
  LayoutToSpecs(*layout, &again);
  EXPECT_FALSE(again[0].has_type());  // F32 stays implicit
  EXPECT_EQ(again[1].type(), pb::TENSOR_TYPE_BF16);

  // An unknown type number (a newer peer) is refused, naming the tensor:
  // proto2 parses it into the unknown fields, where it must not read as F32.
  std::string bytes;
  ASSERT_TRUE(specs[1].SerializeToString(&bytes));
  bytes += std::string("\x18\x63", 2);  // field 3 (type), varint 99
  ASSERT_TRUE(specs[1].ParseFromString(bytes));
  EXPECT_THAT(LayoutFromSpecs(specs),
              ::meridian::testing::StatusIs(StatusCode::kInvalidArgument,
                                            ::testing::HasSubstr("'w'")));
}

TEST(DecodeMessageTest, AcceptsWellFormedCommit) {
  const Wire wire = ValidCommit();
  pb::Header header;
  const Verdict verdict = Decode(wire, &header);
  ASSERT_FALSE(verdict) << verdict->reason;
  EXPECT_EQ(header.protocol_version(), kProtocolVersion);
  EXPECT_EQ(header.type(), pb::COMMIT);
  EXPECT_EQ(header.sequence(), 17u);
  EXPECT_EQ(header.sender().id(), 3u);
  EXPECT_EQ(header.commit().base_version(), 5u);
  ASSERT_EQ(header.slices_size(), 2);
  EXPECT_EQ(header.slices(0).tensor(), "w");
  EXPECT_EQ(header.slices(0).length(), 6u);
  EXPECT_EQ(header.slices(0).payload_bytes(), 24u);
  EXPECT_EQ(header.slices(1).tensor(), "b");
  EXPECT_EQ(header.slices(1).length(), 3u);
  EXPECT_EQ(DescribeHeader(header),
            "COMMIT from site-a/worker#3 seq 17 (2 slices)");
}

TEST(DescribeHeaderTest, QuotesAndEscapesASiteNameThatIsNotPlain) {
  pb::Endpoint sender = Worker(3);
  sender.set_site("evil\nFAKE 12:00:00.000 E site-a: forged");
  EXPECT_EQ(DescribeHeader(MakeHeader(pb::PULL, sender, 1)),
            "PULL from \"evil\\nFAKE 12:00:00.000 E site-a: forged\"/worker#3 "
            "seq 1");
  // A name cannot pose as another sender, nor close its quotes.
  sender.set_site("site-a/server seq 9 (1 slices)\" x");
  EXPECT_EQ(
      DescribeHeader(MakeHeader(pb::PULL, sender, 1)),
      "PULL from \"site-a/server seq 9 (1 slices)\\\" x\"/worker#3 seq 1");
  // Control bytes, invalid UTF-8 and length are handled; UTF-8 is kept.
  sender.set_site(std::string("z\xc3\xbcrich\x1b[2J\xff") +
                  std::string(500, 'x'));
  const std::string described = DescribeHeader(MakeHeader(pb::PULL, sender, 1));
  EXPECT_EQ(described.find('\n'), std::string::npos);
  EXPECT_EQ(described.find('\x1b'), std::string::npos);
  EXPECT_EQ(described.rfind("PULL from \"z\xc3\xbcrich\\x1b[2J\\xffxxx", 0), 0u)
      << described;
  EXPECT_NE(described.find("more bytes)\"/worker#3 seq 1"), std::string::npos)
      << described;
  EXPECT_LT(described.size(), 150u);
  // Plain names stay as they are.
  sender.set_site("us-east_1.b");
  EXPECT_EQ(DescribeHeader(MakeHeader(pb::PULL, sender, 1)),
            "PULL from us-east_1.b/worker#3 seq 1");
  sender.clear_site();
  EXPECT_EQ(DescribeHeader(MakeHeader(pb::PULL, sender, 1)),
            "PULL from ?/worker#3 seq 1");
}

TEST(DecodeMessageTest, AcceptsBodylessTypesWhereOptional) {
  Wire pull;
  pull.header = MakeHeader(pb::PULL, Worker(0), 1);
  EXPECT_EQ(DecodeCode(pull), pb::ERROR_CODE_UNSPECIFIED);
  pull.header.mutable_pull();
  EXPECT_EQ(DecodeCode(pull), pb::ERROR_CODE_UNSPECIFIED);

  Wire status;
  status.header = MakeHeader(pb::STATUS_REQUEST, Worker(0), 1);
  EXPECT_EQ(DecodeCode(status), pb::ERROR_CODE_UNSPECIFIED);
}

TEST(DecodeMessageTest, RejectsEmptyHeaderFrame) {
  pb::Header header;
  const Verdict verdict = DecodeFrames("", {}, &header);
  ASSERT_TRUE(verdict);
  EXPECT_EQ(verdict->code, pb::ERROR_MALFORMED);
  EXPECT_FALSE(verdict->reason.empty());
}

TEST(DecodeMessageTest, RejectsGarbageHeader) {
  pb::Header header;
  header.set_sequence(99);  // must be cleared
  // Field 1 as a length-delimited record far longer than the frame.
  const std::string garbage("\x0a\xff\xff\xff\x0f garbage", 13);
  const Verdict verdict = DecodeFrames(garbage, {}, &header);
  ASSERT_TRUE(verdict);
  EXPECT_EQ(verdict->code, pb::ERROR_MALFORMED);
  EXPECT_FALSE(header.has_sequence());

  // An invalid wire type (7).
  EXPECT_EQ(CodeOf(DecodeFrames(std::string("\x0f\x01\x02", 3), {}, &header)),
            pb::ERROR_MALFORMED);
}

TEST(DecodeMessageTest, RejectsOversizedHeader) {
  Wire wire;
  wire.header = MakeHeader(pb::SHUTDOWN, Worker(0), 1);
  wire.header.mutable_shutdown()->set_reason(
      std::string(kMaxHeaderBytes + 1, 'x'));
  EXPECT_EQ(DecodeCode(wire), pb::ERROR_MALFORMED);
}

TEST(DecodeMessageTest, RejectsWrongProtocolVersion) {
  Wire wire = ValidCommit();
  wire.header.set_protocol_version(kProtocolVersion + 1);
  pb::Header header;
  const Verdict verdict = Decode(wire, &header);
  ASSERT_TRUE(verdict);
  EXPECT_EQ(verdict->code, pb::ERROR_VERSION);
  // What parsed is kept so that the receiver can answer.
  EXPECT_EQ(header.sequence(), 17u);

  wire.header.clear_protocol_version();
  EXPECT_EQ(DecodeCode(wire), pb::ERROR_VERSION);
}

TEST(DecodeMessageTest, RejectsMissingOrUnknownType) {
  Wire wire = ValidCommit();
  wire.header.clear_type();
  EXPECT_EQ(DecodeCode(wire), pb::ERROR_MALFORMED);

  // A type number this build does not know (field 2, varint 99).
  pb::Header header;
  const std::string bytes =
      wire.header.SerializeAsString() + std::string("\x10\x63", 2);
  EXPECT_EQ(CodeOf(DecodeFrames(bytes, wire.payload, &header)),
            pb::ERROR_MALFORMED);
}

TEST(DecodeMessageTest, RejectsTypeWithWrongBody) {
  Wire commit = ValidCommit();
  commit.header.mutable_pull();  // replaces the commit body
  EXPECT_EQ(DecodeCode(commit), pb::ERROR_MALFORMED);

  commit.header.clear_body();  // COMMIT requires its body
  EXPECT_EQ(DecodeCode(commit), pb::ERROR_MALFORMED);

  Wire pull;
  pull.header = MakeHeader(pb::PULL, Worker(0), 1);
  pull.header.mutable_bye();
  EXPECT_EQ(DecodeCode(pull), pb::ERROR_MALFORMED);

  Wire status;  // STATUS_REQUEST carries no body at all
  status.header = MakeHeader(pb::STATUS_REQUEST, Worker(0), 1);
  status.header.mutable_pull();
  EXPECT_EQ(DecodeCode(status), pb::ERROR_MALFORMED);
}

TEST(DecodeMessageTest, RejectsSlicesOnTypeThatAllowsNone) {
  const ModelLayout layout = SmallLayout();
  Wire wire;
  wire.header = MakeHeader(pb::PULL, Worker(0), 1);
  wire.header.mutable_pull();
  AddTensorSlice(layout.tensors()[1], &wire.header);
  wire.payload.push_back(FloatBytes({1, 2, 3}));
  EXPECT_EQ(DecodeCode(wire), pb::ERROR_MALFORMED);

  wire.header = MakeHeader(pb::HELLO, Worker(0), 1);
  wire.header.mutable_hello()->set_worker_index(0);
  AddTensorSlice(layout.tensors()[1], &wire.header);
  EXPECT_EQ(DecodeCode(wire), pb::ERROR_MALFORMED);
}

TEST(DecodeMessageTest, RejectsFrameCountDifferentFromSliceCount) {
  Wire missing = ValidCommit();
  missing.payload.pop_back();
  EXPECT_EQ(DecodeCode(missing), pb::ERROR_SIZE_MISMATCH);

  Wire extra = ValidCommit();
  extra.payload.push_back(FloatBytes({7}));
  EXPECT_EQ(DecodeCode(extra), pb::ERROR_SIZE_MISMATCH);

  Wire no_slices;  // a PULL with a stray payload frame
  no_slices.header = MakeHeader(pb::PULL, Worker(0), 1);
  no_slices.payload.push_back(FloatBytes({7}));
  EXPECT_EQ(DecodeCode(no_slices), pb::ERROR_SIZE_MISMATCH);
}

TEST(DecodeMessageTest, RejectsPayloadBytesDifferentFromFrameSize) {
  Wire wire = ValidCommit();
  wire.header.mutable_slices(1)->set_payload_bytes(16);  // frame has 12
  EXPECT_EQ(DecodeCode(wire), pb::ERROR_SIZE_MISMATCH);

  // Header consistent with itself, frame one byte short.
  wire = ValidCommit();
  wire.payload[0].pop_back();
  EXPECT_EQ(DecodeCode(wire), pb::ERROR_SIZE_MISMATCH);
}

TEST(DecodeMessageTest, RejectsLengthTimesElementSizeDifferentFromFrame) {
  Wire wire = ValidCommit();
  wire.header.mutable_slices(0)->set_length(5);  // 20 bytes, frame has 24
  EXPECT_EQ(DecodeCode(wire), pb::ERROR_SIZE_MISMATCH);

  // A frame size that is not a whole number of floats.
  wire = ValidCommit();
  wire.payload[1] += 'x';
  wire.header.mutable_slices(1)->set_payload_bytes(13);
  EXPECT_EQ(DecodeCode(wire), pb::ERROR_SIZE_MISMATCH);
}

TEST(DecodeMessageTest, RejectsLengthWhoseByteSizeOverflows) {
  // 2^62 * 4 wraps to 0, matching an empty frame if computed naively.
  Wire wire = ValidCommit();
  wire.header.mutable_slices(1)->set_length(uint64_t{1} << 62);
  wire.header.mutable_slices(1)->set_payload_bytes(0);
  wire.payload[1].clear();
  EXPECT_EQ(DecodeCode(wire), pb::ERROR_SIZE_MISMATCH);

  // (2^62 + 1) * 4 wraps to 4: one real float.
  wire = ValidCommit();
  wire.header.mutable_slices(1)->set_length((uint64_t{1} << 62) + 1);
  wire.header.mutable_slices(1)->set_payload_bytes(4);
  wire.payload[1] = FloatBytes({1});
  EXPECT_EQ(DecodeCode(wire), pb::ERROR_SIZE_MISMATCH);

  wire.header.mutable_slices(1)->set_length(kU64Max);
  EXPECT_EQ(DecodeCode(wire), pb::ERROR_SIZE_MISMATCH);
}

TEST(DecodeMessageTest, RejectsUnknownDtypeOrCodec) {
  Wire wire = ValidCommit();
  wire.header.mutable_slices(1)->set_dtype(pb::DTYPE_UNSPECIFIED);
  EXPECT_EQ(DecodeCode(wire), pb::ERROR_MALFORMED);

  wire = ValidCommit();
  wire.header.mutable_slices(1)->set_codec(pb::CODEC_UNSPECIFIED);
  EXPECT_EQ(DecodeCode(wire), pb::ERROR_MALFORMED);
}

// A newer peer may send a dtype or codec number this build has never heard
// of (proto2 then leaves the field unset, i.e. at its FLOAT32/RAW default).
// It must be refused, not read as raw floats.
TEST(DecodeMessageTest, RejectsDtypeOrCodecNumbersFromTheFuture) {
  for (const int field : {4 /* dtype */, 5 /* codec */}) {
    Wire wire = ValidCommit();
    pb::TensorSlice* slice = wire.header.mutable_slices(1);
    if (field == 4) {
      slice->clear_dtype();
    } else {
      slice->clear_codec();
    }
    slice->mutable_unknown_fields()->AddVarint(field, 9);
    EXPECT_EQ(DecodeCode(wire), pb::ERROR_MALFORMED) << "field " << field;
  }
  // Unknown fields other than dtype/codec stay compatible.
  Wire wire = ValidCommit();
  wire.header.mutable_slices(1)->mutable_unknown_fields()->AddVarint(99, 2);
  EXPECT_EQ(DecodeCode(wire), pb::ERROR_CODE_UNSPECIFIED);
}

TEST(DecodeMessageTest, EnforcesSliceLimit) {
  const auto commit_with = [](int slices) {
    Wire wire;
    wire.header = MakeHeader(pb::COMMIT, Worker(0), 1);
    wire.header.mutable_commit();
    for (int i = 0; i < slices; ++i) {
      pb::TensorSlice* slice = wire.header.add_slices();
      slice->set_tensor("b");
      slice->set_length(0);
      slice->set_payload_bytes(0);
      wire.payload.emplace_back();
    }
    return wire;
  };
  EXPECT_EQ(DecodeCode(commit_with(kMaxSlices)), pb::ERROR_CODE_UNSPECIFIED);
  EXPECT_EQ(DecodeCode(commit_with(kMaxSlices + 1)), pb::ERROR_MALFORMED);
}

TEST(DecodeMessageTest, RejectionToStatusNamesTheCode) {
  const Rejection rejection{pb::ERROR_VERSION, "protocol version 7"};
  const Status status = rejection.ToStatus();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "ERROR_VERSION: protocol version 7");
}

// ---------------------------------------------------------------------------
// CheckSlicesAgainstLayout

pb::Header HeaderWithSlices(
    const std::vector<std::tuple<std::string, uint64_t, uint64_t>>& slices) {
  pb::Header header = MakeHeader(pb::COMMIT, Worker(0), 1);
  for (const auto& [tensor, offset, length] : slices) {
    pb::TensorSlice* slice = header.add_slices();
    slice->set_tensor(tensor);
    slice->set_offset(offset);
    slice->set_length(length);
    slice->set_payload_bytes(length * sizeof(float));
  }
  return header;
}

pb::ErrorCode LayoutCode(const pb::Header& header, bool whole_model) {
  return CodeOf(
      RejectionOf(CheckSlicesAgainstLayout(header, SmallLayout(), whole_model)));
}

TEST(CheckSlicesAgainstLayoutTest, AcceptsSlicesInsideTensors) {
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"w", 0, 6}, {"b", 0, 3}}), false),
            pb::ERROR_CODE_UNSPECIFIED);
  // Partial slices, any order, repeated tensors: fine outside whole_model.
  EXPECT_EQ(
      LayoutCode(HeaderWithSlices({{"b", 1, 2}, {"w", 3, 3}, {"w", 0, 1}}),
                 false),
      pb::ERROR_CODE_UNSPECIFIED);
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"w", 6, 0}}), false),
            pb::ERROR_CODE_UNSPECIFIED);
  EXPECT_EQ(LayoutCode(HeaderWithSlices({}), false),
            pb::ERROR_CODE_UNSPECIFIED);
}

TEST(CheckSlicesAgainstLayoutTest, RejectsUnknownTensor) {
  const Verdict verdict = RejectionOf(CheckSlicesAgainstLayout(
      HeaderWithSlices({{"w", 0, 6}, {"bias", 0, 3}}), SmallLayout(), false));
  ASSERT_TRUE(verdict);
  EXPECT_EQ(verdict->code, pb::ERROR_OUT_OF_RANGE);
  EXPECT_NE(verdict->reason.find("bias"), std::string::npos) << verdict->reason;
}

TEST(CheckSlicesAgainstLayoutTest, RejectsRangesBeyondTheTensor) {
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"w", 4, 3}}), false),
            pb::ERROR_OUT_OF_RANGE);
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"w", 0, 7}}), false),
            pb::ERROR_OUT_OF_RANGE);
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"b", 4, 0}}), false),
            pb::ERROR_OUT_OF_RANGE);
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"b", 0, 3}, {"b", 3, 1}}), false),
            pb::ERROR_OUT_OF_RANGE);
}

TEST(CheckSlicesAgainstLayoutTest, RangeCheckDoesNotOverflow) {
  // Each of these wraps offset + length to a small number.
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"w", kU64Max, 1}}), false),
            pb::ERROR_OUT_OF_RANGE);
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"w", kU64Max - 1, 3}}), false),
            pb::ERROR_OUT_OF_RANGE);
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"w", 1, kU64Max}}), false),
            pb::ERROR_OUT_OF_RANGE);
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"w", 0, kU64Max}}), false),
            pb::ERROR_OUT_OF_RANGE);
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"w", kU64Max, kU64Max}}), false),
            pb::ERROR_OUT_OF_RANGE);
}

TEST(CheckSlicesAgainstLayoutTest, WholeModelAcceptsEveryTensorInOrder) {
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"w", 0, 6}, {"b", 0, 3}}), true),
            pb::ERROR_CODE_UNSPECIFIED);
  pb::Header built = MakeHeader(pb::COMMIT, Worker(0), 1);
  AddLayoutSlices(SmallLayout(), &built);
  EXPECT_EQ(LayoutCode(built, true), pb::ERROR_CODE_UNSPECIFIED);
}

TEST(CheckSlicesAgainstLayoutTest, WholeModelRejectsWrongOrder) {
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"b", 0, 3}, {"w", 0, 6}}), true),
            pb::ERROR_OUT_OF_RANGE);
}

TEST(CheckSlicesAgainstLayoutTest, WholeModelRejectsPartialTensor) {
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"w", 0, 5}, {"b", 0, 3}}), true),
            pb::ERROR_OUT_OF_RANGE);
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"w", 1, 5}, {"b", 0, 3}}), true),
            pb::ERROR_OUT_OF_RANGE);
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"w", 0, 6}, {"b", 1, 2}}), true),
            pb::ERROR_OUT_OF_RANGE);
}

TEST(CheckSlicesAgainstLayoutTest, WholeModelRejectsMissingExtraOrRepeated) {
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"w", 0, 6}}), true),
            pb::ERROR_OUT_OF_RANGE);
  EXPECT_EQ(LayoutCode(HeaderWithSlices({}), true), pb::ERROR_OUT_OF_RANGE);
  EXPECT_EQ(
      LayoutCode(HeaderWithSlices({{"w", 0, 6}, {"b", 0, 3}, {"b", 0, 3}}),
                 true),
      pb::ERROR_OUT_OF_RANGE);
  EXPECT_EQ(LayoutCode(HeaderWithSlices({{"w", 0, 6}, {"w", 0, 6}}), true),
            pb::ERROR_OUT_OF_RANGE);
}

// ---------------------------------------------------------------------------
// CheckFinite

pb::TensorSlice SliceAt(uint64_t offset, uint64_t length) {
  pb::TensorSlice slice;
  slice.set_tensor("w");
  slice.set_offset(offset);
  slice.set_length(length);
  slice.set_payload_bytes(length * sizeof(float));
  return slice;
}

Verdict Finite(uint64_t offset, const std::vector<float>& values) {
  const std::string bytes = FloatBytes(values);
  return RejectionOf(CheckFinite(SliceAt(offset, values.size()),
                                 std::as_bytes(std::span(bytes))));
}

TEST(CheckFiniteTest, AcceptsFiniteValuesIncludingExtremes) {
  using L = std::numeric_limits<float>;
  EXPECT_FALSE(Finite(0, {}));
  EXPECT_FALSE(
      Finite(0, {0.0f, -0.0f, 1.0f, -1.5f, L::max(), L::lowest(), L::min(),
                 -L::min(), L::denorm_min(), -L::denorm_min(), L::epsilon()}));
}

TEST(CheckFiniteTest, LocatesNaN) {
  const Verdict verdict =
      Finite(10, {1.0f, 2.0f, std::numeric_limits<float>::quiet_NaN(), 4.0f});
  ASSERT_TRUE(verdict);
  EXPECT_EQ(verdict->code, pb::ERROR_NON_FINITE);
  EXPECT_NE(verdict->reason.find("NaN"), std::string::npos) << verdict->reason;
  EXPECT_NE(verdict->reason.find("'w'"), std::string::npos) << verdict->reason;
  EXPECT_NE(verdict->reason.find("element 12"), std::string::npos)
      << verdict->reason;
}

TEST(CheckFiniteTest, LocatesPositiveAndNegativeInfinity) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (const float bad : {kInf, -kInf}) {
    std::vector<float> values(9, 0.5f);
    values[7] = bad;
    const Verdict verdict = Finite(0, values);
    ASSERT_TRUE(verdict) << bad;
    EXPECT_EQ(verdict->code, pb::ERROR_NON_FINITE);
    EXPECT_NE(verdict->reason.find("Inf"), std::string::npos)
        << verdict->reason;
    EXPECT_EQ(verdict->reason.find("NaN"), std::string::npos)
        << verdict->reason;
    EXPECT_NE(verdict->reason.find("element 7"), std::string::npos)
        << verdict->reason;
  }
}

TEST(CheckFiniteTest, ReportsTheFirstBadElementAndOddNaNs) {
  // A signalling NaN with a payload, then an Inf: the NaN comes first.
  float snan;
  const uint32_t bits = 0x7f800001u;
  std::memcpy(&snan, &bits, sizeof(snan));
  const Verdict verdict =
      Finite(0, {1, snan, std::numeric_limits<float>::infinity()});
  ASSERT_TRUE(verdict);
  EXPECT_NE(verdict->reason.find("NaN"), std::string::npos) << verdict->reason;
  EXPECT_NE(verdict->reason.find("element 1"), std::string::npos)
      << verdict->reason;
}

TEST(CheckFiniteTest, WorksOnMisalignedPayload) {
  std::string buffer(1, 'x');
  buffer += FloatBytes({1, 2, std::numeric_limits<float>::quiet_NaN()});
  const std::span<const std::byte> payload =
      std::as_bytes(std::span(buffer)).subspan(1);
  const Verdict verdict = RejectionOf(CheckFinite(SliceAt(0, 3), payload));
  ASSERT_TRUE(verdict);
  EXPECT_NE(verdict->reason.find("element 2"), std::string::npos)
      << verdict->reason;
}

// ---------------------------------------------------------------------------
// Transport over real ZeroMQ sockets

std::string UniqueInproc() {
  static std::atomic<int> counter{0};
  return "inproc://message-test-" + std::to_string(counter++);
}

std::string AsString(const zmq::message_t& frame) { return frame.to_string(); }

class TransportTest : public ::testing::Test {
 protected:
  zmq::context_t context_{1};
};

TEST_F(TransportTest, RoundTripPreservesPayloadAndRoutingId) {
  zmq::socket_t router(context_, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  const std::string endpoint = UniqueInproc();
  router.bind(endpoint);
  zmq::socket_t dealer(context_, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::routing_id, "worker-7");
  dealer.connect(endpoint);

  const Wire wire = ValidCommit();
  std::vector<zmq::message_t> payload;
  for (const std::string& frame : wire.payload) {
    payload.emplace_back(frame.data(), frame.size());
  }
  ASSERT_OK(SendMessage(dealer, wire.header, std::move(payload)));

  Result<Received> got = ReceiveMessage(router, true, milliseconds(5000));
  ASSERT_OK(got);
  ASSERT_TRUE(got->message)
      << (got->refused ? got->refused->rejection.reason : "timed out");
  const Envelope& envelope = *got->message;
  EXPECT_EQ(envelope.routing_id, "worker-7");
  EXPECT_EQ(envelope.header.SerializeAsString(),
            wire.header.SerializeAsString());
  ASSERT_EQ(envelope.payload.size(), 2u);
  EXPECT_EQ(AsString(envelope.payload[0]), wire.payload[0]);
  EXPECT_EQ(AsString(envelope.payload[1]), wire.payload[1]);

  // And back to the dealer through the routing id.
  pb::Header reply = MakeHeader(pb::MODEL, pb::Endpoint(), 1);
  reply.mutable_model()->set_version(9);
  pb::TensorSlice* slice = reply.add_slices();
  slice->set_tensor("b");
  slice->set_length(3);
  slice->set_payload_bytes(12);
  std::vector<zmq::message_t> reply_payload;
  reply_payload.push_back(CopyFloatFrame(std::vector<float>{7, 8, 9}));
  ASSERT_OK(SendMessage(router, reply, std::move(reply_payload), envelope.routing_id));
  Result<Received> back = ReceiveMessage(dealer, false, milliseconds(5000));
  ASSERT_OK(back);
  ASSERT_TRUE(back->message);
  EXPECT_EQ(back->message->routing_id, "");
  EXPECT_EQ(back->message->header.model().version(), 9u);
  ASSERT_EQ(back->message->payload.size(), 1u);
  EXPECT_EQ(AsString(back->message->payload[0]), FloatBytes({7, 8, 9}));
}

TEST_F(TransportTest, MalformedMessageComesBackRefused) {
  zmq::socket_t router(context_, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  const std::string endpoint = UniqueInproc();
  router.bind(endpoint);
  zmq::socket_t dealer(context_, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::routing_id, "w1");
  dealer.connect(endpoint);

  // A COMMIT whose second payload frame is missing.
  Wire wire = ValidCommit();
  std::vector<zmq::message_t> payload;
  payload.emplace_back(wire.payload[0].data(), wire.payload[0].size());
  ASSERT_OK(SendMessage(dealer, wire.header, std::move(payload)));

  Result<Received> got = ReceiveMessage(router, true, milliseconds(5000));
  ASSERT_OK(got);
  ASSERT_FALSE(got->message);
  ASSERT_TRUE(got->refused);
  EXPECT_FALSE(got->timed_out());
  EXPECT_EQ(got->refused->routing_id, "w1");
  EXPECT_EQ(got->refused->rejection.code, pb::ERROR_SIZE_MISMATCH);
  EXPECT_EQ(got->refused->header.sequence(), 17u);

  // Garbage header bytes.
  const std::string garbage = "\xff\xff\xff";
  ASSERT_TRUE(dealer.send(zmq::message_t(garbage.data(), garbage.size()),
                          zmq::send_flags::none));
  got = ReceiveMessage(router, true, milliseconds(5000));
  ASSERT_OK(got);
  ASSERT_TRUE(got->refused);
  EXPECT_EQ(got->refused->rejection.code, pb::ERROR_MALFORMED);

  // The sender hears about it through SendError.
  ASSERT_OK(SendError(router, pb::Endpoint(), 4, got->refused->rejection, 17,
                        got->refused->routing_id));
  Result<Received> error = ReceiveMessage(dealer, false, milliseconds(5000));
  ASSERT_OK(error);
  ASSERT_TRUE(error->message);
  EXPECT_EQ(error->message->header.type(), pb::ERROR);
  EXPECT_EQ(error->message->header.error().code(), pb::ERROR_MALFORMED);
  EXPECT_EQ(error->message->header.error().rejected_sequence(), 17u);
}

TEST_F(TransportTest, ReceiveTimesOut) {
  zmq::socket_t router(context_, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind(UniqueInproc());
  const auto start = Clock::now();
  Result<Received> got = ReceiveMessage(router, true, milliseconds(50));
  const auto elapsed = Clock::now() - start;
  ASSERT_OK(got);
  EXPECT_TRUE(got->timed_out());
  EXPECT_GE(elapsed, milliseconds(40));
  EXPECT_LT(elapsed, milliseconds(5000));
}

// Answers every request with a MODEL whose version is the request's
// sequence number and whose payload echoes the request's.
class EchoServer {
 public:
  explicit EchoServer(zmq::context_t& context)
      : router_(context, zmq::socket_type::router) {
    router_.set(zmq::sockopt::linger, 0);
    router_.bind("tcp://127.0.0.1:*");
    endpoint_ = BoundEndpoint(router_).value();
    thread_ = std::thread([this] { Loop(); });
  }
  ~EchoServer() {
    stop_ = true;
    thread_.join();
  }

  const std::string& endpoint() const { return endpoint_; }
  // The last request seen (read after the call returned).
  pb::Header last_request() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_request_;
  }

 private:
  void Loop() {
    while (!stop_) {
      Result<Received> got = ReceiveMessage(router_, true, milliseconds(20));
      if (!got.ok() || !got->message) continue;
      Envelope& request = *got->message;
      {
        std::lock_guard<std::mutex> lock(mu_);
        last_request_ = request.header;
      }
      pb::Header reply = MakeHeader(pb::MODEL, pb::Endpoint(), 1);
      reply.mutable_model()->set_version(request.header.sequence());
      *reply.mutable_slices() = request.header.slices();
      SendMessage(router_, reply, std::move(request.payload),
                  request.routing_id)
          .IgnoreError();
    }
  }

  zmq::socket_t router_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  pb::Header last_request_;
  std::thread thread_;
};

TEST_F(TransportTest, RpcCallGetsReply) {
  EchoServer server(context_);
  RpcClient client(context_, server.endpoint(), Worker(2));

  pb::Header request;
  request.set_type(pb::PULL);
  request.mutable_pull();
  Result<Envelope> reply = client.Call(request, {}, milliseconds(10000));
  ASSERT_OK(reply);
  EXPECT_EQ(reply->header.type(), pb::MODEL);
  EXPECT_EQ(reply->header.model().version(), 1u);
  EXPECT_EQ(client.last_sequence(), 1u);
  const pb::Header seen = server.last_request();
  EXPECT_EQ(seen.protocol_version(), kProtocolVersion);
  EXPECT_EQ(seen.sender().site(), "site-a");
  EXPECT_EQ(seen.sender().id(), 2u);

  // Second call with a payload: new sequence, payload echoed.
  const Wire wire = ValidCommit();
  std::vector<zmq::message_t> payload;
  for (const std::string& frame : wire.payload) {
    payload.emplace_back(frame.data(), frame.size());
  }
  reply = client.Call(wire.header, std::move(payload), milliseconds(10000));
  ASSERT_OK(reply);
  EXPECT_EQ(reply->header.model().version(), 2u);
  EXPECT_EQ(client.last_sequence(), 2u);
  ASSERT_EQ(reply->payload.size(), 2u);
  EXPECT_EQ(AsString(reply->payload[0]), wire.payload[0]);
  EXPECT_EQ(AsString(reply->payload[1]), wire.payload[1]);
}

TEST_F(TransportTest, RpcCallTimesOutWhenNobodyAnswers) {
  zmq::socket_t router(context_, zmq::socket_type::router);  // never reads
  router.set(zmq::sockopt::linger, 0);
  router.bind("tcp://127.0.0.1:*");
  RpcClient client(context_, BoundEndpoint(router).value(), Worker(0));
  pb::Header request;
  request.set_type(pb::PULL);
  const auto start = Clock::now();
  Result<Envelope> reply = client.Call(request, {}, milliseconds(250));
  const auto elapsed = Clock::now() - start;
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kDeadlineExceeded)
      << reply.status();
  EXPECT_GE(elapsed, milliseconds(240));
  EXPECT_LT(elapsed, milliseconds(5000));
}

TEST_F(TransportTest, RpcCallIsCancelledFromAnotherThread) {
  zmq::socket_t router(context_, zmq::socket_type::router);  // never reads
  router.set(zmq::sockopt::linger, 0);
  const std::string endpoint = UniqueInproc();
  router.bind(endpoint);
  std::atomic<bool> cancel{false};
  RpcClient client(context_, endpoint, Worker(0), &cancel);
  pb::Header request;
  request.set_type(pb::PULL);

  std::thread canceller([&cancel, &router] {
    // Cancel once the call is waiting: its request has arrived.
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, milliseconds(60000));
    cancel = true;
  });
  const auto start = Clock::now();
  Result<Envelope> reply = client.Call(request, {}, milliseconds(60000));
  const auto cancelled_after = Clock::now() - start;
  canceller.join();
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kCancelled) << reply.status();
  EXPECT_LT(cancelled_after, milliseconds(150) + std::chrono::seconds(1));
}

TEST(FloatsOfTest, ViewsAlignedFrame) {
  const std::vector<float> values = {1.5f, -2.0f, 3.25f};
  const zmq::message_t frame = CopyFloatFrame(values);
  std::vector<float> scratch;
  const std::span<const float> floats = FloatsOf(frame, &scratch);
  if (reinterpret_cast<uintptr_t>(frame.data()) % alignof(float) == 0) {
    EXPECT_EQ(static_cast<const void*>(floats.data()), frame.data());
  }
  EXPECT_EQ(std::vector<float>(floats.begin(), floats.end()), values);
}

TEST(FloatsOfTest, CopiesMisalignedFrame) {
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 1e-40f, 7.0f};
  // Storage aligned for floats, frame starting one byte in.
  std::vector<float> storage(values.size() + 2);
  auto* base = reinterpret_cast<std::byte*>(storage.data());
  std::memcpy(base + 1, values.data(), values.size() * sizeof(float));
  // Zero-copy frame over our buffer (no free function: we own it).
  const zmq::message_t frame(base + 1, values.size() * sizeof(float), nullptr);
  ASSERT_NE(reinterpret_cast<uintptr_t>(frame.data()) % alignof(float), 0u);

  std::vector<float> scratch;
  const std::span<const float> floats = FloatsOf(frame, &scratch);
  EXPECT_EQ(floats.data(), scratch.data());
  ASSERT_EQ(floats.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(floats[i], values[i]) << i;
  }
}

TEST(FloatsOfTest, IgnoresTrailingPartialFloat) {
  std::string bytes = FloatBytes({4.0f, 5.0f}) + "xy";
  const zmq::message_t frame(bytes.data(), bytes.size());
  std::vector<float> scratch;
  const std::span<const float> floats = FloatsOf(frame, &scratch);
  ASSERT_EQ(floats.size(), 2u);
  EXPECT_EQ(floats[0], 4.0f);
  EXPECT_EQ(floats[1], 5.0f);
}

// ---------------------------------------------------------------------------
// CODEC_ROWS

TensorInfo Embedding() {
  TensorInfo tensor;
  tensor.name = "emb";
  tensor.shape = {5, 3};
  tensor.size = 15;
  tensor.offset = 100;
  return tensor;
}

// A CODEC_ROWS payload of `rows` with row k's values all equal to k + 0.5.
std::vector<std::byte> RowsPayload(const std::vector<uint32_t>& rows,
                                   pb::Header* header) {
  const TensorInfo tensor = Embedding();
  std::vector<std::byte> bytes(RowsPayloadBytes(rows.size(), 3));
  float* values = AddRowsSlice(tensor, rows, bytes, header);
  for (size_t k = 0; k < rows.size(); ++k) {
    const float v[3] = {k + 0.5f, k + 0.5f, k + 0.5f};
    std::memcpy(values + 3 * k, v, sizeof(v));
  }
  return bytes;
}

TEST(RowsCodecTest, RoundTripsRowsAndTheirValues) {
  pb::Header header;
  const std::vector<std::byte> bytes = RowsPayload({0, 3, 4}, &header);
  ASSERT_EQ(header.slices_size(), 1);
  const pb::TensorSlice& slice = header.slices(0);
  EXPECT_EQ(slice.codec(), pb::CODEC_ROWS);
  EXPECT_EQ(slice.length(), 15u);
  EXPECT_EQ(slice.payload_bytes(), bytes.size());
  // 4 (count) + 3 x 4 (indices) + 3 x 3 x 4 (values): the bytes grow with
  // the rows sent, not with the tensor.
  EXPECT_EQ(bytes.size(), 4u + 12u + 36u);
  Parsed<DecodedRows> decoded = DecodeRows(slice, Embedding(), bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.rejection().reason;
  DecodedRows rows = *decoded;
  EXPECT_EQ(rows.row_length, 3u);
  EXPECT_EQ(rows.rows, (std::vector<uint32_t>{0, 3, 4}));
  EXPECT_EQ(rows.values, (std::vector<float>{0.5f, 0.5f, 0.5f, 1.5f, 1.5f, 1.5f,
                                             2.5f, 2.5f, 2.5f}));
  // No rows at all is a valid (empty) update.
  pb::Header empty_header;
  const std::vector<std::byte> empty = RowsPayload({}, &empty_header);
  Parsed<DecodedRows> none = DecodeRows(empty_header.slices(0), Embedding(), empty);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->rows.empty());
}

TEST(RowsCodecTest, RefusesEveryMalformedPayloadNamingTheProblem) {
  struct Case {
    std::vector<uint32_t> rows;
    void (*mutate)(pb::TensorSlice*, std::vector<std::byte>*);
    pb::ErrorCode code;
    const char* says;
  };
  const Case cases[] = {
      {{3, 1}, nullptr, pb::ERROR_MALFORMED, "not ascending"},
      {{1, 1}, nullptr, pb::ERROR_MALFORMED, "not ascending"},
      {{5}, nullptr, pb::ERROR_MALFORMED, "out of range"},
      {{1},
       [](pb::TensorSlice*, std::vector<std::byte>* b) { b->pop_back(); },
       pb::ERROR_SIZE_MISMATCH,
       "need"},
      {{1},
       [](pb::TensorSlice*, std::vector<std::byte>* b) { b->resize(2); },
       pb::ERROR_SIZE_MISMATCH,
       "shorter"},
      {{1},
       [](pb::TensorSlice*, std::vector<std::byte>* b) {
         (*b)[0] = std::byte{6};  // more rows than the tensor has
       },
       pb::ERROR_OUT_OF_RANGE,
       "the tensor has 5"},
      {{1},
       [](pb::TensorSlice* s, std::vector<std::byte>*) { s->set_offset(3); },
       pb::ERROR_MALFORMED,
       "whole tensor"},
      {{1},
       [](pb::TensorSlice*, std::vector<std::byte>* b) {
         const float nan = std::numeric_limits<float>::quiet_NaN();
         std::memcpy(b->data() + 8, &nan, sizeof(nan));
       },
       pb::ERROR_NON_FINITE,
       "NaN"},
  };
  for (const Case& c : cases) {
    pb::Header header;
    std::vector<std::byte> bytes = RowsPayload(c.rows, &header);
    pb::TensorSlice slice = header.slices(0);
    if (c.mutate != nullptr) c.mutate(&slice, &bytes);
    const Verdict verdict =
        RejectionOf(DecodeRows(slice, Embedding(), bytes));
    ASSERT_TRUE(verdict) << c.says;
    EXPECT_EQ(verdict->code, c.code) << verdict->reason;
    EXPECT_NE(verdict->reason.find(c.says), std::string::npos)
        << verdict->reason;
    EXPECT_NE(verdict->reason.find("'emb'"), std::string::npos)
        << verdict->reason;
  }
}

// ---------------------------------------------------------------------------
// ParseModelPayload, ParseCommit

// The frames of `wire` as a receiver views them.
std::vector<FrameView> Views(const Wire& wire) {
  std::vector<FrameView> views;
  for (const std::string& frame : wire.payload) {
    views.push_back(FrameView{std::as_bytes(std::span(frame))});
  }
  return views;
}

TEST(ParseModelPayloadTest, BorrowsEveryTensorsValuesFromAlignedFrames) {
  const ModelLayout layout = SmallLayout();
  const Wire wire = ValidCommit();
  const std::vector<FrameView> views = Views(wire);
  Parsed<ModelPayload> parsed = ParseModelPayload(wire.header, views, layout);
  ASSERT_TRUE(parsed.ok()) << parsed.rejection().reason;
  ASSERT_EQ(parsed->tensors.size(), 2u);
  EXPECT_FALSE(parsed->has_rows());
  EXPECT_TRUE(parsed->realigned.empty());
  for (size_t t = 0; t < 2; ++t) {
    const TensorPayload& tensor = parsed->tensors[t];
    EXPECT_EQ(tensor.tensor, &layout.tensors()[t]);
    EXPECT_FALSE(tensor.rows.has_value());
    // A view of the frame itself: no copy.
    EXPECT_EQ(static_cast<const void*>(tensor.values.data()),
              static_cast<const void*>(views[t].bytes.data()));
  }
  EXPECT_EQ(std::vector<float>(parsed->tensors[1].values.begin(),
                               parsed->tensors[1].values.end()),
            (std::vector<float>{-1, -2, -3}));
}

TEST(ParseModelPayloadTest, CopiesOnlyFramesNotAlignedForFloats) {
  const ModelLayout layout = SmallLayout();
  const Wire wire = ValidCommit();
  std::vector<FrameView> views = Views(wire);
  // Tensor b's bytes one byte into a buffer: not aligned for floats.
  std::vector<std::byte> shifted(wire.payload[1].size() + 1);
  std::memcpy(shifted.data() + 1, wire.payload[1].data(),
              wire.payload[1].size());
  views[1] = FrameView{std::span<const std::byte>(shifted).subspan(1)};
  Parsed<ModelPayload> parsed = ParseModelPayload(wire.header, views, layout);
  ASSERT_TRUE(parsed.ok()) << parsed.rejection().reason;
  ASSERT_EQ(parsed->realigned.size(), 1u);
  EXPECT_EQ(static_cast<const void*>(parsed->tensors[0].values.data()),
            static_cast<const void*>(views[0].bytes.data()));
  // A move keeps the copy the values point into.
  ModelPayload moved = std::move(parsed).value();
  EXPECT_EQ(moved.tensors[1].values.data(), moved.realigned[0].data());
  EXPECT_EQ(std::vector<float>(moved.tensors[1].values.begin(),
                               moved.tensors[1].values.end()),
            (std::vector<float>{-1, -2, -3}));
}

TEST(ParseModelPayloadTest, DecodesRowsSlices) {
  const ModelLayout layout = SmallLayout();
  Wire wire = ValidCommit();
  wire.header.clear_slices();
  // w (2 rows of 3) as its row 1, b whole.
  std::vector<std::byte> rows(RowsPayloadBytes(1, 3));
  float* values = AddRowsSlice(layout.tensors()[0], std::vector<uint32_t>{1},
                               rows, &wire.header);
  const float row[3] = {7, 8, 9};
  std::memcpy(values, row, sizeof(row));
  AddTensorSlice(layout.tensors()[1], &wire.header);
  wire.payload[0].assign(reinterpret_cast<const char*>(rows.data()),
                         rows.size());
  Parsed<ModelPayload> parsed =
      ParseModelPayload(wire.header, Views(wire), layout);
  ASSERT_TRUE(parsed.ok()) << parsed.rejection().reason;
  EXPECT_TRUE(parsed->has_rows());
  ASSERT_TRUE(parsed->tensors[0].rows.has_value());
  EXPECT_TRUE(parsed->tensors[0].values.empty());
  EXPECT_EQ(parsed->tensors[0].rows->rows, std::vector<uint32_t>{1});
  EXPECT_EQ(parsed->tensors[0].rows->values, (std::vector<float>{7, 8, 9}));
  EXPECT_EQ(parsed->tensors[1].values.size(), 3u);
}

TEST(ParseModelPayloadTest, RefusesWithTheFirstFailingCheck) {
  const ModelLayout layout = SmallLayout();
  struct Case {
    void (*mutate)(Wire*);
    pb::ErrorCode code;
    const char* says;
  };
  const Case cases[] = {
      // Not the whole model: the layout check comes first, even before the
      // NaN in the remaining slice.
      {[](Wire* w) {
         w->header.mutable_slices()->RemoveLast();
         w->payload.pop_back();
         const float nan = std::numeric_limits<float>::quiet_NaN();
         std::memcpy(w->payload[0].data(), &nan, sizeof(nan));
       },
       pb::ERROR_OUT_OF_RANGE, "expected one slice per tensor (2), got 1"},
      {[](Wire* w) {
         w->header.mutable_slices(1)->set_codec(pb::CODEC_PIPELINE);
       },
       pb::ERROR_MALFORMED,
       "slice 1 ('b') must be encoded as CODEC_RAW or CODEC_ROWS in COMMIT"},
      {[](Wire* w) {
         const float inf = std::numeric_limits<float>::infinity();
         std::memcpy(w->payload[1].data() + 4, &inf, sizeof(inf));
       },
       pb::ERROR_NON_FINITE, "Inf in tensor 'b' at element 1"},
      {[](Wire* w) { w->payload.pop_back(); }, pb::ERROR_SIZE_MISMATCH,
       "header announces 2 payload frames, message has 1"},
  };
  for (const Case& c : cases) {
    Wire wire = ValidCommit();
    c.mutate(&wire);
    const Verdict verdict =
        RejectionOf(ParseModelPayload(wire.header, Views(wire), layout));
    ASSERT_TRUE(verdict) << c.says;
    EXPECT_EQ(verdict->code, c.code) << verdict->reason;
    EXPECT_EQ(verdict->reason, c.says);
  }
}

TEST(ParseCommitTest, HoldsTheFieldsTheUpdateAndTheReads) {
  const ModelLayout layout = SmallLayout();
  Wire wire = ValidCommit();
  pb::RowRead* read = wire.header.mutable_commit()->add_reads();
  read->set_tensor("w");
  read->add_rows(1);
  const std::vector<FrameView> views = Views(wire);
  Parsed<WorkerCommit> commit = ParseCommit(wire.header, views, layout);
  ASSERT_TRUE(commit.ok()) << commit.rejection().reason;
  EXPECT_EQ(commit->fields, &wire.header.commit());
  EXPECT_EQ(commit->fields->base_version(), 5u);
  ASSERT_EQ(commit->update.tensors.size(), 2u);
  ASSERT_EQ(commit->reads.size(), 2u);
  EXPECT_EQ(commit->reads[0], std::vector<uint32_t>{1});
  EXPECT_FALSE(commit->reads[1].has_value());
}

TEST(ParseCommitTest, RefusesTheUpdateBeforeTheReads) {
  const ModelLayout layout = SmallLayout();
  Wire wire = ValidCommit();
  wire.header.mutable_commit()->add_reads()->set_tensor("nope");
  Verdict verdict = RejectionOf(ParseCommit(wire.header, Views(wire), layout));
  ASSERT_TRUE(verdict);
  EXPECT_EQ(verdict->code, pb::ERROR_OUT_OF_RANGE);
  EXPECT_EQ(verdict->reason, "reads[0] ('nope'): unknown tensor");

  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(wire.payload[0].data(), &nan, sizeof(nan));
  verdict = RejectionOf(ParseCommit(wire.header, Views(wire), layout));
  ASSERT_TRUE(verdict);
  EXPECT_EQ(verdict->code, pb::ERROR_NON_FINITE);
  EXPECT_EQ(verdict->reason, "NaN in tensor 'w' at element 0");
}

}  // namespace
}  // namespace meridian
