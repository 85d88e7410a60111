#include "worker/undurable_commits.h"

#include <algorithm>

#include "meridian/core/log.h"

namespace meridian {

void UndurableCommits::Add(uint64_t commit_id, std::vector<float>* change,
                           const pb::DurablePoint& point) {
  Kept kept;
  kept.first_id = commit_id;
  kept.last_id = commit_id;
  kept.sum = std::move(*change);
  kept.sum.resize(num_elements_);
  *change = std::move(spare_);
  spare_ = {};
  kept_.push_back(std::move(kept));
  OnDurablePoint(point);
}

void UndurableCommits::OnDurablePoint(const pb::DurablePoint& point) {
  pending_.assign(point.pending().begin(), point.pending().end());
  while (!kept_.empty() && kept_.front().last_id <= point.commit_id()) {
    spare_ = std::move(kept_.front().sum);
    kept_.pop_front();
  }
  Compact();
}

void UndurableCommits::Clear() {
  kept_.clear();
  pending_.clear();
}

uint64_t UndurableCommits::commits() const {
  uint64_t total = 0;
  for (const Kept& kept : kept_) total += kept.last_id - kept.first_id + 1;
  return total;
}

bool UndurableCommits::Separated(const Kept& a, const Kept& b) const {
  return std::any_of(pending_.begin(), pending_.end(), [&](uint64_t id) {
    return id >= a.last_id && id < b.first_id;
  });
}

void UndurableCommits::MergeInto(Kept& a, Kept& b) {
  for (size_t k = 0; k < a.sum.size(); ++k) a.sum[k] += b.sum[k];
  a.last_id = b.last_id;
  spare_ = std::move(b.sum);
}

void UndurableCommits::Compact() {
  for (size_t i = 0; i + 1 < kept_.size();) {
    if (Separated(kept_[i], kept_[i + 1])) {
      ++i;
      continue;
    }
    MergeInto(kept_[i], kept_[i + 1]);
    kept_.erase(kept_.begin() + static_cast<ptrdiff_t>(i) + 1);
  }
  while (kept_.size() > kMaxKept) {
    if (forced_merges_++ % 100 == 0) {
      MLOG(WARNING) << "more than " << kMaxKept << " sums of commits the "
                    << "site does not hold durably: commits "
                    << kept_[0].first_id << " to " << kept_[1].last_id
                    << " are kept as one sum (a restart of the site from a "
                    << "checkpoint between them loses them)";
    }
    MergeInto(kept_[0], kept_[1]);
    kept_.erase(kept_.begin() + 1);
  }
}

}  // namespace meridian
