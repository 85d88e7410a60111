#include <algorithm>
#include <limits>

#include "meridian/sync/sync.h"

namespace meridian {

MirrorClocks::MirrorClocks(std::vector<std::string> peers) {
  for (std::string& peer : peers) clocks_.emplace(std::move(peer), 0);
}

Status MirrorClocks::Advance(const std::string& peer, int64_t clock) {
  auto it = clocks_.find(peer);
  if (it == clocks_.end()) {
    return InvalidArgumentError("clock from '" + peer +
                                "', which is not a site this one syncs with");
  }
  if (clock <= it->second) {
    return InvalidArgumentError(
        "clock " + std::to_string(clock) + " from '" + peer + "' " +
        (clock == it->second ? "repeats" : "goes backwards") +
        " (its last clock was " + std::to_string(it->second) + ")");
  }
  it->second = clock;
  return Status::Ok();
}

Status MirrorClocks::Reset(const std::string& peer, int64_t clock) {
  auto it = clocks_.find(peer);
  if (it == clocks_.end()) {
    return InvalidArgumentError("clock from '" + peer +
                                "', which is not a site this one syncs with");
  }
  it->second = clock;
  return Status::Ok();
}

int64_t MirrorClocks::Min() const {
  int64_t min = std::numeric_limits<int64_t>::max();
  for (const auto& [peer, clock] : clocks_) min = std::min(min, clock);
  return min;
}

bool MirrorClocks::WithinBound(int64_t local, uint32_t max_skew) const {
  if (clocks_.empty()) return true;
  return local - Min() <= static_cast<int64_t>(max_skew);
}

std::optional<int64_t> MirrorClocks::ClockOf(const std::string& peer) const {
  auto it = clocks_.find(peer);
  if (it == clocks_.end()) return std::nullopt;
  return it->second;
}

void BlockedKeys::Block(const std::string& peer, int64_t clock,
                        std::span<const uint64_t> keys) {
  std::vector<uint64_t>& held = by_update_[{peer, clock}];
  for (uint64_t key : keys) {
    held.push_back(key);
    ++count_[key];
  }
}

void BlockedKeys::Release(const std::string& peer, int64_t clock) {
  auto it = by_update_.find({peer, clock});
  if (it == by_update_.end()) return;
  for (uint64_t key : it->second) {
    auto counted = count_.find(key);
    if (--counted->second == 0) count_.erase(counted);
  }
  by_update_.erase(it);
}

bool BlockedKeys::Intersects(uint64_t begin, uint64_t end) const {
  auto it = count_.lower_bound(begin);
  return it != count_.end() && it->first < end;
}

}  // namespace meridian
