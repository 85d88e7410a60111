// The order in which the site server serves what arrives on its worker
// socket: joined connections first, everyone else with a bounded share.
//
// ZeroMQ's ROUTER hands the event loop one message per connection in turn,
// so without an order of its own a joined worker's PULL waits behind one
// message of every other connection, and serving each of those (a STATUS
// reply, a refusal) is what takes the time. Each turn the loop therefore
// reads up to kReadsPerTurn messages (reading and decoding one is cheap),
// serves at once those that came over a joined worker's or the evaluator's
// connection, and of the others (HELLOs, status probes, control messages,
// strangers) at most kOthersPerTurn, oldest first; the rest wait here.
// A joined worker's request thus waits behind at most kOthersPerTurn
// messages of anonymous work, whatever the number of other connections.
//
// Per connection, order is kept: a message over a connection that has
// messages waiting waits behind them even when the connection joined
// meanwhile.
//
// Bounds: at most kMaxWaitingMessages messages and kMaxWaitingBytes of
// payload wait. A message that does not fit is not taken: Wait() gives it
// back and the loop refuses it with ERROR_BUSY (nothing was done; clients
// send such a request again after a pause).
//
// Ownership and threads: owned by the event loop, used on its thread only.
// Crash: nothing here is durable; a waiting request is lost with the
// process like any unanswered request (its sender asks again).
#ifndef MERIDIAN_SITE_REQUEST_INTAKE_H_
#define MERIDIAN_SITE_REQUEST_INTAKE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>

#include "meridian/net/transport.h"

namespace meridian {

class RequestIntake {
 public:
  static constexpr size_t kReadsPerTurn = 64;
  static constexpr size_t kOthersPerTurn = 4;
  static constexpr size_t kMaxWaitingMessages = 256;
  static constexpr uint64_t kMaxWaitingBytes = 16ull << 20;

  // Whether a message over `routing_id` may be served before the waiting
  // ones: its connection is `joined` and has nothing waiting.
  bool ServeFirst(const std::string& routing_id, bool joined) const {
    return joined && !waiting_per_connection_.contains(routing_id);
  }

  // Queues `message` behind the waiting ones; nullopt when taken, else the
  // message given back (the bounds are reached).
  std::optional<Envelope> Wait(Envelope message);

  // The oldest waiting message, or nullopt.
  std::optional<Envelope> Next();

  size_t waiting() const { return waiting_.size(); }
  uint64_t waiting_bytes() const { return waiting_bytes_; }

 private:
  std::deque<Envelope> waiting_;
  uint64_t waiting_bytes_ = 0;  // payload frames of waiting_
  // Messages in waiting_ per connection (no entry: none).
  std::unordered_map<std::string, size_t> waiting_per_connection_;
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_REQUEST_INTAKE_H_
