// A hostile ZeroMQ peer by hand: raw ZMTP 3.0 bytes over a plain TCP
// connection, for what no libzmq client sends (libzmq keeps a multipart
// message until its last frame, so it never streams one that does not
// end). Header-only.
#ifndef MERIDIAN_TESTING_RAW_ZMTP_H_
#define MERIDIAN_TESTING_RAW_ZMTP_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace meridian::testing {

// A NULL-mechanism greeting and a DEALER's READY command.
inline std::string ZmtpDealerHandshake() {
  std::string greeting(64, '\0');
  greeting[0] = '\xFF';
  greeting[8] = '\x01';
  greeting[9] = '\x7F';
  greeting[10] = '\x03';
  greeting.replace(12, 4, "NULL");
  const std::string ready("\x05READY\x0bSocket-Type\x00\x00\x00\x06" "DEALER",
                          28);
  return greeting + '\x04' + static_cast<char>(ready.size()) + ready;
}

// A data frame of `size` bytes with MORE set: one more part of a message
// (the long form over 255 bytes).
inline std::string ZmtpMoreFrame(size_t size) {
  std::string frame;
  if (size > 255) {
    frame += '\x03';
    for (int i = 7; i >= 0; --i) {
      frame += static_cast<char>((static_cast<uint64_t>(size) >> (8 * i)) &
                                 0xFF);
    }
  } else {
    frame += '\x01';
    frame += static_cast<char>(size);
  }
  return frame + std::string(size, 'e');
}

// Sends the handshake over `fd` (a blocking socket) and reads the server's
// greeting and READY command: libzmq takes a peer's data frames only once
// its own READY is out (frames that arrive earlier break the handshake).
// False when the server closed or said nothing within 10 s.
inline bool ZmtpHandshake(int fd) {
  const std::string handshake = ZmtpDealerHandshake();
  if (::send(fd, handshake.data(), handshake.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(handshake.size())) {
    return false;
  }
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string got;
  char buffer[512];
  // A greeting, then a short command frame: flags, size, body.
  while (got.size() < 66 ||
         got.size() < size_t{66} + static_cast<uint8_t>(got[65])) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return false;
    got.append(buffer, static_cast<size_t>(n));
  }
  return true;
}

// Streams one message that never ends over `fd` (after ZmtpHandshake): MORE
// frames of `frame_bytes`, as fast as the kernel takes them, until sends
// have been refused 50 times in a row 2 ms apart (nobody reads any more) or
// `max_bytes` went out. Calls `after_send` after every send (to sample the
// server). Returns the bytes sent; `fd` is left non-blocking.
inline uint64_t SendEndlessMessage(int fd, size_t frame_bytes,
                                   uint64_t max_bytes,
                                   const std::function<void()>& after_send) {
  std::string block;
  while (block.size() < (64u << 10)) block += ZmtpMoreFrame(frame_bytes);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  uint64_t sent = 0;
  size_t offset = 0;
  int refused = 0;
  while (sent < max_bytes && refused < 50) {
    const ssize_t n =
        ::send(fd, block.data() + offset, block.size() - offset, MSG_NOSIGNAL);
    after_send();
    if (n < 0) {
      ++refused;  // a moment for the reader to read more, if it would
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    refused = 0;
    sent += static_cast<uint64_t>(n);
    offset = (offset + static_cast<size_t>(n)) % block.size();
  }
  return sent;
}

// A blocking TCP connection to the port of `endpoint` ("tcp://H:PORT") on
// 127.0.0.1; -1 when it fails.
inline int ConnectRawTcp(const std::string& endpoint) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(
      std::stoi(endpoint.substr(endpoint.rfind(':') + 1))));
  ::inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
      0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Strangers at a ZeroMQ listener, driven by a thread of their own from
// construction to destruction:
//  - `endless` connections that complete the handshake and then each
//    stream one multipart message that never ends (even ones in 1 KiB
//    frames, odd ones in empty frames), pushed whenever the kernel takes
//    more;
//  - `drips` connections that each send one byte every 100 ms of a
//    handshake and then of a message that never ends; one the listener
//    closes is opened again at once, so `drips` always press.
// Threads: the counters may be read from any thread.
class Intruders {
 public:
  Intruders(std::string endpoint, int endless, int drips)
      : endpoint_(std::move(endpoint)) {
    for (int i = 0; i < endless; ++i) {
      const int fd = ConnectRawTcp(endpoint_);
      if (fd < 0) continue;
      if (!ZmtpHandshake(fd)) {
        ::close(fd);
        continue;
      }
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
      Stream stream{fd, {}, 0, 0};
      while (stream.block.size() < (64u << 10)) {
        stream.block += ZmtpMoreFrame(i % 2 == 0 ? 1024 : 0);
      }
      streams_.push_back(std::move(stream));
    }
    drip_bytes_ = ZmtpDealerHandshake();
    handshake_bytes_ = drip_bytes_.size();
    while (drip_bytes_.size() < 4096) drip_bytes_ += ZmtpMoreFrame(1024);
    drips_.assign(static_cast<size_t>(drips), Drip{-1, 0});
    thread_ = std::thread([this] { Run(); });
  }
  ~Intruders() {
    stop_ = true;
    thread_.join();
    for (const Stream& stream : streams_) ::close(stream.fd);
    for (const Drip& drip : drips_) {
      if (drip.fd >= 0) ::close(drip.fd);
    }
  }
  Intruders(const Intruders&) = delete;
  Intruders& operator=(const Intruders&) = delete;

  // Endless connections that completed the handshake.
  size_t endless() const { return streams_.size(); }
  // The most bytes one endless message got into the kernel so far.
  uint64_t max_stream_bytes() const { return max_stream_bytes_.load(); }
  // Bytes of every connection that went into the kernel so far.
  uint64_t bytes_sent() const { return bytes_sent_.load(); }
  // Drip connections the listener closed (each was opened again).
  uint64_t drips_closed() const { return drips_closed_.load(); }

 private:
  struct Stream {
    int fd;
    std::string block;
    size_t offset;
    uint64_t sent;
  };
  struct Drip {
    int fd;
    size_t next;  // into drip_bytes_
  };

  void Run() {
    auto next_drip = std::chrono::steady_clock::now();
    while (!stop_) {
      bool sent_any = false;
      for (Stream& stream : streams_) {
        const ssize_t n =
            ::send(stream.fd, stream.block.data() + stream.offset,
                   stream.block.size() - stream.offset, MSG_NOSIGNAL);
        if (n <= 0) continue;
        sent_any = true;
        bytes_sent_ += static_cast<uint64_t>(n);
        stream.sent += static_cast<uint64_t>(n);
        stream.offset =
            (stream.offset + static_cast<size_t>(n)) % stream.block.size();
        if (stream.sent > max_stream_bytes_.load()) {
          max_stream_bytes_ = stream.sent;
        }
      }
      if (std::chrono::steady_clock::now() >= next_drip) {
        next_drip += std::chrono::milliseconds(100);
        for (Drip& drip : drips_) DripOne(drip);
      }
      if (!sent_any) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  void DripOne(Drip& drip) {
    if (drip.fd < 0) {
      drip.fd = ConnectRawTcp(endpoint_);
      if (drip.fd < 0) return;
      ::fcntl(drip.fd, F_SETFL, ::fcntl(drip.fd, F_GETFL) | O_NONBLOCK);
      drip.next = 0;
    }
    // The byte after the handshake's end loops over the message's frames.
    if (drip.next == drip_bytes_.size()) drip.next = handshake_bytes_;
    const ssize_t n =
        ::send(drip.fd, drip_bytes_.data() + drip.next, 1, MSG_NOSIGNAL);
    if (n == 1) {
      ++drip.next;
      ++bytes_sent_;
    } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      ::close(drip.fd);
      drip.fd = -1;
      ++drips_closed_;
    }
  }

  const std::string endpoint_;
  std::vector<Stream> streams_;  // owned by the thread once it runs
  std::string drip_bytes_;  // a handshake, then whole 1 KiB frames
  size_t handshake_bytes_ = 0;
  std::vector<Drip> drips_;  // owned by the thread once it runs
  std::atomic<uint64_t> max_stream_bytes_{0};
  std::atomic<uint64_t> drips_closed_{0};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace meridian::testing

#endif  // MERIDIAN_TESTING_RAW_ZMTP_H_
