// SkewScout's model travelling (sync.skewscout): every travel period this
// site sends its model to the next peer in turn, which scores it on its
// own held-out sample against its own model and sends the scores back;
// the controller (skew_control.h) turns them into the communication knob
// in effect — θ (pushed into SendThreshold), the top-k density (into the
// update codec) or the proposed averaging period (read by the outer
// rounds). This site also scores the models its peers send it, off the
// event loop (SyncEngineOptions::score_travelled).
//
// A travel goes on the numbered channel, so it is counted, logged and
// delivered once like any update, and never applied by the receiver.
//
// Ownership and threads: owned by the SyncEngine (also when SkewScout is
// off: it refuses travels then, and may still score peers' models);
// driven by its event loop (not thread-safe). Size: the controller's
// bounded decision log, one model-sized snapshot buffer while a travel is
// encoded, and per peer the outstanding travel (PeerTravel).
#ifndef MERIDIAN_SYNC_SKEWSCOUT_TRAVEL_H_
#define MERIDIAN_SYNC_SKEWSCOUT_TRAVEL_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "meridian/checkpoint.pb.h"
#include "meridian/config/config.h"
#include "meridian/report.pb.h"
#include "meridian/sync/skew_control.h"
#include "sync/mirror_messages.h"
#include "sync/outbox.h"
#include "sync/peer_table.h"
#include "sync/send_threshold.h"
#include "sync/sync_context.h"

namespace meridian {

class SkewScoutTravel {
 public:
  using ScoreTravelled =
      std::function<bool(const std::string& peer, uint64_t travel_id,
                         int64_t clock, std::vector<float> model)>;

  // `controller`: SkewScout's (sync.skewscout.enabled), nullopt when off.
  // A θ knob is in effect from now on.
  SkewScoutTravel(const SyncContext& context, PeerTable& peers, Outbox& outbox,
                  SendThreshold& threshold, ScoreTravelled score,
                  std::optional<SkewController> controller);
  SkewScoutTravel(const SkewScoutTravel&) = delete;
  SkewScoutTravel& operator=(const SkewScoutTravel&) = delete;

  bool enabled() const { return controller_.has_value(); }
  SkewKnob knob_kind() const { return knob_kind_; }
  // The controller's knob (precondition: enabled()).
  double knob() const { return controller_->knob(); }

  // Training started at `now` (decisions are timed from it).
  void Start(double now) { connected_s_ = now; }
  // The site reached `clock`: the model travels every travel period (the
  // first time one period after the first clock: before, the replicas had
  // no time to drift apart).
  void OnLocalClock(int64_t clock);
  // The scores of a model `site` sent go back to it.
  void OnTravelScored(const std::string& site, uint64_t travel_id,
                      int64_t clock, const TravelScores& scores);

  // ---- incoming -------------------------------------------------------------
  // Whether this site scores travelled models (else it refuses them).
  bool scores_travels() const;
  // A peer's model to score: handed to the evaluator when it can take one
  // now, else dropped (counted).
  void Score(const Peer& peer, MirrorTravel travel);
  // A peer's scores of this site's model (precondition: enabled()): an
  // answer to the outstanding travel moves the knob; one given up on, or
  // to an earlier incarnation, is ignored.
  void OnResult(Peer& peer, const MirrorTravelResult& result);

  // ---- checkpoints and reporting --------------------------------------------
  void SaveTo(pb::SyncCheckpoint* out) const;
  // A restarted site continues with the knob its controller had reached
  // (SkewController::Restore bounds what the file says).
  void RestoreFrom(const pb::SyncCheckpoint& state);
  void FillSummary(pb::SyncSummary* summary) const;

 private:
  // What travelled, and how it was answered.
  struct Counters {
    uint64_t sent = 0;
    double bytes = 0;
    uint64_t results_received = 0;
    uint64_t scored = 0;      // peers' models this site scored
    uint64_t dropped = 0;     // ... could not take then
    uint64_t accepted = 0;    // ... took to score
    uint64_t unanswered = 0;  // travels of this site given up on
  };

  // Sends the model to the next peer in turn that can take it and has
  // answered the last travel (or not for two periods: that one is given
  // up). Coded with skewscout.travel_value_coding.
  void Travel(int64_t clock);
  // The knob moved: θ into the threshold, a density into the codec.
  void ApplyKnob();

  const SyncContext& context_;
  PeerTable& peers_;
  Outbox& outbox_;
  SendThreshold& threshold_;
  const ScoreTravelled score_;
  std::optional<SkewController> controller_;
  const SkewKnob knob_kind_;  // what the controller moves
  size_t next_travel_peer_ = 0;
  // The first clock at or after which the model travels again (-1: set
  // one period after the first local clock).
  int64_t next_travel_clock_ = -1;
  std::vector<float> travel_model_;  // scratch: the snapshot that travels
  double connected_s_ = 0;
  Counters counters_;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_SKEWSCOUT_TRAVEL_H_
