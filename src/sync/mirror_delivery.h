// Delivery of mirror messages between two site servers, exactly once in
// order, across broken connections, restarts of the WAN emulator and
// crashes of either site (with checkpoints).
//
// ZeroMQ keeps order on one TCP connection but loses what was in a
// connection that breaks; it reconnects silently. On top of it, per
// direction of a pair of sites:
//   - the sender numbers every message that carries state (MIRROR_UPDATE,
//     MIRROR_INDICES, MIRROR_CLOCK) 1, 2, 3 ... on the channel, and keeps
//     each one (OutboundChannel's retention) until the receiver's
//     acknowledgement says its durable checkpoint holds it (or, without
//     checkpoints, that it was applied);
//   - the receiver (InboundChannel) applies message n only after n - 1,
//     drops what it has applied already (a duplicate from a resend) and,
//     when it sees a gap (a later number, or a HEARTBEAT naming a later
//     last number), asks for a resend of everything after what it applied;
//   - both directions stay alive: the sender sends a HEARTBEAT when nothing
//     went out for an interval, the receiver acknowledges at least every
//     interval, so each side notices a silent peer.
// A slow link is not a dead peer. ZeroMQ delivers only whole messages, so
// what proves a peer alive is its next whole message, and nothing it sends
// overtakes what it queued before on the link. So the channel keeps both
// short: a message carries at most max_message_bytes() (about a quarter
// second of what the link delivers; the sync engine cuts updates to it),
// and at most window() (two seconds of it) is on its way in ZeroMQ and on
// the link ahead of a heartbeat or an acknowledgement (Pump); the rest
// waits in the retention. On a link that delivers at all, a message of
// the peer then arrives every max_message_bytes() / rate seconds.
// MIRROR_HELLO (layout, incarnation, first sequence number) and the
// HEARTBEAT / MIRROR_ACK control messages are outside the numbering.
//
// Memory: the retention holds at most `retention_limit_bytes` (checked
// before a message is created: full() tells the sync engine to keep
// further changes in the channel's accumulator, which is bounded by the
// model); ZeroMQ's queue holds at most its high-water mark, because the
// channel sends without blocking and keeps what did not go out.
//
// Both classes are driven by the site server's event-loop thread only: not
// thread-safe.
#ifndef MERIDIAN_SYNC_MIRROR_DELIVERY_H_
#define MERIDIAN_SYNC_MIRROR_DELIVERY_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "meridian/core/status.h"
#include "meridian/wire.pb.h"

namespace meridian {

struct DeliveryOptions {
  // A HEARTBEAT goes out when nothing else did for this long; the receiver
  // acknowledges at least this often.
  double heartbeat_interval_s = 1.0;
  // Bytes of messages kept for a resend; full() beyond it.
  uint64_t retention_limit_bytes = uint64_t{4} << 20;
  // Sender: forget a message only once the receiver's checkpoint holds it
  // (durable_sequence), not when it was merely applied: the receiver may
  // crash and restart from that checkpoint.
  bool wait_for_durable = true;
  // Receiver: this site writes checkpoints, and what it applied counts as
  // durable once NoteDurable() says a checkpoint holds it; false: applied
  // is durable (nothing better will come).
  bool checkpointed = false;
};

// A message as kept for (re)sending: serialized header and payload frames.
struct RetainedMessage {
  uint64_t sequence = 0;
  std::string header;               // pb::Header, sequence stamped
  std::vector<std::string> frames;  // payload, one per slice
  uint64_t bytes = 0;               // header + frames
  double sent_s = -1;  // first handed to ZeroMQ (-1: not yet, or unknown)
};

// What the acknowledgements of one channel show of its link: the bytes
// delivered, the delivery rate and the shortest round trip. The rate is
// sampled every half second of acknowledgements, and a sample spans at
// least one delivered message (on a link slower than a message per half
// second a shorter one would read as rate 0, "not measured"). A sample
// taken while messages were on their way all along (the link, not the
// sender, limited it) is what the link delivers now and replaces the rate
// at once, so a link slowed at run time shows its new rate within a
// second. A sample with idle time in it only says the link delivers at
// least that much: the rate is then the largest sample of the last
// kPeakS. A peak older than that is forgotten, so a link slowed while the
// sender never filled it is not taken for its old speed for long (a
// decaying peak still read 226 kB/s 12 s after the link fell to 6 kB/s,
// and the final flush sent 56 kB messages the peer took 10 s to hear).
// Samples need acknowledgements, and a link that stalls delivers none:
// between them the channel reports what waits (Waiting), and the rate is
// at most what would have delivered it by now, so a rate measured before
// the link crawled does not size messages and the window for long (one
// measured at 128.8 kB/s stood 11 s after the link fell to 6 kB/s, both
// directions full, no acknowledgement getting through: the final flush
// sent 32 kB messages and each site declared the other unreachable). With
// no sample for kPeakS the rate is stale(): it may be anything now.
// Part of an OutboundChannel; fixed size.
class LinkDelivery {
 public:
  static constexpr double kSampleS = 0.5;
  static constexpr double kPeakS = 3.0;

  // The peer acknowledged a message of `bytes` as applied.
  void Delivered(uint64_t bytes) {
    delivered_bytes_ += bytes;
    rate_bytes_ += bytes;
  }
  // A message sent `seconds` ago was acknowledged.
  void RoundTrip(double seconds) {
    if (min_round_trip_s_ < 0 || seconds < min_round_trip_s_) {
      min_round_trip_s_ = seconds;
    }
  }
  // An acknowledgement arrived at `now` and was counted (Delivered);
  // `in_flight`: enough handed to ZeroMQ is still not acknowledged to
  // keep the link busy (the channel: at least kMinMessageBytes).
  void Acknowledged(double now, bool in_flight);

  // Called on every turn of the channel: the oldest message handed to
  // ZeroMQ and not acknowledged has `head_bytes` (0: none) and has had the
  // link for `waited_s` (since it was sent or since the last delivery,
  // whichever is later, less the shortest round trip). Beyond kSampleS
  // the link delivers less than head_bytes / waited_s now: rate() is at
  // most that until the next sample.
  void Waiting(double now, uint64_t head_bytes, double waited_s);

  // Bytes/s; 0 before the first sample (or stall).
  double rate() const {
    if (stall_rate_ > 0 && (rate_ <= 0 || stall_rate_ < rate_)) {
      return stall_rate_;
    }
    return rate_;
  }
  // A sample delivered bytes, or a message waits: rate() is the link's,
  // not "unknown".
  bool measured() const { return rate() > 0; }
  // The last sample is older than kPeakS (as of the last Waiting): the
  // link may have slowed since without the rate showing it.
  bool stale() const { return stale_; }
  double min_round_trip_s() const { return min_round_trip_s_; }
  uint64_t delivered_bytes() const { return delivered_bytes_; }

 private:
  struct Sample {
    double at_s = -1;
    double rate = 0;
  };
  // Samples are at least kSampleS apart: kPeakS holds at most this many.
  static constexpr size_t kPeakSamples =
      static_cast<size_t>(kPeakS / kSampleS) + 1;

  double rate_ = 0;
  double stall_rate_ = 0;  // bound from the waiting head (0: none)
  double last_sample_s_ = -1;
  bool stale_ = false;
  double min_round_trip_s_ = -1;  // send to acknowledgement, shortest seen
  uint64_t rate_bytes_ = 0;       // delivered since rate_start_s_
  double rate_start_s_ = -1;
  bool idle_ = true;  // nothing was in flight at some point since then
  uint64_t delivered_bytes_ = 0;
  // The samples that count for the peak: the last busy one and the idle
  // ones since, newest last, none older than kPeakS.
  std::array<Sample, kPeakSamples> peak_samples_{};
  size_t peak_count_ = 0;
};

// The sending half of a channel to one peer site. Owns its DEALER socket
// once Attach()ed.
class OutboundChannel {
 public:
  OutboundChannel(std::string peer, pb::Endpoint self, uint64_t incarnation,
                  DeliveryOptions options);
  OutboundChannel(const OutboundChannel&) = delete;
  OutboundChannel& operator=(const OutboundChannel&) = delete;

  const std::string& peer() const { return peer_; }
  bool attached() const { return socket_ != nullptr; }
  zmq::socket_t* socket() { return socket_.get(); }

  // Takes the connected socket (a DEALER; this sets its send timeout to 0)
  // and the MIRROR_HELLO to introduce this site with; sends the hello,
  // then whatever is waiting.
  void Attach(std::unique_ptr<zmq::socket_t> socket, pb::Header hello,
              double now);

  // Numbers `header` (the next sequence number), keeps it with `frames`
  // and sends it as soon as ZeroMQ takes it. Returns its sequence number.
  // Precondition: !full() unless the message must not wait (a final
  // flush).
  uint64_t Enqueue(pb::Header header, std::vector<std::string> frames,
                   double now);

  // Sends what is waiting, in order, while ZeroMQ takes it without
  // blocking and the link's backlog is under window() (a message of at
  // most kSmallMessageBytes, a clock, goes regardless); a HEARTBEAT when
  // nothing went out for an interval. Call on every turn of the event
  // loop.
  void Pump(double now);

  // An acknowledgement from the peer (received on this channel's socket).
  // Forgets what it allows, and on `resend` sends the hello and everything
  // after applied_sequence again. Returns whether it acknowledges this run
  // of the site (an ack for an earlier run changes nothing but liveness).
  bool OnAck(const pb::MirrorAck& ack, double now);

  // Retention at its limit: create no new messages for this peer.
  bool full() const {
    return retained_bytes_ >= options_.retention_limit_bytes;
  }
  // Flow control: more is on the way (handed to ZeroMQ or waiting in the
  // retention, not acknowledged) than the link delivered in kWindowS
  // (window(), at least kMinWindowBytes). Create no new message then: the
  // changes wait, and merge, in the peer's accumulator, and the link's
  // queue — what a heartbeat waits behind — stays short, so a slow link
  // is not mistaken for a dead peer.
  static constexpr double kWindowS = 2.0;
  static constexpr uint64_t kMinWindowBytes = 16 * 1024;
  // Before the first rate sample (half a second of acknowledgements) the
  // link's rate is unknown: the window is this, so that a job's first
  // updates and the clocks behind them are not held to the minimum window
  // for every round trip while the sites start (which slowed a LAN-fast
  // job's first half second about fourfold). Messages stay at
  // kMinMessageBytes meanwhile: on a link that turns out slow, the peer
  // hears one every few seconds even then (a final flush on a 48 kbit/s
  // link that carried too little during training to be measured sent its
  // 247 kB as one message, and the peers declared each other unreachable).
  static constexpr uint64_t kInitialWindowBytes = 1024 * 1024;
  bool congested() const { return unacknowledged_bytes() > window(); }
  uint64_t window() const;
  // Messages this small are handed to ZeroMQ whatever the backlog: a
  // clock announcement follows the update it covers at once.
  static constexpr uint64_t kSmallMessageBytes = 1024;
  // The most a message should carry (bytes): what the link delivers in
  // kMessageS at its measured rate, at least kMinMessageBytes (and that
  // before the rate is known, or while it is stale()). While a flush
  // crosses, the peer hears from this site at least that often.
  static constexpr double kMessageS = 0.25;
  static constexpr uint64_t kMinMessageBytes = 8 * 1024;
  uint64_t max_message_bytes() const;
  // The link's delivery rate as acknowledgements show it (bytes/s; see
  // LinkDelivery), 0 before any.
  double delivery_rate() const { return link_.rate(); }
  // The link is saturated: it is congested(), or its oldest
  // unacknowledged message has waited more than kSaturationS, or 4 round
  // trips (the shortest seen), whichever is longer — it queues what it is
  // given. The bandwidth-adaptive threshold rises while it is (and while
  // the peer is not silent: a frozen peer acknowledges nothing either).
  static constexpr double kSaturationS = 1.0;
  bool Saturated(double now) const;
  // Every message up to `sequence` was applied by the peer.
  bool Delivered(uint64_t sequence) const {
    return applied_sequence_ >= sequence;
  }

  uint64_t last_sequence() const { return next_sequence_ - 1; }
  uint64_t applied_sequence() const { return applied_sequence_; }
  uint64_t durable_sequence() const { return durable_sequence_; }
  // The peer's last clock from this site, as its last acknowledgement
  // said (-1: not heard).
  int64_t peer_view_of_clock() const { return peer_clock_; }
  double last_ack_s() const { return last_ack_s_; }
  uint64_t retained_bytes() const { return retained_bytes_; }
  uint64_t retained_messages() const { return retained_.size(); }
  // Bytes of messages handed to ZeroMQ and not yet acknowledged as
  // applied: what the link has not delivered yet.
  uint64_t backlog_bytes() const;
  // Bytes of the messages up to `sequence` (default: all) not
  // acknowledged as applied, handed to ZeroMQ or not.
  uint64_t unacknowledged_bytes(
      uint64_t sequence = std::numeric_limits<uint64_t>::max()) const;
  // Cumulative bytes of messages the peer acknowledged as applied.
  uint64_t delivered_bytes() const { return link_.delivered_bytes(); }
  // Bytes handed to ZeroMQ (headers and payloads, resends included;
  // control messages too).
  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t messages_resent() const { return messages_resent_; }
  uint64_t resend_requests() const { return resend_requests_; }
  // HEARTBEATs handed to ZeroMQ.
  uint64_t heartbeats_sent() const { return heartbeats_sent_; }

  // ---- checkpoints -----------------------------------------------------
  // The channel's state for a checkpoint: next sequence number and every
  // retained message.
  struct State {
    uint64_t next_sequence = 1;
    uint64_t applied_sequence = 0;
    uint64_t durable_sequence = 0;
    std::vector<RetainedMessage> retained;
  };
  State Save() const;
  // Before Attach: continues from a checkpoint's state.
  void Restore(State state);
  // Before Attach, after Restore: a message of the outgoing log (sent,
  // or about to be, after the checkpoint). Ignored when it is not newer
  // than what the channel has.
  void RestoreLogged(RetainedMessage message);

 private:
  // Pump's sending, without the link bookkeeping.
  void SendWaiting(double now);
  // Tells link_ what waits for it (LinkDelivery::Waiting).
  void TrackHead(double now);
  void SendHello(double now);
  // Hands one message to ZeroMQ without blocking; false when it would
  // block.
  bool SendRetained(const RetainedMessage& message, double now);
  bool SendControl(const pb::Header& header, double now);
  void Forget(uint64_t up_to);

  const std::string peer_;
  const pb::Endpoint self_;
  const uint64_t incarnation_;
  const DeliveryOptions options_;
  std::unique_ptr<zmq::socket_t> socket_;
  pb::Header hello_;

  uint64_t next_sequence_ = 1;
  // Contiguous sequence numbers [front, next_sequence_): forgotten only
  // from the front.
  std::deque<RetainedMessage> retained_;
  // Messages from this number on wait to be handed to ZeroMQ.
  uint64_t next_to_send_ = 1;
  // What a HEARTBEAT names as sent (set back on a resend request).
  uint64_t last_sent_sequence_ = 0;
  uint64_t retained_bytes_ = 0;
  uint64_t applied_sequence_ = 0;
  uint64_t durable_sequence_ = 0;
  int64_t peer_clock_ = -1;
  bool hello_pending_ = false;
  bool resumed_ = false;  // Restore()d from a checkpoint

  double last_send_s_ = -1;  // anything handed to ZeroMQ
  double last_ack_s_ = -1;
  // Since then the oldest unacknowledged message has the link to itself
  // (a delivery, a resend or a new connection).
  double head_since_s_ = -1;
  LinkDelivery link_;
  uint64_t bytes_sent_ = 0;
  uint64_t messages_resent_ = 0;
  uint64_t heartbeats_sent_ = 0;
  uint64_t resend_requests_ = 0;
};

// The receiving half: what this site knows of one peer's channel towards
// it. Pure bookkeeping; the sync engine applies messages and sends the
// acknowledgements it asks for on the mirror socket.
class InboundChannel {
 public:
  explicit InboundChannel(DeliveryOptions options) : options_(options) {}

  // See DeliveryOptions::checkpointed.
  void SetCheckpointed(bool checkpointed) {
    options_.checkpointed = checkpointed;
  }

  enum class Admission {
    kApply,      // the next message: apply it, then Applied()
    kDuplicate,  // applied before (a resend): drop
    kGap,        // messages before it are missing: drop, a resend is asked
  };
  // A numbered message arrived.
  Admission Admit(uint64_t sequence, double now);
  // It was applied (or refused for good: either way it is done); `bytes`:
  // its size, counted until a checkpoint holds it.
  void Applied(uint64_t sequence, uint64_t bytes = 0) {
    applied_ = sequence;
    bytes_since_durable_ += bytes;
  }

  // MIRROR_HELLO: `incarnation` of the sender, which may send from
  // `first_sequence` on; `resumed`: it restarted from a checkpoint and
  // continues the numbering. Returns a description of what changed for the
  // log (a restarted sender, a gap that cannot be filled), empty when
  // nothing noteworthy happened.
  std::string OnHello(uint64_t incarnation, uint64_t first_sequence,
                      bool resumed, double now);
  // HEARTBEAT naming the sender's last sequence number.
  void OnHeartbeat(uint64_t last_sequence, double now);
  void Heard(double now) { last_heard_s_ = now; }
  // Acknowledge at the next AckDue (a final flush: the sender waits for
  // it before it exits).
  void AckSoon() { ack_now_ = true; }

  // A checkpoint holding everything applied up to `sequence` is durable;
  // `bytes_after`: the bytes applied since that checkpoint's snapshot.
  void NoteDurable(uint64_t sequence, uint64_t bytes_after = 0) {
    durable_ = std::max(durable_, sequence);
    bytes_since_durable_ = std::min(bytes_since_durable_, bytes_after);
  }
  // Bytes of messages applied that no durable checkpoint holds yet: the
  // sender keeps as much for a resend.
  uint64_t bytes_since_durable() const { return bytes_since_durable_; }

  // The acknowledgement to send now, if one is due: after a gap or a
  // hello at once (a resend request at most every interval), after new
  // messages at most every 50 ms, otherwise every heartbeat interval.
  // `clock`: the last clock received from the sender.
  std::optional<pb::MirrorAck> AckDue(double now, int64_t clock);

  bool hello() const { return incarnation_ != 0; }
  uint64_t incarnation() const { return incarnation_; }
  uint64_t applied() const { return applied_; }
  uint64_t durable() const { return durable_; }
  double last_heard_s() const { return last_heard_s_; }
  uint64_t duplicates() const { return duplicates_; }
  uint64_t gaps() const { return gaps_; }

  // For checkpoints: the sender's incarnation and what was applied.
  void Restore(uint64_t incarnation, uint64_t applied) {
    incarnation_ = incarnation;
    applied_ = applied;
    durable_ = applied;
    acked_ = 0;  // say so at once
  }

 private:
  DeliveryOptions options_;
  uint64_t incarnation_ = 0;
  uint64_t applied_ = 0;
  uint64_t durable_ = 0;
  // What the last acknowledgement said (to send one only on change).
  uint64_t acked_ = 0;
  uint64_t acked_durable_ = 0;
  double last_ack_s_ = -1;
  bool gap_ = false;
  bool ack_now_ = false;
  double last_resend_request_s_ = -1;
  double last_heard_s_ = -1;
  uint64_t duplicates_ = 0;
  uint64_t gaps_ = 0;
  uint64_t bytes_since_durable_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_MIRROR_DELIVERY_H_
