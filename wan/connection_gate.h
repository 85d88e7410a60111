// Admission of connections to the emulator's routes: a cap per route and
// one for all routes together, the latter lowered to what the process's
// descriptor limit allows, so that a flood of connections (10,000 opened
// and held) is refused at the door instead of exhausting descriptors,
// threads and the forward addresses' endpoints. A refused connection is
// accepted and closed at once (the client learns it is refused; the
// kernel's listen queue does not fill up for the next legitimate one), and
// the refusal logged, rate-limited.
//
// Thread-safe: every route's accept thread admits and releases; the count
// is one atomic.
#ifndef MERIDIAN_WAN_CONNECTION_GATE_H_
#define MERIDIAN_WAN_CONNECTION_GATE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace meridian::wan {

// Descriptors one proxied connection may hold: the client's and the
// forward socket, and a splice pipe (two descriptors) per direction.
inline constexpr size_t kDescriptorsPerConnection = 6;
// Descriptors kept for the rest of the process (listeners, the control
// and metrics endpoints, whose own cap is 256 connections, logs).
inline constexpr size_t kReservedDescriptors = 512;

// Raises this process's soft limit on open descriptors to its hard limit
// (`meridian wanem` does so at start) and returns the soft limit in force.
uint64_t RaiseDescriptorLimit();
// The soft limit on open descriptors in force.
uint64_t DescriptorLimit();

class ConnectionGate {
 public:
  // At most `max_per_route` connections per route, and at most
  // `max_total` in all, lowered to what `descriptor_limit` allows
  // (kDescriptorsPerConnection each beyond kReservedDescriptors; at least
  // one).
  ConnectionGate(size_t max_total, size_t max_per_route,
                 uint64_t descriptor_limit);

  // Admits (and counts) a connection to a route that holds `route_open`
  // connections; else says which cap refuses it, e.g. "64 connections
  // open on this route (max_connections_per_route)".
  std::optional<std::string> TryAdmit(size_t route_open);
  // An admitted connection has closed its sockets.
  void Release();

  size_t open() const { return open_.load(); }
  size_t max_total() const { return max_total_; }
  size_t max_per_route() const { return max_per_route_; }

 private:
  const size_t max_total_;
  const size_t max_per_route_;
  std::atomic<size_t> open_{0};
};

}  // namespace meridian::wan

#endif  // MERIDIAN_WAN_CONNECTION_GATE_H_
