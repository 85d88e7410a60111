// Receiving from a ZeroMQ socket that a ConnectionFront relays to
// (wan/front.h): the worker endpoint's and the mirror socket's.
#ifndef MERIDIAN_SYNC_FRONT_RECEIVE_H_
#define MERIDIAN_SYNC_FRONT_RECEIVE_H_

#include <zmq.hpp>

#include "meridian/core/status.h"
#include "meridian/net/transport.h"
#include "meridian/wan/front.h"

namespace meridian {

// The message waiting on ROUTER `socket` (or nothing), as ReceiveMessage
// without waiting. With a `front` (may be null), tells it what the message
// took off its connection, so the connection is read on, and sets the
// message's front_port (for Trust).
Result<Received> ReceiveThroughFront(zmq::socket_t& socket,
                                     wan::ConnectionFront* front);

}  // namespace meridian

#endif  // MERIDIAN_SYNC_FRONT_RECEIVE_H_
