// ZeroMQ edge: sending and receiving framed messages (see message.h).
// zmq::error_t never escapes this layer; everything returns Status.
#ifndef MERIDIAN_TRANSPORT_H_
#define MERIDIAN_TRANSPORT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "meridian/wire.pb.h"
#include "meridian/message.h"
#include "meridian/status.h"

namespace meridian {

// A decoded, structurally valid message. Owns its frames.
struct Envelope {
  std::string routing_id;  // set on ROUTER sockets, empty otherwise
  // The ZAP user id of the connection it came over (under CURVE: the name
  // of the site whose key was admitted, security.h); empty without ZAP.
  std::string user_id;
  pb::Header header;
  std::vector<zmq::message_t> payload;  // one frame per header.slices()
};

// Frames of a message that failed DecodeMessage: enough to answer the
// sender with an ERROR.
struct Refused {
  std::string routing_id;
  Rejection rejection;
  pb::Header header;  // whatever parsed (may be partially filled)
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

// The result of one receive: nothing (timeout), a valid message, or a
// message refused by DecodeMessage.
struct Received {
  std::optional<Envelope> message;
  std::optional<Refused> refused;
  bool timed_out() const { return !message && !refused; }
};

// Waits up to `timeout` (negative: forever) for one message and decodes
// it. `routed`: the socket is a ROUTER and frame 0 is the routing id.
// Transport failures (socket closed, context terminated) are errors.
Result<Received> ReceiveMessage(zmq::socket_t& socket, bool routed,
                                std::chrono::milliseconds timeout);

// Sends an ERROR reply for `rejection` to the sender of `request`.
Status SendError(zmq::socket_t& socket, const pb::Endpoint& self,
                 uint64_t sequence, const Rejection& rejection,
                 uint64_t rejected_sequence, std::string_view routing_id);

// A request/reply client over a DEALER socket: one outstanding request at a
// time, replies matched by order. Not thread-safe; owns its socket.
class RpcClient {
 public:
  // Connects (lazily, as ZeroMQ does) to `endpoint` as `self`. When
  // `cancel` (not owned, may be null) becomes true, a waiting Call returns
  // Cancelled within about 100 ms.
  RpcClient(zmq::context_t& context, const std::string& endpoint,
            pb::Endpoint self, const std::atomic<bool>* cancel = nullptr);
  RpcClient(const RpcClient&) = delete;
  RpcClient& operator=(const RpcClient&) = delete;

  // Stamps version, sender and sequence on `header`, sends it with
  // `payload`, and waits up to `timeout` for the reply. An ERROR reply is
  // returned as a message (callers decide); a refused reply or a timeout is
  // an error. After a timeout the client reconnects so that a late reply
  // cannot be mistaken for the answer to the next request. After a
  // cancellation it keeps the connection, and the next Call first waits
  // (up to its timeout) for the cancelled call's reply and discards it.
  Result<Envelope> Call(pb::Header header, std::vector<zmq::message_t> payload,
                        std::chrono::milliseconds timeout);

  // Replaces the cancellation flag (null: calls cannot be cancelled).
  void set_cancel(const std::atomic<bool>* cancel) { cancel_ = cancel; }

  const pb::Endpoint& self() const { return self_; }
  uint64_t last_sequence() const { return sequence_; }

 private:
  void Connect();
  // Waits for one message; Received{} on timeout, Cancelled when
  // `cancellable` and the flag is set.
  Result<Received> AwaitReply(std::chrono::milliseconds timeout,
                              bool cancellable);

  zmq::context_t& context_;
  std::string endpoint_;
  pb::Endpoint self_;
  const std::atomic<bool>* cancel_;
  std::optional<zmq::socket_t> socket_;
  uint64_t sequence_ = 0;
  bool reply_outstanding_ = false;
};

// The endpoint a bound socket actually listens on (resolves port 0 / "*").
Result<std::string> BoundEndpoint(zmq::socket_t& socket);

}  // namespace meridian

#endif  // MERIDIAN_TRANSPORT_H_
