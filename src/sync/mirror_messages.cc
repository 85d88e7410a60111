#include "sync/mirror_messages.h"

#include <string>
#include <utility>

namespace meridian {
namespace {

// The slices of an update-shaped message checked against `layout`
// (covering the whole model when `whole_model`) and the codec, then
// decoded. Each check is the one every receiver of slices uses
// (message.h); a payload that does not decode is malformed.
Parsed<DecodedUpdate> ParseSlices(const Envelope& message,
                                  const ModelLayout& layout, bool whole_model,
                                  UpdateDecoder& decoder) {
  const pb::Header& header = message.header;
  MERIDIAN_RETURN_IF_REJECTED(
      CheckSlicesAgainstLayout(header, layout, whole_model));
  MERIDIAN_RETURN_IF_REJECTED(CheckCodec(header, pb::CODEC_PIPELINE));
  Result<DecodedUpdate> decoded =
      DecodeUpdate(layout, header, FrameSpans(message.payload), decoder);
  if (!decoded.ok()) {
    return Rejection{pb::ERROR_MALFORMED, decoded.status().message()};
  }
  return std::move(decoded).value();
}

}  // namespace

Parsed<MirrorHello> ParseMirrorHello(const Envelope& message,
                                     const ModelLayout& layout) {
  const pb::Header& header = message.header;
  const pb::MirrorHello& body = header.mirror_hello();
  Result<ModelLayout> theirs = LayoutFromSpecs(body.layout());
  if (!theirs.ok() || !(*theirs == layout)) {
    return Rejection{
        pb::ERROR_LAYOUT_MISMATCH,
        "site '" + header.sender().site() + "' has model [" +
            (theirs.ok() ? theirs->DebugString() : theirs.status().message()) +
            "], this site [" + layout.DebugString() + "]"};
  }
  MirrorHello hello;
  hello.incarnation = body.incarnation();
  hello.first_sequence = body.first_sequence();
  hello.resumed = body.resumed();
  hello.clock = body.clock();
  return hello;
}

Parsed<MirrorHeartbeat> ParseMirrorHeartbeat(const Envelope& message) {
  return MirrorHeartbeat{message.header.heartbeat().last_sequence()};
}

Parsed<MirrorClock> ParseMirrorClock(const Envelope& message) {
  const pb::MirrorClock& body = message.header.mirror_clock();
  return MirrorClock{body.clock(), body.final()};
}

Parsed<MirrorUpdate> ParseMirrorUpdate(const Envelope& message,
                                       const ModelLayout& layout,
                                       UpdateDecoder& decoder) {
  Parsed<DecodedUpdate> decoded =
      ParseSlices(message, layout, /*whole_model=*/false, decoder);
  if (!decoded.ok()) return std::move(decoded).rejection();
  const pb::Header& header = message.header;
  const pb::MirrorUpdate& body = header.mirror_update();
  MirrorUpdate update;
  update.indices_only = header.type() == pb::MIRROR_INDICES;
  update.clock = header.clock();
  update.average = body.average();
  update.outer_round = body.outer_round();
  update.next_period = body.next_period();
  update.sent_unix_s = static_cast<double>(body.sent_unix_us()) * 1e-6;
  update.window_start_unix_s =
      static_cast<double>(body.window_start_unix_us()) * 1e-6;
  update.decoded = std::move(decoded).value();
  return update;
}

Parsed<MirrorTravel> ParseMirrorTravel(const Envelope& message,
                                       const ModelLayout& layout,
                                       UpdateDecoder& decoder) {
  Parsed<DecodedUpdate> decoded =
      ParseSlices(message, layout, /*whole_model=*/true, decoder);
  if (!decoded.ok()) return std::move(decoded).rejection();
  const DecodedUpdate& received = *decoded;
  const uint64_t n = layout.num_elements();
  bool whole = received.indices.size() == n;
  for (uint64_t i = 0; whole && i < n; ++i) whole = received.indices[i] == i;
  if (!whole) {
    return Rejection{pb::ERROR_MALFORMED,
                     "a travelled model must carry every element once (got " +
                         std::to_string(received.indices.size()) + " of " +
                         std::to_string(n) + ")"};
  }
  MirrorTravel travel;
  travel.travel_id = message.header.mirror_travel().travel_id();
  travel.clock = message.header.mirror_travel().clock();
  travel.model = std::move(std::move(decoded).value().values);
  return travel;
}

Parsed<MirrorTravelResult> ParseMirrorTravelResult(const Envelope& message) {
  const pb::MirrorTravelResult& body = message.header.mirror_travel_result();
  MirrorTravelResult result;
  result.travel_id = body.travel_id();
  result.clock = body.clock();
  result.scores.samples = body.samples();
  result.scores.own_accuracy = body.own_accuracy();
  result.scores.travelled_accuracy = body.travelled_accuracy();
  result.scores.discordant = body.discordant();
  switch (body.score_kind()) {
    case 0: result.scores.kind = ScoreKind::kPairedAccuracy; break;
    case 1: result.scores.kind = ScoreKind::kAccuracy; break;
    case 2: result.scores.kind = ScoreKind::kRelative; break;
    default:
      return Rejection{pb::ERROR_MALFORMED,
                       "MIRROR_TRAVEL_RESULT has an unknown score_kind " +
                           std::to_string(body.score_kind())};
  }
  return result;
}

Parsed<pb::MirrorAck> ParseMirrorAck(const Envelope& message) {
  return message.header.mirror_ack();
}

}  // namespace meridian
