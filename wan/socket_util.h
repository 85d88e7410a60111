// Plain blocking TCP sockets for the emulator (private to wan/).
#ifndef MERIDIAN_WAN_SOCKET_UTIL_H_
#define MERIDIAN_WAN_SOCKET_UTIL_H_

#include <cstddef>
#include <string>

#include "meridian/core/clock.h"
#include "meridian/core/status.h"
#include "wan/host_port.h"

namespace meridian::wan {

// A listening socket (close-on-exec, SO_REUSEADDR) on `address`, with up
// to `backlog` connections waiting to be accepted (the kernel caps it at
// net.core.somaxconn).
Result<int> ListenTcp(const HostPort& address, int backlog = 128);
// Checks that `address` resolves (does not connect).
Status ResolveTcp(const HostPort& address);
// Connects to `address` within `timeout`; the socket is blocking and has
// TCP_NODELAY set.
Result<int> ConnectTcp(const HostPort& address, Duration timeout);
// "host:port" of the socket's local end.
Result<std::string> LocalAddress(int fd);
// "host:port" of the socket's remote end, or "an unknown address".
std::string RemoteAddress(int fd);
// Closes `fd` with an RST (SO_LINGER 0): the kernel keeps nothing of it.
void ResetAndClose(int fd);
void SetNoDelay(int fd);
// Writes all `size` bytes (retrying on EINTR and short writes; no SIGPIPE).
// False when the peer is gone or the socket was shut down.
bool WriteAll(int fd, const void* data, size_t size);
// Closes `fd` if >= 0 and sets it to -1.
void CloseFd(int* fd);

}  // namespace meridian::wan

#endif  // MERIDIAN_WAN_SOCKET_UTIL_H_
