// A front for a ZeroMQ endpoint that peers on the network reach (a site
// server's worker endpoint): it accepts their TCP connections on the public
// address and relays each, byte for byte, over a connection of its own to
// the socket bound at a private loopback address. ZMTP, CURVE handshakes
// and encrypted frames included, passes through untouched; what the front
// adds are the bounds libzmq cannot enforce on a ROUTER socket:
//
//  - Bytes held per connection. libzmq keeps a multipart message until its
//    last frame arrives and counts its queues in whole messages, so one
//    peer that sends a message that never ends (in small frames, or empty
//    ones) grows the process without bound. The front reads a connection
//    only while what it has read from it and the application has not taken
//    (in the front's buffer, in libzmq, in the kernel between them) stays
//    within the connection's credit, counting its bytes and
//    kFrameChargeBytes per frame (the frames are counted by parsing the
//    ZMTP stream, wan/zmtp.h; under CURVE every frame is one MESSAGE
//    command); the application reports what it takes (Consumed: each
//    message's bytes and frames) and the connection is read again. A connection out of credit for
//    stall_timeout without the application taking anything from it is
//    closed; libzmq drops the partial message with the connection.
//  - Two credits: untrusted_credit for a connection until the application
//    vouches for it (Trust: a worker it admitted, a peer site it knows,
//    each an identity), trusted_credit after. One connection per identity
//    is trusted: trusting a new one for it (a worker that joined again, a
//    peer that reconnected) takes the trust of the old one. At most
//    max_trusted connections are trusted at once (the worker slots):
//    trusting one more takes the trust of the one trusted longest ago (on
//    a plaintext endpoint anyone may say HELLO).
//    untrusted_credit must hold the largest message a peer sends before it
//    is trusted (a HELLO), trusted_credit the largest message times the
//    messages the socket queues per connection; a connection whose next
//    message does not fit its credit stalls and is closed.
//  - Connections: at most max_connections (lowered to what the descriptor
//    limit allows, kDescriptorsPerFrontConnection each). A connection
//    beyond them evicts the untrusted one the application took nothing
//    from for longest; when every open connection is trusted it is
//    accepted and closed at once (refused).
//
// What peers can make the process hold: per connection 2 x kBufferBytes
// in the front and its credit in libzmq (the kernel's socket buffers are
// not the process's); in all max_connections x (2 x kBufferBytes +
// untrusted_credit) + max_trusted x trusted_credit (MemoryBound()).
//
// The application identifies the connection a message came over by the
// front's local port of its upstream connection: the port at the other end
// of the descriptor libzmq read the message from (UpstreamPortOfFd).
//
// Threads: the relay runs on a thread of the front's own (epoll over
// non-blocking sockets). Consumed and Trust may be called from any thread;
// they queue the event and wake the relay. stats() is safe from any
// thread. Ownership: Start returns the front; its destructor stops the
// thread and closes every connection.
#ifndef MERIDIAN_WAN_FRONT_H_
#define MERIDIAN_WAN_FRONT_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "meridian/core/status.h"

namespace meridian::wan {

// The descriptors one relayed connection costs this process: the peer's,
// the front's upstream connection, libzmq's end of it and a pipe per
// direction (bulk bytes are spliced, never copied into the process).
inline constexpr size_t kDescriptorsPerFrontConnection = 7;

struct FrontOptions {
  // Where peers connect: "tcp://HOST:PORT" (HOST "*" for every interface,
  // PORT 0 or "*" for a free one).
  std::string listen;
  // The ZeroMQ socket's private endpoint: "tcp://127.0.0.1:PORT".
  std::string upstream;
  // For logs: "worker endpoint of site 'us'".
  std::string name;
  size_t max_connections = 1024;
  size_t max_trusted = 64;
  uint64_t untrusted_credit = 256 << 10;
  uint64_t trusted_credit = 64 << 20;
  std::chrono::milliseconds stall_timeout{30000};
  // Messages per second the front passes from untrusted connections, all
  // of them together (0: no limit); it stops reading them while the
  // budget is spent, and serves the waiting ones in turn as it refills.
  // The default is the site's (job.proto server.limits) and the mirror's.
  static constexpr double kDefaultUntrustedMessagesPerSecond = 1000;
  double untrusted_messages_per_s = kDefaultUntrustedMessagesPerSecond;
};

class ConnectionFront {
 public:
  // Bytes of a connection's framing and small frames the front reads into
  // the process's memory (MemoryBound counts twice that per connection).
  // Bulk bytes pass through a pipe per direction instead: kernel memory,
  // up to 1 MiB each, never the process's.
  static constexpr size_t kBufferBytes = 64 << 10;
  // What a frame costs libzmq beyond its payload (a zmq_msg_t), charged
  // to a connection's credit for every frame it sends: a message of empty
  // frames holds memory too.
  static constexpr uint64_t kFrameChargeBytes = 64;
  // Credited back per frame taken, beyond its payload and charge: at least
  // a frame's ZMTP framing (2-9 bytes; up to 42 under CURVE). The surplus
  // pays back the handshake, which the application never takes.
  static constexpr uint64_t kFramingAllowanceBytes = 64;
  // Connections the kernel completes before they are accepted, on the
  // public listener and on the application's socket behind it (ZeroMQ's
  // ZMQ_BACKLOG; its default, 100, makes a burst of new connections wait
  // for SYN retransmits: the front relays each at once).
  static constexpr int kListenBacklog = 1024;

  struct Stats {
    uint64_t open = 0;       // connections relayed now
    uint64_t trusted = 0;    // of them, trusted
    uint64_t accepted = 0;   // since start
    uint64_t refused = 0;    // accepted and closed at once: all trusted
    uint64_t evicted = 0;    // untrusted, closed for a newer connection
    uint64_t stalled = 0;    // closed out of credit for stall_timeout
    uint64_t held_bytes = 0; // read and not yet taken, every connection
    uint64_t max_connections = 0;  // the cap in force
    // FrontOptions' credits: a message larger than untrusted_credit (bytes
    // + kFrameChargeBytes per frame) from an untrusted connection is held
    // until it stalls and is closed, never delivered.
    uint64_t untrusted_credit = 0;
    uint64_t trusted_credit = 0;
    // Times an untrusted connection waited for the message budget.
    uint64_t budget_waits = 0;
  };

  // Listens on options.listen and starts the relay. Errors name the
  // address (in use, unresolvable) or the option.
  static Result<std::unique_ptr<ConnectionFront>> Start(FrontOptions options);
  ~ConnectionFront();
  ConnectionFront(const ConnectionFront&) = delete;
  ConnectionFront& operator=(const ConnectionFront&) = delete;

  // "tcp://HOST:PORT" with the port resolved.
  const std::string& endpoint() const { return endpoint_; }

  // The application took a message of `frames` frames and `bytes` bytes
  // (routing id frames not counted) that came over the connection whose
  // upstream port is `upstream_port`.
  void Consumed(uint16_t upstream_port, uint64_t bytes, uint64_t frames);
  // The connection behind `upstream_port` speaks for `identity` (a worker
  // slot, a peer site: the application's numbering) and gets
  // trusted_credit from now on; the connection trusted for `identity`
  // before gets untrusted_credit.
  void Trust(uint16_t upstream_port, uint64_t identity);

  Stats stats() const;
  // What peers can make the process hold in the front and libzmq at most
  // (see above).
  uint64_t MemoryBound() const;

 private:
  struct Connection;
  struct Event {
    uint16_t port;
    uint64_t bytes;   // Consumed; 0 for Trust
    uint64_t frames;
    bool trust;
    uint64_t identity;  // Trust
  };

  explicit ConnectionFront(FrontOptions options);
  void Run();
  void Wake();
  void ApplyEvents();
  void Accept();
  void OnReady(uint64_t tag, uint32_t events);
  // Moves what can move on `c` (both ways); closes it when a side is gone.
  void Pump(Connection& c);
  // One step of each direction; *progress when bytes moved. False: the
  // peer is gone.
  bool FromPeer(Connection& c, bool* progress);
  void ToUpstream(Connection& c, bool* progress);
  bool FromUpstreamToPeer(Connection& c, bool* progress);
  void Watch(Connection& c);
  void EndUpstream(Connection& c);
  // Bytes that may be taken from `c`'s peer now, within `credit`;
  // `splice_body`: through the pipe (the body of a large frame).
  static uint64_t PeerRoom(const Connection& c, uint64_t credit,
                           bool* splice_body);
  void Close(uint64_t id, const char* why);
  // Until the budget has a message for a waiting connection, at most a
  // tick; the waiting connections pumped in turn while it lasts.
  int WaitMilliseconds() const;
  void ResumeWaiting();
  void CloseStalled();
  bool EvictOne();
  void Publish();
  void MarkTrusted(Connection& c, uint64_t identity);
  void Demote(Connection& c);

  FrontOptions options_;
  std::string endpoint_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::string upstream_host_;
  uint16_t upstream_port_ = 0;
  size_t cap_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;

  std::mutex events_mutex_;
  std::vector<Event> events_;  // guarded by events_mutex_

  // Relay thread only. At most cap_ connections; by_port_ has one entry
  // per connection whose upstream is connected.
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
  std::unordered_map<uint16_t, uint64_t> by_port_;
  // Ids of trusted connections, the longest trusted first (ids of closed
  // or demoted connections are skipped, and dropped when they pile up).
  std::deque<std::pair<uint64_t, uint64_t>> trusted_order_;  // id, since
  uint64_t trust_count_ = 0;  // Trust calls that trusted a connection
  // The connection trusted last for each identity (its id). At most one
  // entry per identity the application vouched for (worker slots, peer
  // sites); an entry whose connection closed or speaks for another
  // identity now is stale and ignored.
  std::unordered_map<uint64_t, uint64_t> trusted_by_identity_;
  bool listen_paused_ = false;
  // The untrusted message budget and the untrusted connections waiting
  // for it, oldest first (ids; at most one entry per connection, stale
  // ones skipped).
  struct Budget {
    double rate = 0;    // messages a second; 0: no limit
    double tokens = 0;  // at most a quarter second's worth, or 1
    std::chrono::steady_clock::time_point at{};
    std::deque<uint64_t> waiting;
    std::unordered_set<uint64_t> waiting_ids;  // the ids in `waiting`
    void Refill();
    bool Allows() const { return rate <= 0 || tokens >= 1; }
  };
  Budget budget_;
  // held_bytes, trusted and the counts since start (open and
  // max_connections are filled in by Publish).
  Stats counts_;

  // Published by the relay for stats().
  mutable std::mutex stats_mutex_;
  Stats stats_;  // guarded by stats_mutex_
};

// The local port of the peer at the other end of `fd` (a descriptor libzmq
// read a message from, ZMQ_SRCFD): the front's upstream port. 0 when `fd`
// is not a TCP socket (or already closed).
uint16_t UpstreamPortOfFd(int fd);

}  // namespace meridian::wan

#endif  // MERIDIAN_WAN_FRONT_H_
