#include "sync/skewscout_travel.h"

#include <utility>

#include "meridian/core/log.h"
#include "meridian/net/message.h"

namespace meridian {
namespace {

// SkewScout's decisions as report.json and checkpoints record them.
void ToRecord(const SkewDecision& d, pb::SkewDecisionRecord* record) {
  record->set_t_s(d.t_s);
  record->set_clock(d.clock);
  record->set_peer(d.peer);
  record->set_samples(d.samples);
  record->set_own_accuracy(d.own_accuracy);
  record->set_travelled_accuracy(d.travelled_accuracy);
  record->set_estimate(d.estimate);
  record->set_smoothed(d.smoothed);
  record->set_theta_before(d.knob_before);
  record->set_theta_after(d.knob_after);
  record->set_action(SkewActionName(d.action));
  record->set_discordant(d.discordant);
  record->set_standard_error(d.standard_error);
  record->set_travel_period(d.travel_period);
}

SkewDecision FromRecord(const pb::SkewDecisionRecord& record) {
  SkewDecision d;
  d.t_s = record.t_s();
  d.clock = record.clock();
  d.peer = record.peer();
  d.samples = record.samples();
  d.own_accuracy = record.own_accuracy();
  d.travelled_accuracy = record.travelled_accuracy();
  d.estimate = record.estimate();
  d.smoothed = record.smoothed();
  d.knob_before = record.theta_before();
  d.knob_after = record.theta_after();
  d.action = SkewActionFromName(record.action());
  d.discordant = record.discordant();
  d.standard_error = record.standard_error();
  d.travel_period = record.travel_period();
  return d;
}

}  // namespace

SkewScoutTravel::SkewScoutTravel(const SyncContext& context, PeerTable& peers,
                                 Outbox& outbox, SendThreshold& threshold,
                                 ScoreTravelled score,
                                 std::optional<SkewController> controller)
    : context_(context),
      peers_(peers),
      outbox_(outbox),
      threshold_(threshold),
      score_(std::move(score)),
      controller_(std::move(controller)),
      knob_kind_(controller_ ? SkewKnobOf(context.sync) : SkewKnob::kTheta) {
  if (controller_ && knob_kind_ == SkewKnob::kTheta) {
    threshold_.SetSkewTheta(controller_->knob());
  }
}

void SkewScoutTravel::OnLocalClock(int64_t clock) {
  if (!controller_) return;
  if (next_travel_clock_ < 0) {
    next_travel_clock_ = clock + controller_->travel_period();
  } else if (clock >= next_travel_clock_) {
    next_travel_clock_ = clock + controller_->travel_period();
    Travel(clock);
  }
}

void SkewScoutTravel::Travel(int64_t clock) {
  const int64_t period = controller_->travel_period();
  const auto& all = peers_.all();
  for (size_t tried = 0; tried < all.size(); ++tried) {
    Peer& peer = *all[next_travel_peer_++ % all.size()];
    if (!peers_.Sendable(peer) || peer.out.full() || !peer.in.hello()) {
      continue;
    }
    if (peer.travel.outstanding != 0 &&
        clock - peer.travel.sent_clock < 2 * period) {
      continue;
    }
    if (peer.travel.outstanding != 0) ++counters_.unanswered;
    ParameterStore& store = *context_.store;
    travel_model_.resize(store.num_elements());
    store.Snapshot(travel_model_);
    const EncodedSlices encoded =
        outbox_.codec().EncodeTravel(store, travel_model_);
    pb::Header header = MakeHeader(pb::MIRROR_TRAVEL, context_.self, 0);
    header.set_clock(clock);
    for (const pb::TensorSlice& slice : encoded.slices) {
      *header.add_slices() = slice;
    }
    const uint64_t id = (context_.incarnation << 32) + ++counters_.sent;
    header.mutable_mirror_travel()->set_travel_id(id);
    header.mutable_mirror_travel()->set_clock(clock);
    counters_.bytes +=
        static_cast<double>(header.ByteSizeLong() + encoded.bytes);
    peer.travel.outstanding = id;
    peer.travel.sent_clock = clock;
    outbox_.Send(peer, std::move(header), encoded.frames);
    return;
  }
}

void SkewScoutTravel::OnTravelScored(const std::string& site,
                                     uint64_t travel_id, int64_t clock,
                                     const TravelScores& scores) {
  Peer* peer = peers_.Find(site);
  if (peer == nullptr || !peers_.Sendable(*peer)) return;
  pb::Header header = MakeHeader(pb::MIRROR_TRAVEL_RESULT, context_.self, 0);
  header.set_clock(clock);
  pb::MirrorTravelResult* result = header.mutable_mirror_travel_result();
  result->set_travel_id(travel_id);
  result->set_clock(clock);
  result->set_samples(scores.samples);
  result->set_own_accuracy(scores.own_accuracy);
  result->set_travelled_accuracy(scores.travelled_accuracy);
  result->set_discordant(scores.discordant);
  if (scores.kind != ScoreKind::kPairedAccuracy) {
    result->set_score_kind(static_cast<uint32_t>(scores.kind));
  }
  ++counters_.scored;
  outbox_.Send(*peer, std::move(header), {});
}

bool SkewScoutTravel::scores_travels() const {
  return score_ && context_.sync.skewscout().enabled();
}

void SkewScoutTravel::Score(const Peer& peer, MirrorTravel travel) {
  if (score_(peer.name, travel.travel_id, travel.clock,
             std::move(travel.model))) {
    ++counters_.accepted;
  } else {
    ++counters_.dropped;
  }
}

void SkewScoutTravel::OnResult(Peer& peer, const MirrorTravelResult& result) {
  if (result.travel_id != peer.travel.outstanding || result.travel_id == 0) {
    return;  // an answer given up on, or to an earlier incarnation
  }
  peer.travel.outstanding = 0;
  ++counters_.results_received;
  const SkewDecision& decision = controller_->Observe(
      context_.Now() - connected_s_, result.clock, peer.name, result.scores);
  ApplyKnob();
  MLOG(INFO) << "skewscout: '" << peer.name << "' scored this site's model "
             << "of clock " << decision.clock << " "
             << decision.travelled_accuracy << " against its own "
             << decision.own_accuracy << " on " << decision.samples
             << " samples: estimated loss " << decision.estimate
             << " (smoothed " << decision.smoothed << " ± "
             << decision.standard_error << "), "
             << SkewActionName(decision.action) << ", "
             << SkewKnobName(knob_kind_) << " " << decision.knob_before
             << " -> " << decision.knob_after << ", next travel in "
             << decision.travel_period << " clocks";
}

// A density knob is the configured pipeline's top-k fraction; the period
// is read where it is proposed (OuterRounds).
void SkewScoutTravel::ApplyKnob() {
  switch (knob_kind_) {
    case SkewKnob::kTheta:
      threshold_.SetSkewTheta(controller_->knob());
      return;
    case SkewKnob::kTopKDensity:
      if (Status set = outbox_.codec().SetTopKFraction(controller_->knob());
          !set.ok()) {
        MLOG(ERROR) << "skewscout: " << set;  // bounded by the controller
      }
      return;
    case SkewKnob::kAveragingPeriod:
      return;
  }
}

void SkewScoutTravel::SaveTo(pb::SyncCheckpoint* out) const {
  if (!controller_) return;
  pb::SkewScoutCheckpoint* saved = out->mutable_skewscout();
  SkewController::State state = controller_->Save();
  saved->set_theta(state.knob);
  saved->set_travel_period(state.travel_period);
  saved->set_smoothed(state.smoothed);
  saved->set_smoothed_variance(state.smoothed_variance);
  saved->set_estimates(state.estimates);
  saved->set_low_in_a_row(state.low_in_a_row);
  saved->set_tightened(state.tightened);
  saved->set_loosened(state.loosened);
  for (const SkewDecision& d : state.decisions) {
    ToRecord(d, saved->add_decisions());
  }
  saved->set_travels_sent(counters_.sent);
  saved->set_travel_bytes(counters_.bytes);
  saved->set_results_received(counters_.results_received);
  saved->set_travels_scored(counters_.scored);
  saved->set_travels_dropped(counters_.dropped);
  saved->set_travels_accepted(counters_.accepted);
  saved->set_travels_unanswered(counters_.unanswered);
}

void SkewScoutTravel::RestoreFrom(const pb::SyncCheckpoint& state) {
  if (!controller_ || !state.has_skewscout()) return;
  const pb::SkewScoutCheckpoint& saved = state.skewscout();
  SkewController::State restored;
  restored.knob = saved.theta();
  restored.travel_period = saved.travel_period();
  restored.smoothed = saved.smoothed();
  restored.smoothed_variance = saved.smoothed_variance();
  restored.estimates = saved.estimates();
  restored.low_in_a_row = saved.low_in_a_row();
  restored.tightened = saved.tightened();
  restored.loosened = saved.loosened();
  for (const pb::SkewDecisionRecord& record : saved.decisions()) {
    restored.decisions.push_back(FromRecord(record));
  }
  controller_->Restore(std::move(restored));
  ApplyKnob();
  counters_.sent = saved.travels_sent();
  counters_.bytes = saved.travel_bytes();
  counters_.results_received = saved.results_received();
  counters_.scored = saved.travels_scored();
  counters_.dropped = saved.travels_dropped();
  counters_.accepted = saved.travels_accepted();
  counters_.unanswered = saved.travels_unanswered();
}

void SkewScoutTravel::FillSummary(pb::SyncSummary* summary) const {
  if (!controller_ && counters_.scored == 0 && counters_.accepted == 0) {
    return;
  }
  pb::SkewScoutSummary* out = summary->mutable_skewscout();
  out->set_travels_sent(counters_.sent);
  out->set_travel_bytes(counters_.bytes);
  out->set_results_received(counters_.results_received);
  out->set_travels_scored(counters_.scored);
  out->set_travels_dropped(counters_.dropped);
  if (!controller_) return;
  out->set_final_theta(controller_->knob());
  out->set_knob(SkewKnobName(knob_kind_));
  for (const SkewDecision& d : controller_->decisions()) {
    ToRecord(d, out->add_decisions());
  }
}

}  // namespace meridian
