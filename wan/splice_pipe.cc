#include "wan/splice_pipe.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "wan/socket_util.h"

namespace meridian::wan {

SplicePipe::~SplicePipe() {
  CloseFd(&fds_[0]);
  CloseFd(&fds_[1]);
}

ssize_t SplicePipe::In(int src, size_t want) {
  if (fds_[0] < 0) {
    if (::pipe2(fds_, O_CLOEXEC) != 0) {
      usable_ = false;
      return kSpliceUnsupported;
    }
    ::fcntl(fds_[1], F_SETPIPE_SZ, static_cast<int>(kSpliceMaxBytes));
    const int size = ::fcntl(fds_[1], F_GETPIPE_SZ);
    capacity_ = size > 0 ? static_cast<size_t>(size) : 65536;
  }
  want = std::min(want, capacity_);
  const ssize_t n =
      ::splice(src, nullptr, fds_[1], nullptr, want, SPLICE_F_MOVE);
  if (n < 0 && (errno == EINVAL || errno == ENOSYS)) {
    usable_ = false;
    return kSpliceUnsupported;
  }
  return n;
}

bool SplicePipe::Out(int dst, size_t size) {
  while (size > 0) {
    const ssize_t n =
        ::splice(fds_[0], nullptr, dst, nullptr, size, SPLICE_F_MOVE);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool SplicePipe::Read(uint8_t* out, size_t size) {
  while (size > 0) {
    const ssize_t n = ::read(fds_[0], out, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    out += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace meridian::wan
