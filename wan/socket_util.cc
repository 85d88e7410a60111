#include "wan/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace meridian::wan {
namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { ::freeaddrinfo(info); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

Result<AddrInfoPtr> Resolve(const HostPort& address, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  const int rc =
      ::getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return UnavailableError("cannot resolve '" + address.host +
                            "': " + ::gai_strerror(rc));
  }
  return AddrInfoPtr(found);
}

std::string Errno(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

}  // namespace

void SetNoDelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void CloseFd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

Status ResolveTcp(const HostPort& address) {
  MERIDIAN_ASSIGN_OR_RETURN(AddrInfoPtr info, Resolve(address, false));
  return Status::Ok();
}

Result<int> ListenTcp(const HostPort& address, int backlog) {
  MERIDIAN_ASSIGN_OR_RETURN(AddrInfoPtr info, Resolve(address, true));
  std::string error = "no usable address";
  for (addrinfo* ai = info.get(); ai != nullptr; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
                            ai->ai_protocol);
    if (fd < 0) {
      error = Errno("socket");
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      error = Errno("bind");
      ::close(fd);
      continue;
    }
    if (::listen(fd, backlog) != 0) {
      error = Errno("listen");
      ::close(fd);
      continue;
    }
    return fd;
  }
  return UnavailableError("cannot listen on " + address.ToString() + ": " +
                          error);
}

Result<int> ConnectTcp(const HostPort& address, Duration timeout) {
  MERIDIAN_ASSIGN_OR_RETURN(AddrInfoPtr info, Resolve(address, false));
  std::string error = "no usable address";
  for (addrinfo* ai = info.get(); ai != nullptr; ai = ai->ai_next) {
    int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                 ai->ai_protocol);
    if (fd < 0) {
      error = Errno("socket");
      continue;
    }
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd item{fd, POLLOUT, 0};
      const int ms = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(timeout)
              .count());
      do {
        rc = ::poll(&item, 1, ms);
      } while (rc < 0 && errno == EINTR);
      if (rc == 0) {
        error = "timed out after " + std::to_string(ms) + " ms";
        ::close(fd);
        continue;
      }
      int so_error = 0;
      socklen_t len = sizeof(so_error);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
      if (so_error != 0) {
        errno = so_error;
        rc = -1;
      } else {
        rc = 0;
      }
    }
    if (rc != 0) {
      error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    const int flags = ::fcntl(fd, F_GETFL);
    ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    SetNoDelay(fd);
    return fd;
  }
  return UnavailableError("cannot connect to " + address.ToString() + ": " +
                          error);
}

namespace {

// "host:port" of one end of `fd`, as `get_name` (getsockname or
// getpeername) tells it.
Result<std::string> EndAddress(int fd,
                               int (*get_name)(int, sockaddr*, socklen_t*)) {
  sockaddr_storage storage{};
  socklen_t len = sizeof(storage);
  if (get_name(fd, reinterpret_cast<sockaddr*>(&storage), &len) != 0) {
    return InternalError(Errno("getsockname"));
  }
  char host[INET6_ADDRSTRLEN] = {};
  HostPort out;
  if (storage.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    out.port = ntohs(in->sin_port);
  } else if (storage.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    out.port = ntohs(in6->sin6_port);
  } else {
    return InternalError("not an IP socket");
  }
  out.host = host;
  return out.ToString();
}

}  // namespace

Result<std::string> LocalAddress(int fd) {
  return EndAddress(fd, ::getsockname);
}

std::string RemoteAddress(int fd) {
  Result<std::string> address = EndAddress(fd, ::getpeername);
  return address.ok() ? *address : "an unknown address";
}

void ResetAndClose(int fd) {
  const linger reset{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  ::close(fd);
}

bool WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace meridian::wan
