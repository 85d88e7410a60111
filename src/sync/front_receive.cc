#include "sync/front_receive.h"

#include <chrono>

namespace meridian {

Result<Received> ReceiveThroughFront(zmq::socket_t& socket,
                                     wan::ConnectionFront* front) {
  if (front == nullptr) {
    return ReceiveMessage(socket, true, std::chrono::milliseconds(0));
  }
  ReceivedFrom from;
  Result<Received> received =
      ReceiveMessage(socket, true, std::chrono::milliseconds(0), &from);
  if (!received.ok() || received->timed_out()) return received;
  // What the peer sent has left ZeroMQ: its connection may send more.
  const uint16_t port = wan::UpstreamPortOfFd(from.fd);
  front->Consumed(port, from.bytes, from.frames);
  if (received->message) received->message->front_port = port;
  if (received->refused) received->refused->front_port = port;
  return received;
}

}  // namespace meridian
