#include "metrics/connection_budget.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <tuple>

namespace meridian {

PeerAddress PeerAddress::FromSockaddr(const sockaddr_storage& address) {
  PeerAddress out;
  if (address.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
    out.bytes[10] = 0xff;
    out.bytes[11] = 0xff;
    std::memcpy(&out.bytes[12], &v4->sin_addr, 4);
  } else if (address.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
    std::memcpy(out.bytes.data(), &v6->sin6_addr, 16);
  }
  return out;
}

std::string PeerAddress::ToString() const {
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0,
                                          0, 0, 0, 0, 0xff, 0xff};
  char text[INET6_ADDRSTRLEN] = {};
  if (std::memcmp(bytes.data(), kMapped, sizeof(kMapped)) == 0) {
    ::inet_ntop(AF_INET, &bytes[12], text, sizeof(text));
  } else {
    ::inet_ntop(AF_INET6, bytes.data(), text, sizeof(text));
  }
  return text;
}

ConnectionBudget::ConnectionBudget(size_t max_connections,
                                   size_t max_per_address)
    : max_connections_(std::max<size_t>(1, max_connections)),
      max_per_address_(std::max<size_t>(1, max_per_address)) {}

ConnectionBudget::Admission ConnectionBudget::Admit(
    const PeerAddress& peer) const {
  Admission admission;
  if (CountOf(peer) >= max_per_address_) {
    admission.cap = Cap::kPerAddress;
    admission.shed = Oldest(peer);
    return admission;
  }
  if (entries_.size() < max_connections_) return admission;
  admission.cap = Cap::kTotal;
  const auto heaviest = std::max_element(
      per_address_.begin(), per_address_.end(),
      [](const auto& a, const auto& b) { return a.second < b.second; });
  if (heaviest != per_address_.end()) admission.shed = Oldest(heaviest->first);
  return admission;
}

void ConnectionBudget::Add(uint64_t id, const PeerAddress& peer, Time now) {
  if (!entries_.emplace(id, Entry{peer, false, now}).second) return;
  ++per_address_[peer];
}

void ConnectionBudget::Remove(uint64_t id) {
  const auto it = entries_.find(id);
  if (it == entries_.end()) return;
  const auto count = per_address_.find(it->second.peer);
  if (count != per_address_.end() && --count->second == 0) {
    per_address_.erase(count);
  }
  entries_.erase(it);
}

void ConnectionBudget::MarkIdle(uint64_t id, Time since) {
  if (auto it = entries_.find(id); it != entries_.end()) {
    it->second.busy = false;
    it->second.since = since;
  }
}

void ConnectionBudget::MarkBusy(uint64_t id, Time since) {
  if (auto it = entries_.find(id); it != entries_.end()) {
    it->second.busy = true;
    it->second.since = since;
  }
}

size_t ConnectionBudget::CountOf(const PeerAddress& peer) const {
  const auto it = per_address_.find(peer);
  return it == per_address_.end() ? 0 : it->second;
}

std::optional<uint64_t> ConnectionBudget::Oldest(
    const PeerAddress& peer) const {
  std::optional<uint64_t> oldest;
  std::tuple<bool, Time, uint64_t> best;
  for (const auto& [id, entry] : entries_) {
    if (entry.peer != peer) continue;
    const auto key = std::make_tuple(entry.busy, entry.since, id);
    if (!oldest || key < best) {
      oldest = id;
      best = key;
    }
  }
  return oldest;
}

}  // namespace meridian
