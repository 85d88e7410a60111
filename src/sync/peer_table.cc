#include "sync/peer_table.h"

#include <algorithm>
#include <limits>

#include "meridian/core/log.h"
#include "meridian/sync/addresses.h"

namespace meridian {
namespace {

// Heartbeat intervals without a word after which a peer counts as silent
// (PeerTable::Silent).
constexpr double kSilentHeartbeats = 2.5;

}  // namespace

PeerTable::PeerTable(const SyncContext& context,
                     const DeliveryOptions& delivery)
    : context_(context),
      delivery_(delivery),
      clocks_(context.PeerNames()),
      events_(context.name, context.wall_clock) {
  for (int site : context_.role.Peers()) {
    auto peer =
        std::make_unique<Peer>(site, context_.job.site(site).name(),
                               context_.self, context_.incarnation, delivery_);
    peer->endpoint =
        PeerMirrorEndpoint(context_.job, context_.site_index, site);
    if (context_.UsesAccumulators()) {
      peer->acc = context_.store->AddAccumulator();
    }
    peers_.push_back(std::move(peer));
  }
}

// ---- the peers --------------------------------------------------------------

Peer* PeerTable::Find(const std::string& site) {
  for (auto& peer : peers_) {
    if (peer->name == site) return peer.get();
  }
  return nullptr;
}

const Peer* PeerTable::At(int site) const {
  for (const auto& peer : peers_) {
    if (peer->site == site) return peer.get();
  }
  return nullptr;
}

std::vector<Peer*> PeerTable::Select(const std::vector<int>& sites) {
  std::vector<Peer*> selected;
  for (auto& peer : peers_) {
    if (std::find(sites.begin(), sites.end(), peer->site) != sites.end()) {
      selected.push_back(peer.get());
    }
  }
  return selected;
}

uint32_t PeerTable::PositionOf(const Peer& peer) const {
  uint32_t position = 0;
  while (position < peers_.size() && peers_[position].get() != &peer) {
    ++position;
  }
  return position;
}

std::vector<size_t> PeerTable::RelayTargets(int from) const {
  std::vector<size_t> targets;
  if (context_.role.kind != SyncRole::Kind::kHub) return targets;
  for (const auto& peer : peers_) {
    if (peer->site == from) continue;
    if (context_.IsMember(from) || context_.IsMember(peer->site)) {
      targets.push_back(peer->acc);
    }
  }
  return targets;
}

void PeerTable::EnableCheckpoints() {
  for (auto& peer : peers_) peer->in.SetCheckpointed(true);
}

// ---- clocks -----------------------------------------------------------------

int64_t PeerTable::ClockOf(const Peer& peer) const {
  return clocks_.ClockOf(peer.name).value_or(0);
}

int64_t PeerTable::ClockOfSite(int site) const {
  return clocks_.ClockOf(context_.job.site(site).name()).value_or(0);
}

int64_t PeerTable::BoundingClock() const {
  int64_t slowest = std::numeric_limits<int64_t>::max();
  for (const auto& peer : peers_) {
    if (Bounding(*peer)) slowest = std::min(slowest, ClockOf(*peer));
  }
  return slowest == std::numeric_limits<int64_t>::max() ? local_clock_
                                                        : slowest;
}

std::vector<size_t> PeerTable::BoundingAccumulators() const {
  std::vector<size_t> ids;
  for (const auto& peer : peers_) {
    if (Bounding(*peer)) ids.push_back(peer->acc);
  }
  return ids;
}

int64_t PeerTable::ClockFloor() const {
  if (context_.fault.partition_policy() != pb::PARTITION_CONTINUE) return 0;
  int64_t slowest = std::numeric_limits<int64_t>::max();
  for (const auto& peer : peers_) {
    if (!peer->live.reachable || !peer->in.hello()) continue;
    slowest = std::min(slowest, ClockOf(*peer));
  }
  if (slowest == std::numeric_limits<int64_t>::max()) return 0;
  return std::max<int64_t>(
      0, slowest - static_cast<int64_t>(context_.sync.max_clock_skew()));
}

int64_t PeerTable::SlowestClock() const {
  return peers_.empty() ? local_clock_ : clocks_.Min();
}

// ---- liveness ---------------------------------------------------------------

void PeerTable::StartLiveness(double now) {
  training_ = true;
  liveness_floor_s_ = now;
}

bool PeerTable::Bounding(const Peer& peer) const {
  if (context_.fault.partition_policy() == pb::PARTITION_BLOCK) return true;
  return peer.live.reachable && !peer.live.catching_up && !Silent(peer);
}

double PeerTable::SilentFor(const Peer& peer) const {
  return context_.Now() - std::max({peer.in.last_heard_s(),
                                    peer.out.last_ack_s(), liveness_floor_s_});
}

// Silent for more than a few heartbeat intervals: a live peer is heard at
// least every interval (it acknowledges that often). Under
// PARTITION_CONTINUE the DS bound stops waiting for it right away — the
// site does not stall for peer_timeout_s before the peer is declared
// unreachable — and its link no longer steers the threshold.
bool PeerTable::Silent(const Peer& peer) const {
  return training_ &&
         SilentFor(peer) >
             std::max(kSilentHeartbeats * context_.fault.heartbeat_interval_s(),
                      1.0);
}

void PeerTable::HeardFrom(Peer& peer) {
  if (peer.live.reachable) return;
  const double now = context_.Now();
  const double out_s = now - peer.live.unreachable_since_s;
  peer.live.reachable = true;
  peer.live.unreachable_total_s += out_s;
  peer.live.catching_up =
      context_.fault.partition_policy() == pb::PARTITION_CONTINUE;
  MLOG(INFO) << "site '" << peer.name << "' is reachable again after " << out_s
             << " s"
             << (peer.live.catching_up ? "; outside the DS bound until it has "
                                         "caught up"
                                       : "");
  events_.Record(pb::PEER_REACHABLE, "site '" + peer.name + "'",
                 "unreachable for " + std::to_string(out_s) + " s", out_s);
  UpdateCatchingUp(peer);
}

void PeerTable::UpdateCatchingUp(Peer& peer) {
  if (!peer.live.catching_up) return;
  if (ClockOf(peer) >=
      local_clock_ - static_cast<int64_t>(context_.sync.max_clock_skew())) {
    peer.live.catching_up = false;
    MLOG(INFO) << "site '" << peer.name << "' caught up (clock "
               << ClockOf(peer) << "): within the DS bound again";
  }
}

void PeerTable::NoteServiceTurn(double now) {
  // A stalled event loop (the process was stopped, or starved) heard
  // nothing meanwhile: give every peer a fresh window rather than declare
  // them all unreachable at once.
  const double stall = std::max(1.0, context_.fault.peer_timeout_s() / 2);
  if (last_service_s_ >= 0 && now - last_service_s_ > stall) {
    MLOG(WARNING) << "the event loop did not run for " << now - last_service_s_
                  << " s: peers get a fresh liveness window";
    liveness_floor_s_ = now;
  }
  last_service_s_ = now;
}

void PeerTable::CheckLiveness(Peer& peer, double now) {
  // Also while finishing: the final flush stops waiting for a peer that
  // went silent. Not once the exchange with it is complete: it may end
  // its process.
  if (!peer.live.reachable || !training_ || Flushed(peer)) return;
  const double silent_s = SilentFor(peer);
  if (silent_s <= context_.fault.peer_timeout_s()) return;
  peer.live.reachable = false;
  peer.live.catching_up = false;
  peer.live.unreachable_since_s = now;
  const char* policy =
      context_.fault.partition_policy() == pb::PARTITION_CONTINUE
          ? "training goes on; its changes wait until it is back"
          : "the DS bound still waits for it (PARTITION_BLOCK)";
  MLOG(WARNING) << "site '" << peer.name << "' is unreachable: nothing "
                << "heard for " << silent_s << " s; " << policy;
  events_.Record(pb::PEER_UNREACHABLE, "site '" + peer.name + "'",
                 std::string("silent for more than ") +
                     std::to_string(context_.fault.peer_timeout_s()) + " s; " +
                     policy);
}

uint32_t PeerTable::unreachable() const {
  return static_cast<uint32_t>(
      std::count_if(peers_.begin(), peers_.end(),
                    [](const auto& peer) { return !peer->live.reachable; }));
}

std::vector<std::string> PeerTable::SilentPeers() const {
  std::vector<std::string> names;
  for (const auto& peer : peers_) {
    if (!peer->in.hello()) {
      names.push_back(peer->name + " (" + peer->endpoint + ")");
    }
  }
  return names;
}

// ---- the end of the job -----------------------------------------------------

bool PeerTable::Flushed(const Peer& peer) const {
  return peer.receiving.final_received && peer.sending.final_sent &&
         peer.out.Delivered(peer.sending.final_sequence);
}

bool PeerTable::AllFlushed() const {
  return std::all_of(peers_.begin(), peers_.end(),
                     [&](const auto& peer) { return Flushed(*peer); });
}

bool PeerTable::Exchanged(const Peer& peer) const {
  return peer.receiving.final_received &&
         (!peer.sending.final_sent ||
          peer.out.Delivered(peer.sending.final_sequence));
}

bool PeerTable::Done(const std::vector<int>& sites) const {
  for (int site : sites) {
    const Peer* peer = At(site);
    if (peer == nullptr || !peer->live.reachable) continue;
    if (!Exchanged(*peer)) return false;
  }
  return true;
}

std::vector<std::string> PeerTable::Unflushed() const {
  std::vector<std::string> names;
  for (const auto& peer : peers_) {
    if (!Flushed(*peer)) names.push_back(peer->name);
  }
  return names;
}

// ---- reporting --------------------------------------------------------------

std::vector<SyncEngine::PeerCounters> PeerTable::Counters() const {
  std::vector<SyncEngine::PeerCounters> out;
  for (const auto& peer : peers_) {
    SyncEngine::PeerCounters counters;
    counters.site = peer->name;
    counters.bytes_sent = peer->out.bytes_sent();
    counters.bytes_received = peer->receiving.bytes_received;
    counters.messages_received = peer->receiving.messages_received;
    counters.connected = peer->in.hello();
    counters.clock = ClockOf(*peer);
    counters.reachable = peer->live.reachable;
    counters.retained_bytes = peer->out.retained_bytes();
    counters.backlog_bytes = peer->out.backlog_bytes();
    out.push_back(std::move(counters));
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.site < b.site; });
  return out;
}

void PeerTable::FillSummary(pb::SyncSummary* summary) const {
  double resent = 0, duplicates = 0, gaps = 0, unreachable = 0;
  for (const auto& peer : peers_) {
    resent += static_cast<double>(peer->out.messages_resent());
    duplicates += static_cast<double>(peer->in.duplicates());
    gaps += static_cast<double>(peer->in.gaps());
    unreachable += peer->live.unreachable_total_s +
                   (peer->live.reachable
                        ? 0
                        : context_.Now() - peer->live.unreachable_since_s);
  }
  summary->set_resent(resent);
  summary->set_duplicates_dropped(duplicates);
  summary->set_gaps(gaps);
  summary->set_unreachable_s(unreachable);
  for (const auto& peer : peers_) {
    if (peer->receiving.age.updates() > 0) {
      peer->receiving.age.Fill(peer->name, summary->add_remote_update_age());
    }
  }
}

void PeerTable::Describe(std::ostream& out) const {
  for (const auto& peer : peers_) {
    const Peer& p = *peer;
    out << "; " << p.name << ": clock " << ClockOf(p)
        << (Bounding(p) ? ", counted" : ", not counted")
        << (p.live.reachable ? "" : ", unreachable")
        << (p.live.catching_up ? ", catching up" : "") << ", heard "
        << SilentFor(p) << " s ago, in " << p.in.applied() << " applied, out "
        << p.out.last_sequence() << " made / " << p.out.applied_sequence()
        << " applied, announced " << p.sending.announced
        << (p.out.full() ? ", retention full" : "")
        << (p.out.congested() ? ", congested" : "");
  }
}

}  // namespace meridian
