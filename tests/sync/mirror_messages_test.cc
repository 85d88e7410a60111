// The mirror protocol's parse functions (src/sync/mirror_messages.h) on
// hand-made envelopes, without a network: a valid message becomes its
// typed value; a bad one its rejection, with the code and reason the site
// answers with (mirror_input_test.cc sends the same through a live site).
#include "sync/mirror_messages.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>
#include <zmq.hpp>

#include "meridian/compression/compression.h"
#include "meridian/net/message.h"
#include "testing/mirror_messages.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

class MirrorMessagesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK(layout_.Add("fc0.weight", {2, 3}));
    ASSERT_OK(layout_.Add("fc0.bias", {3}));
    sender_.set_site("b");
    sender_.set_role(pb::ROLE_SITE_SERVER);
  }

  // A MIRROR_UPDATE of clock 1 adding `value` to fc0.bias[0..2].
  Envelope BiasUpdate(float value) {
    Envelope message;
    EXPECT_OK(testing::MakeBiasUpdate(layout_, 1, "b", value, &message.header,
                                      &message.payload));
    *message.header.mutable_sender() = sender_;
    return message;
  }

  // A MIRROR_TRAVEL carrying `model`'s values at `carried` of its
  // elements (all of them: a whole model).
  Envelope Travel(const std::vector<float>& model,
                  const std::vector<uint64_t>& carried) {
    Envelope message;
    message.header = MakeHeader(pb::MIRROR_TRAVEL, sender_, 1);
    message.header.mutable_mirror_travel()->set_travel_id(7);
    message.header.mutable_mirror_travel()->set_clock(5);
    pb::CompressionConfig config;
    config.set_value_coding(pb::VALUE_FP32);
    Result<UpdateEncoder> encoder = UpdateEncoder::Create(config);
    EXPECT_OK(encoder);
    for (const TensorInfo& tensor : layout_.tensors()) {
      std::vector<uint32_t> indices;
      std::vector<float> values;
      for (uint64_t i : carried) {
        if (i < tensor.offset || i >= tensor.offset + tensor.size) continue;
        indices.push_back(static_cast<uint32_t>(i - tensor.offset));
        values.push_back(model[i]);
      }
      Result<EncodedUpdate> encoded =
          encoder->EncodeSparse(tensor.size, indices, values, {});
      EXPECT_OK(encoded);
      pb::TensorSlice* slice = message.header.add_slices();
      slice->set_tensor(tensor.name);
      slice->set_offset(0);
      slice->set_length(tensor.size);
      slice->set_codec(pb::CODEC_PIPELINE);
      slice->set_payload_bytes(encoded->bytes.size());
      message.payload.emplace_back(encoded->bytes.data(),
                                   encoded->bytes.size());
    }
    return message;
  }

  ModelLayout layout_;
  pb::Endpoint sender_;
  UpdateDecoder decoder_;
};

TEST_F(MirrorMessagesTest, AValidUpdateIsItsDecodedValues) {
  Envelope message = BiasUpdate(0.25f);
  message.header.mutable_mirror_update()->set_sent_unix_us(3'000'000);
  message.header.mutable_mirror_update()->set_window_start_unix_us(1'500'000);
  Parsed<MirrorUpdate> update = ParseMirrorUpdate(message, layout_, decoder_);
  ASSERT_TRUE(update.ok()) << update.rejection().reason;
  EXPECT_FALSE(update->indices_only);
  EXPECT_FALSE(update->average);
  EXPECT_EQ(update->clock, 1);
  EXPECT_DOUBLE_EQ(update->sent_unix_s, 3.0);
  EXPECT_DOUBLE_EQ(update->window_start_unix_s, 1.5);
  const uint64_t bias = layout_.Find("fc0.bias")->offset;
  EXPECT_EQ(update->decoded.indices,
            (std::vector<uint64_t>{bias, bias + 1, bias + 2}));
  EXPECT_EQ(update->decoded.values, (std::vector<float>(3, 0.25f)));
}

TEST_F(MirrorMessagesTest, IndicesAreMarkedAsSuch) {
  Envelope message = BiasUpdate(0.0f);
  message.header.set_type(pb::MIRROR_INDICES);
  Parsed<MirrorUpdate> update = ParseMirrorUpdate(message, layout_, decoder_);
  ASSERT_TRUE(update.ok()) << update.rejection().reason;
  EXPECT_TRUE(update->indices_only);
  EXPECT_EQ(update->decoded.indices.size(), 3u);
}

TEST_F(MirrorMessagesTest, AnUnknownTensorIsOutOfRange) {
  Envelope message = BiasUpdate(1.0f);
  message.header.mutable_slices(0)->set_tensor("fc9.bias");
  Parsed<MirrorUpdate> update = ParseMirrorUpdate(message, layout_, decoder_);
  ASSERT_FALSE(update.ok());
  EXPECT_EQ(update.rejection().code, pb::ERROR_OUT_OF_RANGE);
  EXPECT_NE(update.rejection().reason.find("fc9.bias"), std::string::npos);
}

TEST_F(MirrorMessagesTest, ARawSliceIsMalformed) {
  Envelope message = BiasUpdate(1.0f);
  message.header.mutable_slices(0)->set_codec(pb::CODEC_RAW);
  Parsed<MirrorUpdate> update = ParseMirrorUpdate(message, layout_, decoder_);
  ASSERT_FALSE(update.ok());
  EXPECT_EQ(update.rejection().code, pb::ERROR_MALFORMED);
  EXPECT_NE(update.rejection().reason.find("CODEC_PIPELINE"),
            std::string::npos);
}

TEST_F(MirrorMessagesTest, ACorruptPayloadIsMalformedNamingItsSlice) {
  Envelope message = BiasUpdate(1.0f);
  zmq::message_t& frame = message.payload[0];
  static_cast<char*>(frame.data())[frame.size() / 2] ^= 0x5a;
  Parsed<MirrorUpdate> update = ParseMirrorUpdate(message, layout_, decoder_);
  ASSERT_FALSE(update.ok());
  EXPECT_EQ(update.rejection().code, pb::ERROR_MALFORMED);
  EXPECT_NE(update.rejection().reason.find("fc0.bias"), std::string::npos);
}

TEST_F(MirrorMessagesTest, AWholeModelTravelsAsItsValues) {
  std::vector<float> model(layout_.num_elements());
  std::vector<uint64_t> all;
  for (uint64_t i = 0; i < model.size(); ++i) {
    model[i] = 0.5f * static_cast<float>(i) - 1.0f;
    all.push_back(i);
  }
  Parsed<MirrorTravel> travel =
      ParseMirrorTravel(Travel(model, all), layout_, decoder_);
  ASSERT_TRUE(travel.ok()) << travel.rejection().reason;
  EXPECT_EQ(travel->travel_id, 7u);
  EXPECT_EQ(travel->clock, 5);
  EXPECT_EQ(travel->model, model);
}

TEST_F(MirrorMessagesTest, ATravelMissingElementsIsMalformed) {
  const std::vector<float> model(layout_.num_elements(), 1.0f);
  Parsed<MirrorTravel> travel =
      ParseMirrorTravel(Travel(model, {0, 1, 2}), layout_, decoder_);
  ASSERT_FALSE(travel.ok());
  EXPECT_EQ(travel.rejection().code, pb::ERROR_MALFORMED);
  EXPECT_NE(travel.rejection().reason.find("every element once (got 3 of 9)"),
            std::string::npos)
      << travel.rejection().reason;
}

TEST_F(MirrorMessagesTest, AnUpdateIsNotAWholeModel) {
  Envelope message = BiasUpdate(1.0f);
  message.header.set_type(pb::MIRROR_TRAVEL);
  Parsed<MirrorTravel> travel = ParseMirrorTravel(message, layout_, decoder_);
  ASSERT_FALSE(travel.ok());
  EXPECT_EQ(travel.rejection().code, pb::ERROR_OUT_OF_RANGE);
  EXPECT_NE(travel.rejection().reason.find("one slice per tensor"),
            std::string::npos);
}

TEST_F(MirrorMessagesTest, AHelloWithAnotherModelIsALayoutMismatch) {
  ModelLayout other;
  ASSERT_OK(other.Add("fc0.weight", {5, 784}));
  Envelope message;
  message.header = MakeHeader(pb::MIRROR_HELLO, sender_, 0);
  LayoutToSpecs(other, message.header.mutable_mirror_hello()->mutable_layout());
  Parsed<MirrorHello> hello = ParseMirrorHello(message, layout_);
  ASSERT_FALSE(hello.ok());
  EXPECT_EQ(hello.rejection().code, pb::ERROR_LAYOUT_MISMATCH);
  EXPECT_NE(hello.rejection().reason.find("site 'b' has model [fc0.weight"),
            std::string::npos)
      << hello.rejection().reason;
}

TEST_F(MirrorMessagesTest, AHelloIsItsChannelsStart) {
  Envelope message;
  message.header = MakeHeader(pb::MIRROR_HELLO, sender_, 0);
  pb::MirrorHello* body = message.header.mutable_mirror_hello();
  LayoutToSpecs(layout_, body->mutable_layout());
  body->set_incarnation(42);
  body->set_first_sequence(3);
  body->set_resumed(true);
  body->set_clock(9);
  Parsed<MirrorHello> hello = ParseMirrorHello(message, layout_);
  ASSERT_TRUE(hello.ok()) << hello.rejection().reason;
  EXPECT_EQ(hello->incarnation, 42u);
  EXPECT_EQ(hello->first_sequence, 3u);
  EXPECT_TRUE(hello->resumed);
  EXPECT_EQ(hello->clock, 9);
}

TEST_F(MirrorMessagesTest, ClocksAndTravelResultsAreTheirFields) {
  Envelope clock;
  clock.header = MakeHeader(pb::MIRROR_CLOCK, sender_, 4);
  clock.header.mutable_mirror_clock()->set_clock(12);
  clock.header.mutable_mirror_clock()->set_final(true);
  Parsed<MirrorClock> parsed_clock = ParseMirrorClock(clock);
  ASSERT_TRUE(parsed_clock.ok());
  EXPECT_EQ(parsed_clock->clock, 12);
  EXPECT_TRUE(parsed_clock->final);

  Envelope result;
  result.header = MakeHeader(pb::MIRROR_TRAVEL_RESULT, sender_, 5);
  pb::MirrorTravelResult* body = result.header.mutable_mirror_travel_result();
  body->set_travel_id(7);
  body->set_clock(5);
  body->set_samples(100);
  body->set_own_accuracy(0.9);
  body->set_travelled_accuracy(0.8);
  body->set_discordant(12);
  Parsed<MirrorTravelResult> parsed = ParseMirrorTravelResult(result);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->travel_id, 7u);
  EXPECT_EQ(parsed->clock, 5);
  EXPECT_EQ(parsed->scores.samples, 100u);
  EXPECT_DOUBLE_EQ(parsed->scores.own_accuracy, 0.9);
  EXPECT_DOUBLE_EQ(parsed->scores.travelled_accuracy, 0.8);
  EXPECT_EQ(parsed->scores.discordant, 12u);
}

}  // namespace
}  // namespace meridian
