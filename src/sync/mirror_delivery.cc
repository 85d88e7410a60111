#include "sync/mirror_delivery.h"

#include <algorithm>

#include "meridian/core/log.h"
#include "meridian/net/message.h"

namespace meridian {
namespace {

// Acknowledgements of newly applied messages are spaced at least this far
// apart (seconds): often enough for the sender's delivery-rate estimate
// and the final flush, rare enough to cost nothing on the link.
constexpr double kAckSpacingS = 0.05;

}  // namespace

// ---- LinkDelivery -----------------------------------------------------------

void LinkDelivery::Acknowledged(double now, bool in_flight) {
  if (rate_start_s_ < 0) {
    rate_start_s_ = now;
    idle_ = !in_flight;
    return;
  }
  const double elapsed = now - rate_start_s_;
  if (elapsed < kSampleS || (rate_bytes_ == 0 && !idle_)) {
    // Too short, or busy and nothing delivered yet (a slow link): the
    // sample goes on.
    if (!in_flight) idle_ = true;
    return;
  }
  if (rate_bytes_ == 0) {
    // Idle and nothing delivered: says nothing about the link.
    rate_start_s_ = now;
    idle_ = !in_flight;
    return;
  }
  const Sample sample{now, static_cast<double>(rate_bytes_) / elapsed};
  if (!idle_) {
    // The link set the pace: this is its rate now, whatever came before.
    peak_count_ = 0;
  } else {
    // Forget samples older than kPeakS (and the oldest if full).
    size_t keep_from = 0;
    while (keep_from < peak_count_ &&
           (now - peak_samples_[keep_from].at_s > kPeakS ||
            peak_count_ - keep_from >= kPeakSamples)) {
      ++keep_from;
    }
    std::copy(peak_samples_.begin() + keep_from,
              peak_samples_.begin() + peak_count_, peak_samples_.begin());
    peak_count_ -= keep_from;
  }
  peak_samples_[peak_count_++] = sample;
  rate_ = 0;
  for (size_t i = 0; i < peak_count_; ++i) {
    rate_ = std::max(rate_, peak_samples_[i].rate);
  }
  rate_bytes_ = 0;
  rate_start_s_ = now;
  idle_ = !in_flight;
  last_sample_s_ = now;
  stale_ = false;
  stall_rate_ = 0;  // the head changed: the next Waiting says
}

void LinkDelivery::Waiting(double now, uint64_t head_bytes, double waited_s) {
  stall_rate_ = head_bytes > 0 && waited_s > kSampleS
                    ? static_cast<double>(head_bytes) / waited_s
                    : 0;
  stale_ = last_sample_s_ >= 0 && now - last_sample_s_ > kPeakS;
}

// ---- OutboundChannel --------------------------------------------------------

OutboundChannel::OutboundChannel(std::string peer, pb::Endpoint self,
                                 uint64_t incarnation, DeliveryOptions options)
    : peer_(std::move(peer)),
      self_(std::move(self)),
      incarnation_(incarnation),
      options_(options) {}

void OutboundChannel::Attach(std::unique_ptr<zmq::socket_t> socket,
                             pb::Header hello, double now) {
  socket_ = std::move(socket);
  try {
    // Never block the event loop on a slow peer: what ZeroMQ does not take
    // now stays in the retention and goes out on a later Pump.
    socket_->set(zmq::sockopt::sndtimeo, 0);
  } catch (const zmq::error_t& error) {
    MLOG(WARNING) << "channel to site '" << peer_
                  << "': cannot make sends non-blocking: " << error.what();
  }
  hello_ = std::move(hello);
  hello_pending_ = true;
  head_since_s_ = now;
  next_to_send_ =
      retained_.empty() ? next_sequence_ : retained_.front().sequence;
  Pump(now);
}

uint64_t OutboundChannel::Enqueue(pb::Header header,
                                  std::vector<std::string> frames, double now) {
  RetainedMessage message;
  message.sequence = next_sequence_++;
  header.set_sequence(message.sequence);
  header.SerializeToString(&message.header);
  message.bytes = message.header.size();
  for (const std::string& frame : frames) message.bytes += frame.size();
  message.frames = std::move(frames);
  retained_bytes_ += message.bytes;
  retained_.push_back(std::move(message));
  Pump(now);
  return retained_.back().sequence;
}

void OutboundChannel::Pump(double now) {
  if (!socket_) return;
  SendWaiting(now);
  TrackHead(now);
}

void OutboundChannel::TrackHead(double now) {
  // Sequence numbers in the retention are contiguous: the head is found by
  // index (this runs on every turn of the event loop).
  const uint64_t head = applied_sequence_ + 1;
  if (!retained_.empty() && head >= retained_.front().sequence &&
      head < next_to_send_ && head <= retained_.back().sequence) {
    const RetainedMessage& message =
        retained_[head - retained_.front().sequence];
    if (message.sent_s >= 0) {
      const double waited = now - std::max(message.sent_s, head_since_s_) -
                            std::max(link_.min_round_trip_s(), 0.0);
      link_.Waiting(now, message.bytes, waited);
      return;
    }
  }
  link_.Waiting(now, 0, 0);
}

void OutboundChannel::SendWaiting(double now) {
  if (hello_pending_) {
    SendHello(now);
    if (hello_pending_) return;  // ZeroMQ would block: later
  }
  if (next_to_send_ < next_sequence_ && !retained_.empty()) {
    const uint64_t first = retained_.front().sequence;
    next_to_send_ = std::max(next_to_send_, first);
    // What a heartbeat or an acknowledgement waits behind on the link: at
    // most the window and one message.
    uint64_t backlog = backlog_bytes();
    const uint64_t window = this->window();
    while (next_to_send_ < next_sequence_) {
      RetainedMessage& message = retained_[next_to_send_ - first];
      if (backlog >= window && message.bytes > kSmallMessageBytes) break;
      if (!SendRetained(message, now)) return;
      backlog += message.bytes;
      if (message.sent_s < 0) message.sent_s = now;
      last_sent_sequence_ = message.sequence;
      ++next_to_send_;
    }
  }
  if (last_send_s_ < 0 || now - last_send_s_ >= options_.heartbeat_interval_s) {
    pb::Header heartbeat = MakeHeader(pb::HEARTBEAT, self_, 0);
    heartbeat.mutable_heartbeat()->set_last_sequence(last_sent_sequence_);
    if (SendControl(heartbeat, now)) ++heartbeats_sent_;
  }
}

bool OutboundChannel::OnAck(const pb::MirrorAck& ack, double now) {
  last_ack_s_ = now;
  // Incarnation 0: the receiver does not know who we are (it restarted
  // without our hello) and asks for the hello and everything it misses.
  if (ack.incarnation() != 0 && ack.incarnation() != incarnation_) {
    return false;  // for an earlier run of this site
  }
  peer_clock_ = ack.clock();
  const uint64_t applied = std::min(ack.applied_sequence(), last_sequence());
  if (applied > applied_sequence_) {
    head_since_s_ = now;
    for (const RetainedMessage& message : retained_) {
      if (message.sequence > applied) break;
      if (message.sequence > applied_sequence_) {
        link_.Delivered(message.bytes);
        if (message.sent_s >= 0 && message.sequence == applied) {
          link_.RoundTrip(now - message.sent_s);
        }
      }
    }
  }
  if (ack.resend()) {
    // The receiver may have lost what it applied (it restarted from an
    // older checkpoint): trust it, and go back to what it has.
    applied_sequence_ = applied;
  } else {
    applied_sequence_ = std::max(applied_sequence_, applied);
  }
  durable_sequence_ = std::max(
      durable_sequence_, std::min(ack.durable_sequence(), applied_sequence_));
  Forget(options_.wait_for_durable ? durable_sequence_ : applied_sequence_);
  // In flight: at least a message's worth, so a trickle of clock
  // announcements (the sender, not the link, limiting it) counts as idle.
  link_.Acknowledged(now, backlog_bytes() >= kMinMessageBytes);
  if (ack.resend()) {
    ++resend_requests_;
    const uint64_t from = applied_sequence_ + 1;
    if (!retained_.empty() && from < retained_.front().sequence) {
      MLOG(ERROR) << "site '" << peer_ << "' asks for messages from " << from
                  << " but this site kept only " << retained_.front().sequence
                  << " onwards (it acknowledged "
                  << "them as durable before): they cannot be sent again";
    }
    const uint64_t first =
        retained_.empty() ? next_sequence_ : retained_.front().sequence;
    const uint64_t restart = std::max(from, first);
    if (restart < next_to_send_) messages_resent_ += next_to_send_ - restart;
    next_to_send_ = restart;
    last_sent_sequence_ = applied_sequence_;
    hello_pending_ = true;
    head_since_s_ = now;
    Pump(now);
  }
  TrackHead(now);
  return true;
}

bool OutboundChannel::Saturated(double now) const {
  if (congested()) return true;
  for (const RetainedMessage& message : retained_) {
    if (message.sequence <= applied_sequence_) continue;
    if (message.sequence >= next_to_send_ || message.sent_s < 0) break;
    const double limit =
        std::max(kSaturationS, 4 * std::max(link_.min_round_trip_s(), 0.0));
    return now - message.sent_s > limit;
  }
  return false;
}

uint64_t OutboundChannel::window() const {
  if (!link_.measured()) return kInitialWindowBytes;
  return std::max<uint64_t>(kMinWindowBytes,
                            static_cast<uint64_t>(kWindowS * link_.rate()));
}

uint64_t OutboundChannel::max_message_bytes() const {
  if (!link_.measured() || link_.stale()) return kMinMessageBytes;
  return std::max<uint64_t>(kMinMessageBytes,
                            static_cast<uint64_t>(kMessageS * link_.rate()));
}

uint64_t OutboundChannel::unacknowledged_bytes(uint64_t sequence) const {
  uint64_t bytes = 0;
  for (const RetainedMessage& message : retained_) {
    if (message.sequence > sequence) break;
    if (message.sequence > applied_sequence_) bytes += message.bytes;
  }
  return bytes;
}

uint64_t OutboundChannel::backlog_bytes() const {
  uint64_t backlog = 0;
  for (const RetainedMessage& message : retained_) {
    if (message.sequence > applied_sequence_ &&
        message.sequence < next_to_send_) {
      backlog += message.bytes;
    }
  }
  return backlog;
}

OutboundChannel::State OutboundChannel::Save() const {
  State state;
  state.next_sequence = next_sequence_;
  state.applied_sequence = applied_sequence_;
  state.durable_sequence = durable_sequence_;
  state.retained.assign(retained_.begin(), retained_.end());
  return state;
}

void OutboundChannel::Restore(State state) {
  resumed_ = true;
  next_sequence_ = state.next_sequence;
  applied_sequence_ = state.applied_sequence;
  durable_sequence_ = state.durable_sequence;
  last_sent_sequence_ = applied_sequence_;
  retained_.clear();
  retained_bytes_ = 0;
  for (RetainedMessage& message : state.retained) {
    retained_bytes_ += message.bytes;
    retained_.push_back(std::move(message));
  }
}

void OutboundChannel::RestoreLogged(RetainedMessage message) {
  if (message.sequence < next_sequence_) return;  // in the checkpoint
  if (message.sequence != next_sequence_) {
    MLOG(ERROR) << "outgoing log for site '" << peer_ << "' jumps from "
                << next_sequence_ - 1 << " to " << message.sequence;
  }
  next_sequence_ = message.sequence + 1;
  retained_bytes_ += message.bytes;
  retained_.push_back(std::move(message));
}

void OutboundChannel::SendHello(double now) {
  pb::Header hello = hello_;
  pb::MirrorHello* body = hello.mutable_mirror_hello();
  body->set_incarnation(incarnation_);
  body->set_first_sequence(retained_.empty() ? next_sequence_
                                             : retained_.front().sequence);
  body->set_resumed(resumed_);
  if (SendControl(hello, now)) hello_pending_ = false;
}

bool OutboundChannel::SendRetained(const RetainedMessage& message, double now) {
  try {
    const bool more = !message.frames.empty();
    if (!socket_->send(
            zmq::buffer(message.header),
            more ? zmq::send_flags::sndmore : zmq::send_flags::none)) {
      return false;  // would block: the peer is not reading fast enough
    }
    for (size_t i = 0; i < message.frames.size(); ++i) {
      // Once the first frame was taken the rest of a multipart message is
      // queued: this cannot half-fail on EAGAIN.
      socket_->send(zmq::buffer(message.frames[i]),
                    i + 1 < message.frames.size() ? zmq::send_flags::sndmore
                                                  : zmq::send_flags::none);
    }
  } catch (const zmq::error_t& error) {
    MLOG(ERROR) << "channel to site '" << peer_ << "': " << error.what();
    return false;
  }
  bytes_sent_ += message.bytes;
  last_send_s_ = now;
  return true;
}

bool OutboundChannel::SendControl(const pb::Header& header, double now) {
  std::string bytes;
  header.SerializeToString(&bytes);
  try {
    if (!socket_->send(zmq::buffer(bytes), zmq::send_flags::none)) {
      return false;
    }
  } catch (const zmq::error_t& error) {
    MLOG(ERROR) << "channel to site '" << peer_ << "': " << error.what();
    return false;
  }
  bytes_sent_ += bytes.size();
  last_send_s_ = now;
  return true;
}

void OutboundChannel::Forget(uint64_t up_to) {
  while (!retained_.empty() && retained_.front().sequence <= up_to &&
         retained_.front().sequence < next_to_send_) {
    retained_bytes_ -= retained_.front().bytes;
    retained_.pop_front();
  }
}

// ---- InboundChannel ---------------------------------------------------------

InboundChannel::Admission InboundChannel::Admit(uint64_t sequence, double now) {
  last_heard_s_ = now;
  if (sequence <= applied_) {
    ++duplicates_;
    return Admission::kDuplicate;
  }
  if (sequence > applied_ + 1) {
    if (!gap_) ++gaps_;
    gap_ = true;
    return Admission::kGap;
  }
  return Admission::kApply;
}

std::string InboundChannel::OnHello(uint64_t incarnation,
                                    uint64_t first_sequence, bool resumed,
                                    double now) {
  last_heard_s_ = now;
  ack_now_ = true;
  std::string note;
  if (incarnation_ != 0 && incarnation != incarnation_) {
    if (!resumed) {
      note = "restarted without its state (its channel starts again at 1)";
      applied_ = 0;
      durable_ = 0;
      acked_ = 0;
    } else {
      note = "restarted";
    }
  }
  incarnation_ = incarnation;
  if (first_sequence > applied_ + 1) {
    if (!note.empty()) note += "; ";
    note += "messages " + std::to_string(applied_ + 1) + " to " +
            std::to_string(first_sequence - 1) +
            " are no longer available from it";
    applied_ = first_sequence - 1;
  }
  return note;
}

void InboundChannel::OnHeartbeat(uint64_t last_sequence, double now) {
  last_heard_s_ = now;
  if (last_sequence > applied_) {
    if (!gap_) ++gaps_;
    gap_ = true;
  }
}

std::optional<pb::MirrorAck> InboundChannel::AckDue(double now, int64_t clock) {
  if (incarnation_ == 0) return std::nullopt;  // nobody to answer yet
  bool due =
      ack_now_ || (options_.checkpointed && durable_ != acked_durable_) ||
      last_ack_s_ < 0 || now - last_ack_s_ >= options_.heartbeat_interval_s ||
      (applied_ != acked_ && now - last_ack_s_ >= kAckSpacingS);
  bool resend = false;
  if (gap_ && (last_resend_request_s_ < 0 ||
               now - last_resend_request_s_ >= options_.heartbeat_interval_s)) {
    resend = true;
    due = true;
  }
  if (!due) return std::nullopt;
  const uint64_t durable =
      options_.checkpointed ? std::min(durable_, applied_) : applied_;
  pb::MirrorAck ack;
  ack.set_applied_sequence(applied_);
  ack.set_durable_sequence(durable);
  ack.set_incarnation(incarnation_);
  ack.set_clock(clock);
  if (resend) {
    ack.set_resend(true);
    gap_ = false;
    last_resend_request_s_ = now;
  }
  acked_ = applied_;
  acked_durable_ = durable_;
  last_ack_s_ = now;
  ack_now_ = false;
  return ack;
}

}  // namespace meridian
