// ZeroMQ edge: sending and receiving framed messages (see message.h).
// zmq::error_t never escapes this layer; everything returns Status.
#ifndef MERIDIAN_NET_TRANSPORT_H_
#define MERIDIAN_NET_TRANSPORT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "meridian/core/clock.h"
#include "meridian/net/message.h"
#include "meridian/core/status.h"
#include "meridian/wire.pb.h"

namespace meridian {

// A decoded, structurally valid message. Owns its frames.
struct Envelope {
  std::string routing_id;  // set on ROUTER sockets, empty otherwise
  // The ZAP user id of the connection it came over (under CURVE: the name
  // of the site whose key was admitted, security.h); empty without ZAP.
  std::string user_id;
  pb::Header header;
  std::vector<zmq::message_t> payload;  // one frame per header.slices()
  // The connection it came over, as the endpoint's front knows it (its
  // upstream port, wan/front.h); 0 without a front.
  uint16_t front_port = 0;
};

// Bytes of `message`'s payload frames (its header not counted).
uint64_t PayloadBytes(const Envelope& message);

// Frames of a message that failed DecodeMessage: enough to answer the
// sender with an ERROR.
struct Refused {
  std::string routing_id;
  Rejection rejection;
  pb::Header header;  // whatever parsed (may be partially filled)
  uint16_t front_port = 0;  // as Envelope::front_port
};

// Frames owned by zmq, viewed as bytes.
inline std::span<const std::byte> BytesOf(const zmq::message_t& frame) {
  return {static_cast<const std::byte*>(frame.data()), frame.size()};
}

// The floats of a FLOAT32 payload frame. Returns a view of the frame when
// it is suitably aligned; otherwise copies into `scratch` and views that.
std::span<const float> FloatsOf(const zmq::message_t& frame,
                                std::vector<float>* scratch);

// A payload frame of `count` floats to be filled by the caller (no extra
// copy on send).
zmq::message_t MakeFloatFrame(size_t count);
// A payload frame holding a copy of `values`.
zmq::message_t CopyFloatFrame(std::span<const float> values);

// Sends the header and payload frames (moved out of `payload`). On a
// ROUTER socket pass the peer's routing id. Fails with Unavailable when the
// peer is gone or the send would block past the socket's send timeout.
// `routing_id` is empty except on ROUTER sockets.
Status SendMessage(zmq::socket_t& socket, const pb::Header& header,
                   std::vector<zmq::message_t> payload = {},
                   std::string_view routing_id = {});

// Sends a message without payload now or not at all: fails with
// Unavailable instead of waiting when the socket cannot take it (a full
// queue, no connection yet). For heartbeats, which must never block.
Status TrySendMessage(zmq::socket_t& socket, const pb::Header& header,
                      std::string_view routing_id = {});

// The result of one receive: nothing (timeout), a valid message, or a
// message refused by DecodeMessage.
struct Received {
  std::optional<Envelope> message;
  std::optional<Refused> refused;
  bool timed_out() const { return !message && !refused; }
};

// What one receive took off a socket, for a front's accounting
// (wan/front.h): the descriptor libzmq read the message from (ZMQ_SRCFD;
// -1 when unknown) and its frames and bytes, a ROUTER's routing id frame
// not counted. Filled for refused messages too.
struct ReceivedFrom {
  int fd = -1;
  uint64_t frames = 0;
  uint64_t bytes = 0;
};

// Waits up to `timeout` (negative: forever) for one message and decodes
// it. `routed`: the socket is a ROUTER and frame 0 is the routing id.
// `from` (optional): set when a message was taken. Transport failures
// (socket closed, context terminated) are errors.
Result<Received> ReceiveMessage(zmq::socket_t& socket, bool routed,
                                std::chrono::milliseconds timeout,
                                ReceivedFrom* from = nullptr);

// Sends an ERROR reply for `rejection` to the sender of `request`.
Status SendError(zmq::socket_t& socket, const pb::Endpoint& self,
                 uint64_t sequence, const Rejection& rejection,
                 uint64_t rejected_sequence, std::string_view routing_id);

// How every server refuses a message: logs it (what, from whom, why) and
// answers its sender with an ERROR on `socket` (a ROUTER: `routing_id`),
// except a HEARTBEAT, which is never answered (its sender would take the
// ERROR for the reply to its request). Send failures are logged. The
// caller counts the refusal.
void RefuseMessage(zmq::socket_t& socket, const pb::Endpoint& self,
                   uint64_t sequence, std::string_view routing_id,
                   const pb::Header& header, const Rejection& rejection);

// How a client tells a live server from a gone one (fault { } settings):
// it sends a HEARTBEAT whenever it has sent nothing for
// `heartbeat_interval`, and takes the server for gone after
// `silence_timeout` without any message from it (a reply, or a HEARTBEAT
// the server sends while it holds the reply). Time is the client's clock.
struct RpcLiveness {
  Duration heartbeat_interval = std::chrono::seconds(1);
  Duration silence_timeout = std::chrono::seconds(10);
};

// A request/reply client over a DEALER socket: one outstanding request at a
// time, replies matched by order. HEARTBEATs from the server are never
// taken for a reply. Not thread-safe; owns its socket.
class RpcClient {
 public:
  // Connects (lazily, as ZeroMQ does) to `endpoint` as `self`. When
  // `cancel` (not owned, may be null) becomes true, a waiting Call returns
  // Cancelled within about 100 ms. `clock` (not owned) times the liveness
  // rules (CallWhileAlive, HeartbeatIfIdle); Call's timeouts are real time.
  RpcClient(zmq::context_t& context, const std::string& endpoint,
            pb::Endpoint self, const std::atomic<bool>* cancel = nullptr,
            const Clock* clock = SystemClock());
  RpcClient(const RpcClient&) = delete;
  RpcClient& operator=(const RpcClient&) = delete;

  // Stamps version, sender and sequence on `header`, sends it with
  // `payload`, and waits up to `timeout` for the reply. An ERROR reply is
  // returned as a message (callers decide); a refused reply or a timeout is
  // an error. After a timeout the client reconnects so that a late reply
  // cannot be mistaken for the answer to the next request. After a
  // cancellation it keeps the connection, and the next Call first waits
  // (up to its timeout) for the cancelled call's reply and discards it.
  // A request without payload that the server answers with ERROR_BUSY
  // (nothing was done) is sent again after a pause (50 ms, doubling up to
  // 1 s) while time is left; with a payload, the ERROR is returned.
  Result<Envelope> Call(pb::Header header, std::vector<zmq::message_t> payload,
                        std::chrono::milliseconds timeout);

  // Like Call, but without a fixed timeout: waits as long as the server
  // shows it is alive (see RpcLiveness), sending HEARTBEATs meanwhile.
  // Fails with DeadlineExceeded once the server has been silent for
  // liveness.silence_timeout (the connection is then dropped, so that a
  // late reply cannot be taken for a later call's), with Cancelled as Call
  // does. A stall of this process itself (it was stopped, or starved) is
  // not taken for the server's silence: after a gap of more than a quarter
  // of the timeout between two looks, the wait starts afresh. ERROR_BUSY
  // as for Call, sent again as long as the server keeps answering.
  Result<Envelope> CallWhileAlive(pb::Header header,
                                  std::vector<zmq::message_t> payload,
                                  const RpcLiveness& liveness);

  // Sends a HEARTBEAT when nothing went out for liveness.heartbeat_interval;
  // never blocks (a heartbeat the socket cannot take now is dropped).
  void HeartbeatIfIdle(const RpcLiveness& liveness);

  // Drops the connection and anything still owed on it; the next call
  // opens a new one, which the server sees as a new peer (a new routing
  // id). Sequence numbers go on.
  void Reconnect();

  // Makes every connection from now on a CURVE client (security.h
  // MakeCurveClient) with the key pair `public_key`/`secret_key` that only
  // talks to the server holding the secret half of `server_public_key`
  // (all Z85). Drops the current connection. InvalidArgument when a key is
  // not Z85, Unavailable when libzmq has no CURVE. Without it (the
  // default) connections are plaintext.
  Status SetCurve(std::string public_key, std::string secret_key,
                  std::string server_public_key);

  // Replaces the cancellation flag (null: calls cannot be cancelled).
  void set_cancel(const std::atomic<bool>* cancel) { cancel_ = cancel; }

  const pb::Endpoint& self() const { return self_; }
  uint64_t last_sequence() const { return sequence_; }

 private:
  void Connect();
  // Stamps `header` and sends it on the current connection.
  Status SendRequest(pb::Header* header, std::vector<zmq::message_t> payload);
  // Whether `received` is a HEARTBEAT (to be skipped, not answered).
  static bool IsHeartbeat(const Received& received);
  // Waits for one message; Received{} on timeout, Cancelled when
  // `cancellable` and the flag is set.
  Result<Received> AwaitReply(std::chrono::milliseconds timeout,
                              bool cancellable);
  // One request and its reply (Call, CallWhileAlive without the retries
  // after ERROR_BUSY).
  Result<Envelope> CallOnce(pb::Header header,
                            std::vector<zmq::message_t> payload,
                            std::chrono::milliseconds timeout);
  Result<Envelope> CallWhileAliveOnce(pb::Header header,
                                      std::vector<zmq::message_t> payload,
                                      const RpcLiveness& liveness);
  // Waits `*pause` (real time; false when cancelled meanwhile) and
  // doubles it up to 1 s: the pause after an ERROR_BUSY.
  bool PauseAfterBusy(std::chrono::milliseconds* pause) const;

  zmq::context_t& context_;
  std::string endpoint_;
  pb::Endpoint self_;
  const std::atomic<bool>* cancel_;
  const Clock* clock_;
  std::optional<zmq::socket_t> socket_;
  // Set by SetCurve (Z85 keys).
  struct CurveSettings {
    std::string public_key;
    std::string secret_key;
    std::string server_public_key;
  };
  std::optional<CurveSettings> curve_;
  uint64_t sequence_ = 0;
  bool reply_outstanding_ = false;
  // When this client last sent anything (on clock_; zero: never), for
  // HeartbeatIfIdle.
  Duration last_send_{0};
};

// The endpoint a bound socket actually listens on (resolves port 0 / "*").
Result<std::string> BoundEndpoint(zmq::socket_t& socket);

}  // namespace meridian

#endif  // MERIDIAN_NET_TRANSPORT_H_
