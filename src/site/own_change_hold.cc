#include "site/own_change_hold.h"

#include <algorithm>
#include <string>
#include <utility>

namespace meridian {

OwnChangeHold::OwnChangeHold(ParameterStore* store, size_t max_clocks,
                             bool as_sent)
    : store_(store),
      max_clocks_(std::max<size_t>(max_clocks, 1)),
      as_sent_(as_sent) {}

void OwnChangeHold::QueueHeld(int64_t clock,
                              std::span<const size_t> unsent_in) {
  std::vector<float> change = std::move(spare_);
  change.resize(store_->num_elements());
  store_->TakeHeld(change, unsent_in);
  queue_.push_back({clock, std::move(change)});
}

void OwnChangeHold::OnClock(int64_t clock, std::span<const size_t> unsent_in) {
  QueueHeld(clock, as_sent_ ? unsent_in : std::span<const size_t>());
  while (queue_.size() > max_clocks_) {
    ApplyFront();
    ++forced_;
  }
}

void OwnChangeHold::Release(int64_t peers_clock) {
  while (!queue_.empty() && queue_.front().clock <= peers_clock) ApplyFront();
}

void OwnChangeHold::ReleaseAll() {
  // What the clock being trained holds goes last (its clock is unknown).
  QueueHeld(queue_.empty() ? 0 : queue_.back().clock);
  while (!queue_.empty()) ApplyFront();
}

void OwnChangeHold::AddTo(std::span<float> out) const {
  for (const Entry& entry : queue_) {
    for (size_t i = 0; i < out.size(); ++i) out[i] += entry.change[i];
  }
  store_->AddHeldTo(out);
}

namespace {

Status CheckHeldSize(const ParameterStore& store, size_t size) {
  if (size == store.num_elements()) return Status::Ok();
  return DataLossError("the checkpoint's held own changes have " +
                       std::to_string(size) + " elements, the model " +
                       std::to_string(store.num_elements()));
}

}  // namespace

Status OwnChangeHold::Restore(std::span<const float> change, int64_t clock) {
  MERIDIAN_RETURN_IF_ERROR(CheckHeldSize(*store_, change.size()));
  queue_.clear();
  queue_.push_back({clock, {change.begin(), change.end()}});
  return Status::Ok();
}

Status OwnChangeHold::ApplyHeld(ParameterStore* store,
                                std::span<const float> change) {
  MERIDIAN_RETURN_IF_ERROR(CheckHeldSize(*store, change.size()));
  const UpdateSegment all{0, change};
  store->ApplyExternal(std::span<const UpdateSegment>(&all, 1));
  return Status::Ok();
}

void OwnChangeHold::ApplyFront() {
  Entry& front = queue_.front();
  const UpdateSegment all{0, front.change};
  store_->ApplyExternal(std::span<const UpdateSegment>(&all, 1));
  spare_ = std::move(front.change);
  queue_.pop_front();
}

}  // namespace meridian
