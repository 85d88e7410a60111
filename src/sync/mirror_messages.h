// The mirror protocol's messages as typed values: what a peer site sends
// on its channel (MIRROR_HELLO, HEARTBEAT, MIRROR_CLOCK, MIRROR_UPDATE,
// MIRROR_INDICES, MIRROR_TRAVEL, MIRROR_TRAVEL_RESULT) and what comes back
// on ours (MIRROR_ACK), parsed at the boundary. Each Parse* takes an
// Envelope that DecodeMessage accepted (version, type, body present, one
// frame per slice of the right size) and returns the value, or the
// rejection to answer with (its pb::ErrorCode and reason). Nothing is
// applied: what the engine does with a value (its policy: clocks, rounds,
// whether it serves the message at all) comes after.
//
// Pure functions; thread-compatible. A decoded update holds at most one
// entry per parameter of the layout (the decoder's bound).
#ifndef MERIDIAN_SYNC_MIRROR_MESSAGES_H_
#define MERIDIAN_SYNC_MIRROR_MESSAGES_H_

#include <cstdint>
#include <vector>

#include "meridian/compression/compression.h"
#include "meridian/core/layout.h"
#include "meridian/net/message.h"
#include "meridian/net/transport.h"
#include "meridian/sync/skew_control.h"
#include "meridian/wire.pb.h"
#include "sync/update_codec.h"

namespace meridian {

// MIRROR_HELLO: a peer introduces (or re-introduces) its channel.
struct MirrorHello {
  uint64_t incarnation = 0;     // the sender's run
  uint64_t first_sequence = 0;  // the first message it can still send
  bool resumed = false;         // restarted from a checkpoint
  int64_t clock = 0;            // its clock
};
// Refused (ERROR_LAYOUT_MISMATCH) when the sender's model is not `layout`.
Parsed<MirrorHello> ParseMirrorHello(const Envelope& message,
                                     const ModelLayout& layout);

// HEARTBEAT: the sender's last sequence number on its channel.
struct MirrorHeartbeat {
  uint64_t last_sequence = 0;
};
Parsed<MirrorHeartbeat> ParseMirrorHeartbeat(const Envelope& message);

// MIRROR_CLOCK: the sender reached `clock` (every update of it came
// before); `final`: its end-of-job flush.
struct MirrorClock {
  int64_t clock = 0;
  bool final = false;
};
Parsed<MirrorClock> ParseMirrorClock(const Envelope& message);

// MIRROR_UPDATE (or MIRROR_INDICES: the indices of an update whose values
// follow) decoded against the layout.
struct MirrorUpdate {
  bool indices_only = false;  // MIRROR_INDICES
  int64_t clock = 0;          // the clock it belongs to
  // An outer gradient (DILOCO, MODEL_AVERAGING) of the round at
  // `outer_round`, with the averaging period the sender proposes (0:
  // none).
  bool average = false;
  int64_t outer_round = 0;
  uint32_t next_period = 0;
  // When the sender sent it and when the changes it carries began (Unix
  // s; 0: a sender that does not stamp).
  double sent_unix_s = 0;
  double window_start_unix_s = 0;
  DecodedUpdate decoded;
};
// Refused when its slices leave the layout (CheckSlicesAgainstLayout:
// ERROR_OUT_OF_RANGE), use another codec than CODEC_PIPELINE (CheckCodec),
// or do not decode (ERROR_MALFORMED, DecodeUpdate's reason).
Parsed<MirrorUpdate> ParseMirrorUpdate(const Envelope& message,
                                       const ModelLayout& layout,
                                       UpdateDecoder& decoder);

// MIRROR_TRAVEL: a peer's whole model for this site to score (SkewScout).
struct MirrorTravel {
  uint64_t travel_id = 0;
  int64_t clock = 0;
  std::vector<float> model;  // one value per parameter of the layout
};
// Refused as an update, also when its slices do not cover every tensor
// once, and (ERROR_MALFORMED) when it does not carry every element of the
// model exactly once.
Parsed<MirrorTravel> ParseMirrorTravel(const Envelope& message,
                                       const ModelLayout& layout,
                                       UpdateDecoder& decoder);

// MIRROR_TRAVEL_RESULT: how a peer scored the model this site sent.
struct MirrorTravelResult {
  uint64_t travel_id = 0;
  int64_t clock = 0;
  TravelScores scores;
};
Parsed<MirrorTravelResult> ParseMirrorTravelResult(const Envelope& message);

// MIRROR_ACK (on this site's channel): what the peer applied and holds.
Parsed<pb::MirrorAck> ParseMirrorAck(const Envelope& message);

}  // namespace meridian

#endif  // MERIDIAN_SYNC_MIRROR_MESSAGES_H_
