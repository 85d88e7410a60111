#include "sync/change_sender.h"

#include <algorithm>
#include <cmath>

#include "meridian/net/message.h"

namespace meridian {

ChangeSender::ChangeSender(const SyncContext& context, PeerTable& peers,
                           Outbox& outbox, SendThreshold& threshold)
    : context_(context),
      peers_(peers),
      outbox_(outbox),
      threshold_(threshold) {}

void ChangeSender::SendAtClock(int64_t clock) {
  const double theta = threshold_.Theta(clock);
  threshold_.ObserveBandwidth();
  SendSignificantToPeers(theta);
  last_send_s_ = context_.Now();
}

void ChangeSender::SendIfPeriodDue(double now) {
  if (!peers_.training() || !context_.UsesAccumulators() ||
      context_.sync.send_period_s() <= 0 ||
      now - last_send_s_ < context_.sync.send_period_s()) {
    return;
  }
  last_send_s_ = now;
  const uint64_t before = outbox_.updates_sent();
  SendSignificantToPeers(threshold_.Theta(peers_.local_clock()));
  updates_between_clocks_ += outbox_.updates_sent() - before;
}

// A hub's members get their share of the group's sum with each clock
// announcement (AnnounceClock), not here.
void ChangeSender::SendSignificantToPeers(double theta) {
  for (const auto& peer : peers_.all()) {
    if (context_.IsHubMember(peer->site)) continue;
    SendSignificant(*peer, theta);
  }
}

void ChangeSender::SendSignificant(Peer& peer, double theta) {
  // An unreachable peer, one whose channel holds all it may, or whose link
  // has as much on the way as it delivers in a couple of seconds, gets its
  // changes later: they stay (and merge) in its accumulator.
  if (!peers_.Sendable(peer) || peer.out.full()) return;
  if (peer.out.congested()) {
    peer.link.period_congested = true;
    return;
  }
  SendWithBarrier(outbox_.codec().Take(*context_.store, peer.acc, theta,
                                       context_.sync.threshold_mode(),
                                       UpdateCodec::Fidelity::kConfigured,
                                       peer.out.max_message_bytes()),
                  peer);
}

void ChangeSender::SendWithBarrier(const std::vector<EncodedSlices>& update,
                                   Peer& peer) {
  uint64_t entries = 0;
  for (const EncodedSlices& part : update) entries += part.entries;
  const double fraction = context_.sync.selective_barrier_fraction();
  const bool barrier =
      fraction > 0 &&
      static_cast<double>(entries) >
          fraction * static_cast<double>(context_.store->num_elements());
  outbox_.SendParts(update, barrier, peer);
}

void ChangeSender::AnnounceClocks() {
  for (const auto& peer : peers_.all()) {
    AnnounceClock(*peer, /*changes_first=*/false);
  }
}

void ChangeSender::AnnounceClock(Peer& peer, bool changes_first) {
  const int64_t due = DueClock(peer);
  if (peer.sending.announced >= due || !peers_.Sendable(peer)) return;
  if (context_.IsHubMember(peer.site) ||
      (changes_first && context_.UsesAccumulators())) {
    SendSignificant(peer, threshold_.Theta(peers_.local_clock()));
  }
  peer.sending.announced = due;
  pb::Header header = MakeHeader(pb::MIRROR_CLOCK, context_.self, 0);
  header.set_clock(due);
  header.mutable_mirror_clock()->set_clock(due);
  header.mutable_mirror_clock()->set_relayed(context_.role.kind ==
                                             SyncRole::Kind::kHub);
  outbox_.Send(peer, std::move(header), {});
}

// The local clock for a mesh node or member; for a hub, the slowest of its
// group towards other hubs, and the slowest of everyone towards its
// members (sites the DS bound does not wait for do not hold the
// announcements back).
int64_t ChangeSender::DueClock(const Peer& peer) const {
  const int64_t local_clock = peers_.local_clock();
  if (context_.role.kind != SyncRole::Kind::kHub) return local_clock;
  auto slowest = [&](const std::vector<int>& sites, int64_t start) {
    int64_t clock = start;
    for (int site : sites) {
      const Peer* other = peers_.At(site);
      if (other != nullptr && !peers_.Bounding(*other)) continue;
      clock = std::min(clock, peers_.ClockOfSite(site));
    }
    return clock;
  };
  const int64_t group = slowest(context_.role.members, local_clock);
  if (context_.IsHub(peer.site)) return group;
  return slowest(context_.role.hubs, group);
}

void ChangeSender::FlushAndSendFinal(const std::vector<Peer*>& targets) {
  for (Peer* peer : targets) {
    PeerSending& sending = peer->sending;
    if (sending.final_sent) continue;
    if (context_.UsesAccumulators()) {
      // In messages the link carries in a fraction of a second each (the
      // channel paces them), so the peer keeps hearing from this site.
      outbox_.SendParts(outbox_.codec().Take(*context_.store, peer->acc, 0.0,
                                             context_.sync.threshold_mode(),
                                             UpdateCodec::Fidelity::kLossless,
                                             peer->out.max_message_bytes()),
                        /*indices_first=*/false, *peer);
    }
    ++sending.announced;
    pb::Header header = MakeHeader(pb::MIRROR_CLOCK, context_.self, 0);
    header.set_clock(sending.announced);
    header.mutable_mirror_clock()->set_clock(sending.announced);
    header.mutable_mirror_clock()->set_final(true);
    outbox_.Send(*peer, std::move(header), {});
    sending.final_sent = true;
    sending.final_sequence = peer->out.last_sequence();
  }
}

// From at most kUnsentSample elements per peer (every stride-th, the offset
// moving on each time), so the event loop's cost does not grow with the
// model.
void ChangeSender::SampleUnsent() {
  constexpr double kPeriodS = 1.0;
  constexpr uint64_t kUnsentSample = uint64_t{1} << 16;
  const double now = context_.Now();
  if (now - last_unsent_sample_s_ < kPeriodS) return;
  last_unsent_sample_s_ = now;
  if (!context_.UsesAccumulators()) return;
  ParameterStore& store = *context_.store;
  const uint64_t stride =
      std::max<uint64_t>(1, store.num_elements() / kUnsentSample);
  const uint64_t offset = unsent_offset_++ % stride;
  for (const auto& peer : peers_.all()) {
    double acc_squares = 0, w_squares = 0;
    store.VisitAccumulator(
        peer->acc, [&](const KeyRange& range, std::span<const float> w,
                       std::span<float> acc) {
          // The first index of this shard that is offset modulo stride.
          uint64_t i = (offset + stride - range.begin % stride) % stride;
          for (; i < w.size(); i += stride) {
            acc_squares += static_cast<double>(acc[i]) * acc[i];
            w_squares += static_cast<double>(w[i]) * w[i];
          }
        });
    const double ratio =
        w_squares > 0 ? std::sqrt(acc_squares / w_squares) : 0.0;
    PeerSending& sending = peer->sending;
    ++sending.unsent_samples;
    sending.unsent_sum += ratio;
    sending.unsent_max = std::max(sending.unsent_max, ratio);
  }
}

void ChangeSender::FillSummary(pb::SyncSummary* summary) const {
  summary->set_updates_sent_between_clocks(
      static_cast<double>(updates_between_clocks_));
  for (const auto& peer : peers_.all()) {
    const PeerSending& sending = peer->sending;
    if (sending.unsent_samples == 0) continue;
    pb::UnsentChange* unsent = summary->add_unsent_change();
    unsent->set_peer(peer->name);
    unsent->set_samples(sending.unsent_samples);
    unsent->set_mean_relative_norm(sending.unsent_sum /
                                   static_cast<double>(sending.unsent_samples));
    unsent->set_max_relative_norm(sending.unsent_max);
  }
}

}  // namespace meridian
