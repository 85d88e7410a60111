// Exactly-once delivery of mirror messages (src/sync/mirror_delivery.h)
// over real ZeroMQ sockets: a sender's OutboundChannel on a DEALER, a
// receiver's InboundChannel behind a ROUTER, time passed in explicitly.
// Lost messages are messages the receiver never applies (what a broken
// connection does); the receiver must notice and get them again, and never
// apply one twice.
#include "sync/mirror_delivery.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <set>
#include <thread>
#include <zmq.hpp>

#include "meridian/net/message.h"
#include "meridian/net/transport.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

pb::Endpoint Site(const std::string& name) {
  pb::Endpoint self;
  self.set_site(name);
  self.set_role(pb::ROLE_SITE_SERVER);
  return self;
}

pb::Header Hello() { return MakeHeader(pb::MIRROR_HELLO, Site("a"), 0); }

pb::Header Clock(int64_t clock) {
  pb::Header header = MakeHeader(pb::MIRROR_CLOCK, Site("a"), 0);
  header.set_clock(clock);
  header.mutable_mirror_clock()->set_clock(clock);
  return header;
}

// A MIRROR_UPDATE carrying `bytes` of raw float values, and its frames.
pb::Header Update(size_t bytes) {
  pb::Header header = MakeHeader(pb::MIRROR_UPDATE, Site("a"), 0);
  header.mutable_mirror_update()->set_origin_site("a");
  pb::TensorSlice* slice = header.add_slices();
  slice->set_tensor("w");
  slice->set_dtype(pb::DTYPE_FLOAT32);
  slice->set_codec(pb::CODEC_RAW);
  slice->set_length(bytes / 4);
  slice->set_payload_bytes(bytes / 4 * 4);
  return header;
}

// The receiving site: a ROUTER and the InboundChannel of its one peer.
class Receiver {
 public:
  Receiver(zmq::context_t& context, const std::string& endpoint,
           DeliveryOptions options)
      : socket_(context, zmq::socket_type::router), in_(options) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::router_handover, 1);
    // A socket closed just before releases its port asynchronously.
    for (int attempt = 0;; ++attempt) {
      try {
        socket_.bind(endpoint);
        break;
      } catch (const zmq::error_t& error) {
        if (error.num() != EADDRINUSE || attempt == 100) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    endpoint_ = *BoundEndpoint(socket_);
  }

  // Where it listens (the port resolved).
  const std::string& endpoint() const { return endpoint_; }

  // Receives for up to `wait`, handling everything; messages whose
  // sequence number is in `drop` are lost (never looked at) the first time.
  void Receive(double now, std::chrono::milliseconds wait =
                               std::chrono::milliseconds(200)) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < deadline) {
      Result<Received> received =
          ReceiveMessage(socket_, true, std::chrono::milliseconds(20));
      ASSERT_OK(received);
      if (!received->message) continue;
      const pb::Header& header = received->message->header;
      routing_id_ = received->message->routing_id;
      switch (header.type()) {
        case pb::MIRROR_HELLO:
          notes_.push_back(in_.OnHello(header.mirror_hello().incarnation(),
                                       header.mirror_hello().first_sequence(),
                                       header.mirror_hello().resumed(), now));
          ++hellos_;
          break;
        case pb::HEARTBEAT:
          in_.OnHeartbeat(header.heartbeat().last_sequence(), now);
          break;
        default:
          if (drop_.erase(header.sequence()) > 0) break;  // lost
          if (in_.Admit(header.sequence(), now) ==
              InboundChannel::Admission::kApply) {
            in_.Applied(header.sequence());
            applied_.push_back(header.mirror_clock().clock());
          }
      }
    }
    if (std::optional<pb::MirrorAck> ack = in_.AckDue(now, 0)) {
      pb::Header header = MakeHeader(pb::MIRROR_ACK, Site("b"), 0);
      *header.mutable_mirror_ack() = *ack;
      ASSERT_OK(SendMessage(socket_, header, {}, routing_id_));
    }
  }

  void Drop(uint64_t sequence) { drop_.insert(sequence); }
  InboundChannel& in() { return in_; }
  const std::vector<int64_t>& applied() const { return applied_; }
  int hellos() const { return hellos_; }
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  zmq::socket_t socket_;
  std::string endpoint_;
  InboundChannel in_;
  std::string routing_id_;
  std::set<uint64_t> drop_;
  std::vector<int64_t> applied_;  // the clocks of applied messages, in order
  std::vector<std::string> notes_;
  int hellos_ = 0;
};

// The sending site: an OutboundChannel on a DEALER connected to `endpoint`.
std::unique_ptr<OutboundChannel> Sender(
    zmq::context_t& context, const std::string& endpoint, uint64_t incarnation,
    DeliveryOptions options, OutboundChannel::State* restore = nullptr) {
  auto channel =
      std::make_unique<OutboundChannel>("b", Site("a"), incarnation, options);
  if (restore != nullptr) channel->Restore(*restore);
  auto socket =
      std::make_unique<zmq::socket_t>(context, zmq::socket_type::dealer);
  socket->set(zmq::sockopt::linger, 0);
  socket->set(zmq::sockopt::routing_id, "a#" + std::to_string(incarnation));
  socket->connect(endpoint);
  channel->Attach(std::move(socket), Hello(), 0.0);
  return channel;
}

// Reads acknowledgements on the sender's socket.
void ReadAcks(OutboundChannel& out, double now) {
  while (true) {
    Result<Received> received =
        ReceiveMessage(*out.socket(), false, std::chrono::milliseconds(50));
    ASSERT_OK(received);
    if (!received->message) return;
    if (received->message->header.type() == pb::MIRROR_ACK) {
      out.OnAck(received->message->header.mirror_ack(), now);
    }
  }
}

std::vector<int64_t> Range(int64_t from, int64_t to) {
  std::vector<int64_t> out;
  for (int64_t i = from; i <= to; ++i) out.push_back(i);
  return out;
}

class MirrorDeliveryTest : public ::testing::Test {
 protected:
  zmq::context_t context_;
  const std::string endpoint_ = "inproc://mirror-delivery-test";
};

TEST_F(MirrorDeliveryTest, DeliversInOrderAndForgetsWhatWasApplied) {
  DeliveryOptions options;
  Receiver receiver(context_, endpoint_, options);
  auto out = Sender(context_, endpoint_, 7, options);
  for (int64_t c = 1; c <= 5; ++c) out->Enqueue(Clock(c), {}, 0.1);
  EXPECT_EQ(out->retained_messages(), 5u);
  receiver.Receive(0.2);
  EXPECT_EQ(receiver.applied(), Range(1, 5));
  ReadAcks(*out, 0.3);
  EXPECT_TRUE(out->Delivered(5));
  // The receiver keeps no checkpoints: applied counts as durable.
  EXPECT_EQ(out->retained_messages(), 0u);
  EXPECT_GT(out->delivered_bytes(), 0u);
  EXPECT_EQ(out->backlog_bytes(), 0u);
}

TEST_F(MirrorDeliveryTest, LostMessagesAreSentAgainAndAppliedOnce) {
  DeliveryOptions options;
  Receiver receiver(context_, endpoint_, options);
  auto out = Sender(context_, endpoint_, 7, options);
  receiver.Drop(3);
  receiver.Drop(4);
  for (int64_t c = 1; c <= 6; ++c) out->Enqueue(Clock(c), {}, 0.1);
  // 3 and 4 vanished with a broken connection: 5 and 6 show the gap and
  // are not applied out of order.
  receiver.Receive(0.2);
  EXPECT_EQ(receiver.applied(), Range(1, 2));
  EXPECT_EQ(receiver.in().gaps(), 1u);
  ReadAcks(*out, 0.3);  // the ack asks for a resend from 3
  EXPECT_EQ(out->resend_requests(), 1u);
  EXPECT_EQ(out->messages_resent(), 4u);
  receiver.Receive(0.4);
  EXPECT_EQ(receiver.applied(), Range(1, 6));
  ReadAcks(*out, 0.5);
  EXPECT_TRUE(out->Delivered(6));
  EXPECT_EQ(receiver.in().duplicates(), 0u);
}

TEST_F(MirrorDeliveryTest, ALostTailIsNoticedFromTheHeartbeat) {
  DeliveryOptions options;
  options.heartbeat_interval_s = 1.0;
  Receiver receiver(context_, endpoint_, options);
  auto out = Sender(context_, endpoint_, 7, options);
  receiver.Drop(2);
  out->Enqueue(Clock(1), {}, 0.1);
  out->Enqueue(Clock(2), {}, 0.1);  // the last message: nothing follows it
  receiver.Receive(0.2);
  EXPECT_EQ(receiver.applied(), Range(1, 1));
  out->Pump(1.5);  // idle for an interval: a heartbeat naming 2
  receiver.Receive(1.6);
  ReadAcks(*out, 1.7);
  receiver.Receive(1.8);
  EXPECT_EQ(receiver.applied(), Range(1, 2));
}

TEST_F(MirrorDeliveryTest, DuplicatesOfAResendAreDropped) {
  DeliveryOptions options;
  Receiver receiver(context_, endpoint_, options);
  auto out = Sender(context_, endpoint_, 7, options);
  for (int64_t c = 1; c <= 3; ++c) out->Enqueue(Clock(c), {}, 0.1);
  receiver.Receive(0.2);
  // A stale resend request (e.g. sent before the messages arrived): the
  // sender sends 1..3 again and the receiver drops all three.
  pb::MirrorAck stale;
  stale.set_applied_sequence(0);
  stale.set_resend(true);
  stale.set_incarnation(7);
  out->OnAck(stale, 0.3);
  receiver.Receive(0.4);
  EXPECT_EQ(receiver.applied(), Range(1, 3));
  EXPECT_EQ(receiver.in().duplicates(), 3u);
}

TEST_F(MirrorDeliveryTest, WaitsForTheReceiversCheckpointBeforeForgetting) {
  DeliveryOptions options;
  options.checkpointed = true;        // the receiver's checkpoints decide
  options.retention_limit_bytes = 1;  // full as soon as one is kept
  Receiver receiver(context_, endpoint_, options);
  auto out = Sender(context_, endpoint_, 7, options);
  out->Enqueue(Clock(1), {}, 0.1);
  out->Enqueue(Clock(2), {}, 0.1);
  EXPECT_TRUE(out->full());
  receiver.Receive(0.2);
  ReadAcks(*out, 0.3);
  EXPECT_TRUE(out->Delivered(2));
  EXPECT_EQ(out->retained_messages(), 2u);  // applied, not yet durable
  EXPECT_TRUE(out->full());
  receiver.in().NoteDurable(2);
  receiver.Receive(0.4, std::chrono::milliseconds(50));
  ReadAcks(*out, 0.5);
  EXPECT_EQ(out->durable_sequence(), 2u);
  EXPECT_EQ(out->retained_messages(), 0u);
  EXPECT_FALSE(out->full());
}

// A receiver that crashed and restarted from its checkpoint has lost what
// it applied after it; the sender still has it (it waited for the
// checkpoint) and sends it again.
TEST_F(MirrorDeliveryTest, AReceiverRestoredFromACheckpointGetsWhatItLost) {
  DeliveryOptions options;
  options.checkpointed = true;  // the receiver's checkpoints decide
  auto out = std::unique_ptr<OutboundChannel>();
  std::string endpoint;  // TCP: the sender reconnects to the new receiver
  {
    Receiver first(context_, "tcp://127.0.0.1:*", options);
    endpoint = first.endpoint();
    out = Sender(context_, endpoint, 7, options);
    for (int64_t c = 1; c <= 4; ++c) out->Enqueue(Clock(c), {}, 0.1);
    first.in().NoteDurable(0);
    first.Receive(0.2);
    ReadAcks(*out, 0.3);
    first.in().NoteDurable(2);  // its checkpoint holds 1 and 2
    first.Receive(0.4, std::chrono::milliseconds(50));
    ReadAcks(*out, 0.5);
    ASSERT_EQ(out->durable_sequence(), 2u);
  }
  Receiver second(context_, endpoint, options);
  second.in().Restore(/*incarnation=*/7, /*applied=*/2);
  out->Enqueue(Clock(5), {}, 1.0);  // reaches the new receiver: a gap
  for (int turn = 0; turn < 50 && second.applied() != Range(3, 5); ++turn) {
    const double now = 1.0 + 1.5 * (turn + 1);  // past a resend interval
    out->Pump(now);
    second.Receive(now);
    ReadAcks(*out, now);
  }
  EXPECT_EQ(second.applied(), Range(3, 5));
}

// A sender that crashed and restarted from its checkpoint continues the
// channel's numbering: the receiver drops what it already has.
TEST_F(MirrorDeliveryTest, ARestartedSenderContinuesTheNumbering) {
  DeliveryOptions options;
  Receiver receiver(context_, endpoint_, options);
  OutboundChannel::State saved;
  {
    auto out = Sender(context_, endpoint_, 7, options);
    out->Enqueue(Clock(1), {}, 0.1);
    saved = out->Save();  // checkpoint: message 1 kept
    out->Enqueue(Clock(2), {}, 0.1);
    receiver.Receive(0.2);
    ASSERT_EQ(receiver.applied(), Range(1, 2));
  }
  // The new run restores the checkpoint and the outgoing log (message 2).
  RetainedMessage logged;
  logged.sequence = 2;
  pb::Header two = Clock(2);
  two.set_sequence(2);
  two.SerializeToString(&logged.header);
  logged.bytes = logged.header.size();
  auto out = std::make_unique<OutboundChannel>("b", Site("a"), 8, options);
  out->Restore(saved);
  out->RestoreLogged(logged);
  auto socket =
      std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
  socket->set(zmq::sockopt::linger, 0);
  socket->connect(endpoint_);
  out->Attach(std::move(socket), Hello(), 1.0);
  out->Enqueue(Clock(3), {}, 1.0);
  receiver.Receive(1.1);
  EXPECT_EQ(receiver.applied(), Range(1, 3));
  EXPECT_EQ(receiver.in().duplicates(), 2u);
  EXPECT_EQ(receiver.in().incarnation(), 8u);
  ASSERT_FALSE(receiver.notes().empty());
  EXPECT_EQ(receiver.notes().back(), "restarted");
}

TEST_F(MirrorDeliveryTest, ASenderRestartedWithoutStateStartsAgain) {
  DeliveryOptions options;
  Receiver receiver(context_, endpoint_, options);
  {
    auto out = Sender(context_, endpoint_, 7, options);
    for (int64_t c = 1; c <= 3; ++c) out->Enqueue(Clock(c), {}, 0.1);
    receiver.Receive(0.2);
  }
  auto out = Sender(context_, endpoint_, 9, options);
  out->Enqueue(Clock(1), {}, 1.0);
  receiver.Receive(1.1);
  EXPECT_EQ(receiver.applied(), (std::vector<int64_t>{1, 2, 3, 1}));
  EXPECT_NE(receiver.notes().back().find("without its state"),
            std::string::npos);
}

TEST(InboundChannelTest, AcknowledgesOnChangeAndEveryInterval) {
  DeliveryOptions options;
  options.heartbeat_interval_s = 1.0;
  options.checkpointed = true;  // durable only when a checkpoint says so
  InboundChannel in(options);
  EXPECT_FALSE(in.AckDue(0.0, 0));  // nobody said hello yet
  in.OnHello(5, 1, false, 0.0);
  ASSERT_TRUE(in.AckDue(0.0, 0));  // a hello is answered at once
  EXPECT_FALSE(in.AckDue(0.01, 0));
  ASSERT_EQ(in.Admit(1, 0.02), InboundChannel::Admission::kApply);
  in.Applied(1);
  EXPECT_FALSE(in.AckDue(0.03, 0));  // within the 50 ms spacing
  std::optional<pb::MirrorAck> ack = in.AckDue(0.1, 4);
  ASSERT_TRUE(ack);
  EXPECT_EQ(ack->applied_sequence(), 1u);
  EXPECT_EQ(ack->durable_sequence(), 0u);
  EXPECT_EQ(ack->clock(), 4);
  EXPECT_FALSE(in.AckDue(0.5, 4));
  EXPECT_TRUE(in.AckDue(1.2, 4));  // liveness: at least every interval
  // A gap asks for a resend at once, then at most once per interval.
  EXPECT_EQ(in.Admit(3, 1.3), InboundChannel::Admission::kGap);
  ack = in.AckDue(1.3, 4);
  ASSERT_TRUE(ack);
  EXPECT_TRUE(ack->resend());
  EXPECT_EQ(in.Admit(4, 1.4), InboundChannel::Admission::kGap);
  ack = in.AckDue(1.4, 4);
  EXPECT_TRUE(!ack || !ack->resend());
  EXPECT_EQ(in.Admit(1, 1.5), InboundChannel::Admission::kDuplicate);
}

// A link that stalls acknowledges nothing, so no sample shows it: the
// message waiting at its head bounds the rate instead. A rate measured
// before stands no longer than it takes that message to prove it wrong,
// and messages and the window shrink with it, so what the peer hears next
// is small (a final flush at a rate from before a slowdown sent 32 kB
// messages on a 6 kB/s link, and each site declared the other dead).
TEST_F(MirrorDeliveryTest, AStalledLinkShrinksMessagesAndTheWindow) {
  DeliveryOptions options;
  Receiver receiver(context_, endpoint_, options);
  auto out = Sender(context_, endpoint_, 7, options);
  const std::string payload(30000, 'x');
  out->Enqueue(Update(payload.size()), {payload}, 0.1);
  receiver.Receive(0.15);
  ReadAcks(*out, 0.16);
  for (int i = 0; i < 4; ++i) out->Enqueue(Update(payload.size()), {payload}, 0.2);
  receiver.Receive(0.7);
  ReadAcks(*out, 0.7);
  ASSERT_TRUE(out->Delivered(5));
  const double fast = out->delivery_rate();
  ASSERT_GT(fast, 200000);
  ASSERT_GT(out->max_message_bytes(), 4 * OutboundChannel::kMinMessageBytes);

  // The link stalls: what was sent at 1.0 is not acknowledged.
  out->Enqueue(Update(payload.size()), {payload}, 1.0);
  const uint64_t backlog = out->backlog_bytes();
  ASSERT_GE(backlog, payload.size());
  out->Pump(1.3);
  EXPECT_DOUBLE_EQ(out->delivery_rate(), fast) << "not yet a stall";
  out->Pump(6.0);
  EXPECT_LT(out->delivery_rate(), 7000);
  EXPECT_EQ(out->max_message_bytes(), OutboundChannel::kMinMessageBytes);
  EXPECT_EQ(out->window(), OutboundChannel::kMinWindowBytes);
  EXPECT_TRUE(out->congested());
  // Nothing more goes into the stalled link but clocks.
  out->Enqueue(Update(payload.size()), {payload}, 6.0);
  EXPECT_EQ(out->backlog_bytes(), backlog);

  // It delivers again: a sample, and the waiting message goes.
  receiver.Receive(6.1);
  ReadAcks(*out, 6.2);
  EXPECT_TRUE(out->Delivered(6));
  EXPECT_GT(out->delivery_rate(), 0);
  EXPECT_LT(out->delivery_rate(), 7000);
  out->Pump(6.2);
  EXPECT_GT(out->backlog_bytes(), 0u);
}

// No sample for kPeakS: the link may have slowed while it carried nothing,
// so the next messages are small until a sample shows its rate again.
TEST(LinkDeliveryTest, ARateWithoutASampleForThePeakTimeIsStale) {
  LinkDelivery link;
  link.Acknowledged(0.0, true);
  link.Delivered(100000);
  link.Acknowledged(0.5, true);
  link.Waiting(1.0, 0, 0);
  EXPECT_FALSE(link.stale());
  link.Acknowledged(2.0, false);
  link.Waiting(3.6, 0, 0);
  EXPECT_TRUE(link.stale());
  EXPECT_DOUBLE_EQ(link.rate(), 200000) << "the window keeps it";
  link.Delivered(20000);
  link.Acknowledged(4.0, true);
  EXPECT_FALSE(link.stale());
}

// Before any sample, a message that waits gives the first bound: the
// window is no longer kInitialWindowBytes on a link that delivers nothing.
TEST(LinkDeliveryTest, AWaitingMessageMeasuresAnUnmeasuredLink) {
  LinkDelivery link;
  link.Acknowledged(0.0, true);
  link.Waiting(0.4, 8000, 0.4);
  EXPECT_FALSE(link.measured());
  link.Waiting(2.0, 8000, 2.0);
  EXPECT_TRUE(link.measured());
  EXPECT_DOUBLE_EQ(link.rate(), 4000);
}

// The rate is what the link delivered while it was busy; a sample with
// idle time in it only raises the decaying peak.
TEST(LinkDeliveryTest, ABusyLinkShowsItsNewRateAtOnce) {
  LinkDelivery link;
  link.Acknowledged(0.0, /*in_flight=*/true);
  link.Delivered(100000);
  link.Acknowledged(0.5, true);
  EXPECT_DOUBLE_EQ(link.rate(), 200000);
  // Slowed to 6 kB/s, messages on their way all along: the next sample.
  link.Delivered(3000);
  link.Acknowledged(1.0, true);
  EXPECT_DOUBLE_EQ(link.rate(), 6000);
}

// A link slower than a message per half second: an acknowledgement that
// delivered nothing new does not end the sample (it would read as rate 0,
// "not measured", and open the window to kInitialWindowBytes on exactly the
// link that can least take it); the sample spans until a message arrives.
TEST(LinkDeliveryTest, ASlowBusyLinkIsNeverReadAsUnmeasured) {
  LinkDelivery link;
  EXPECT_FALSE(link.measured());
  link.Acknowledged(0.0, true);
  link.Delivered(8000);
  link.Acknowledged(0.5, true);
  ASSERT_DOUBLE_EQ(link.rate(), 16000);
  EXPECT_TRUE(link.measured());
  // Then 8 kB every 1.6 s (5 kB/s); acknowledgements in between carry none.
  link.Acknowledged(1.0, true);
  link.Acknowledged(1.5, true);
  EXPECT_DOUBLE_EQ(link.rate(), 16000) << "no sample without a delivery";
  link.Delivered(8000);
  link.Acknowledged(2.1, true);
  EXPECT_DOUBLE_EQ(link.rate(), 5000);
}

TEST(LinkDeliveryTest, AnIdleLinkKeepsItsPeakForAWhile) {
  LinkDelivery link;
  link.Acknowledged(0.0, true);
  link.Delivered(100000);
  link.Acknowledged(0.5, true);
  ASSERT_DOUBLE_EQ(link.rate(), 200000);
  // Drained: the next half second says only "at least 2 kB/s".
  link.Delivered(1000);
  link.Acknowledged(0.7, /*in_flight=*/false);
  link.Acknowledged(1.0, false);
  EXPECT_DOUBLE_EQ(link.rate(), 200000);
  // Heartbeat acknowledgements of an idle link change nothing.
  link.Acknowledged(2.0, false);
  link.Acknowledged(3.0, false);
  EXPECT_DOUBLE_EQ(link.rate(), 200000);
  // kPeakS after it, the busy sample is forgotten: the largest idle
  // sample since is the rate (5 kB over the 0.9 s since the last empty
  // acknowledgement).
  link.Delivered(3000);
  link.Acknowledged(3.4, false);
  link.Delivered(2000);
  link.Acknowledged(3.9, false);
  EXPECT_DOUBLE_EQ(link.rate(), 5000 / 0.9);
  EXPECT_TRUE(link.measured());
}

// A link slowed while its sender never filled it: samples with idle time
// in them, each only "at least". The old peak goes within kPeakS, and the
// rate is what the link carried since (not the old speed for long).
TEST(LinkDeliveryTest, AnUnfilledLinkSlowedAtRunTimeShowsItWithinThePeakTime) {
  LinkDelivery link;
  link.Acknowledged(0.0, true);
  link.Delivered(1'200'000);
  link.Acknowledged(0.5, false);
  ASSERT_DOUBLE_EQ(link.rate(), 2.4e6);
  double now = 0.5;
  for (int i = 0; i < 12; ++i) {
    link.Delivered(2000);
    now += 0.5;
    link.Acknowledged(now, false);
  }
  EXPECT_DOUBLE_EQ(link.rate(), 4000);
}

}  // namespace
}  // namespace meridian
