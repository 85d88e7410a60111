// How long a ZeroMQ socket of this project may keep sending after it is
// closed.
#ifndef MERIDIAN_CORE_SOCKET_CLOSE_H_
#define MERIDIAN_CORE_SOCKET_CLOSE_H_

namespace meridian {

// ZMQ_LINGER, in milliseconds, of every socket that closes while its
// process goes on (a client that reconnects) or at the end of a process.
//
// Not 0: libzmq 4.3 aborts the whole process (session_base.cpp,
// clean_pipes; zeromq/libzmq#3442) when a socket closed with linger 0 is
// in the middle of handing a multipart message to its connection and that
// connection fails at the same moment: the rest of the message is no
// longer readable and libzmq asserts that it is. With any positive linger
// the rest stays readable until the socket is gone, and is discarded.
//
// The cost: for up to this long after a close, what the socket still had
// queued may be delivered on the old connection, beside a resend on the
// new one. Every protocol here takes a duplicate: a worker's commit is
// applied once per commit id and a commit from a replaced connection is
// refused (site/worker_table.h), mirror messages are applied once per
// channel sequence number (sync/mirror_delivery.h), and the other
// requests are reads or idempotent. A closing process waits at most this
// long for its sockets.
inline constexpr int kSocketCloseLingerMs = 100;

}  // namespace meridian

#endif  // MERIDIAN_CORE_SOCKET_CLOSE_H_
