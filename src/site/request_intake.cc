#include "site/request_intake.h"

#include <utility>

namespace meridian {

std::optional<Envelope> RequestIntake::Wait(Envelope message) {
  const uint64_t bytes = PayloadBytes(message);
  if (waiting_.size() >= kMaxWaitingMessages ||
      bytes > kMaxWaitingBytes - waiting_bytes_) {
    return message;
  }
  ++waiting_per_connection_[message.routing_id];
  waiting_bytes_ += bytes;
  waiting_.push_back(std::move(message));
  return std::nullopt;
}

std::optional<Envelope> RequestIntake::Next() {
  if (waiting_.empty()) return std::nullopt;
  Envelope message = std::move(waiting_.front());
  waiting_.pop_front();
  waiting_bytes_ -= PayloadBytes(message);
  auto it = waiting_per_connection_.find(message.routing_id);
  if (--it->second == 0) waiting_per_connection_.erase(it);
  return message;
}

}  // namespace meridian
