// Which connections the metrics endpoint keeps when a new one arrives and
// a cap is reached: the endpoint always admits the newcomer (a scrape is
// a new connection that sends its request at once) and makes room by
// closing the connection that has waited longest for a request of its own
// (idle or trickling a head), else the one that has waited longest for a
// client to read its response:
//  - at the per-address cap, one of the newcomer's own address (so that
//    one address can only push out its own connections);
//  - at the total cap, one of the address holding the most connections
//    (so that the heaviest address pays, not the others).
// A client therefore cannot keep a scrape out by holding connections:
// each of its own it opens closes its oldest one, and those of other
// addresses are never touched while it holds the most.
//
// Bookkeeping only (no sockets, no clock): the server's event loop owns it
// and reports every connection's state. Size: one entry per open
// connection (at most max_connections); Admit() scans them, which is
// cheap at the few hundred a cap allows. Thread-compatible.
#ifndef MERIDIAN_METRICS_CONNECTION_BUDGET_H_
#define MERIDIAN_METRICS_CONNECTION_BUDGET_H_

#include <sys/socket.h>

#include <array>
#include <chrono>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>

namespace meridian {

// A peer's IP address (its port is not part of it): IPv6, or IPv4 held as
// ::ffff:a.b.c.d, so that both spellings of an IPv4 peer count as one.
struct PeerAddress {
  std::array<uint8_t, 16> bytes{};

  // From accept()'s address; all zeros for another family (a Unix socket).
  static PeerAddress FromSockaddr(const sockaddr_storage& address);
  // "1.2.3.4" or "2001:db8::1".
  std::string ToString() const;
  friend auto operator<=>(const PeerAddress&, const PeerAddress&) = default;
};

class ConnectionBudget {
 public:
  using Time = std::chrono::steady_clock::time_point;

  // Caps of at least 1 (0 is taken as 1).
  ConnectionBudget(size_t max_connections, size_t max_per_address);

  enum class Cap { kNone, kPerAddress, kTotal };
  struct Admission {
    Cap cap = Cap::kNone;           // which cap is reached, if any
    std::optional<uint64_t> shed;   // the connection to close first
  };
  // What admitting a connection from `peer` takes. Always admits: when a
  // cap is reached, `shed` names the connection to close (Remove it, then
  // Add the newcomer).
  Admission Admit(const PeerAddress& peer) const;

  // A connection accepted at `now`, waiting for its first request.
  void Add(uint64_t id, const PeerAddress& peer, Time now);
  void Remove(uint64_t id);
  // The connection waits for a request since `since` (accepted, or its
  // previous response written): the first to go.
  void MarkIdle(uint64_t id, Time since);
  // The connection writes a response whose client has not taken it all
  // since `since`: goes only when no idle one can.
  void MarkBusy(uint64_t id, Time since);

  size_t size() const { return entries_.size(); }
  size_t CountOf(const PeerAddress& peer) const;

 private:
  struct Entry {
    PeerAddress peer;
    bool busy = false;
    Time since;
  };
  // The connection of `peer` to close first: idle before busy, the longest
  // waiting first (then the oldest id).
  std::optional<uint64_t> Oldest(const PeerAddress& peer) const;

  const size_t max_connections_;
  const size_t max_per_address_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::map<PeerAddress, size_t> per_address_;  // open connections by peer
};

}  // namespace meridian

#endif  // MERIDIAN_METRICS_CONNECTION_BUDGET_H_
