// Zero-copy forwarding between two sockets through a pipe (splice(2)): the
// emulator's passthrough path for bytes its message counter need not see.
// One SplicePipe per connection direction, used by that direction's reader
// thread alone; the pipe (two descriptors, up to kSpliceMaxBytes of kernel
// memory) is created on first use and closed on destruction.
#ifndef MERIDIAN_WAN_SPLICE_PIPE_H_
#define MERIDIAN_WAN_SPLICE_PIPE_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace meridian::wan {

// Fewer opaque bytes ahead than this are read and copied instead.
inline constexpr uint64_t kSpliceMinBytes = 64 * 1024;
inline constexpr uint64_t kSpliceMaxBytes = 1024 * 1024;
inline constexpr ssize_t kSpliceUnsupported = -2;

class SplicePipe {
 public:
  SplicePipe() = default;
  ~SplicePipe();
  SplicePipe(const SplicePipe&) = delete;
  SplicePipe& operator=(const SplicePipe&) = delete;

  // Moves up to `want` bytes from socket `src` into the pipe (blocking
  // until some are there). Returns the count, 0 at end of stream, -1 with
  // errno on error, kSpliceUnsupported when splice cannot be used (then
  // usable() turns false).
  ssize_t In(int src, size_t want);
  // Moves `size` bytes from the pipe to socket `dst`. False when the peer
  // is gone.
  bool Out(int dst, size_t size);
  // Reads `size` bytes back out of the pipe into `out` (bytes that must be
  // queued after all).
  bool Read(uint8_t* out, size_t size);
  // False once splice() proved unsupported here.
  bool usable() const { return usable_; }

 private:
  int fds_[2] = {-1, -1};
  size_t capacity_ = 0;
  bool usable_ = true;
};

}  // namespace meridian::wan

#endif  // MERIDIAN_WAN_SPLICE_PIPE_H_
