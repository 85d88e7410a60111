// The WAN emulator: a TCP proxy whose links shape bandwidth, latency,
// jitter and partitions, and count every byte and ZeroMQ message that
// crosses them.
//
// A link ("a-b") has two direction shapers (a->b, b->a). A ROUTE is a TCP
// listener attached to a link for connections initiated from one side
// (`from_site`) to an address on the other side (`forward`): bytes read from
// the client go through the from->to shaper, bytes coming back through
// to->from. All routes and connections of a link share its two shapers
// (the link's bandwidth is shared, FIFO in arrival order); each
// connection's byte order is preserved. Nothing is ever dropped: when a
// direction holds its queue limit, the emulator stops reading the sockets
// that feed it (TCP backpressure); the limit can only be overshot by one
// read (at most the limit again) that was already under way when a
// passthrough link got partitioned or shaped. A partition holds bytes and
// keeps connections open; heal resumes delivery in order.
//
// Per connection direction, a reader thread feeds the link's shaper and a
// writer thread writes released chunks; one shaper thread per link
// direction releases them on time. A passthrough direction (unlimited
// bandwidth, no latency or jitter, not partitioned) skips the shaper: the
// reader writes what it read itself.
//
// Accounting happens where bytes cross: `bytes` counts what was written to
// the far side's socket, `messages` the ZeroMQ messages (ZMTP 3.x framing,
// see wan/zmtp.h) completed among those bytes. All methods are thread-safe.
//
// What peers can make the emulator hold (EmulatorOptions in brackets):
//  - Connections: at most max_connections_per_route [64] per route and
//    max_connections [1024] in all, the latter lowered to what the
//    descriptor limit allows (wan/connection_gate.h: 6 descriptors per
//    connection beyond 512). A connection beyond them is accepted and
//    closed at once (an RST), with a rate-limited log line naming the cap;
//    it costs no thread, no forward connection and no buffer. Each admitted
//    connection has four threads and a connection to its forward address.
//  - Bytes per connection: each direction's reader holds at most one read
//    (read_bytes [256 KiB]); a client that sends faster than its link
//    drains is not read (TCP backpressure), and one that does not read
//    what is forwarded to it stops its writer, so its link direction stops
//    reading too. Neither makes the emulator buffer more.
//  - Bytes per link direction: at most its queue limit of accepted,
//    undelivered bytes (reads reserve their room before they read), plus at
//    most one read (read_bytes) per connection whose reader was passing
//    bytes straight through when the direction got partitioned or shaped.
// So the process holds at most (connections x 2 x read_bytes) of read
// buffers plus the link directions' queue limits (and as much again in
// the worst case, where a chunk keeps the read buffer it came from),
// whatever its peers do. A client that does not read holds up the other
// connections of its link direction (the queue is shared, as on one
// bottleneck link), never the other direction or other links.
#ifndef MERIDIAN_WAN_EMULATOR_H_
#define MERIDIAN_WAN_EMULATOR_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "meridian/core/clock.h"
#include "meridian/job.pb.h"
#include "meridian/wan_control.pb.h"
#include "meridian/core/status.h"
#include "meridian/wan/link_model.h"

namespace meridian::wan {

struct EmulatorOptions {
  std::vector<LinkModel> links;  // fixed for the emulator's life
  // Time of the shapers. Sleeps are real (condition variables), so tests
  // of the emulator use the system clock; the Shaper itself is unit-tested
  // on virtual time.
  const Clock* clock = SystemClock();
  // Largest single read from a socket.
  size_t read_bytes = 256 * 1024;
  // How long a new connection may take to reach its forward address.
  Duration connect_timeout = std::chrono::seconds(3);
  // Connections open at once on one route, and on all routes together
  // (lowered to what the descriptor limit allows). A job needs a few per
  // route: one per site pair's mirror, one per worker.
  size_t max_connections_per_route = 64;
  size_t max_connections = 1024;
};

class Emulator {
 public:
  // Checks the links (unique names, distinct sites, no site pair twice);
  // starts no thread until a route is added.
  static Result<std::unique_ptr<Emulator>> Create(EmulatorOptions options);
  ~Emulator();  // Stop()
  Emulator(const Emulator&) = delete;
  Emulator& operator=(const Emulator&) = delete;

  // Opens a listener for `route`; returns the bound address ("host:port").
  // The forward address must parse and resolve; whether something listens
  // there is found out per connection (a client whose forward connection
  // fails is closed, and the route keeps serving).
  Result<std::string> AddRoute(const RouteSpec& route);

  // Applies `change` (unit strings) to one or both directions of `link`,
  // atomically: on error nothing changes. Fields not set keep their value.
  Status SetLink(std::string_view link, pb::LinkDirection direction,
                 const pb::LinkDirectionConfig& change);
  // Replaces the model of one or both directions.
  Status SetLinkModel(std::string_view link, pb::LinkDirection direction,
                      const DirectionModel& model);
  Status Partition(std::string_view link);
  Status Heal(std::string_view link);
  // Closes every open connection of `link` (both ways), dropping the bytes
  // they held or had in flight: a broken TCP connection, on demand. The
  // routes keep listening, so the peers reconnect.
  Status ResetConnections(std::string_view link);

  // State and counters of one link / of every link (in creation order).
  Result<pb::WanLinkState> LinkState(std::string_view link) const;
  std::vector<pb::WanLinkState> LinkStates() const;
  std::vector<std::string> LinkNames() const;
  double UptimeSeconds() const;
  const Clock* clock() const;

  // Closes every listener and connection and joins every thread.
  // Idempotent.
  void Stop();

  class Impl;

 private:
  explicit Emulator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meridian::wan

#endif  // MERIDIAN_WAN_EMULATOR_H_
