#include "sync/final_flush.h"

#include <algorithm>
#include <cstdio>

#include "meridian/core/format.h"
#include "meridian/core/log.h"

namespace meridian {
namespace {

std::string Kilobytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f kB", bytes / 1e3);
  return text;
}

}  // namespace

FinalFlush::FinalFlush(const SyncContext& context, PeerTable& peers)
    : context_(context), peers_(peers), waits_(peers.size()) {}

FinalFlush::PeerWait& FinalFlush::WaitFor(const Peer& peer) {
  return waits_[peers_.PositionOf(peer)];
}

void FinalFlush::Start(double now) {
  started_ = true;
  ended_ = false;
  start_s_ = now;
  linger_start_s_ = -1;
  for (const auto& peer : peers_.all()) {
    PeerWait& wait = WaitFor(*peer);
    wait = PeerWait();
    wait.deadline_s = now + kMarginS;
    wait.progress_s = now;
    wait.acked = peer->out.applied_sequence();
    wait.applied = peer->in.applied();
    if (peer->sending.final_sent) {
      // Sent by an earlier run of this site (a --resume): what is left of
      // it, at a rate not measured yet.
      wait.bytes = peer->out.unacknowledged_bytes(peer->sending.final_sequence);
    }
  }
}

void FinalFlush::Sent(const std::vector<Peer*>& targets, double now) {
  for (Peer* peer : targets) {
    PeerWait& wait = WaitFor(*peer);
    if (wait.sent || !peer->sending.final_sent) continue;
    wait.sent = true;
    wait.bytes = peer->out.unacknowledged_bytes(peer->sending.final_sequence);
    wait.rate = peer->out.delivery_rate();
    wait.deadline_s =
        now + kMarginS +
        (wait.rate > 0 ? static_cast<double>(wait.bytes) / wait.rate : 0.0);
    MLOG(INFO) << "final flush to site '" << peer->name << "': "
               << Kilobytes(static_cast<double>(wait.bytes)) << " to deliver"
               << (wait.rate > 0 ? " at " + Kilobytes(wait.rate) + "/s"
                                 : std::string(" (rate not measured yet)"))
               << "; waiting up to " << FormatSeconds(wait.deadline_s - now)
               << " s, and longer while it keeps delivering";
  }
}

bool FinalFlush::StillWaiting(const Peer& peer, PeerWait& wait, double now) {
  if (peer.out.applied_sequence() > wait.acked ||
      peer.in.applied() > wait.applied) {
    wait.acked = std::max(wait.acked, peer.out.applied_sequence());
    wait.applied = std::max(wait.applied, peer.in.applied());
    wait.progress_s = now;
  }
  if (wait.gave_up) return false;
  const double stalled_s = now - wait.progress_s;
  if (now < wait.deadline_s || stalled_s < context_.fault.peer_timeout_s()) {
    return true;
  }
  wait.gave_up = true;
  MLOG(WARNING) << "final flush with site '" << peer.name
                << "': nothing delivered either way for "
                << FormatSeconds(stalled_s) << " s, past its bound of "
                << FormatSeconds(wait.deadline_s - start_s_)
                << " s: no longer waiting for it";
  return false;
}

bool FinalFlush::Waiting(const std::vector<int>& sites, double now) {
  bool waiting = false;
  for (int site : sites) {
    const Peer* peer = peers_.At(site);
    if (peer == nullptr || !peer->live.reachable || peers_.Exchanged(*peer)) {
      continue;
    }
    if (StillWaiting(*peer, WaitFor(*peer), now)) waiting = true;
  }
  return waiting;
}

bool FinalFlush::Lingering(double now) {
  if (linger_start_s_ < 0) linger_start_s_ = now;
  const double silence_s = context_.fault.peer_timeout_s();
  bool lingering = false;
  for (const auto& peer : peers_.all()) {
    if (!peers_.Flushed(*peer) || peer->receiving.said_flushed) continue;
    PeerWait& wait = WaitFor(*peer);
    if (wait.stayed) continue;
    const double silent_s = peers_.SilentFor(*peer);
    if (silent_s < silence_s && now - linger_start_s_ < kLingerS) {
      lingering = true;
      continue;
    }
    wait.stayed = true;
    MLOG(INFO) << "final flush with site '" << peer->name
               << "' complete here; it did not say it is complete there ("
               << (silent_s >= silence_s
                       ? "silent for " + FormatSeconds(silent_s) + " s"
                       : "after " + FormatSeconds(now - linger_start_s_) +
                             " s")
               << "): no longer staying for it";
  }
  return lingering;
}

void FinalFlush::End(double now) {
  ended_ = true;
  end_s_ = now;
}

uint64_t FinalFlush::bytes_left() const {
  uint64_t bytes = 0;
  for (const auto& peer : peers_.all()) {
    if (peer->sending.final_sent) {
      bytes += peer->out.unacknowledged_bytes(peer->sending.final_sequence);
    }
  }
  return bytes;
}

void FinalFlush::FillSummary(pb::SyncSummary* summary) const {
  if (!started_) return;
  double bound = 0;
  uint64_t bytes = 0;
  for (const PeerWait& wait : waits_) {
    bound = std::max(bound, wait.deadline_s - start_s_);
    bytes += wait.bytes;
  }
  summary->set_flush_s((ended_ ? end_s_ : context_.Now()) - start_s_);
  summary->set_flush_bound_s(bound);
  summary->set_flush_bytes(static_cast<double>(bytes));
}

}  // namespace meridian
